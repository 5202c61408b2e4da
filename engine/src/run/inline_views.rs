//! Text read from Parquet as string views keeps the dictionary page's data buffer
//! even when every value is short enough (12 bytes or less) to live in its view. Arrow
//! compares, hashes and copies such columns on a slower path while a buffer is
//! attached, so a scan's batches drop it when no view points into it: a status
//! compared with a literal then costs one 16-byte comparison a row.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray};
use arrow::datatypes::{ByteViewType, DataType};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;

/// Puts [`InlineViewsExec`] above every scan of `plan` that yields string views.
pub(crate) fn above_scans(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let views = node
            .schema()
            .fields()
            .iter()
            .any(|f| is_view(f.data_type()));
        if views && node.downcast_ref::<DataSourceExec>().is_some() {
            Ok(Transformed::yes(Arc::new(InlineViewsExec::new(node)) as _))
        } else {
            Ok(Transformed::no(node))
        }
    })
    .map(|t| t.data)
}

fn is_view(t: &DataType) -> bool {
    matches!(t, DataType::Utf8View | DataType::BinaryView)
}

/// A column without the data buffers none of its views point into; others as they are.
fn inline(column: &ArrayRef) -> Option<ArrayRef> {
    match column.data_type() {
        DataType::Utf8View => without_unused_buffers(column.as_string_view()),
        DataType::BinaryView => without_unused_buffers(column.as_binary_view()),
        _ => None,
    }
}

fn without_unused_buffers<T: ByteViewType>(a: &GenericByteViewArray<T>) -> Option<ArrayRef> {
    let unused = !a.data_buffers().is_empty() && a.total_buffer_bytes_used() == 0;
    unused.then(|| Arc::new(a.gc()) as ArrayRef)
}

fn inline_batch(batch: RecordBatch) -> Result<RecordBatch> {
    let mut changed = false;
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match inline(c) {
            Some(slim) => {
                changed = true;
                slim
            }
            None => Arc::clone(c),
        })
        .collect();
    if !changed {
        return Ok(batch);
    }
    RecordBatch::try_new(batch.schema(), columns).map_err(DataFusionError::from)
}

/// Passes its input's batches on, with short-string columns freed of unused buffers.
#[derive(Debug)]
pub(crate) struct InlineViewsExec {
    input: Arc<dyn ExecutionPlan>,
}

impl InlineViewsExec {
    fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self { input }
    }
}

impl DisplayAs for InlineViewsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "InlineViewsExec")
    }
}

impl ExecutionPlan for InlineViewsExec {
    fn name(&self) -> &str {
        "InlineViewsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "InlineViewsExec has one input".into(),
            ));
        }
        Ok(Arc::new(Self::new(children.swap_remove(0))))
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
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let batches = input.map(|b| b.and_then(inline_batch));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;
    use arrow::buffer::Buffer;
    use arrow::datatypes::{Field, Schema};

    /// Views of "open" and "cancelled", inline, beside a dictionary buffer as the
    /// Parquet reader leaves it.
    fn short_with_buffer() -> StringViewArray {
        let inline = StringViewArray::from(vec![Some("open"), None, Some("cancelled")]);
        let (views, _, nulls) = inline.into_parts();
        let buffer = Buffer::from(b"open cancelled a value longer than twelve".as_slice());
        StringViewArray::new(views, vec![buffer], nulls)
    }

    fn batch(columns: Vec<ArrayRef>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    #[test]
    fn short_strings_lose_the_buffer_and_keep_their_values() {
        let long = StringViewArray::from(vec!["a value longer than twelve", "x", "y"]);
        let out = inline_batch(batch(vec![
            Arc::new(short_with_buffer()),
            Arc::new(long.clone()),
        ]))
        .unwrap();
        let short = out.column(0).as_string_view();
        assert!(short.data_buffers().is_empty());
        assert_eq!(short, &short_with_buffer());
        let kept = out.column(1).as_string_view();
        assert_eq!(kept.data_buffers().len(), long.data_buffers().len());
        assert_eq!(kept, &long);
    }

    #[test]
    fn a_batch_without_unused_buffers_is_passed_on_as_it_is() {
        let plain = StringViewArray::from(vec!["a", "b"]);
        let input = batch(vec![Arc::new(plain)]);
        let out = inline_batch(input.clone()).unwrap();
        assert!(Arc::ptr_eq(out.column(0), input.column(0)));
    }
}
