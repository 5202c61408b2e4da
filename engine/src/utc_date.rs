//! `CAST(ts AS DATE)` of a UTC (or zone-less) timestamp, computed as integer division.
//!
//! Daily partitions come from this cast (`cast(created_at as date) as dt`), so it runs
//! once per row of nearly every job. Arrow's cast kernel goes through chrono and the
//! time-zone database for every value, about a tenth of a one-day write's CPU time;
//! for a timestamp in UTC (or without a zone) the date is simply the number of whole
//! days since the epoch, rounded down. An optimizer rule puts this function in place of
//! such casts in projections and aggregations; the result, its name and type are the
//! same. Casts in filters are left alone, so statistics pruning still sees them.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Date32Array};
use arrow::datatypes::{
    DataType, Field, FieldRef, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// arrow's extension-type metadata keys (`arrow_schema::extension`), which a cast drops.
const EXTENSION_TYPE_NAME_KEY: &str = "ARROW:extension:name";
const EXTENSION_TYPE_METADATA_KEY: &str = "ARROW:extension:metadata";

/// The function: `idem_utc_date(ts)` → Date32.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct UtcDate {
    signature: Signature,
}

impl UtcDate {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(UtcDate {
            signature: Signature::any(1, Volatility::Immutable),
        })
    }
}

/// Whether `t` is a timestamp whose date is its day count since the epoch.
fn is_utc_timestamp(t: &DataType) -> bool {
    match t {
        DataType::Timestamp(_, None) => true,
        DataType::Timestamp(_, Some(tz)) => {
            matches!(
                tz.as_ref(),
                "UTC" | "utc" | "Etc/UTC" | "Z" | "+00:00" | "+00"
            )
        }
        _ => false,
    }
}

/// The day counts chrono (and so arrow's cast) can represent: its dates span about
/// ±262,000 years.
fn day_range() -> std::ops::RangeInclusive<i64> {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
    (chrono::NaiveDate::MIN - epoch).num_days()..=(chrono::NaiveDate::MAX - epoch).num_days()
}

fn days(values: &dyn Array) -> Result<ArrayRef> {
    /// One pass for the range of the valid values, then a division by a constant the
    /// compiler turns into a multiplication; the per-value check only to name a value
    /// out of range.
    fn run<T: arrow::datatypes::ArrowPrimitiveType<Native = i64>, const PER_DAY: i64>(
        values: &dyn Array,
    ) -> Result<Date32Array> {
        let values = values.as_primitive::<T>();
        let range = day_range();
        let first = range.start().saturating_mul(PER_DAY);
        let last = range
            .end()
            .saturating_add(1)
            .saturating_mul(PER_DAY)
            .saturating_sub(1);
        let within = |v: Option<i64>| v.is_none_or(|v| (first..=last).contains(&v));
        let (lo, hi) = (arrow::compute::min(values), arrow::compute::max(values));
        if within(lo) && within(hi) {
            // A batch of one day's timestamps (a daily partition's rows) is that day.
            if let (Some(lo), Some(hi)) = (lo, hi)
                && lo.div_euclid(PER_DAY) == hi.div_euclid(PER_DAY)
            {
                let day = vec![lo.div_euclid(PER_DAY) as i32; values.len()];
                return Ok(Date32Array::new(day.into(), values.nulls().cloned()));
            }
            return Ok(values.unary(|v| v.div_euclid(PER_DAY) as i32));
        }
        Ok(values.try_unary(|v| {
            let d = v.div_euclid(PER_DAY);
            if range.contains(&d) {
                Ok(d as i32)
            } else {
                Err(arrow::error::ArrowError::CastError(format!(
                    "timestamp {v} is out of range for a date"
                )))
            }
        })?)
    }
    let out = match values.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => run::<TimestampSecondType, 86_400>(values),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            run::<TimestampMillisecondType, 86_400_000>(values)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            run::<TimestampMicrosecondType, 86_400_000_000>(values)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            run::<TimestampNanosecondType, 86_400_000_000_000>(values)
        }
        t => return exec_err!("idem_utc_date: {t} is not a timestamp"),
    }?;
    Ok(Arc::new(out))
}

impl ScalarUDFImpl for UtcDate {
    fn name(&self) -> &str {
        "idem_utc_date"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Date32)
    }

    /// The field a type-only cast gives: the argument's nullability and metadata (less
    /// any extension type), so plans keep the schema the cast had.
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let [arg] = args.arg_fields else {
            return exec_err!("idem_utc_date takes one argument");
        };
        let mut metadata = arg.metadata().clone();
        metadata.remove(EXTENSION_TYPE_NAME_KEY);
        metadata.remove(EXTENSION_TYPE_METADATA_KEY);
        Ok(Arc::new(
            Field::new(self.name(), DataType::Date32, arg.is_nullable()).with_metadata(metadata),
        ))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [arg] = &args.args[..] else {
            return exec_err!("idem_utc_date takes one argument");
        };
        let t = arg.data_type();
        if !is_utc_timestamp(&t) {
            return exec_err!("idem_utc_date: {t} is not a UTC timestamp");
        }
        Ok(match arg {
            ColumnarValue::Array(a) => ColumnarValue::Array(days(a.as_ref())?),
            ColumnarValue::Scalar(s) => {
                let a = s.to_array()?;
                ColumnarValue::Scalar(datafusion::common::ScalarValue::try_from_array(
                    days(a.as_ref())?.as_ref(),
                    0,
                )?)
            }
        })
    }
}

