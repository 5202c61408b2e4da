//! The determinism guard: a job's output must depend only on its inputs.
//!
//! Before anything runs, every function in the unoptimized logical plan (subqueries
//! included) is checked against DataFusion's own volatility marking; anything not
//! `Immutable` (now(), current_date, random(), uuid(), …) is rejected with an error that
//! names it. The unoptimized plan matters: the optimizer folds now() into a literal.
//! Order-dependent results that DataFusion marks immutable (LIMIT without ORDER BY,
//! row_number() over a non-unique order) are left to `idem verify`.
//!
//! The guard also refuses what DataFusion plans but computes wrongly and no option
//! turns off (see `known_wrong` for those an option does): `INTERSECT ALL` and
//! `EXCEPT ALL`, which DataFusion 55 runs as a semi and an anti join (every left row
//! with a match, or without one) instead of SQL's multiset intersection and difference.

use std::path::Path;

use datafusion::common::NullEquality;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, Volatility, WindowFunctionDefinition};

use crate::error::{Error, Result};

/// Returns the first function in `plan` that is not immutable, with its volatility.
pub fn first_nondeterministic(plan: &LogicalPlan) -> Option<(String, Volatility)> {
    let mut found = None;
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Some(hit) = volatility_of(e)
                    && hit.1 != Volatility::Immutable
                {
                    found = Some(hit);
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(if found.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

fn volatility_of(e: &Expr) -> Option<(String, Volatility)> {
    match e {
        Expr::ScalarFunction(f) => Some((f.func.name().to_string(), f.func.signature().volatility)),
        Expr::AggregateFunction(AggregateFunction { func, .. }) => {
            Some((func.name().to_string(), func.signature().volatility))
        }
        Expr::WindowFunction(w) => {
            let WindowFunction { fun, .. } = w.as_ref();
            match fun {
                WindowFunctionDefinition::AggregateUDF(u) => {
                    Some((u.name().to_string(), u.signature().volatility))
                }
                WindowFunctionDefinition::WindowUDF(u) => {
                    Some((u.name().to_string(), u.signature().volatility))
                }
            }
        }
        _ => None,
    }
}

/// The first `INTERSECT ALL` or `EXCEPT ALL` in `plan` (unoptimized): DataFusion's SQL
/// planner makes each a semi or anti join that treats NULLs as equal, over a left input
/// that is not made distinct (`INTERSECT` and `EXCEPT` make it distinct; a join the
/// user writes never treats NULLs as equal).
pub fn first_multiset_operation(plan: &LogicalPlan) -> Option<&'static str> {
    let mut found = None;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Join(j) = node
            && j.null_equality == NullEquality::NullEqualsNull
            && !distinct(&j.left)
        {
            found = match j.join_type {
                JoinType::LeftSemi => Some("INTERSECT ALL"),
                JoinType::LeftAnti => Some("EXCEPT ALL"),
                _ => None,
            };
        }
        Ok(if found.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

/// Whether `plan` yields distinct rows: a `Distinct`, under any aliases (a set
/// operation over one table aliases its sides).
fn distinct(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Distinct(_) => true,
        LogicalPlan::SubqueryAlias(a) => distinct(&a.input),
        _ => false,
    }
}

/// Rejects a plan that reads the clock or a random source, or that DataFusion would
/// compute wrongly.
pub fn check_answer(job: &Path, plan: &LogicalPlan) -> Result<()> {
    match first_multiset_operation(plan) {
        None => Ok(()),
        Some(op) => Err(Error::Sql {
            path: job.to_path_buf(),
            message: format!(
                "{op} is not supported: DataFusion 55 computes it as {} join (every row \
                 of the left side {} on the right, however often), not as SQL's {}. \
                 Write {} (distinct rows), or count the rows of each side and join the counts",
                if op == "INTERSECT ALL" {
                    "a semi"
                } else {
                    "an anti"
                },
                if op == "INTERSECT ALL" {
                    "with a match"
                } else {
                    "without a match"
                },
                if op == "INTERSECT ALL" {
                    "multiset intersection (each row as often as on both sides)"
                } else {
                    "multiset difference (each row as often as it is more on the left)"
                },
                op.trim_end_matches(" ALL"),
            ),
        }),
    }
}

/// Rejects a plan that reads the clock or a random source.
pub fn check(job: &Path, plan: &LogicalPlan) -> Result<()> {
    match first_nondeterministic(plan) {
        None => Ok(()),
        Some((function, volatility)) => Err(Error::Nondeterministic {
            path: job.to_path_buf(),
            function: format!("{function}()"),
            volatility: format!("{volatility:?}"),
        }),
    }
}
