//! The changes a merge applies: the job's output, computed once and held in memory,
//! its keys shown unique and present (or the offending rows shown), and the copy of it
//! the merged output streams once.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::row::{Row, RowConverter, SortField};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;
use idem_io::digest::{Difference, digest_batch};

use super::keys::{ChangedKeys, equal_iff_same_bytes};
use super::prune::KeyProbe;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::sql::{first_value, ident, pretty, query};

/// The changes (the job's output), computed once, and what is known of their keys.
pub(super) struct Changes {
    pub(super) batches: Vec<RecordBatch>,
    pub(super) rows: usize,
    /// The source files they were computed from, for the manifest.
    pub(super) inputs: Vec<idem_io::manifest::InputFile>,
    /// Whether every row is shown to have a key without NULLs that no other row has
    /// (only a change set that may not be is queried for what explains why).
    pub(super) clean: bool,
    /// A clean change set's keys as a bitmap (a single integer key whose values are
    /// dense enough, see `ChangedKeys`).
    pub(super) keys: Option<Arc<ChangedKeys>>,
    /// The changed keys, sorted per column, to prune the table's files by statistics.
    pub(super) probe: KeyProbe,
}

impl Changes {
    pub(super) async fn compute(
        job: &Job,
        ctx: &SessionContext,
        output_df: DataFrame,
        output: &SchemaRef,
    ) -> Result<Self> {
        let exec = |e| Error::execution(&job.path, "merge: ", e);
        let plan = output_df.create_physical_plan().await.map_err(exec)?;
        let inputs = crate::session::inputs_of(&plan, job).await;
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .map_err(exec)?;
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        // A single integer key whose changed values are dense enough is also a bitmap:
        // the anti join becomes a bit test per row of the table, and the bitmap gives
        // the sorted keys and their check without a sort.
        let keys =
            ChangedKeys::new(&batches, output, &job.target.key).map_err(|e| exec(e.into()))?;
        let sorted = keys
            .as_ref()
            .map(|k| k.sorted(output, &job.target.key[0]))
            .transpose()
            .map_err(|e| exec(e.into()))?;
        let probe =
            KeyProbe::new(&batches, output, &job.target.key, sorted).map_err(|e| exec(e.into()))?;
        let clean = match &keys {
            Some(keys) => keys.unique_and_present,
            None => keys_unique_and_present(&probe, &batches, output, &job.target.key)
                .map_err(|e| exec(e.into()))?,
        };
        Ok(Self {
            batches,
            rows,
            inputs,
            clean,
            keys: keys.filter(|_| clean).map(Arc::new),
            probe,
        })
    }
}

/// Refuses changes (`__idem_changes`) with NULL or repeated keys, showing some.
pub(super) async fn refuse_bad_keys(job: &Job, ctx: &SessionContext) -> Result<()> {
    let exec = |e| Error::execution(&job.path, "merge: ", e);
    let key: Vec<String> = job.target.key.iter().map(|k| ident(k)).collect();
    let key_list = key.join(", ");
    let any_null = key
        .iter()
        .map(|k| format!("{k} is null"))
        .collect::<Vec<_>>()
        .join(" or ");
    let nulls = query(
        ctx,
        format!("select * from __idem_changes where {any_null} limit 5"),
    )
    .await
    .map_err(exec)?;
    if nulls.iter().any(|b| b.num_rows() > 0) {
        return Err(Error::Output {
            path: job.path.clone(),
            message: format!(
                "has rows with NULL in the merge key ({}); a NULL key matches nothing. For example:\n{}",
                job.target.key.join(", "),
                pretty(&nulls)
            ),
        });
    }
    let dups = query(
        ctx,
        format!(
            "select {key_list}, count(*) as copies from __idem_changes group by {key_list} \
             having count(*) > 1 order by copies desc, {key_list} limit 5"
        ),
    )
    .await
    .map_err(exec)?;
    if dups.iter().any(|b| b.num_rows() > 0) {
        let total = query(
            ctx,
            format!(
                "select count(*) from (select {key_list} from __idem_changes group by {key_list} having count(*) > 1)"
            ),
        )
        .await
        .map_err(exec)?;
        let n = first_value(&total);
        return Err(Error::Output {
            path: job.path.clone(),
            message: format!(
                "has {n} duplicate merge keys ({}): a merge needs one row per key. \
                 Deduplicate in the SQL, or give the source `dedupe = {{ key = [...], latest_by = \"...\" }}`. \
                 The most repeated:\n{}",
                job.target.key.join(", "),
                pretty(&dups)
            ),
        });
    }
    Ok(())
}

/// The changes, as the merged output's last input: a stream that gives each batch up
/// as it goes. Executed once; a second execution is an error, never an empty change
/// set.
#[derive(Debug)]
pub(super) struct ChangesOnce {
    schema: SchemaRef,
    batches: std::sync::Mutex<Option<Vec<RecordBatch>>>,
    /// Where each batch is recorded as rows put in, when the digest is derived.
    pub(super) added: Option<Arc<Difference>>,
}

impl ChangesOnce {
    pub(super) fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self {
            schema,
            batches: std::sync::Mutex::new(Some(batches)),
            added: None,
        }
    }
}

impl PartitionStream for ChangesOnce {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches = self.batches.lock().expect("changes lock").take();
        let added = self.added.clone();
        let stream = match batches {
            Some(batches) => futures::stream::iter(batches.into_iter().map(move |b| {
                if let Some(rows) = &added {
                    rows.add(digest_batch(&b));
                }
                Ok(b)
            }))
            .left_stream(),
            None => futures::stream::once(async {
                Err(datafusion::error::DataFusionError::Internal(
                    "a merge's changes were read twice".into(),
                ))
            })
            .right_stream(),
        };
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        ))
    }
}

/// Whether every row of the changes has a key without NULLs that no other row has,
/// by sorting the keys in the row format: a single-column key's sort is the probe's,
/// a longer key's rows are sorted here. Only for keys whose equality is bytewise in
/// that format (not floats, where `-0.0 = 0.0`); `false` means "not shown", and the
/// caller asks the query engine.
pub(super) fn keys_unique_and_present(
    probe: &KeyProbe,
    batches: &[RecordBatch],
    schema: &Schema,
    key: &[String],
) -> arrow::error::Result<bool> {
    if let [single] = probe.columns.as_slice() {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        return Ok(single.values.num_rows() == rows && single.distinct());
    }
    let indices = key
        .iter()
        .map(|k| schema.index_of(k))
        .collect::<arrow::error::Result<Vec<_>>>()?;
    if indices
        .iter()
        .any(|&i| !equal_iff_same_bytes(schema.field(i).data_type()))
    {
        return Ok(false);
    }
    let converter = RowConverter::new(
        indices
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )?;
    let mut rows = converter.empty_rows(0, 0);
    for b in batches {
        let columns: Vec<ArrayRef> = indices.iter().map(|&i| Arc::clone(b.column(i))).collect();
        if columns.iter().any(|c| c.null_count() > 0) {
            return Ok(false);
        }
        converter.append(&mut rows, &columns)?;
    }
    let mut sorted: Vec<Row<'_>> = rows.iter().collect();
    sorted.sort_unstable();
    Ok(sorted.windows(2).all(|w| w[0] != w[1]))
}
