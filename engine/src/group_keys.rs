//! Grouping by several narrow columns as by one key.
//!
//! DataFusion groups rows by one primitive column with a plain hash table of values,
//! and by several columns with a table that compares every column of every row. A
//! daily aggregate's `group by dt, store_id` is the second kind, though its values fit
//! in one integer. An optimizer rule puts one 128-bit key in place of the columns of a
//! `GROUP BY` whose values (integers, dates, times and timestamps, with a null flag
//! each) fit in it, and takes the columns back out of the key above the aggregation:
//! the same groups, names and types.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, AsArray, Decimal128Array, make_array};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Decimal128Type, FieldRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, Result, TableReference, exec_err};
use datafusion::logical_expr::{
    Aggregate, ColumnarValue, Expr, LogicalPlan, Projection, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// The key's bits in use: below 2^126 every key is a valid `Decimal128(38, 0)`.
const KEY_BITS: u32 = 126;
const KEY_NAME: &str = "__idem_group_key";

/// Where one grouping column sits in the key: its value's bits from `shift`, then one
/// bit set when it is null (the value's bits are then zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Slot {
    shift: u32,
    bits: u32,
}

impl Slot {
    fn null_bit(&self) -> u32 {
        self.shift + self.bits
    }

    fn mask(&self) -> u128 {
        (u128::MAX >> (128 - self.bits)) << self.shift
    }
}

/// The width of a type whose values are integers of 1, 2, 4 or 8 bytes.
fn bits(t: &DataType) -> Option<u32> {
    use DataType::*;
    match t {
        Int8 | UInt8 => Some(8),
        Int16 | UInt16 => Some(16),
        Int32 | UInt32 | Date32 | Time32(_) => Some(32),
        Int64 | UInt64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => Some(64),
        _ => None,
    }
}

/// The slots of an aggregation's grouping columns, when there are several and all fit.
fn layout(aggregate: &Aggregate) -> Option<Vec<Slot>> {
    let columns = aggregate.group_expr.len();
    if columns < 2
        || aggregate
            .group_expr
            .iter()
            .any(|e| matches!(e, Expr::GroupingSet(_)))
    {
        return None;
    }
    let mut next = 0;
    let mut slots = Vec::with_capacity(columns);
    for field in aggregate.schema.fields().iter().take(columns) {
        let bits = bits(field.data_type())?;
        slots.push(Slot { shift: next, bits });
        next += bits + 1;
    }
    (next <= KEY_BITS).then_some(slots)
}

/// `idem_pack_group_key(c1, c2, ...)`: the key of each row.
#[derive(Debug, PartialEq, Eq, Hash)]
struct PackKey {
    slots: Vec<Slot>,
    signature: Signature,
}

impl ScalarUDFImpl for PackKey {
    fn name(&self) -> &str {
        "idem_pack_group_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Decimal128(38, 0))
    }

