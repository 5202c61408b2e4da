//! Comparisons of a timestamp with a constant finer than its unit stay exact.
//!
//! DataFusion 55 compares a `Timestamp(ms)` column with a nanosecond literal by casting
//! the column up, then its simplifier "unwraps" the cast and casts the literal down
//! instead, truncating it: `ts = '… 00:00:00.515835'` is true for a `ts` of
//! `00:00:00.515`, and `ts >= '… .5159'` keeps it too (`try_cast_literal_to_type`
//! documents the truncation). This optimizer rule runs before every simplification
//! (the optimizer's filter pushdown makes new comparisons, through a union or a
//! projection that casts) and, where the constant has digits the column's unit cannot
//! hold, rewrites the comparison to
//! an exact one on the column's own unit, which the simplifier then leaves alone (and
//! which still prunes row groups): with `f` the constant rounded down to the unit,
//! `x < c` and `x <= c` become `x <= f`, `x > c` and `x >= c` become `x > f`, `x = c`
//! is never true (NULL for a NULL `x`), `x <> c` always (but NULL). Constants the unit
//! holds exactly are left to DataFusion, whose rewrite is then exact. A cast that puts
//! a zone on a timestamp without one shifts its values, so such a comparison is left
//! alone. (DataFusion's simplifier also runs per file when a file's column has another
//! unit than the table's; that pruning is not covered.)

use std::sync::Arc;

use arrow::array::RecordBatchOptions;
use arrow::datatypes::{DataType, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::expr::{Between, Cast, InList, TryCast};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{BinaryExpr, Expr, ExprSchemable, LogicalPlan, Operator, lit};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::create_physical_expr;
use datafusion::physical_plan::ColumnarValue;

#[derive(Debug, Default)]
struct ExactTimestampComparisons;

impl OptimizerRule for ExactTimestampComparisons {
    fn name(&self) -> &str {
        "idem_exact_timestamp_comparisons"
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        plan.transform_up_with_subqueries(|node| {
            let mut schema = DFSchema::empty();
            for input in node.inputs() {
                schema.merge(input.schema());
            }
            // An aggregate's or a projection's output is named after its expressions:
            // a rewritten one keeps its name.
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                let saved = names.save(&e);
                Ok(e.transform_up(|e| rewrite(e, &schema))?
                    .update_data(|e| saved.restore(e)))
            })
        })
    }
}

/// DataFusion's optimizer rules with this rule before each simplification.
pub(crate) fn optimizer_rules() -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    let mut rules = Vec::new();
    for rule in datafusion::optimizer::Optimizer::new().rules {
        if rule.name() == "simplify_expressions" {
            rules.push(Arc::new(ExactTimestampComparisons) as Arc<dyn OptimizerRule + Send + Sync>);
        }
        rules.push(rule);
    }
    rules
}

fn scale(unit: &TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    }
}

/// `x`'s timestamp value and unit, when it is a non-null timestamp constant.
fn timestamp(s: &ScalarValue) -> Option<(i64, TimeUnit)> {
    match s {
        ScalarValue::TimestampSecond(Some(v), _) => Some((*v, TimeUnit::Second)),
        ScalarValue::TimestampMillisecond(Some(v), _) => Some((*v, TimeUnit::Millisecond)),
        ScalarValue::TimestampMicrosecond(Some(v), _) => Some((*v, TimeUnit::Microsecond)),
        ScalarValue::TimestampNanosecond(Some(v), _) => Some((*v, TimeUnit::Nanosecond)),
        _ => None,
    }
}

fn timestamp_literal(v: i64, unit: &TimeUnit, tz: Option<Arc<str>>) -> Expr {
    lit(match unit {
        TimeUnit::Second => ScalarValue::TimestampSecond(Some(v), tz),
        TimeUnit::Millisecond => ScalarValue::TimestampMillisecond(Some(v), tz),
        TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(Some(v), tz),
        TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(Some(v), tz),
    })
}

/// The value of `e` when it reads no column and evaluates here.
fn constant(e: &Expr) -> Option<ScalarValue> {
    if !e.column_refs().is_empty() || e.is_volatile() {
        return None;
    }
    let props = ExecutionProps::new();
    let physical = create_physical_expr(
        e,
        &DFSchema::empty(),
        &props,
        &PhysicalPlanningContext::default(),
    )
    .ok()?;
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .ok()?;
    match physical.evaluate(&one_row).ok()? {
        ColumnarValue::Scalar(s) => Some(s),
        ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0).ok(),
    }
}

