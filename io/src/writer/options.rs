//! How partitions are encoded: compression, row groups and file size, and the
//! Parquet properties they make (a column whose values barely repeat is written
//! without a dictionary).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use parquet::basic::Compression;
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

/// The Parquet writer's properties; `plain` columns are written without a dictionary.
pub(super) fn writer_properties(opts: &WriterOptions, plain: &[String]) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(opts.compression)
        .set_max_row_group_row_count(Some(opts.row_group_rows))
        .set_created_by(format!("idem {}", env!("CARGO_PKG_VERSION")));
    for c in plain {
        props = props.set_column_dictionary_enabled(c.as_str().into(), false);
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
/// fall back to plain encoding anyway, so they are written plain from the start.
pub(super) fn high_cardinality_columns(batch: &RecordBatch) -> Vec<String> {
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
        .map(|(f, _)| f.name().clone())
        .collect()
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
