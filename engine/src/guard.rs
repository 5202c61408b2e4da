//! The determinism guard: a job's output must depend only on its inputs.
//!
//! Before anything runs, every function in the unoptimized logical plan (subqueries
//! included) is checked against DataFusion's own volatility marking; anything not
//! `Immutable` (now(), current_date, random(), uuid(), …) is rejected with an error that
//! names it. The unoptimized plan matters: the optimizer folds now() into a literal.
//! Order-dependent results that DataFusion marks immutable (LIMIT without ORDER BY,
//! row_number() over a non-unique order) are left to `idem verify`.

use std::path::Path;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility, WindowFunctionDefinition};

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
