//! DataFusion paths known to give wrong rows, switched off in every session idem plans
//! or executes in: a run's, a check's, `verify`'s, and a cluster's scheduler and
//! executors. A wrong number is worse than a slow one: each stays off until a
//! DataFusion release fixes it and the differential search (`cli/tests/it/answers.rs`)
//! passes at the upgrade budget with it back on (CONTRIBUTING.md, "Upgrading
//! DataFusion").
//!
//! All three are dynamic filters: operators that learn bounds while running (a join's
//! build side, an aggregation's running min/max, a top-k's current k-th value) and push
//! them into the scans below, where they skip row groups. In DataFusion 55.2 the
//! aggregation's filter ignores aggregates of expressions, and the filters pushed
//! through an aggregation are mapped onto its input by column *name*, so they land on
//! a raw column where the aggregation grouped by a cast of it, or on the first of two
//! grouping columns of one name. The rows skipped are rows the query needed.
//!
//! The same mapping by name also moves *static* filters: DataFusion's first physical
//! filter pushdown (`FilterPushdown`, before its other rules) maps a filter from an
//! operator into its input by column name, so through a projection whose outputs share
//! a name (`b.id`, `a.id` after a join) `b.id IS NULL` becomes `a.id IS NULL` and
//! prunes every row group of `a` (`tb b right join ta a … where b.id is null` returns
//! nothing). No option turns that pushdown off, so idem runs it with a fence: an
//! operator where a name is ambiguous passes no filter down (the logical optimizer has
//! already pushed every filter it could below joins and aggregations, by expression).
//!
//! `IDEM_UNSAFE_REENABLE=name[,name]` (or `all`) turns paths back on, for the upgrade
//! gate and the regression tests that show each class still fails with its path on.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};

/// One switched-off path: its name for `IDEM_UNSAFE_REENABLE`, the DataFusion option,
/// and the upstream issues that describe it.
#[derive(Debug)]
pub struct WrongPath {
    pub name: &'static str,
    pub option: &'static str,
    pub upstream: &'static str,
}

/// Every path idem switches off.
pub const PATHS: [WrongPath; 5] = [
    // `min(price), max(seq + 1)`: the running min/max of `price` prunes row groups
    // that `max(seq + 1)` needs (one answer per run, depending on file order).
    WrongPath {
        name: "aggregate_dynamic_filter",
        option: "datafusion.optimizer.enable_aggregate_dynamic_filter_pushdown",
        upstream: "apache/datafusion#24816",
    },
    // A join's bounds pushed through an aggregation by name: onto `p` where the
    // aggregation grouped by `cast(cast(p as int) as decimal(12,2))`, or onto `a.v`
    // where it grouped by `a.v, b.v` and the join is on `b.v`.
    WrongPath {
        name: "join_dynamic_filter",
        option: "datafusion.optimizer.enable_join_dynamic_filter_pushdown",
        upstream: "apache/datafusion#25264, #25244, #25262",
    },
    // A top-k's threshold pushed through an aggregation the same way: `order by p
    // limit k` over a grouping by a cast of `p` prunes by the raw `p`.
    WrongPath {
        name: "topk_dynamic_filter",
        option: "datafusion.optimizer.enable_topk_dynamic_filter_pushdown",
        upstream: "apache/datafusion#25264 (the same mapping by name)",
    },
    // Static filters pushed by name through an operator whose names are ambiguous:
    // fenced (see the module's documentation), not switched by an option.
    WrongPath {
        name: "filter_pushdown_by_name",
        option: "",
        upstream: "apache/datafusion#25262, #25244 (and ProjectionExec::collect_reverse_alias)",
    },
    // A timestamp compared with a constant finer than its unit: the simplifier casts
    // the constant down, truncating it. Made exact by an analyzer rule
    // (`exact_timestamps`), not switched by an option.
    WrongPath {
        name: "timestamp_literal_truncation",
        option: "",
        upstream: "datafusion-expr-common 55.2 casts.rs (try_cast_literal_to_type truncates by design)",
    },
];

/// The variable that turns paths back on.
pub const REENABLE_VAR: &str = "IDEM_UNSAFE_REENABLE";

/// Whether `IDEM_UNSAFE_REENABLE` turns the path `name` back on.
pub(crate) fn reenabled(name: &str) -> bool {
    std::env::var(REENABLE_VAR)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .any(|r| r == name || r == "all")
}

