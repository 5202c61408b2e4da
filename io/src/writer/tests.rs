//! Unit tests of the partition writer.

use std::fs::File;

use arrow::datatypes::DataType;

use super::options::*;
use super::*;
use crate::digest::digest_batch;
use crate::manifest::{describe_schema, read_from_file};
use arrow::array::{ArrayRef, AsArray, Int64Array, StringArray};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn batch(start: i64, n: i64) -> RecordBatch {
    let ids: Vec<i64> = (start..start + n).collect();
    let names: Vec<String> = ids.iter().map(|i| format!("name-{i}")).collect();
    RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
        ("name", Arc::new(StringArray::from(names)) as ArrayRef),
    ])
    .unwrap()
}

fn write(dir: &Path, opts: WriterOptions, batches: &[RecordBatch]) -> WrittenPartition {
    let schema = batches[0].schema();
    let p = PartitionPath::new(vec![("dt".into(), Some("2026-06-01".into()))]);
    let mut w = PartitionWriter::new(p, dir.to_path_buf(), Arc::clone(&schema), opts).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish(&RunInfo::default(), describe_schema(&schema, &[]))
        .unwrap()
}

/// Nearly-unique columns are written without a dictionary, repetitive ones with
/// one, and the rows read back the same either way.
#[test]
fn high_cardinality_columns_skip_the_dictionary() {
    let dir = tempfile::tempdir().unwrap();
    let n = 5000i64;
    let ids: Vec<i64> = (0..n).collect();
    let status: Vec<&str> = (0..n)
        .map(|i| ["paid", "shipped"][i as usize % 2])
        .collect();
    let b = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
        ("status", Arc::new(StringArray::from(status)) as ArrayRef),
    ])
    .unwrap();
    let written = write(
        dir.path(),
        WriterOptions::default(),
        std::slice::from_ref(&b),
    );
    let file = File::open(written.dir.join(&written.manifest.files[0].name)).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let chunk = |i: usize| {
        reader
            .metadata()
            .row_group(0)
            .column(i)
            .dictionary_page_offset()
    };
    assert_eq!(chunk(0), None, "id has a dictionary");
    assert!(chunk(1).is_some(), "status has no dictionary");
    let back: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
    let back = arrow::compute::concat_batches(&back[0].schema(), &back).unwrap();
    assert_eq!(back.columns(), b.columns());
    // Too few rows to judge: every column keeps its dictionary.
    let small = tempfile::tempdir().unwrap();
    let written = write(small.path(), WriterOptions::default(), &[batch(0, 100)]);
    let file = File::open(written.dir.join(&written.manifest.files[0].name)).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    assert!(
        reader
            .metadata()
            .row_group(0)
            .column(0)
            .dictionary_page_offset()
            .is_some()
    );
}

/// Nearly-unique integer columns that move by narrow steps (a growing id, keys of a
/// bounded range drawn at random, times within a day, with NULLs between) are written
/// as deltas, wide ones (hashes, unsigned values beyond `i64`) plain; every column
/// reads back the same, through several row groups.
#[test]
fn narrow_integer_columns_are_written_as_deltas() {
    use arrow::array::{Int32Array, TimestampMicrosecondArray, UInt64Array};
    use parquet::basic::Encoding;
    let dir = tempfile::tempdir().unwrap();
    let n = 40_000i64;
    let mix = |i: i64| {
        (i as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29)
    };
    let b = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(1_000..1_000 + n)) as ArrayRef,
        ),
        (
            "customer",
            Arc::new(Int64Array::from_iter_values(
                (0..n).map(|i| 1 + (mix(i) % 5_000_000) as i64),
            )) as ArrayRef,
        ),
        (
            "hash",
            Arc::new(Int64Array::from_iter_values((0..n).map(|i| mix(i) as i64))) as ArrayRef,
        ),
        (
            "small",
            Arc::new(Int32Array::from_iter(
                (0..n).map(|i| (i % 50 != 0).then_some(i as i32 * 3)),
            )) as ArrayRef,
        ),
        (
            "wide",
            Arc::new(UInt64Array::from_iter_values(
                (0..n as u64).map(|i| if i % 2 == 0 { i } else { u64::MAX - i }),
            )) as ArrayRef,
        ),
        (
            "at",
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(
                    (0..n).map(|i| 1_700_000_000_000_000 + (mix(i) % 86_400_000_000) as i64),
                )
                .with_timezone("UTC"),
            ) as ArrayRef,
        ),
    ])
    .unwrap();
    let opts = WriterOptions {
        row_group_rows: 16 * 1024,
        ..WriterOptions::default()
    };
    let written = write(dir.path(), opts, std::slice::from_ref(&b));
    let file = File::open(written.dir.join(&written.manifest.files[0].name)).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let meta = reader.metadata().clone();
    assert_eq!(meta.num_row_groups(), 3);
    for rg in meta.row_groups() {
        let delta = |i: usize| {
            let encodings: Vec<Encoding> = rg.column(i).encodings().collect();
            assert!(rg.column(i).dictionary_page_offset().is_none());
            encodings.contains(&Encoding::DELTA_BINARY_PACKED)
        };
        assert!(delta(0), "a growing id is written as deltas");
        assert!(delta(1), "keys of a bounded range are written as deltas");
        assert!(!delta(2), "hashes are written plain");
        assert!(
            delta(3),
            "steps of 3 with NULLs between are written as deltas"
        );
        assert!(!delta(4), "unsigned values beyond i64 are written plain");
        assert!(delta(5), "times within a day are written as deltas");
    }
    let back: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
    let back = arrow::compute::concat_batches(&back[0].schema(), &back).unwrap();
    assert_eq!(back.columns(), b.columns());
}