    fn return_field_from_args(&self, _args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(arrow::datatypes::Field::new(
            self.name(),
            DataType::Decimal128(38, 0),
            false,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if args.args.len() != self.slots.len() {
            return exec_err!("idem_pack_group_key takes {} arguments", self.slots.len());
        }
        Ok(ColumnarValue::Array(keys(
            &args.args,
            args.number_rows,
            &self.slots,
        )?))
    }
}

/// The keys of `rows` rows of `columns` (arrays of that length, or values that stand
/// for every row).
fn keys(columns: &[ColumnarValue], rows: usize, slots: &[Slot]) -> Result<ArrayRef> {
    let mut keys = vec![0i128; rows];
    for (column, slot) in columns.iter().zip(slots) {
        pack(&mut keys, column.to_array(rows)?.as_ref(), *slot)?;
    }
    Ok(Arc::new(
        Decimal128Array::new(keys.into(), None).with_precision_and_scale(38, 0)?,
    ))
}

/// Adds one column's values (and null flags) to the keys.
fn pack(keys: &mut [i128], column: &dyn Array, slot: Slot) -> Result<()> {
    fn add<T: Copy + Into<u128> + arrow::datatypes::ArrowNativeType>(
        keys: &mut [i128],
        values: &Buffer,
        offset: usize,
        shift: u32,
    ) {
        let values = ScalarBuffer::<T>::new(values.clone(), offset, keys.len());
        for (key, value) in keys.iter_mut().zip(values.iter()) {
            // Below bit 126: never negative.
            *key |= ((*value).into() << shift) as i128;
        }
    }
    if column.len() != keys.len() || bits(column.data_type()) != Some(slot.bits) {
        return exec_err!(
            "idem_pack_group_key: a column of {} {} values for {} rows",
            column.len(),
            column.data_type(),
            keys.len()
        );
    }
    let data = column.to_data();
    let (values, offset) = (&data.buffers()[0], data.offset());
    match slot.bits {
        8 => add::<u8>(keys, values, offset, slot.shift),
        16 => add::<u16>(keys, values, offset, slot.shift),
        32 => add::<u32>(keys, values, offset, slot.shift),
        _ => add::<u64>(keys, values, offset, slot.shift),
    }
    if let Some(nulls) = column.nulls().filter(|n| n.null_count() > 0) {
        let (clear, flag) = (!(slot.mask() as i128), 1i128 << slot.null_bit());
        for row in nulls.iter().enumerate().filter(|(_, valid)| !valid) {
            keys[row.0] = keys[row.0] & clear | flag;
        }
    }
    Ok(())
}

/// `idem_unpack_group_key(key)`: one grouping column, as the aggregation gave it.
#[derive(Debug, PartialEq, Eq, Hash)]
struct UnpackKey {
    slot: Slot,
    field: FieldRef,
    signature: Signature,
}

impl ScalarUDFImpl for UnpackKey {
    fn name(&self) -> &str {
        "idem_unpack_group_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.field.data_type().clone())
    }

    fn return_field_from_args(&self, _args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(Arc::clone(&self.field))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [key] = &args.args[..] else {
            return exec_err!("idem_unpack_group_key takes one argument");
        };
        let keys = key.to_array(args.number_rows)?;
        let Some(keys) = keys.as_primitive_opt::<Decimal128Type>() else {
            return exec_err!("idem_unpack_group_key: {} is not a key", keys.data_type());
        };
        Ok(ColumnarValue::Array(unpack(
            keys.values(),
            self.slot,
            &self.field,
        )?))
    }
}

fn unpack(keys: &[i128], slot: Slot, field: &FieldRef) -> Result<ArrayRef> {
    fn take<T: arrow::datatypes::ArrowNativeType>(
        keys: &[i128],
        shift: u32,
        narrow: impl Fn(u128) -> T,
    ) -> Buffer {
        let values: Vec<T> = keys.iter().map(|k| narrow((*k as u128) >> shift)).collect();
        Buffer::from_vec(values)
    }
    let shift = slot.shift;
    let values = match slot.bits {
        8 => take(keys, shift, |v| v as u8),
        16 => take(keys, shift, |v| v as u16),
        32 => take(keys, shift, |v| v as u32),
        _ => take(keys, shift, |v| v as u64),
    };
    let flag = 1i128 << slot.null_bit();
    let nulls = NullBuffer::from_iter(keys.iter().map(|k| k & flag == 0));
    let nulls = (nulls.null_count() > 0).then(|| nulls.into_inner().into_inner());
    let data = ArrayData::try_new(
        field.data_type().clone(),
        keys.len(),
        nulls,
        0,
        vec![values],
        vec![],
    )?;
    Ok(make_array(data))
}

/// Puts one key in place of an aggregation's grouping columns where they fit, and
/// above it a projection that gives them back under their names.
#[derive(Debug, Default)]
pub struct PackGroupKeys;

impl OptimizerRule for PackGroupKeys {
    fn name(&self) -> &str {
        "idem_pack_group_keys"
    }

    /// Called once for the whole plan, which it walks from the top: see [`pack_below`].
    fn apply_order(&self) -> Option<ApplyOrder> {
        None
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        pack_below(plan, false)
    }
}

/// Packs the aggregations of `plan` except those whose results a join or a limit
/// reaches (through projections, aliases, filters and sorts): DataFusion pushes a
/// join's and a top-k's dynamic filters through an aggregation by column name, into
/// its input's scan, and stops a `DISTINCT … LIMIT n` early only when the limit sits
/// on the aggregation itself; a packed key would hide the columns from both.
fn pack_below(plan: LogicalPlan, kept: bool) -> Result<Transformed<LogicalPlan>> {
    let keep_inputs = match &plan {
        LogicalPlan::Join(_) | LogicalPlan::Limit(_) => true,
        LogicalPlan::Sort(sort) if sort.fetch.is_some() => true,
        LogicalPlan::Projection(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_) => kept,
        _ => false,
    };
    let plan = plan.map_children(|input| pack_below(input, keep_inputs))?;
    if kept {
        return Ok(plan);
    }
    plan.transform_data(pack_aggregate)
}

/// `plan` with one key in place of its grouping columns, when it is an aggregation
/// whose columns fit.
fn pack_aggregate(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Aggregate(aggregate) = plan else {
        return Ok(Transformed::no(plan));
    };
    let Some(slots) = layout(&aggregate) else {
        return Ok(Transformed::no(LogicalPlan::Aggregate(aggregate)));
    };
    let columns: Vec<(Option<TableReference>, FieldRef)> = aggregate
        .schema
        .iter()
        .take(slots.len())
        .map(|(qualifier, field)| (qualifier.cloned(), Arc::clone(field)))
        .collect();
    let pack = ScalarUDF::new_from_impl(PackKey {
        signature: Signature::any(slots.len(), Volatility::Immutable),
        slots: slots.clone(),
    });
    let grouped = aggregate
        .group_expr
        .iter()
        .cloned()
        .map(Expr::unalias)
        .collect();
    let key = pack.call(grouped).alias(KEY_NAME);
    let packed = Aggregate::try_new(
        Arc::clone(&aggregate.input),
        vec![key],
        aggregate.aggr_expr.clone(),
    )?;
    let key = Expr::Column(Column::new_unqualified(KEY_NAME));
    let mut exprs: Vec<Expr> = columns
        .into_iter()
        .zip(slots)
        .map(|((qualifier, field), slot)| {
            let name = field.name().clone();
            ScalarUDF::new_from_impl(UnpackKey {
                slot,
                field,
                signature: Signature::any(1, Volatility::Immutable),
            })
            .call(vec![key.clone()])
            .alias_qualified(qualifier, name)
        })
        .collect();
    exprs.extend(
        packed
            .schema
            .iter()
            .skip(1)
            .map(|(qualifier, field)| Expr::Column(Column::new(qualifier.cloned(), field.name()))),
    );
    let projection = Projection::try_new(exprs, Arc::new(LogicalPlan::Aggregate(packed)))?;
    Ok(Transformed::yes(LogicalPlan::Projection(projection)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        Date32Array, Int8Array, Int16Array, Int32Array, Int64Array, RecordBatch,
        TimestampMicrosecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array,
    };
    use arrow::datatypes::{Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    /// The values each column of [`tables`] draws from, the extremes of its type among
    /// them: i8, u8, i16, u16, i32, u32, i64, u64 (never null), a date, a timestamp,
    /// and `x`, the aggregated column.
    const CHOICES: [&[i128]; 11] = [
        &[i8::MIN as i128, -1, 0, 1, i8::MAX as i128],
        &[0, 1, u8::MAX as i128],
        &[i16::MIN as i128, -1, 0, i16::MAX as i128],
        &[0, 7, u16::MAX as i128],
        &[i32::MIN as i128, -1, 0, 1, i32::MAX as i128],
        &[0, 1, u32::MAX as i128],
        &[i64::MIN as i128, -1, 0, i64::MAX as i128],
        &[0, 1 << 63, u64::MAX as i128],
        &[-719_162, -1, 0, 19_723, 2_932_896],
        &[i64::MIN as i128, -1, 0, 86_400_000_000, i64::MAX as i128],
        &[-5, 1, 3, 1000],
    ];

    /// Tables of every packable width, signed and unsigned, with nulls (one value in
    /// six) and the extremes of each type, in four batches of 1–40 rows.
    fn tables() -> impl Strategy<Value = (Arc<Schema>, Vec<RecordBatch>)> {
        let row: Vec<_> = CHOICES
            .iter()
            .map(|c| proptest::option::weighted(5.0 / 6.0, proptest::sample::select(*c)))
            .collect();
        proptest::collection::vec(proptest::collection::vec(row, 1..=40), 4).prop_map(table)
    }

    /// The table of batches of rows of [`CHOICES`]' columns.
    fn table(batches: Vec<Vec<Vec<Option<i128>>>>) -> (Arc<Schema>, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i8", DataType::Int8, true),
            Field::new("u8", DataType::UInt8, true),
            Field::new("i16", DataType::Int16, true),
            Field::new("u16", DataType::UInt16, true),
            Field::new("i32", DataType::Int32, true),
            Field::new("u32", DataType::UInt32, true),
            Field::new("i64", DataType::Int64, true),
            Field::new("u64", DataType::UInt64, false),
            Field::new("d", DataType::Date32, true),
            Field::new(
                "ts",
                DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("x", DataType::Int64, true),
        ]));
        let batches = batches
            .into_iter()
            .map(|rows| {
                let col = |c: usize| rows.iter().map(move |row| row[c]);
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int8Array::from_iter(col(0).map(|v| v.map(|v| v as i8)))),
                    Arc::new(UInt8Array::from_iter(col(1).map(|v| v.map(|v| v as u8)))),
                    Arc::new(Int16Array::from_iter(col(2).map(|v| v.map(|v| v as i16)))),
                    Arc::new(UInt16Array::from_iter(col(3).map(|v| v.map(|v| v as u16)))),
                    Arc::new(Int32Array::from_iter(col(4).map(|v| v.map(|v| v as i32)))),
                    Arc::new(UInt32Array::from_iter(col(5).map(|v| v.map(|v| v as u32)))),
                    Arc::new(Int64Array::from_iter(col(6).map(|v| v.map(|v| v as i64)))),
                    Arc::new(UInt64Array::from_iter_values(
                        col(7).map(|v| v.unwrap_or(0) as u64),
                    )),
                    Arc::new(Date32Array::from_iter(col(8).map(|v| v.map(|v| v as i32)))),
                    Arc::new(
                        TimestampMicrosecondArray::from_iter(col(9).map(|v| v.map(|v| v as i64)))
                            .with_timezone("UTC"),
                    ),
                    Arc::new(Int64Array::from_iter(col(10).map(|v| v.map(|v| v as i64)))),
                ];
                RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
            })
            .collect();
        (schema, batches)
    }

