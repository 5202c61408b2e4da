//! Partition routing: splits each output batch by the target's partition columns and
//! drops those columns (their values live in the directory names, Hive style).
//!
//! The common case, a batch whose rows all belong to one partition, is detected with
//! one vectorised comparison per partition column and costs no copy; mixed batches are
//! grouped by the row-encoded partition values and split with `take`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Scalar, UInt32Array};
use arrow::compute::kernels::cmp::eq;
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use idem_io::hive::PartitionPath;

/// Whether a value of type `from` cast to `to` is the same value: a decimal's precision
/// at the same scale (checked for overflow), or the same text or bytes held as a
/// dictionary, a view or a large array.
fn keeps_values(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let text = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    let bytes = |t: &DataType| matches!(t, Binary | LargeBinary | BinaryView);
    match (from, to) {
        (Decimal128(_, a), Decimal128(_, b)) | (Decimal256(_, a), Decimal256(_, b)) => a == b,
        (Dictionary(_, v), t) | (t, Dictionary(_, v)) => v.as_ref() == t || keeps_values(v, t),
        (a, b) => (text(a) && text(b)) || (bytes(a) && bytes(b)),
    }
}

/// Splits batches of one output schema into per-partition data batches.
#[derive(Debug)]
pub struct Router {
    partition_cols: Vec<(usize, String)>,
    data_cols: Vec<usize>,
    data_schema: SchemaRef,
}

impl Router {
    /// `output` is the transform's schema; `partition_by` names columns present in it.
    pub fn new(output: &SchemaRef, partition_by: &[String]) -> Self {
        let partition_cols: Vec<(usize, String)> = partition_by
            .iter()
            .map(|c| (output.index_of(c).expect("validated"), c.clone()))
            .collect();
        let data_cols: Vec<usize> = (0..output.fields().len())
            .filter(|i| !partition_cols.iter().any(|(p, _)| p == i))
            .collect();
        let data_schema = Arc::new(output.project(&data_cols).expect("indices in range"));
        Self {
            partition_cols,
            data_cols,
            data_schema,
        }
    }

    /// The schema of the data files: the output minus the partition columns.
    pub fn data_schema(&self) -> &SchemaRef {
        &self.data_schema
    }

    /// `data` with every column of the type and nullability the plan declared.
    /// DataFusion's batches can carry others: a `sum` of decimals beside a
    /// `count(distinct …)` comes out of DataFusion 55 as Decimal128(29, 2) where its
    /// plan says Decimal128(19, 2), and a `union all` passes each side's batches on
    /// with that side's nullability. A column of another type is cast back only where
    /// the cast keeps every value (a decimal's precision at the same scale, a
    /// dictionary or a view of the declared values), checked, so a value that does not
    /// fit is an error; any other difference is an error, never a changed value.
    fn conform(&self, data: RecordBatch) -> arrow::error::Result<RecordBatch> {
        let declared = self.data_schema.fields();
        if data.schema().fields() == declared {
            return Ok(data);
        }
        let checked = arrow::compute::CastOptions {
            safe: false,
            ..Default::default()
        };
        let columns = data
            .columns()
            .iter()
            .zip(declared.iter())
            .map(|(c, want)| {
                if c.data_type() == want.data_type() {
                    Ok(Arc::clone(c))
                } else if keeps_values(c.data_type(), want.data_type()) {
                    arrow::compute::cast_with_options(c, want.data_type(), &checked)
                } else {
                    Err(arrow::error::ArrowError::ComputeError(format!(
                        "column `{}`: the query produced {} where its plan declared {}",
                        want.name(),
                        c.data_type(),
                        want.data_type()
                    )))
                }
            })
            .collect::<arrow::error::Result<Vec<_>>>()?;
        RecordBatch::try_new(Arc::clone(&self.data_schema), columns)
    }

