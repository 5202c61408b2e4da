//! The statistics of an `add` action, read from a data file's footer: the record count
//! and, per top-level column of a type readers skip files by, the minimum, maximum and
//! null count, in the JSON layout the Delta protocol gives ("Per-file Statistics").
//! A column whose statistics are incomplete (a row group without them, a NaN, a long
//! string's maximum) is left out: a reader then never skips a file it should read.

use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Schema};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::file::metadata::ParquetMetaData;
use serde_json::{Map, Value, json};

use crate::error::Result;

/// Strings longer than this keep only a prefix as their minimum and no maximum, as
/// Spark and delta-rs bound their statistics.
const STRING_PREFIX: usize = 32;

/// The `stats` JSON of the Parquet file at `path`, whose columns are `schema`'s.
pub(super) fn of_file(path: &Path, schema: &Schema) -> Result<String> {
    let meta = crate::manifest::read_footer(path)?;
    Ok(of_metadata(&meta, schema).to_string())
}

fn of_metadata(meta: &ParquetMetaData, schema: &Schema) -> Value {
    let rows: i64 = meta.row_groups().iter().map(|rg| rg.num_rows()).sum();
    let (mut mins, mut maxes, mut nulls) = (Map::new(), Map::new(), Map::new());
    for field in schema.fields() {
        let Ok(conv) =
            StatisticsConverter::try_new(field.name(), schema, meta.file_metadata().schema_descr())
        else {
            continue;
        };
        let groups = meta.row_groups().iter();
        let counts = conv.row_group_null_counts(groups.clone()).ok();
        if let Some(counts) = &counts
            && counts.null_count() == 0
        {
            nulls.insert(
                field.name().clone(),
                json!(counts.values().iter().sum::<u64>()),
            );
        }
        if !skippable(field.data_type()) {
            continue;
        }
        let (Ok(lo), Ok(hi)) = (
            conv.row_group_mins(groups.clone()),
            conv.row_group_maxes(groups),
        ) else {
            continue;
        };
        // A row group of only NULLs has no minimum; any other gap leaves the column out.
        let all_null: Vec<bool> = meta
            .row_groups()
            .iter()
            .enumerate()
            .map(|(i, rg)| {
                counts
                    .as_ref()
                    .is_some_and(|c| c.is_valid(i) && c.value(i) as i64 == rg.num_rows())
            })
            .collect();
        if let Some(v) = extreme(&lo, &all_null, false) {
            mins.insert(field.name().clone(), v);
        }
        if let Some(v) = extreme(&hi, &all_null, true) {
            maxes.insert(field.name().clone(), v);
        }
    }
    json!({
        "numRecords": rows,
        "minValues": mins,
        "maxValues": maxes,
        "nullCount": nulls,
    })
}

/// Types whose minimum and maximum readers use to skip files, and that idem records.
fn skippable(t: &DataType) -> bool {
    use DataType::*;
    matches!(
        t,
        Int8 | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | Float32
            | Float64
            | Utf8
            | LargeUtf8
            | Utf8View
            | Date32
            | Timestamp(_, _)
    )
}

/// The least (or, with `max`, the greatest) of the row groups' values as Delta's JSON,
/// or `None` when a row group with values lacks its statistic.
fn extreme(values: &ArrayRef, all_null: &[bool], max: bool) -> Option<Value> {
    let mut best: Option<Value> = None;
    let mut best_key: Option<Key> = None;
    for i in 0..values.len() {
        if values.is_null(i) {
            if all_null.get(i).copied().unwrap_or(false) {
                continue;
            }
            return None;
        }
        let (key, v) = scalar(values, i, max)?;
        let better = match &best_key {
            None => true,
            Some(b) if max => key > *b,
            Some(b) => key < *b,
        };
        if better {
            best_key = Some(key);
            best = Some(v);
        }
    }
    best
}

/// A value's order, to compare row groups' statistics.
#[derive(PartialEq, PartialOrd)]
enum Key {
    Int(i128),
    Float(f64),
    Text(String),
}