    /// The `draw`th table of a deterministic run of [`tables`].
    fn some_table(draw: usize) -> (Arc<Schema>, Vec<RecordBatch>) {
        let mut runner = TestRunner::deterministic();
        let mut table = None;
        for _ in 0..=draw {
            table = Some(tables().new_tree(&mut runner).unwrap().current());
        }
        table.unwrap()
    }

    /// The query's rows in order, and its optimized plan, with or without the rule.
    fn query(
        schema: &Arc<Schema>,
        batches: &[RecordBatch],
        sql: &str,
        packed: bool,
    ) -> (Vec<String>, String) {
        let ctx = SessionContext::new_with_config(
            datafusion::prelude::SessionConfig::new().with_target_partitions(3),
        );
        if packed {
            ctx.add_optimizer_rule(Arc::new(PackGroupKeys));
        }
        let table = MemTable::try_new(Arc::clone(schema), vec![batches.to_vec()]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async {
                let df = ctx.sql(sql).await.unwrap();
                let plan = format!(
                    "{}",
                    df.clone().into_optimized_plan().unwrap().display_indent()
                );
                let out = df.collect().await.unwrap();
                let text = arrow::util::pretty::pretty_format_batches(&out)
                    .unwrap()
                    .to_string();
                let schema = out
                    .first()
                    .map(|b| format!("{:?}", b.schema()))
                    .unwrap_or_default();
                let mut rows: Vec<String> = text.lines().map(str::to_string).collect();
                rows.push(schema);
                (rows, plan)
            })
    }

