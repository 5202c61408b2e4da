//! Criterion benchmarks of the write path's hot parts, on one generated day of orders:
//! the partition writer (encode + digest + footers + fsync), the digest alone, and
//! the canonical key. Run with `cargo bench -p idem-benches`.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
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