/// Switches every known-wrong path that has an option off in `options`, except those
/// `IDEM_UNSAFE_REENABLE` names.
pub fn switch_off(options: &mut ConfigOptions) {
    // The umbrella option resets the three when it is set, and Ballista sets a
    // session's options in declaration order, the umbrella after the three: it is
    // off too, unless one of them is turned back on.
    let any_on = PATHS
        .iter()
        .any(|p| p.option.contains("dynamic_filter") && reenabled(p.name));
    options
        .set(
            "datafusion.optimizer.enable_dynamic_filter_pushdown",
            if any_on { "true" } else { "false" },
        )
        .expect("DataFusion knows the umbrella option");
    for path in PATHS.iter().filter(|p| !p.option.is_empty()) {
        let value = if reenabled(path.name) {
            "true"
        } else {
            "false"
        };
        options
            .set(path.option, value)
            .expect("DataFusion knows every option of PATHS");
    }
}

/// DataFusion's physical optimizer rules, with the first filter pushdown fenced.
pub(crate) fn physical_rules() -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = PhysicalOptimizer::new().rules;
    if !reenabled("filter_pushdown_by_name")
        && let Some(at) = rules.iter().position(|r| r.name() == "FilterPushdown")
    {
        rules[at] = Arc::new(FencedFilterPushdown(FilterPushdown::new()));
    }
    rules
}

/// DataFusion's `FilterPushdown` run with every operator whose column names are
/// ambiguous fenced off: no filter crosses a fence, and the fences are gone after.
#[derive(Debug)]
struct FencedFilterPushdown(FilterPushdown);

impl PhysicalOptimizerRule for FencedFilterPushdown {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let fenced = plan
            .transform_up(|node| {
                Ok(if ambiguous(&node) {
                    Transformed::yes(Arc::new(Fence(node)) as Arc<dyn ExecutionPlan>)
                } else {
                    Transformed::no(node)
                })
            })?
            .data;
        let pushed = self.0.optimize(fenced, config)?;
        Ok(pushed
            .transform_up(|node| {
                Ok(match node.downcast_ref::<Fence>() {
                    Some(fence) => Transformed::yes(Arc::clone(&fence.0)),
                    None => Transformed::no(node),
                })
            })?
            .data)
    }

    fn name(&self) -> &str {
        "FilterPushdown"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether DataFusion could map a filter from `node` into its input to the wrong
/// column: an input with two columns of one name (a join's output), a projection
/// whose outputs share a name, or an aggregation that names a grouping expression
/// like an input column it is not.
fn ambiguous(node: &Arc<dyn ExecutionPlan>) -> bool {
    let duplicates = |schema: &arrow::datatypes::Schema| {
        let mut seen = HashSet::new();
        !schema
            .fields()
            .iter()
            .all(|f| seen.insert(f.name().as_str()))
    };
    if node.children().iter().any(|c| duplicates(&c.schema())) {
        return true;
    }
    if node.downcast_ref::<ProjectionExec>().is_some() && duplicates(&node.schema()) {
        return true;
    }
    if let Some(agg) = node.downcast_ref::<AggregateExec>() {
        let input = agg.input().schema();
        return agg.group_expr().expr().iter().any(|(expr, name)| {
            let same = input.index_of(name).ok().is_some_and(|i| {
                expr.downcast_ref::<Column>()
                    .is_some_and(|c| c.index() == i && c.name() == name)
            });
            input.index_of(name).is_ok() && !same
        });
    }
    false
}

/// An operator that no filter pushdown crosses: it shows its operator's inputs (so
/// filters below it are still pushed) but accepts no filter from above.
#[derive(Debug)]
struct Fence(Arc<dyn ExecutionPlan>);

impl DisplayAs for Fence {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Fence: ")?;
        self.0.fmt_as(t, f)
    }
}

impl ExecutionPlan for Fence {
    fn name(&self) -> &str {
        "Fence"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.0.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.0.children()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.0.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let inner = Arc::clone(&self.0).replace_children(children, options)?;
        Ok(Arc::new(Fence(inner)))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.0.execute(partition, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_is_off_in_a_session_of_idem() {
        let mut options = ConfigOptions::default();
        // DataFusion's defaults have them on: this is why idem sets them.
        assert!(options.optimizer.enable_join_dynamic_filter_pushdown);
        switch_off(&mut options);
        if std::env::var_os(REENABLE_VAR).is_none() {
            let o = &options.optimizer;
            assert!(!o.enable_aggregate_dynamic_filter_pushdown);
            assert!(!o.enable_join_dynamic_filter_pushdown);
            assert!(!o.enable_topk_dynamic_filter_pushdown);
        }
    }
}