    /// A search over random tables and random groupings of 2–4 columns: the same rows,
    /// column names and types with the rule as without it, and the key in use exactly
    /// when the columns and their null flags fit in 126 bits. A deterministic run, so
    /// that how many cases use the key is known.
    #[test]
    fn random_groupings_give_the_same_rows_with_the_rule() {
        let names = [
            "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "d", "ts",
        ];
        let widths = [8, 8, 16, 16, 32, 32, 64, 64, 32, 64];
        let cases = (
            tables(),
            proptest::sample::subsequence((0..names.len()).collect::<Vec<_>>(), 2..=4)
                .prop_shuffle(),
            0..3usize,
        );
        let mut runner = TestRunner::new_with_rng(
            Config::with_cases(60),
            TestRng::deterministic_rng(RngAlgorithm::ChaCha),
        );
        let used = std::cell::Cell::new(0);
        runner
            .run(&cases, |((schema, batches), picked, kind)| {
                let columns: Vec<&str> = picked.iter().map(|c| names[*c]).collect();
                let list = columns.join(", ");
                let sql = match kind {
                    0 => format!(
                        "select {list}, count(*) as n, sum(x) as s from t group by {list} \
                         order by {list}, n"
                    ),
                    1 => format!(
                        "select count(*) as n, {list} from t group by {list} \
                         having count(*) > 1 order by {list}"
                    ),
                    _ => format!("select distinct {list} from t order by {list}"),
                };
                let (plain, _) = query(&schema, &batches, &sql, false);
                let (rows, plan) = query(&schema, &batches, &sql, true);
                prop_assert_eq!(rows, plain, "{}", sql);
                let bits: u32 = picked.iter().map(|c| widths[*c] + 1).sum();
                prop_assert_eq!(
                    plan.contains("idem_pack_group_key"),
                    bits <= KEY_BITS,
                    "{}\n{}",
                    sql,
                    plan
                );
                used.set(used.get() + usize::from(bits <= KEY_BITS));
                Ok(())
            })
            .unwrap();
        assert!(used.get() > 30, "only {} cases used the key", used.get());
    }