/// Replaces `CAST(ts AS DATE)` of UTC timestamps by [`UtcDate`] in projections and
/// aggregations, keeping every expression's name.
#[derive(Debug)]
pub struct UtcDateRule {
    udf: Arc<ScalarUDF>,
}

impl UtcDateRule {
    pub fn new() -> Self {
        Self {
            udf: Arc::new(UtcDate::udf()),
        }
    }
}

impl OptimizerRule for UtcDateRule {
    fn name(&self) -> &str {
        "idem_utc_date"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        if !matches!(plan, LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_)) {
            return Ok(Transformed::no(plan));
        }
        let schema = Arc::clone(plan.inputs()[0].schema());
        let names = NamePreserver::new(&plan);
        plan.map_expressions(|expr| {
            // A grouping set is one expression whose children the plan above names
            // one by one: leave it as it is.
            if matches!(expr, Expr::GroupingSet(_)) {
                return Ok(Transformed::no(expr));
            }
            let name = names.save(&expr);
            let rewritten = expr.transform_up(|e| match &e {
                // Only a type-only cast (no explicit name, nullability or metadata),
                // whose field the function reproduces.
                Expr::Cast(Cast { expr: inner, field })
                    if field.data_type() == &DataType::Date32
                        && field.name().is_empty()
                        && field.is_nullable()
                        && field.metadata().is_empty()
                        && inner
                            .get_type(schema.as_ref())
                            .is_ok_and(|t| is_utc_timestamp(&t)) =>
                {
                    Ok(Transformed::yes(self.udf.call(vec![(**inner).clone()])))
                }
                _ => Ok(Transformed::no(e)),
            })?;
            Ok(if rewritten.transformed {
                Transformed::yes(name.restore(rewritten.data))
            } else {
                rewritten
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::TimestampMicrosecondArray;
    use arrow::datatypes::Date32Type;

    #[test]
    fn the_date_is_the_floor_of_the_day_count_like_arrows_cast() {
        let us = 86_400_000_000i64;
        let values = TimestampMicrosecondArray::from(vec![
            Some(0),
            Some(us - 1),
            Some(us),
            Some(-1),
            Some(-us),
            Some(-us - 1),
            None,
            Some(19_876 * us + 3_600_000_000),
        ])
        .with_timezone("UTC");
        let ours = days(&values).unwrap();
        let arrows = arrow::compute::cast(&values, &DataType::Date32).unwrap();
        assert_eq!(ours.as_ref(), arrows.as_ref());
        let naive = TimestampMicrosecondArray::from(vec![Some(-1), Some(us * 3 + 5), None]);
        let arrows = arrow::compute::cast(&naive, &DataType::Date32).unwrap();
        assert_eq!(days(&naive).unwrap().as_ref(), arrows.as_ref());
        // Out of chrono's range: an error, as arrow's cast gives, not a wrapped date.
        let far = arrow::array::TimestampSecondArray::from(vec![i64::MAX / 2]);
        assert!(arrow::compute::cast(&far, &DataType::Date32).is_err());
        assert!(days(&far).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1600))]

        /// Batches of one day (the constant path), of two adjacent days and of
        /// scattered days, with nulls, at and around day boundaries on both sides of
        /// the epoch, in every unit: the same dates as arrow's cast.
        #[test]
        fn batches_near_day_boundaries_match_arrows_cast(
            unit in 0..4usize,
            day in -20i64..=20,
            spread in 0..4usize,
            picks in proptest::collection::vec((0..3usize, proptest::prelude::any::<u64>(), 0..5u8), 1..10),
        ) {
            use arrow::array::{
                TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray,
            };
            let per_day = [86_400, 86_400_000, 86_400_000_000, 86_400_000_000_000][unit];
            let spread = [1, per_day, 2 * per_day, 50 * per_day][spread];
            let values: Vec<Option<i64>> = picks
                .iter()
                .map(|&(edge, offset, null)| {
                    let edge = [0, per_day - 1, per_day][edge];
                    let v = day * per_day + edge + (offset % spread as u64) as i64;
                    (null != 0).then_some(v)
                })
                .collect();
            let values: ArrayRef = match unit {
                0 => Arc::new(TimestampSecondArray::from(values)),
                1 => Arc::new(TimestampMillisecondArray::from(values)),
                2 => Arc::new(TimestampMicrosecondArray::from(values).with_timezone("UTC")),
                _ => Arc::new(TimestampNanosecondArray::from(values)),
            };
            let ours = days(values.as_ref()).unwrap();
            let arrows = arrow::compute::cast(&values, &DataType::Date32).unwrap();
            proptest::prop_assert_eq!(ours.as_ref(), arrows.as_ref(), "{:?}", values);
        }
    }

    /// The edges of the representable dates in every unit: the first and last second of
    /// chrono's range are dates, one second beyond either is an error, a null slot
    /// holding a value out of range is ignored, and nanoseconds (whose whole i64 range
    /// is within chrono's) never fail.
    #[test]
    fn the_range_check_is_exact_at_both_ends_in_every_unit() {
        use arrow::array::{PrimitiveArray, TimestampNanosecondArray, TimestampSecondArray};
        let range = day_range();
        let (first, last) = (range.start() * 86_400, (range.end() + 1) * 86_400 - 1);
        let date =
            |a: &dyn Array| days(a).map(|d| d.as_primitive::<Date32Type>().values().to_vec());
        let secs = TimestampSecondArray::from(vec![first, last, 0]);
        let expected = vec![*range.start() as i32, *range.end() as i32, 0];
        assert_eq!(date(&secs).unwrap(), expected);
        for beyond in [first - 1, last + 1] {
            let err = date(&TimestampSecondArray::from(vec![0, beyond])).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("timestamp {beyond} is out of range")),
                "{err}"
            );
        }
        let hidden: PrimitiveArray<TimestampSecondType> = PrimitiveArray::new(
            vec![86_400, last + 1, first - 1].into(),
            Some(vec![true, false, false].into()),
        );
        let out = days(&hidden).unwrap();
        assert_eq!(out.null_count(), 2);
        assert_eq!(out.as_primitive::<Date32Type>().value(0), 1);
        let millis = arrow::array::TimestampMillisecondArray::from(vec![first * 1000, last * 1000]);
        assert_eq!(date(&millis).unwrap(), expected[..2]);
        assert!(
            date(&arrow::array::TimestampMillisecondArray::from(vec![
                first * 1000 - 1
            ]))
            .is_err()
        );
        let nanos = TimestampNanosecondArray::from(vec![i64::MIN, -1, 0, i64::MAX]);
        let arrows = arrow::compute::cast(&nanos, &DataType::Date32).unwrap();
        assert_eq!(days(&nanos).unwrap().as_ref(), arrows.as_ref());
    }