fn scalar(a: &ArrayRef, i: usize, max: bool) -> Option<(Key, Value)> {
    use arrow::datatypes::*;
    macro_rules! int {
        ($t:ty) => {{
            let v = a.as_primitive::<$t>().value(i);
            Some((Key::Int(v as i128), json!(v)))
        }};
    }
    match a.data_type() {
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::Float32 => float(a.as_primitive::<Float32Type>().value(i) as f64),
        DataType::Float64 => float(a.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => text(a.as_string::<i32>().value(i), max),
        DataType::LargeUtf8 => text(a.as_string::<i64>().value(i), max),
        DataType::Utf8View => text(a.as_string_view().value(i), max),
        DataType::Date32 => {
            let days = a.as_primitive::<Date32Type>().value(i);
            let date = chrono::NaiveDate::from_num_days_from_ce_opt(days + 719_163)?;
            Some((
                Key::Int(days as i128),
                json!(date.format("%Y-%m-%d").to_string()),
            ))
        }
        DataType::Timestamp(unit, tz) => {
            let v = match unit {
                TimeUnit::Second => {
                    a.as_primitive::<TimestampSecondType>().value(i) as i128 * 1_000_000_000
                }
                TimeUnit::Millisecond => {
                    a.as_primitive::<TimestampMillisecondType>().value(i) as i128 * 1_000_000
                }
                TimeUnit::Microsecond => {
                    a.as_primitive::<TimestampMicrosecondType>().value(i) as i128 * 1_000
                }
                TimeUnit::Nanosecond => {
                    a.as_primitive::<TimestampNanosecondType>().value(i) as i128
                }
            };
            // Millisecond precision: the minimum rounds down, the maximum up, so each
            // still bounds the values.
            let ms = if max {
                v.div_euclid(1_000_000) + i128::from(v.rem_euclid(1_000_000) != 0)
            } else {
                v.div_euclid(1_000_000)
            };
            let t = chrono::DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)?;
            let text = if tz.is_some() {
                t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
            } else {
                t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.3f").to_string()
            };
            Some((Key::Int(v), json!(text)))
        }
        _ => None,
    }
}

fn float(v: f64) -> Option<(Key, Value)> {
    // NaN sorts outside every range; -0.0 and 0.0 compare equal and are kept as 0.
    if v.is_nan() {
        return None;
    }
    Some((Key::Float(v), json!(v)))
}

fn text(s: &str, max: bool) -> Option<(Key, Value)> {
    if s.chars().count() <= STRING_PREFIX {
        return Some((Key::Text(s.to_string()), json!(s)));
    }
    if max {
        return None;
    }
    let prefix: String = s.chars().take(STRING_PREFIX).collect();
    Some((Key::Text(prefix.clone()), json!(prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{Field, SchemaRef};
    use std::sync::Arc;

    /// The stats of `columns` written to a file in row groups of two rows.
    fn stats_in_row_groups_of_two(schema: &SchemaRef, columns: Vec<ArrayRef>) -> Value {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.parquet");
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(file, schema.clone(), Some(props)).unwrap();
        w.write(&RecordBatch::try_new(schema.clone(), columns).unwrap())
            .unwrap();
        w.close().unwrap();
        serde_json::from_str(&of_file(&path, schema).unwrap()).unwrap()
    }

    #[test]
    fn min_max_and_nulls_span_row_groups() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let long = "x".repeat(40);
        let stats = stats_in_row_groups_of_two(
            &schema,
            vec![
                Arc::new(Int64Array::from(vec![Some(5), None, Some(-3), Some(9)])),
                Arc::new(StringArray::from(vec![
                    Some("b"),
                    Some("a"),
                    None,
                    Some(long.as_str()),
                ])),
            ],
        );
        assert_eq!(stats["numRecords"], json!(4));
        assert_eq!(stats["minValues"]["n"], json!(-3));
        assert_eq!(stats["maxValues"]["n"], json!(9));
        assert_eq!(stats["nullCount"]["n"], json!(1));
        assert_eq!(stats["minValues"]["s"], json!("a"));
        // The longest string's maximum is not recorded, not truncated into a wrong bound.
        assert!(stats["maxValues"].get("s").is_none());
        assert_eq!(stats["nullCount"]["s"], json!(1));
    }

    #[test]
    fn a_row_group_of_only_nulls_does_not_hide_the_others_bounds() {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)]));
        let stats = stats_in_row_groups_of_two(
            &schema,
            vec![Arc::new(Int64Array::from(vec![
                None,
                None,
                Some(7),
                Some(2),
            ]))],
        );
        assert_eq!(stats["minValues"]["n"], json!(2));
        assert_eq!(stats["maxValues"]["n"], json!(7));
        assert_eq!(stats["nullCount"]["n"], json!(2));
    }
}