/// A nested column's leaves are written by that column's writers, in order: a
/// struct of two leaves between flat columns, and a list, read back the same over
/// several row groups.
#[test]
fn nested_columns_are_written_leaf_by_leaf() {
    use arrow::array::{Int32Array, ListArray, StructArray};
    use arrow::datatypes::{Field, Int64Type};
    let dir = tempfile::tempdir().unwrap();
    let n = 2500;
    let point = StructArray::from(vec![
        (
            Arc::new(Field::new("x", DataType::Int32, true)),
            Arc::new(Int32Array::from_iter(
                (0..n).map(|i| (i % 7 != 0).then_some(i)),
            )) as ArrayRef,
        ),
        (
            Arc::new(Field::new("label", DataType::Utf8, true)),
            Arc::new(StringArray::from_iter(
                (0..n).map(|i| Some(format!("p{i}"))),
            )) as ArrayRef,
        ),
    ]);
    let tags = ListArray::from_iter_primitive::<Int64Type, _, _>(
        (0..n).map(|i| (i % 5 != 0).then(|| (0..i as i64 % 4).map(Some).collect::<Vec<_>>())),
    );
    let b = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
        ),
        ("point", Arc::new(point) as ArrayRef),
        ("tags", Arc::new(tags) as ArrayRef),
        (
            "note",
            Arc::new(StringArray::from_iter(
                (0..n).map(|i| Some(["a", "b"][i as usize % 2])),
            )) as ArrayRef,
        ),
    ])
    .unwrap();
    let opts = WriterOptions {
        row_group_rows: 1000,
        ..Default::default()
    };
    let written = write(dir.path(), opts, &[b.slice(0, 1200), b.slice(1200, 1300)]);
    assert_eq!(written.manifest.rows, n as u64);
    let file = File::open(written.dir.join(&written.manifest.files[0].name)).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    assert_eq!(reader.metadata().num_row_groups(), 3);
    let back: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
    let back = arrow::compute::concat_batches(&back[0].schema(), &back).unwrap();
    assert_eq!(back.columns(), b.columns());
}

#[test]
fn files_roll_and_every_footer_carries_the_whole_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let batches: Vec<_> = (0..20).map(|i| batch(i * 1000, 1000)).collect();
    let small = WriterOptions {
        row_group_rows: 3000,
        target_file_bytes: 16 << 10,
        ..Default::default()
    };
    let rolled = write(&dir.path().join("a"), small, &batches);
    let one = write(&dir.path().join("b"), WriterOptions::default(), &batches);
    assert!(
        rolled.manifest.files.len() > 1,
        "{:?}",
        rolled.manifest.files
    );
    assert_eq!(one.manifest.files.len(), 1);
    assert_eq!(rolled.manifest.rows, 20_000);
    // The digest does not depend on how rows are split into files.
    assert_eq!(rolled.manifest.digest, one.manifest.digest);

    let mut rows = 0;
    for f in &rolled.manifest.files {
        let path = rolled.dir.join(&f.name);
        assert_eq!(read_from_file(&path).unwrap().unwrap(), rolled.manifest);
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        let n: usize = reader.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(n as u64, f.rows);
        rows += n;
    }
    assert_eq!(rows, 20_000);
}

#[test]
fn an_empty_partition_is_one_zero_row_file_with_schema_and_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let schema = batch(0, 1).schema();
    let p = PartitionPath::new(vec![("dt".into(), Some("2026-06-02".into()))]);
    let w = PartitionWriter::new(
        p,
        dir.path().join("e"),
        Arc::clone(&schema),
        WriterOptions::default(),
    )
    .unwrap();
    let written = w
        .finish(&RunInfo::default(), describe_schema(&schema, &[]))
        .unwrap();
    assert_eq!(written.manifest.rows, 0);
    assert_eq!(written.manifest.files.len(), 1);
    let path = written.dir.join(&written.manifest.files[0].name);
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!(builder.schema().fields().len(), 2);
    assert_eq!(builder.metadata().file_metadata().num_rows(), 0);
    assert_eq!(
        read_from_file(&path).unwrap().unwrap().digest,
        written.manifest.digest
    );
}

