//! How partitions are encoded: compression, row groups and file size, and the
//! Parquet properties they make (a column whose values barely repeat is written
//! without a dictionary, and one of integers that move by small steps as deltas).

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use arrow::record_batch::RecordBatch;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;

/// How partitions are encoded.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    pub compression: Compression,
    /// Rows per row group (the unit of parallel reading and of statistics pruning).
    pub row_group_rows: usize,
    /// A file is closed and a new one started once it reaches this size.
    pub target_file_bytes: u64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            compression: Compression::SNAPPY,
            // 256 Ki rows, as Polars writes: a reader and a writer each hold one row
            // group of a column chunk at a time, so this bounds their memory, and a
            // file splits into more units for parallel reading.
            row_group_rows: 1 << 18,
            target_file_bytes: 256 << 20,
        }
    }
}

/// How a column without a dictionary is encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PlainColumn {
    pub name: String,
    /// As `DELTA_BINARY_PACKED`: its values move by steps much narrower than the values.
    pub delta: bool,
}

/// The Parquet writer's properties; `plain` columns are written without a dictionary.
pub(super) fn writer_properties(opts: &WriterOptions, plain: &[PlainColumn]) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(opts.compression)
        .set_max_row_group_row_count(Some(opts.row_group_rows))
        .set_created_by(format!("idem {}", env!("CARGO_PKG_VERSION")));
    for c in plain {
        props = props.set_column_dictionary_enabled(c.name.as_str().into(), false);
        if c.delta {
            props =
                props.set_column_encoding(c.name.as_str().into(), Encoding::DELTA_BINARY_PACKED);
        }
    }
    props.build()
}

/// Rows of the first batch looked at to judge a column's cardinality, and the least
/// that makes a judgement.
pub(super) const CARDINALITY_SAMPLE: usize = 16 * 1024;

pub(super) const CARDINALITY_MIN_ROWS: usize = 1024;

/// The top-level flat columns whose values in the first rows of `batch` are nearly all
/// distinct (ids, keys, timestamps). A dictionary cannot pay for itself on them: the
/// writer would intern every value until the dictionary outgrows its page and then
/// fall back to plain encoding anyway, so they are written without one from the start:
/// integers whose steps from row to row are narrow (ids that grow, keys of a bounded
/// range, times of one day) as deltas, which take a few bits a value instead of the
/// type's whole width; the rest plain.
pub(super) fn high_cardinality_columns(batch: &RecordBatch) -> Vec<PlainColumn> {
    let rows = batch.num_rows().min(CARDINALITY_SAMPLE);
    if rows < CARDINALITY_MIN_ROWS {
        return Vec::new();
    }
    let sample = batch.slice(0, rows);
    sample
        .schema()
        .fields()
        .iter()
        .zip(sample.columns())
        .filter(|(f, _)| !f.data_type().is_nested() && !f.data_type().is_null())
        .filter(|(_, col)| {
            let Ok(converter) = arrow::row::RowConverter::new(vec![arrow::row::SortField::new(
                col.data_type().clone(),
            )]) else {
                return false;
            };
            let Ok(values) = converter.convert_columns(&[Arc::clone(col)]) else {
                return false;
            };
            let distinct: std::collections::HashSet<&[u8]> =
                values.iter().map(|r| r.data()).collect();
            distinct.len() * 10 > rows * 9
        })
        .map(|(f, col)| PlainColumn {
            name: f.name().clone(),
            delta: narrow_steps(col),
        })
        .collect()
}

/// Whether an integer column's steps between consecutive values span at most three
/// quarters of its width: `DELTA_BINARY_PACKED` then stores each value in that many
/// bits (or fewer) instead of the whole width. Only types Parquet stores as `INT32` or
/// `INT64` qualify; values beyond `i64` do not.
fn narrow_steps(col: &ArrayRef) -> bool {
    let bits: u32 = match col.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::Date32
        | DataType::Time32(_) => 32,
        DataType::Int64
        | DataType::UInt64
        | DataType::Date64
        | DataType::Time64(_)
        | DataType::Timestamp(..) => 64,
        _ => return false,
    };
    // Not the default (safe) cast, which would turn values beyond `i64` into NULLs and
    // judge the steps of the rest.
    let exact = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let Ok(values) = arrow::compute::cast_with_options(col, &DataType::Int64, &exact) else {
        return false;
    };
    let mut values = values.as_primitive::<Int64Type>().iter().flatten();
    let Some(mut previous) = values.next() else {
        return false;
    };
    let (mut low, mut high) = (i128::MAX, i128::MIN);
    for v in values {
        let step = i128::from(v) - i128::from(previous);
        (low, high) = (low.min(step), high.max(step));
        previous = v;
    }
    if low > high {
        return false;
    }
    let span = (high - low) as u128;
    128 - span.leading_zeros() <= bits / 4 * 3
}

/// The schema recorded in the footer for Arrow readers: view types are recorded as
/// their plain equivalents, which every reader understands.
pub(super) fn plain_schema(schema: &Schema) -> Schema {
    fn plain(dt: &DataType) -> DataType {
        match dt {
            DataType::Utf8View => DataType::Utf8,
            DataType::BinaryView => DataType::Binary,
            DataType::List(f) => DataType::List(Arc::new(plain_field(f))),
            DataType::LargeList(f) => DataType::LargeList(Arc::new(plain_field(f))),
            DataType::Struct(fs) => {
                DataType::Struct(fs.iter().map(|f| Arc::new(plain_field(f))).collect())
            }
            other => other.clone(),
        }
    }
    fn plain_field(f: &Field) -> Field {
        f.clone().with_data_type(plain(f.data_type()))
    }
    Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| Arc::new(plain_field(f)))
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    )
}
