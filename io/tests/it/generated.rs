//! Properties over generated inputs, so the cases no one thought of are tried too:
//!
//! * every partition value and column name — `:`, `/`, `=`, `%`, spaces, quotes,
//!   control characters, unicode, empty, very long — goes through a directory name and
//!   an object key and comes back exactly once-escaped and exactly equal;
//! * every column type the digest supports (integers of each width, floats with NaN,
//!   -0.0 and infinities, decimals, strings, binary, dates, timestamps in several
//!   zones and units, times, durations, lists, structs, booleans, dictionaries, with
//!   nulls): the digest ignores row order and batch boundaries, survives the Parquet
//!   writer and a reader unchanged, and treats equal values of other widths, scales,
//!   zones and encodings alike.

use std::sync::Arc;

use arrow::array::*;
use arrow::datatypes::*;
use arrow::record_batch::RecordBatch;
use idem_io::digest::{DigestState, digest_batch};
use idem_io::hive::{DEFAULT_PARTITION, PartitionPath, escape, unescape};
use idem_io::writer::{PartitionWriter, WriterOptions};
use proptest::prelude::*;

/// Text with what partition values meet in practice and what breaks paths and keys.
fn nasty_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just(":".to_string()),
        Just("/".to_string()),
        Just("=".to_string()),
        Just("%".to_string()),
        Just("%3A".to_string()),
        Just("%25".to_string()),
        Just(" ".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("#?*[]{}^\\\"'".to_string()),
        Just("\u{0}\u{1}\n\t\u{7f}".to_string()),
        Just("__HIVE_DEFAULT_PARTITION__".to_string()),
        Just("é日本🦀".to_string()),
        "[a-zA-Z0-9_-]{1,8}",
        any::<String>(),
    ];
    prop_oneof![
        8 => prop::collection::vec(piece, 1..6).prop_map(|v| v.concat()),
        1 => "[a-z:%/ ]{200,400}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A value is escaped once into a single path segment (no `/`, no control
    /// character, never `.` or `..`) and parsed back to itself; the empty string is
    /// the Hive default partition (NULL), as every Hive reader reads it.
    #[test]
    fn partition_values_and_names_round_trip_through_paths(
        column in nasty_text(),
        value in nasty_text(),
    ) {
        let p = PartitionPath::new(vec![(column.clone(), Some(value.clone()))]);
        let rel = p.rel_path().to_string_lossy().into_owned();
        prop_assert!(!rel.contains('/'), "{rel:?}");
        prop_assert!(!rel.chars().any(|c| c.is_control()), "{rel:?}");
        prop_assert!(rel != "." && rel != "..");
        let back = PartitionPath::parse(&rel).unwrap();
        // As in Hive: the empty string and the default partition's own name are NULL.
        let expected = if value.is_empty() || value == DEFAULT_PARTITION {
            None
        } else {
            Some(value.clone())
        };
        prop_assert_eq!(back.parts(), &[(column.clone(), expected)][..]);
        prop_assert_eq!(unescape(&escape(&value)), value.clone());
        // Escaped once: escaping what was escaped escapes every `%` again.
        if value.contains('%') {
            prop_assert_ne!(escape(&escape(&value)), escape(&value));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Through an object store: the key holds the escaped path as it is (not escaped
    /// again), and listing the store gives the same partition back.
    #[test]
    fn partition_values_round_trip_through_object_keys(
        column in nasty_text(),
        value in nasty_text(),
    ) {
        use idem_io::commit::CommitBackend;
        let p = PartitionPath::new(vec![(column.clone(), Some(value.clone()))]);
        let rel = p.rel_path().to_string_lossy().into_owned();
        let store = idem_io::store::object_store("memory://keys/t", &Default::default()).unwrap();
        let key = idem_io::store::raw_key(format!("keys-{}/t/{rel}/part-000001-00000.parquet", std::process::id()));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            use object_store::ObjectStoreExt;
            store.put(&key, object_store::PutPayload::from_static(b"x")).await.unwrap();
        });
        prop_assert_eq!(key.as_ref(), format!("keys-{}/t/{rel}/part-000001-00000.parquet", std::process::id()));
        let table = idem_io::commit::object::ObjectTable::new(
            &format!("memory://keys/keys-{}/t", std::process::id()),
            &Default::default(),
            &std::env::temp_dir(),
        )
        .unwrap();
        let found = table.live_partitions(1).unwrap();
        prop_assert!(found.contains(&PartitionPath::parse(&rel).unwrap()), "{found:?}");
        rt.block_on(async {
            use object_store::ObjectStoreExt;
            store.delete(&key).await.unwrap();
        });
    }
}

/// One generated row: a value for every column type (each may be NULL).
#[derive(Clone, Debug)]
struct Seed {
    int: Option<i64>,
    unsigned: Option<u64>,
    float: Option<f64>,
    cents: Option<i64>,
    text: Option<String>,
    bytes: Option<Vec<u8>>,
    micros: Option<i64>,
    day: Option<i32>,
    list: Option<Vec<Option<i32>>>,
    flag: Option<bool>,
}

fn special_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<f64>(),
        1 => Just(f64::NAN),
        1 => Just(f64::from_bits(0xfff8_0000_0000_0001)),
        1 => Just(-0.0),
        1 => Just(0.0),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
    ]
}

