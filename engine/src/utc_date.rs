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
    DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

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

fn days(values: &dyn Array, per_day: i64) -> ArrayRef {
    fn run<T: arrow::datatypes::ArrowPrimitiveType<Native = i64>>(
        values: &dyn Array,
        per_day: i64,
    ) -> Date32Array {
        values
            .as_primitive::<T>()
            .unary(|v| v.div_euclid(per_day) as i32)
    }
    let out = match values.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => run::<TimestampSecondType>(values, per_day),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            run::<TimestampMillisecondType>(values, per_day)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            run::<TimestampMicrosecondType>(values, per_day)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            run::<TimestampNanosecondType>(values, per_day)
        }
        _ => unreachable!("checked by the caller"),
    };
    Arc::new(out)
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

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [arg] = &args.args[..] else {
            return exec_err!("idem_utc_date takes one argument");
        };
        let per_day = match arg.data_type() {
            t if !is_utc_timestamp(&t) => {
                return exec_err!("idem_utc_date: {t} is not a UTC timestamp");
            }
            DataType::Timestamp(unit, _) => match unit {
                TimeUnit::Second => 86_400,
                TimeUnit::Millisecond => 86_400_000,
                TimeUnit::Microsecond => 86_400_000_000,
                TimeUnit::Nanosecond => 86_400_000_000_000,
            },
            _ => unreachable!(),
        };
        Ok(match arg {
            ColumnarValue::Array(a) => ColumnarValue::Array(days(a.as_ref(), per_day)),
            ColumnarValue::Scalar(s) => {
                let a = s.to_array()?;
                ColumnarValue::Scalar(datafusion::common::ScalarValue::try_from_array(
                    days(a.as_ref(), per_day).as_ref(),
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
            let name = names.save(&expr);
            let rewritten = expr.transform_up(|e| match &e {
                Expr::Cast(Cast { expr: inner, field })
                    if field.data_type() == &DataType::Date32
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
        let ours = days(&values, us);
        let arrows = arrow::compute::cast(&values, &DataType::Date32).unwrap();
        assert_eq!(ours.as_ref(), arrows.as_ref());
        let naive = TimestampMicrosecondArray::from(vec![Some(-1), Some(us * 3 + 5), None]);
        let arrows = arrow::compute::cast(&naive, &DataType::Date32).unwrap();
        assert_eq!(days(&naive, us).as_ref(), arrows.as_ref());
    }

    /// The same rows and column names with the rule as without it, and the rule applied
    /// (in a projection and a grouping; a filter's cast is left for pruning).
    #[test]
    fn queries_give_the_same_result_with_the_rule_and_use_it() {
        use arrow::array::RecordBatch;
        use arrow::datatypes::{Field, Schema};
        use datafusion::datasource::MemTable;
        use datafusion::prelude::SessionContext;
        let us = 86_400_000_000i64;
        let utc = TimestampMicrosecondArray::from(vec![Some(-1), Some(0), Some(us + 7), None])
            .with_timezone("UTC");
        let naive = TimestampMicrosecondArray::from(vec![Some(5), Some(-us), None, Some(us)]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("ts", utc.data_type().clone(), true),
            Field::new("naive", naive.data_type().clone(), true),
        ]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(utc), Arc::new(naive)]).unwrap();
        let sql = "select cast(ts as date), cast(naive as date) as d, count(*) as n \
                   from t where cast(ts as date) is not null or true group by 1, 2 order by 1, 2";
        let run = |with_rule: bool| {
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
        let (plain_plan, plain) = run(false);
        let (plan, ours) = run(true);
        assert_eq!(ours, plain);
        assert!(!plain_plan.contains("UtcDate"), "{plain_plan}");
        assert_eq!(plan.matches("UtcDate").count(), 2, "{plan}");
        assert_eq!(ours[0].schema(), plain[0].schema());
    }
}