/// The column side of a comparison: `CAST(x AS Timestamp(finer))` with `x` a
/// timestamp of a coarser unit; `x`, its unit and zone.
fn coarse_cast<'a>(
    e: &'a Expr,
    schema: &DFSchema,
) -> Option<(&'a Expr, TimeUnit, Option<Arc<str>>)> {
    let (expr, field) = match e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => (expr, field),
        _ => return None,
    };
    let DataType::Timestamp(to, to_tz) = field.data_type() else {
        return None;
    };
    match expr.get_type(schema).ok()? {
        // A zone put on a timestamp without one shifts its values: not a unit change.
        DataType::Timestamp(_, None) if to_tz.is_some() => None,
        DataType::Timestamp(from, tz) if scale(&from) < scale(to) => Some((expr, from, tz)),
        _ => None,
    }
}

/// `x op c` made exact on `x`'s unit, when `c` has digits that unit cannot hold.
fn exact(
    x: &Expr,
    unit: &TimeUnit,
    tz: &Option<Arc<str>>,
    op: Operator,
    c: &ScalarValue,
) -> Option<Expr> {
    let (v, c_unit) = timestamp(c)?;
    if scale(&c_unit) <= scale(unit) {
        return None;
    }
    let ratio = scale(&c_unit) / scale(unit);
    if v % ratio == 0 {
        return None;
    }
    let floor = timestamp_literal(v.div_euclid(ratio), unit, tz.clone());
    let x = x.clone();
    let null = lit(ScalarValue::Boolean(None));
    Some(match op {
        Operator::Lt | Operator::LtEq => x.lt_eq(floor),
        Operator::Gt | Operator::GtEq => x.gt(floor),
        Operator::Eq => x.is_null().and(null),
        Operator::NotEq => x.is_not_null().or(null),
        Operator::IsDistinctFrom => lit(true),
        Operator::IsNotDistinctFrom => lit(false),
        _ => return None,
    })
}

fn flip(op: Operator) -> Operator {
    match op {
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        op => op,
    }
}

fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let out = match &e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            if let Some((x, unit, tz)) = coarse_cast(left, schema) {
                constant(right).and_then(|c| exact(x, &unit, &tz, *op, &c))
            } else if let Some((x, unit, tz)) = coarse_cast(right, schema) {
                constant(left).and_then(|c| exact(x, &unit, &tz, flip(*op), &c))
            } else {
                None
            }
        }
        Expr::Between(Between {
            expr,
            negated,
            low,
            high,
        }) if coarse_cast(expr, schema).is_some() => {
            let (x, unit, tz) = coarse_cast(expr, schema).expect("checked");
            let (lo, hi) = (constant(low), constant(high));
            let lo_exact = lo
                .as_ref()
                .and_then(|c| exact(x, &unit, &tz, Operator::GtEq, c));
            let hi_exact = hi
                .as_ref()
                .and_then(|c| exact(x, &unit, &tz, Operator::LtEq, c));
            (lo_exact.is_some() || hi_exact.is_some()).then(|| {
                let lo =
                    lo_exact.unwrap_or_else(|| expr.as_ref().clone().gt_eq(low.as_ref().clone()));
                let hi =
                    hi_exact.unwrap_or_else(|| expr.as_ref().clone().lt_eq(high.as_ref().clone()));
                let both = lo.and(hi);
                if *negated { !both } else { both }
            })
        }
        Expr::InList(InList {
            expr,
            list,
            negated,
        }) if coarse_cast(expr, schema).is_some() => {
            let (x, unit, tz) = coarse_cast(expr, schema).expect("checked");
            // Items the unit cannot hold never equal `x`: drop them.
            let inexact = |item: &Expr| {
                constant(item).is_some_and(|c| exact(x, &unit, &tz, Operator::Eq, &c).is_some())
            };
            let kept: Vec<Expr> = list.iter().filter(|i| !inexact(i)).cloned().collect();
            if kept.len() == list.len() {
                None
            } else if kept.is_empty() {
                let null = lit(ScalarValue::Boolean(None));
                Some(if *negated {
                    x.clone().is_not_null().or(null)
                } else {
                    x.clone().is_null().and(null)
                })
            } else {
                Some(expr.as_ref().clone().in_list(kept, *negated))
            }
        }
        _ => None,
    };
    Ok(match out {
        Some(new) => Transformed::yes(new),
        None => Transformed::no(e),
    })
}