fn seed() -> impl Strategy<Value = Seed> {
    (
        (
            prop::option::of(any::<i64>()),
            prop::option::of(any::<u64>()),
            prop::option::of(special_float()),
            prop::option::of(-1_000_000_000_000i64..1_000_000_000_000),
            prop::option::of(nasty_text()),
        ),
        (
            prop::option::of(prop::collection::vec(any::<u8>(), 0..12)),
            // Within ±30 years of 1970, so every unit below holds it.
            prop::option::of(-1_000_000_000_000_000i64..1_000_000_000_000_000),
            prop::option::of(-100_000i32..100_000),
            prop::option::of(prop::collection::vec(prop::option::of(any::<i32>()), 0..4)),
            prop::option::of(any::<bool>()),
        ),
    )
        .prop_map(
            |((int, unsigned, float, cents, text), (bytes, micros, day, list, flag))| Seed {
                int,
                unsigned,
                float,
                cents,
                text,
                bytes,
                micros,
                day,
                list,
                flag,
            },
        )
}

/// A batch with a column of every supported type, from `rows`.
fn batch(rows: &[Seed]) -> RecordBatch {
    let col = |f: &dyn Fn(&Seed) -> Option<i64>| rows.iter().map(f).collect::<Vec<_>>();
    let ints = col(&|s| s.int);
    let micros = col(&|s| s.micros);
    let cents = col(&|s| s.cents);
    let list =
        ListArray::from_iter_primitive::<Int32Type, _, _>(rows.iter().map(|s| s.list.clone()));
    let struct_fields = Fields::from(vec![
        Field::new("a", DataType::Utf8, true),
        Field::new("b", DataType::Float64, true),
    ]);
    let structs = StructArray::new(
        struct_fields.clone(),
        vec![
            Arc::new(StringArray::from_iter(rows.iter().map(|s| s.text.clone()))) as ArrayRef,
            Arc::new(Float64Array::from_iter(rows.iter().map(|s| s.float))),
        ],
        Some(rows.iter().map(|s| s.flag.is_some()).collect()),
    );
    let day_ms = |d: i32| d as i64 * 86_400_000;
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "i8",
            Arc::new(Int8Array::from_iter(
                ints.iter().map(|v| v.map(|v| v as i8)),
            )),
        ),
        (
            "i16",
            Arc::new(Int16Array::from_iter(
                ints.iter().map(|v| v.map(|v| v as i16)),
            )),
        ),
        (
            "i32",
            Arc::new(Int32Array::from_iter(
                ints.iter().map(|v| v.map(|v| v as i32)),
            )),
        ),
        ("i64", Arc::new(Int64Array::from(ints.clone()))),
        (
            "u8",
            Arc::new(UInt8Array::from_iter(
                rows.iter().map(|s| s.unsigned.map(|v| v as u8)),
            )),
        ),
        (
            "u32",
            Arc::new(UInt32Array::from_iter(
                rows.iter().map(|s| s.unsigned.map(|v| v as u32)),
            )),
        ),
        (
            "u64",
            Arc::new(UInt64Array::from_iter(rows.iter().map(|s| s.unsigned))),
        ),
        (
            "f32",
            Arc::new(Float32Array::from_iter(
                rows.iter().map(|s| s.float.map(|v| v as f32)),
            )),
        ),
        (
            "f64",
            Arc::new(Float64Array::from_iter(rows.iter().map(|s| s.float))),
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from_iter(cents.iter().map(|v| v.map(i128::from)))
                    .with_precision_and_scale(18, 2)
                    .unwrap(),
            ),
        ),
        (
            "utf8",
            Arc::new(StringArray::from_iter(rows.iter().map(|s| s.text.clone()))),
        ),
        (
            "dict",
            Arc::new(
                rows.iter()
                    .map(|s| s.text.as_deref())
                    .collect::<DictionaryArray<Int32Type>>(),
            ),
        ),
        (
            "large",
            Arc::new(LargeStringArray::from_iter(
                rows.iter().map(|s| s.text.clone()),
            )),
        ),
        (
            "bin",
            Arc::new(BinaryArray::from_iter(rows.iter().map(|s| s.bytes.clone()))),
        ),
        (
            "date",
            Arc::new(Date32Array::from_iter(rows.iter().map(|s| s.day))),
        ),
        (
            "date64",
            Arc::new(Date64Array::from_iter(
                rows.iter().map(|s| s.day.map(day_ms)),
            )),
        ),
        (
            "ts_utc",
            Arc::new(TimestampMicrosecondArray::from(micros.clone()).with_timezone("UTC")),
        ),
        (
            "ts_zoned",
            Arc::new(
                TimestampNanosecondArray::from_iter(micros.iter().map(|v| v.map(|v| v * 1000)))
                    .with_timezone("+05:30"),
            ),
        ),
        (
            "ts_naive",
            Arc::new(TimestampMillisecondArray::from_iter(
                micros.iter().map(|v| v.map(|v| v / 1000)),
            )),
        ),
        (
            "time",
            Arc::new(Time64NanosecondArray::from_iter(
                micros
                    .iter()
                    .map(|v| v.map(|v| v.rem_euclid(86_400_000_000) * 1000)),
            )),
        ),
        (
            "dur",
            Arc::new(DurationMicrosecondArray::from(micros.clone())),
        ),
        ("list", Arc::new(list)),
        ("struct", Arc::new(structs)),
        (
            "flag",
            Arc::new(BooleanArray::from_iter(rows.iter().map(|s| s.flag))),
        ),
    ];
    RecordBatch::try_from_iter_with_nullable(columns.into_iter().map(|(n, a)| (n, a, true)))
        .unwrap()
}