    /// Columns cut from the middle of larger arrays (an offset into their buffers and
    /// null bitmaps) give back their own values, nulls where they were.
    #[test]
    fn sliced_columns_round_trip_through_the_key() {
        let a = Int16Array::from(vec![Some(-1), None, Some(i16::MIN), Some(7), None, Some(3)]);
        let b = TimestampMicrosecondArray::from(vec![
            Some(5),
            Some(i64::MIN),
            None,
            Some(-9),
            Some(0),
            Some(4),
        ])
        .with_timezone("UTC");
        let (a, b): (ArrayRef, ArrayRef) = (Arc::new(a.slice(1, 4)), Arc::new(b.slice(2, 4)));
        let slots = [
            Slot { shift: 0, bits: 16 },
            Slot {
                shift: 17,
                bits: 64,
            },
        ];
        let mut keys = vec![0i128; 4];
        for (column, slot) in [&a, &b].into_iter().zip(slots) {
            pack(&mut keys, column.as_ref(), slot).unwrap();
        }
        for (column, slot) in [&a, &b].into_iter().zip(slots) {
            let field = Arc::new(Field::new("c", column.data_type().clone(), true));
            let back = unpack(&keys, slot, &field).unwrap();
            assert_eq!(back.as_ref(), column.as_ref());
        }
        let distinct: std::collections::HashSet<i128> = keys.iter().copied().collect();
        assert_eq!(distinct.len(), 4);
    }