/// A writer given a `Difference` hashes no row of its first file and still records
/// the digest, and every file's sum, that hashing every row gives; it refuses to
/// finish when the rows it was given are not the rows the difference counts.
#[test]
fn a_derived_digest_equals_hashing_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let schema = batch(0, 1).schema();
    // The live file: rows 0..3000. The merge drops rows 1000..1500 and adds 5000..5600.
    let live = digest_batch(&batch(0, 3000));
    let kept = [batch(0, 1000), batch(1500, 1500)];
    let added = batch(5000, 600);
    // `step`: rows per write (parts of a few rows are held and encoded together).
    let written =
        |name: &str, opts: WriterOptions, step: usize, derive: Option<Arc<Difference>>| {
            let mut w = PartitionWriter::new(
                PartitionPath::root(),
                dir.path().join(name),
                Arc::clone(&schema),
                opts,
            )
            .unwrap();
            if let Some(rows) = derive {
                w.derive_digest(rows);
            }
            for b in kept.iter().chain([&added]) {
                for at in (0..b.num_rows()).step_by(step) {
                    w.write(&b.slice(at, step.min(b.num_rows() - at))).unwrap();
                }
            }
            w.finish(&RunInfo::default(), describe_schema(&schema, &[]))
        };
    let difference = || {
        let rows = Difference::new(live);
        rows.remove(digest_batch(&batch(1000, 500)));
        rows.add(digest_batch(&added));
        Arc::new(rows)
    };
    // Several files: the later ones are hashed, the first gets what is left.
    let several = WriterOptions {
        row_group_rows: 500,
        target_file_bytes: 1,
        ..Default::default()
    };
    for (opts, step) in [
        (WriterOptions::default(), usize::MAX),
        (several.clone(), usize::MAX),
        (several, 7),
    ] {
        let hashed = written("hashed", opts.clone(), step, None).unwrap();
        let derived = written("derived", opts.clone(), step, Some(difference())).unwrap();
        assert_eq!(derived.manifest.digest, hashed.manifest.digest);
        // The same files but for their names (each writer names its own).
        let unnamed = |w: &WrittenPartition| {
            let files = w.manifest.files.iter();
            files
                .map(|f| (f.rows, f.data_bytes, f.sum.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(unnamed(&derived), unnamed(&hashed));
        assert_eq!(derived.manifest.rows, 3100);
        std::fs::remove_dir_all(dir.path().join("hashed")).unwrap();
        std::fs::remove_dir_all(dir.path().join("derived")).unwrap();
    }
    // One dropped row too few: the rows written are not the rows counted.
    let wrong = Difference::new(live);
    wrong.remove(digest_batch(&batch(1000, 499)));
    wrong.add(digest_batch(&added));
    let err = written(
        "wrong",
        WriterOptions::default(),
        usize::MAX,
        Some(Arc::new(wrong)),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the digest of partition (table) could not be derived: 3100 rows were written where 3101 were expected"
    );
}

#[test]
fn kept_files_are_linked_listed_and_counted_in_the_digest() {
    let dir = tempfile::tempdir().unwrap();
    let small = WriterOptions {
        row_group_rows: 1000,
        target_file_bytes: 1,
        ..Default::default()
    };
    // The old partition: three files of 1000 rows each.
    let old = write(
        &dir.path().join("old"),
        small.clone(),
        &[batch(0, 1000), batch(1000, 1000), batch(2000, 1000)],
    );
    assert_eq!(old.manifest.files.len(), 3);
    // A merge keeps files 0 and 2 and rewrites the middle one with new rows.
    let kept: Vec<KeptFile> = [0, 2]
        .iter()
        .map(|&i| KeptFile {
            path: old.dir.join(&old.manifest.files[i].name),
            entry: old.manifest.files[i].clone(),
        })
        .collect();
    let schema = batch(0, 1).schema();
    let mut w = PartitionWriter::new(
        old.partition.clone(),
        dir.path().join("new"),
        Arc::clone(&schema),
        small,
    )
    .unwrap();
    w.keep(kept, old.manifest.generation + 1).unwrap();
    w.write(&batch(1000, 1000)).unwrap();
    let new = w
        .finish(&RunInfo::default(), describe_schema(&schema, &[]))
        .unwrap();
    // Same rows as before: the same digest, computed without reading the kept files.
    assert_eq!(new.manifest.digest, old.manifest.digest);
    assert_eq!(new.manifest.rows, 3000);
    assert_eq!(new.manifest.generation, 1);
    // The kept files keep their names; the new file is numbered after them, with a
    // token of its own (no version of a partition reuses another's file names).
    let names: Vec<&str> = new.manifest.files.iter().map(|f| f.name.as_str()).collect();
    let old_names: Vec<&str> = old.manifest.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names[..2], [old_names[0], old_names[2]]);
    assert!(names[2].ends_with("-00003.parquet"), "{names:?}");
    assert!(!old_names.contains(&names[2]), "{names:?}");
    // Kept files are the same inodes; the partition reads as the newest manifest.
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&old.dir.join(names[1])), ino(&new.dir.join(names[1])));
    match crate::manifest::read_partition(&new.dir).unwrap() {
        crate::manifest::LiveState::Managed(m) => assert_eq!(*m, new.manifest),
        other => panic!("{other:?}"),
    }
}