    /// The same rows and schema with the rule as without it, and the rule applied (in a
    /// projection and a grouping; a filter's cast is left for pruning), including a
    /// non-null column grouped over a subquery and a grouping set.
    #[test]
    fn queries_give_the_same_result_with_the_rule_and_use_it() {
        use arrow::array::RecordBatch;
        use arrow::datatypes::Schema;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::SessionContext;
        let us = 86_400_000_000i64;
        let utc = TimestampMicrosecondArray::from(vec![Some(-1), Some(0), Some(us + 7), None])
            .with_timezone("UTC");
        let naive = TimestampMicrosecondArray::from(vec![Some(5), Some(-us), None, Some(us)]);
        let required = TimestampMicrosecondArray::from(vec![0, us, 2 * us, 3 * us - 1])
            .with_timezone("+00:00");
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", utc.data_type().clone(), true),
            Field::new("naive", naive.data_type().clone(), true),
            Field::new("req", required.data_type().clone(), false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(utc), Arc::new(naive), Arc::new(required)],
        )
        .unwrap();
        let run = |sql: &str, with_rule: bool| {
            let ctx = SessionContext::new();
            if with_rule {
                ctx.add_optimizer_rule(Arc::new(UtcDateRule::new()));
            }
            let table = MemTable::try_new(schema.clone(), vec![vec![batch.clone()]]).unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(async {
                    let df = ctx.sql(sql).await.unwrap();
                    let plan = format!("{:?}", df.clone().into_optimized_plan().unwrap());
                    (plan, df.collect().await.unwrap())
                })
        };
        let cases = [
            (
                "select cast(ts as date), cast(naive as date) as d, count(*) as n from t \
                 where cast(ts as date) is not null or true group by 1, 2 order by 1, 2",
                2,
            ),
            (
                "select d, count(*) from (select cast(req as date) as d from t) group by d \
                 order by d",
                1,
            ),
            (
                "select cast(ts as date), count(*) from t \
                 group by rollup (cast(ts as date)) order by 1",
                0,
            ),
        ];
        for (sql, rewritten) in cases {
            let (plain_plan, plain) = run(sql, false);
            let (plan, ours) = run(sql, true);
            assert_eq!(ours, plain, "{sql}");
            assert_eq!(ours[0].schema(), plain[0].schema(), "{sql}");
            assert!(!plain_plan.contains("UtcDate"), "{plain_plan}");
            assert_eq!(plan.matches("UtcDate").count(), rewritten, "{sql}: {plan}");
        }
    }
}
