//! `mode = "merge"`: upsert the job's output into the table by key.
//!
//! A matched key takes the output row's values, a new key is inserted, every other row
//! of the table is kept. The partitions affected — those the output's rows go to, and
//! those holding a key the output carries (a key may move partition) — are rewritten
//! copy-on-write and published by the same atomic swap as any run; an unpartitioned
//! table is rewritten and swapped whole. Writers of one table are serialized by a lock,
//! so two concurrent merges both land. Re-running a merge with the same output leaves
//! every digest equal: `unchanged`, nothing written.
//!
//! With `delete_missing = true`, the run's own window (its time column's partitions
//! inside `[run_start, run_end)`, or the whole of an unpartitioned table) is synced:
//! rows there whose key the output lacks are deleted.
//!
//! The output (the changes) is held in memory while the table streams through; NULL
//! and duplicate keys in it are errors, never silently dropped rows.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::execution::context::SessionContext;
use idem_io::commit::local::LocalTable;
use idem_io::hive::PartitionPath;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::route::Router;
use crate::sql::{first_value, ident, pretty};

pub struct MergePlan {
    /// The new content of every affected partition.
    pub df: DataFrame,
    /// Every partition the merge rewrites (one that ends with no rows is emptied).
    pub affected: Vec<PartitionPath>,
    /// Held until the merge is published.
    pub lock: std::fs::File,
    /// The source files the changes were computed from.
    pub inputs: Vec<idem_io::manifest::InputFile>,
}

pub async fn prepare(
    job: &Job,
    ctx: &SessionContext,
    output_df: DataFrame,
    output: &SchemaRef,
    table: &LocalTable,
    scope: Option<&str>,
) -> Result<MergePlan> {
    let exec = |e: datafusion::error::DataFusionError| Error::Execution {
        path: job.path.clone(),
        message: format!("merge: {e}"),
    };
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let lock = table.lock_writes().map_err(storage)?;

    // The changes, computed once (and the files they came from, for the manifest).
    let plan = output_df.create_physical_plan().await.map_err(exec)?;
    let inputs = crate::session::inputs_of(&plan, job);
    let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
        .await
        .map_err(exec)?;
    let changes = MemTable::try_new(Arc::clone(output), vec![batches]).map_err(exec)?;
    ctx.register_table("__idem_changes", Arc::new(changes))
        .map_err(exec)?;

    let key: Vec<String> = job.target.key.iter().map(|k| ident(k)).collect();
    let key_list = key.join(", ");
    let any_null = key
        .iter()
        .map(|k| format!("{k} is null"))
        .collect::<Vec<_>>()
        .join(" or ");
    let sql = |q: String| async move {
        ctx.sql(&q)
            .await
            .map_err(exec)?
            .collect()
            .await
            .map_err(exec)
    };
    let nulls = sql(format!(
        "select * from __idem_changes where {any_null} limit 5"
    ))
    .await?;
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
    let dups = sql(format!(
        "select {key_list}, count(*) as copies from __idem_changes group by {key_list} \
         having count(*) > 1 order by copies desc, {key_list} limit 5"
    ))
    .await?;
    if dups.iter().any(|b| b.num_rows() > 0) {
        let total = sql(format!(
            "select count(*) from (select {key_list} from __idem_changes group by {key_list} having count(*) > 1)"
        ))
        .await?;
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

    let partition_by = &job.target.partition_by;
    let columns: Vec<String> = output.fields().iter().map(|f| ident(f.name())).collect();
    let t_columns: Vec<String> = columns.iter().map(|c| format!("t.{c}")).collect();
    // The table root holds nothing but partition directories and Parquet files: the
    // table exists once it holds anything.
    let has_target = std::fs::read_dir(table.root())
        .map(|mut rd| rd.next().is_some())
        .unwrap_or(false);
    let router = Router::new(output, partition_by);
    let key_match = job
        .target
        .key
        .iter()
        .map(|k| format!("t.{0} = c.{0}", ident(k)))
        .collect::<Vec<_>>()
        .join(" and ");

    if has_target {
        let partition_cols = partition_by
            .iter()
            .map(|c| {
                let dt = output
                    .field_with_name(c)
                    .expect("validated")
                    .data_type()
                    .clone();
                (c.clone(), dt)
            })
            .collect();
        let url = ListingTableUrl::parse(format!("{}/", table.root().display())).map_err(exec)?;
        let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
            .with_file_extension(".parquet")
            .with_table_partition_cols(partition_cols);
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .with_schema(Arc::clone(router.data_schema()));
        let target = ListingTable::try_new(config).map_err(exec)?;
        ctx.register_table("__idem_target", Arc::new(target))
            .map_err(exec)?;
    } else {
        ctx.sql("create view __idem_target as select * from __idem_changes where false")
            .await
            .map_err(exec)?;
    }

    let mut affected: Vec<PartitionPath> = vec![PartitionPath::root()];

    // The new content: the affected partitions' rows whose key the changes do not carry,
    // plus every row of the changes.
    let kept =
        if partition_by.is_empty() {
            format!(
                "select {t} from __idem_target t left anti join __idem_changes c on {key_match}",
                t = t_columns.join(", ")
            )
        } else {
            let aff_batches = sql(format!(
            "select distinct {} from __idem_changes union select distinct {} from __idem_target t \
             left semi join __idem_changes c on {key_match}",
            partition_by.iter().map(|c| ident(c)).collect::<Vec<_>>().join(", "),
            partition_by.iter().map(|c| format!("t.{}", ident(c))).collect::<Vec<_>>().join(", "),
        ))
        .await?;
            let schema = aff_batches.first().map(|b| b.schema()).unwrap_or_else(|| {
                Arc::new(
                    output
                        .project(
                            &partition_by
                                .iter()
                                .map(|c| output.index_of(c).expect("validated"))
                                .collect::<Vec<_>>(),
                        )
                        .expect("project"),
                )
            });
            affected.clear();
            for b in &aff_batches {
                affected.extend(router.paths_of(b).map_err(|e| exec(e.into()))?);
            }
            affected.sort();
            affected.dedup();
            let aff = MemTable::try_new(schema, vec![aff_batches]).map_err(exec)?;
            ctx.register_table("__idem_affected", Arc::new(aff))
                .map_err(exec)?;
            let on = partition_by
                .iter()
                .map(|c| format!("t.{0} is not distinct from a.{0}", ident(c)))
                .collect::<Vec<_>>()
                .join(" and ");
            format!(
                "select {t} from __idem_target t left semi join __idem_affected a on {on} \
             left anti join __idem_changes c on {key_match}",
                t = t_columns.join(", ")
            )
        };
    // delete_missing: rows in the run's own scope are replaced by the output outright.
    let kept = match scope {
        Some(scope) => format!("select * from ({kept}) t where not coalesce({scope}, false)"),
        None => kept,
    };
    let merged = format!(
        "{kept} union all select {} from __idem_changes",
        columns.join(", ")
    );
    let df = ctx.sql(&merged).await.map_err(exec)?;
    Ok(MergePlan {
        df,
        affected,
        lock,
        inputs,
    })
}
