//! Criterion benchmarks of the write path's hot parts, on one generated day of orders:
//! the partition writer (encode + digest + footers + fsync) per compression and per
//! column type, the digest alone, and partition routing. Run with
//! `cargo bench -p idem-benches --bench write`.

use std::sync::Arc;

use arrow::array::Date32Array;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use idem_engine::route::Router;
use idem_io::digest::DigestState;
use idem_io::hive::PartitionPath;
use idem_io::manifest::{RunInfo, describe_schema};
use idem_io::writer::{PartitionWriter, WriterOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};

const ROWS: u64 = 1_000_000;

fn orders() -> Vec<RecordBatch> {
    let dir = tempfile::tempdir().unwrap();
    let spec = idem_testdata::OrdersSpec {
        days: 1,
        rows_per_day: ROWS,
        customers: 1_000_000,
        ..Default::default()
    };
    let files = idem_testdata::write_orders(dir.path(), &spec).unwrap();
    let file = std::fs::File::open(&files[0]).unwrap();
    ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .with_batch_size(32 * 1024)
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

fn write(c: &mut Criterion) {
    let batches = orders();
    let schema = batches[0].schema();
    let mut group = c.benchmark_group("writer");
    group.throughput(Throughput::Elements(ROWS));
    group.sample_size(10);
    for (name, compression) in [
        ("snappy", Compression::SNAPPY),
        ("zstd3", Compression::ZSTD(ZstdLevel::try_new(3).unwrap())),
        ("none", Compression::UNCOMPRESSED),
    ] {
        group.bench_function(format!("partition_1m_rows_{name}"), |b| {
            b.iter_batched(
                || tempfile::tempdir().unwrap(),
                |dir| {
                    let opts = WriterOptions {
                        compression,
                        ..Default::default()
                    };
                    let p = PartitionPath::new(vec![("dt".into(), Some("2026-06-01".into()))]);
                    let mut w =
                        PartitionWriter::new(p, dir.path().join("p"), Arc::clone(&schema), opts)
                            .unwrap();
                    for batch in &batches {
                        w.write(batch).unwrap();
                    }
                    w.finish(&RunInfo::default(), describe_schema(&schema, &[]))
                        .unwrap();
                    dir
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();

    // One column at a time: what each type costs to encode (snappy).
    let mut group = c.benchmark_group("writer_column");
    group.throughput(Throughput::Elements(ROWS));
    group.sample_size(10);
    for (i, field) in schema.fields().iter().enumerate() {
        let column: Vec<RecordBatch> = batches.iter().map(|b| b.project(&[i]).unwrap()).collect();
        let col_schema = column[0].schema();
        group.bench_function(format!("{}_{}", field.name(), field.data_type()), |b| {
            b.iter_batched(
                || tempfile::tempdir().unwrap(),
                |dir| {
                    let p = PartitionPath::root();
                    let mut w = PartitionWriter::new(
                        p,
                        dir.path().join("p"),
                        Arc::clone(&col_schema),
                        WriterOptions::default(),
                    )
                    .unwrap();
                    for batch in &column {
                        w.write(batch).unwrap();
                    }
                    w.finish(&RunInfo::default(), describe_schema(&col_schema, &[]))
                        .unwrap();
                    dir
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();

    // Routing: one day (every batch belongs to one partition: no copy) and a week
    // interleaved row by row (every batch split seven ways with `take`).
    let with_dt = |days: i32| -> Vec<RecordBatch> {
        let mut n = 0i32;
        batches
            .iter()
            .map(|b| {
                let dt: Vec<i32> = (0..b.num_rows())
                    .map(|_| {
                        n += 1;
                        20605 + n % days
                    })
                    .collect();
                let mut cols = b.columns().to_vec();
                cols.push(Arc::new(Date32Array::from(dt)));
                let mut fields: Vec<Field> = b
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone())
                    .collect();
                fields.push(Field::new("dt", DataType::Date32, false));
                RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
            })
            .collect()
    };
    let mut group = c.benchmark_group("route");
    group.throughput(Throughput::Elements(ROWS));
    group.sample_size(10);
    for (name, days) in [("one_partition", 1), ("seven_interleaved", 7)] {
        let input = with_dt(days);
        let router = Router::new(&input[0].schema(), &["dt".to_string()]);
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut parts = 0;
                for batch in &input {
                    parts += router.split(batch).unwrap().len();
                }
                parts
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("digest");
    group.throughput(Throughput::Elements(ROWS));
    group.sample_size(10);
    group.bench_function("orders_1m_rows", |b| {
        b.iter(|| {
            let mut d = DigestState::default();
            for batch in &batches {
                d.update(batch);
            }
            d.finish()
        })
    });
    group.finish();
}

criterion_group!(benches, write);
criterion_main!(benches);