    /// Splits `batch` into (partition, data batch) pairs.
    pub fn split(
        &self,
        batch: &RecordBatch,
    ) -> arrow::error::Result<Vec<(PartitionPath, RecordBatch)>> {
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let data = self.conform(batch.project(&self.data_cols)?)?;
        if self.partition_cols.is_empty() {
            return Ok(vec![(PartitionPath::root(), data)]);
        }
        if self.single_partition(batch)? {
            return Ok(vec![(self.path_of(batch, 0)?, data)]);
        }
        let fields: Vec<SortField> = self
            .partition_cols
            .iter()
            .map(|(i, _)| SortField::new(batch.column(*i).data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields)?;
        let cols: Vec<ArrayRef> = self
            .partition_cols
            .iter()
            .map(|(i, _)| Arc::clone(batch.column(*i)))
            .collect();
        let rows = converter.convert_columns(&cols)?;
        let mut groups: HashMap<&[u8], Vec<u32>> = HashMap::new();
        let mut order: Vec<&[u8]> = Vec::new();
        for r in 0..batch.num_rows() {
            let key = rows.row(r).data();
            groups
                .entry(key)
                .or_insert_with(|| {
                    order.push(key);
                    Vec::new()
                })
                .push(r as u32);
        }
        let mut out = Vec::with_capacity(order.len());
        for key in order {
            let idx = UInt32Array::from(std::mem::take(groups.get_mut(key).expect("grouped")));
            let path = self.path_of(batch, idx.value(0) as usize)?;
            out.push((path, take_record_batch(&data, &idx)?));
        }
        Ok(out)
    }

    fn single_partition(&self, batch: &RecordBatch) -> arrow::error::Result<bool> {
        for (i, _) in &self.partition_cols {
            let col = batch.column(*i);
            let nulls = col.null_count();
            if nulls == col.len() {
                continue;
            }
            if nulls > 0 || matches!(col.data_type(), DataType::Null) {
                return Ok(false);
            }
            let first = Scalar::new(col.slice(0, 1));
            let same: BooleanArray = eq(col, &first)?;
            if same.true_count() != col.len() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The partition of every row of `batch` (which holds at least the partition
    /// columns, by name), formatted exactly as `split` names partitions.
    pub fn paths_of(&self, batch: &RecordBatch) -> arrow::error::Result<Vec<PartitionPath>> {
        let projected = Router {
            partition_cols: self
                .partition_cols
                .iter()
                .map(|(_, name)| {
                    let i = batch.schema().index_of(name)?;
                    Ok((i, name.clone()))
                })
                .collect::<arrow::error::Result<_>>()?,
            data_cols: Vec::new(),
            data_schema: Arc::clone(&self.data_schema),
        };
        (0..batch.num_rows())
            .map(|r| projected.path_of(batch, r))
            .collect()
    }

    fn path_of(&self, batch: &RecordBatch, row: usize) -> arrow::error::Result<PartitionPath> {
        let mut parts = Vec::with_capacity(self.partition_cols.len());
        for (i, name) in &self.partition_cols {
            parts.push((name.clone(), partition_value(batch.column(*i), row)?));
        }
        Ok(PartitionPath::new(parts))
    }
}

/// The partition value of `col[row]` as its directory names it: `None` for NULL, the
/// empty string and the literal default name, which all live in the one Hive default
/// directory (so they share one writer).
fn partition_value(col: &ArrayRef, row: usize) -> arrow::error::Result<Option<String>> {
    if col.is_null(row) {
        return Ok(None);
    }
    let f = ArrayFormatter::try_new(col.as_ref(), &format_options())?;
    Ok(directory_value(&f, row))
}

/// How partition values are written as text.
fn format_options() -> FormatOptions<'static> {
    FormatOptions::default()
        .with_timestamp_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_timestamp_tz_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_datetime_format(Some("%Y-%m-%d %H:%M:%S%.f"))
}

/// The directory value of non-null row `row` formatted by `f`.
fn directory_value(f: &ArrayFormatter, row: usize) -> Option<String> {
    Some(f.value(row).to_string())
        .filter(|v| !v.is_empty() && v != idem_io::hive::DEFAULT_PARTITION)
}

/// `idem_partition(col, ...)`: the partition directory the router gives a row, as
/// text (the values' directory names joined by `/`). A cluster hashes rows on it, so
/// that every row of one directory goes to the one task that writes it, whatever the
/// values' types (NULL beside '', time zones whose wall clocks repeat, NaNs).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PartitionOf {
    signature: datafusion::logical_expr::Signature,
}

impl PartitionOf {
    pub fn udf() -> datafusion::logical_expr::ScalarUDF {
        datafusion::logical_expr::ScalarUDF::new_from_impl(PartitionOf {
            signature: datafusion::logical_expr::Signature::variadic_any(
                datafusion::logical_expr::Volatility::Immutable,
            ),
        })
    }
}

impl datafusion::logical_expr::ScalarUDFImpl for PartitionOf {
    fn name(&self) -> &str {
        "idem_partition"
    }

    fn signature(&self) -> &datafusion::logical_expr::Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(
        &self,
        args: datafusion::logical_expr::ScalarFunctionArgs,
    ) -> datafusion::common::Result<datafusion::logical_expr::ColumnarValue> {
        let rows = args.number_rows;
        let cols = datafusion::logical_expr::ColumnarValue::values_to_arrays(&args.args)?;
        let options = format_options();
        let formatters = cols
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<arrow::error::Result<Vec<_>>>()?;
        let mut out = arrow::array::StringBuilder::with_capacity(rows, rows * 16);
        let mut path = String::new();
        for r in 0..rows {
            path.clear();
            for (i, (col, f)) in cols.iter().zip(&formatters).enumerate() {
                if i > 0 {
                    path.push('/');
                }
                let value = if col.is_null(r) {
                    None
                } else {
                    directory_value(f, r)
                };
                match value {
                    Some(v) => path.push_str(&idem_io::hive::escape(&v)),
                    None => path.push_str(idem_io::hive::DEFAULT_PARTITION),
                }
            }
            out.append_value(&path);
        }
        Ok(datafusion::logical_expr::ColumnarValue::Array(Arc::new(
            out.finish(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Date32Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    fn batch(dts: Vec<i32>, regions: Vec<Option<&str>>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("dt", DataType::Date32, false),
            Field::new("region", DataType::Utf8, true),
        ]));
        let n = dts.len() as i64;
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(Date32Array::from(dts)),
                Arc::new(StringArray::from(regions)),
            ],
        )
        .unwrap()
    }

    /// A batch of another type than the plan's is cast back only where every value
    /// stays the same; a NOT NULL batch field is relabelled nullable as declared.
    #[test]
    fn batches_are_conformed_to_the_plan_or_refused() {
        use arrow::array::{Decimal128Array, Float64Array};
        let declared = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Decimal128(19, 2), true),
            Field::new("f", DataType::Float64, true),
        ]));
        let r = Router::new(&declared, &[]);
        let wide = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Decimal128(29, 2), false),
            Field::new("f", DataType::Float64, false),
        ]));
        let sums = |v: i128| {
            Arc::new(
                Decimal128Array::from(vec![v])
                    .with_precision_and_scale(29, 2)
                    .unwrap(),
            ) as ArrayRef
        };
        let floats = Arc::new(Float64Array::from(vec![1.5])) as ArrayRef;
        let b =
            RecordBatch::try_new(Arc::clone(&wide), vec![sums(375), Arc::clone(&floats)]).unwrap();
        let out = r.split(&b).unwrap();
        assert_eq!(out[0].1.schema(), declared);
        let s = out[0]
            .1
            .column(0)
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .unwrap();
        assert_eq!((s.value(0), s.precision(), s.scale()), (375, 19, 2));
        // A sum that does not fit the declared precision is an error, not a new value.
        let big =
            RecordBatch::try_new(Arc::clone(&wide), vec![sums(10i128.pow(20)), floats]).unwrap();
        assert!(r.split(&big).is_err());
        // A float where the plan says an integer is never cast.
        let ints = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Decimal128(19, 2), true),
            Field::new("f", DataType::Int64, true),
        ]));
        let r = Router::new(&ints, &[]);
        let msg = r.split(&b).unwrap_err().to_string();
        assert!(
            msg.contains("column `f`: the query produced Float64"),
            "{msg}"
        );
    }

    #[test]
    fn single_partition_batch_is_not_copied() {
        let b = batch(vec![20000, 20000], vec![Some("eu"), Some("eu")]);
        let r = Router::new(&b.schema(), &["dt".into(), "region".into()]);
        let out = r.split(&b).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.to_string(), "dt=2024-10-04/region=eu");
        assert_eq!(out[0].1.num_columns(), 1);
        assert_eq!(out[0].1.num_rows(), 2);
    }

    #[test]
    fn mixed_batch_is_grouped() {
        let b = batch(
            vec![20000, 20001, 20000],
            vec![Some("eu"), None, Some("us")],
        );
        let r = Router::new(&b.schema(), &["dt".into(), "region".into()]);
        let mut out: Vec<_> = r
            .split(&b)
            .unwrap()
            .into_iter()
            .map(|(p, b)| (p.to_string(), b.num_rows()))
            .collect();
        out.sort();
        assert_eq!(
            out,
            vec![
                ("dt=2024-10-04/region=eu".to_string(), 1),
                ("dt=2024-10-04/region=us".to_string(), 1),
                (
                    "dt=2024-10-05/region=__HIVE_DEFAULT_PARTITION__".to_string(),
                    1
                ),
            ]
        );
    }
}