/// A writer of the unpartitioned table's partition, with the default options.
fn root_writer(dir: &Path, schema: &arrow::datatypes::SchemaRef) -> PartitionWriter {
    let opts = WriterOptions::default();
    PartitionWriter::new(PartitionPath::root(), dir.into(), Arc::clone(schema), opts).unwrap()
}

/// Thousands of parts of a few rows each, as a query batch routed into thousands of
/// partitions gives every partition: they are encoded together, so the partition is
/// one row group holding every row in the order written, with the digest of hashing
/// them all; what they hold meanwhile counts toward the memory budget and a flush
/// writes it out.
#[test]
fn small_parts_are_encoded_together_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let whole = batch(0, 9000);
    let schema = whole.schema();
    let mut w = root_writer(&dir.path().join("p"), &schema);
    for at in (0..3000).step_by(3) {
        w.write(&whole.slice(at, 3)).unwrap();
    }
    assert_eq!(w.rows(), 3000);
    assert!(w.buffered_memory() > 0, "held rows count toward the budget");
    w.flush().unwrap();
    assert_eq!(w.buffered_memory(), 0, "a flush writes held rows out");
    for at in (3000..9000).step_by(2) {
        w.write(&whole.slice(at, 2)).unwrap();
    }
    let written = w
        .finish(&RunInfo::default(), describe_schema(&schema, &[]))
        .unwrap();
    assert_eq!(written.manifest.rows, 9000);
    assert_eq!(written.manifest.digest, digest_batch(&whole).finish());
    let path = written.dir.join(&written.manifest.files[0].name);
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
    // The flush cut one row group; the 6,000 rows after it are one more, not 3,000.
    assert_eq!(reader.metadata().num_row_groups(), 2);
    let read: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
    let read = arrow::compute::concat_batches(&schema, &read).unwrap();
    assert_eq!(read.columns(), whole.columns());
}

/// A held part of a string view column keeps only its own values, not the buffers it
/// shares with the batch it was cut from: a partition holding a few rows of each of
/// many large batches holds (and counts) a few rows' worth.
#[test]
fn held_views_keep_only_their_own_values() {
    use arrow::array::StringViewArray;
    let dir = tempfile::tempdir().unwrap();
    let big = |start: usize| {
        let values: Vec<String> = (start..start + 8192)
            .map(|i| format!("a value long enough not to be inlined {i:08}"))
            .collect();
        RecordBatch::try_from_iter([(
            "s",
            Arc::new(StringViewArray::from_iter_values(values)) as ArrayRef,
        )])
        .unwrap()
    };
    let schema = big(0).schema();
    let mut w = root_writer(&dir.path().join("p"), &schema);
    let batches: Vec<_> = (0..100).map(|i| big(i * 8192)).collect();
    let one_batch = batches[0].get_array_memory_size();
    for b in &batches {
        w.write(&b.slice(17, 2)).unwrap();
    }
    assert_eq!(w.rows(), 200);
    assert!(
        w.buffered_memory() < one_batch / 4,
        "200 held rows count {} bytes; one batch they came from has {one_batch}",
        w.buffered_memory()
    );
    let written = w
        .finish(&RunInfo::default(), describe_schema(&schema, &[]))
        .unwrap();
    let path = written.dir.join(&written.manifest.files[0].name);
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let read: Vec<String> = reader
        .flat_map(|b| {
            let b = b.unwrap();
            let c = arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
            c.as_string::<i32>()
                .iter()
                .map(|v| v.unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let expected: Vec<String> = (0..100)
        .flat_map(|i| [i * 8192 + 17, i * 8192 + 18])
        .map(|i| format!("a value long enough not to be inlined {i:08}"))
        .collect();
    assert_eq!(read, expected);
}