    #[test]
    fn a_value_for_every_row_packs_like_a_column() {
        use datafusion::common::ScalarValue;
        let slots = [Slot { shift: 0, bits: 32 }, Slot { shift: 33, bits: 8 }];
        let columns = [
            ColumnarValue::Scalar(ScalarValue::Int32(Some(-2))),
            ColumnarValue::Array(Arc::new(UInt8Array::from(vec![Some(1), None, Some(1)]))),
        ];
        let packed = keys(&columns, 3, &slots).unwrap();
        let packed = packed.as_primitive::<Decimal128Type>().values();
        let field = Arc::new(Field::new("c", DataType::Int32, true));
        let first = unpack(packed, slots[0], &field).unwrap();
        assert_eq!(
            first.as_ref(),
            &Int32Array::from(vec![-2, -2, -2]) as &dyn Array
        );
        assert_eq!(packed[0], packed[2]);
        assert_ne!(packed[0], packed[1]);
    }

    /// An aggregation a join or a limit reaches keeps its columns (DataFusion's
    /// dynamic filters and early stops need them); one beside it is packed.
    #[test]
    fn aggregations_under_joins_and_limits_are_left_as_they_are() {
        let (schema, batches) = some_table(1);
        // Rows in order compared; a limit without order compares only how many.
        let packed = |sql: &str| {
            let (plain, _) = query(&schema, &batches, sql, false);
            let (rows, plan) = query(&schema, &batches, sql, true);
            if sql.contains("order by") {
                assert_eq!(rows, plain, "{sql}");
            } else {
                assert_eq!(rows.len(), plain.len(), "{sql}");
            }
            plan.matches("idem_pack_group_key(").count()
        };
        assert_eq!(
            packed("select d, u8, count(*) from t group by d, u8 order by 1, 2"),
            1
        );
        assert_eq!(packed("select distinct d, u8 from t limit 3"), 0);
        assert_eq!(
            packed("select d, u8, count(*) as n from t group by d, u8 order by n, d, u8 limit 2"),
            0
        );
        assert_eq!(
            packed(
                "select a.d, a.n from (select d, u8, count(*) as n from t group by d, u8) a \
                 join t on a.d = t.d and a.u8 = t.u8 order by 1, 2"
            ),
            0
        );
        assert_eq!(
            packed(
                "select x.d, x.m from (select d, max(n) as m from \
                 (select d, u8, count(*) as n from t group by d, u8) group by d) x \
                 join t on x.d = t.d order by 1, 2"
            ),
            1
        );
    }

    #[test]
    fn qualified_names_joins_and_grouping_sets() {
        let (schema, batches) = some_table(0);
        for sql in [
            "select t.d, t.i32, count(*) from t group by t.d, t.i32 order by 1, 2, 3",
            "select a.d, a.n, b.n from (select d, u8, count(*) as n from t group by d, u8) a \
             join (select d, u8, count(*) as n from t group by u8, d) b \
             on a.d = b.d and a.u8 = b.u8 order by 1, 2, 3",
            "select d, count(distinct i16) from t group by d, u16 order by 1, 2",
            "select d, i8, count(*) from t group by rollup(d, i8) order by 1, 2, 3",
            "select i32 + 1 as k, d, max(x) from t group by i32 + 1, d order by 1, 2, 3",
        ] {
            let (plain, _) = query(&schema, &batches, sql, false);
            let (rows, _) = query(&schema, &batches, sql, true);
            assert_eq!(rows, plain, "{sql}");
        }
    }
}