/// Writes `batches` as one partition and reads every file back: the manifest's digest
/// and the digest of what a reader gets.
fn through_parquet(batches: &[RecordBatch]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let schema = batches[0].schema();
    let opts = WriterOptions {
        row_group_rows: 7,
        target_file_bytes: 2048,
        ..Default::default()
    };
    let mut w = PartitionWriter::new(
        PartitionPath::root(),
        dir.path().join("p"),
        schema.clone(),
        opts,
    )
    .unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    let written = w
        .finish(
            &Default::default(),
            idem_io::manifest::describe_schema(&schema, &[]),
        )
        .unwrap();
    let mut read = DigestState::default();
    for f in &written.manifest().files {
        let file = std::fs::File::open(written.dir().join(&f.name)).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        for b in reader {
            read.update(&b.unwrap());
        }
    }
    (written.manifest().digest.clone(), read.finish())
}

fn digest_of(batches: &[RecordBatch]) -> String {
    let mut d = DigestState::default();
    for b in batches {
        d.update(b);
    }
    d.finish()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_digest_ignores_order_and_batches_and_survives_parquet(
        rows in prop::collection::vec(seed(), 1..40),
        cut in any::<prop::sample::Index>(),
    ) {
        let whole = batch(&rows);
        let mut reversed = rows.clone();
        reversed.reverse();
        let at = cut.index(rows.len() + 1);
        let split = [batch(&reversed[..at]), batch(&reversed[at..])];
        let expected = digest_batch(&whole).finish();
        prop_assert_eq!(digest_of(&split), expected.clone());
        let (manifest, read) = through_parquet(&split);
        prop_assert_eq!(&manifest, &expected);
        prop_assert_eq!(&read, &expected);
    }

    /// Equal values are equal whatever their width, scale or zone.
    #[test]
    fn equal_values_of_other_types_hash_alike(rows in prop::collection::vec(seed(), 1..40)) {
        let b = batch(&rows);
        let one = |name: &str, to: Option<DataType>| {
            let a = b.column(b.schema().index_of(name).unwrap()).clone();
            let a = match to {
                Some(t) => arrow::compute::cast(&a, &t).unwrap(),
                None => a,
            };
            digest_batch(&RecordBatch::try_from_iter([("c", a)]).unwrap()).finish()
        };
        prop_assert_eq!(one("i32", None), one("i32", Some(DataType::Int64)));
        prop_assert_eq!(one("dec", None), one("dec", Some(DataType::Decimal128(38, 10))));
        let zoned = DataType::Timestamp(TimeUnit::Nanosecond, Some("-08:00".into()));
        prop_assert_eq!(one("ts_utc", None), one("ts_utc", Some(zoned)));
        prop_assert_eq!(one("utf8", None), one("large", None));
        prop_assert_eq!(one("utf8", None), one("utf8", Some(DataType::Utf8View)));
        // Dictionary-encoded columns hash as their values, whatever the key type, and
        // a slice of one (whose dictionary holds more values than its rows) as the
        // same slice of the values.
        prop_assert_eq!(one("dict", None), one("utf8", None));
        let keyed = |k: DataType, v: DataType| Some(DataType::Dictionary(Box::new(k), Box::new(v)));
        prop_assert_eq!(one("i64", keyed(DataType::UInt16, DataType::Int64)), one("i64", None));
        prop_assert_eq!(
            one("dec", keyed(DataType::Int8, DataType::Decimal128(18, 2))),
            one("dec", None)
        );
        let sliced = |name: &str| {
            let a = b.column(b.schema().index_of(name).unwrap());
            let a = a.slice(a.len() / 2, a.len() - a.len() / 2);
            digest_batch(&RecordBatch::try_from_iter([("c", a)]).unwrap()).finish()
        };
        prop_assert_eq!(sliced("dict"), sliced("utf8"));
    }
}
