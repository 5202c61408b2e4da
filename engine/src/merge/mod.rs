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
//! Pruning: a file of the table is read only if the Parquet min/max statistics of its
//! key columns admit a key of the changes. In an affected partition, the other files
//! hold no changed key and are kept as they are (hard-linked into the new partition,
//! their bytes untouched); the partition's new manifest lists them with their digest
//! sums, so its digest is computed without reading them.
//!
//! The output (the changes) is held in memory until it is written (a single integer
//! key: as a bitmap of the changed keys while the table streams through); NULL and
//! duplicate keys in it are errors, never silently dropped rows.

mod changes;
mod digest;
mod keys;
mod prune;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::ScalarUDF;
use idem_io::commit::{CommitBackend, Version, WritesGuard};
use idem_io::digest::Difference;
use idem_io::hive::PartitionPath;
use idem_io::writer::KeptFile;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::route::Router;
use crate::sql::ident;
use changes::{Changes, ChangesOnce, refuse_bad_keys};
use digest::rewritten_sum;
use keys::{CHANGED_KEY, ChangedKeys, DROPPED_ROWS, KeyTest};
use prune::{LivePartition, affected_partitions, files_frame, probe_live_files};
#[cfg(test)]
use {changes::keys_unique_and_present, keys::equal_iff_same_bytes, prune::KeyProbe};

pub struct MergePlan {
    /// The new content of every affected partition, less the files it keeps.
    pub df: DataFrame,
    /// Every partition the merge rewrites (one that ends with no rows is emptied).
    pub affected: Vec<PartitionPath>,
    /// Per affected partition: the live files carried over unchanged, and the
    /// generation of the new manifest.
    pub kept: BTreeMap<PartitionPath, (Vec<KeptFile>, u64)>,
    pub stats: MergeStats,
    /// The table's write lock, held until the merge is published.
    pub lock: Option<WritesGuard>,
    /// Per affected partition, the version it must still have at publish: the fence
    /// against any other writer that published since the merge read it (a replace
    /// run, which takes no write lock, or a merge whose lock lease expired).
    pub versions: BTreeMap<PartitionPath, Option<Version>>,
    /// The source files the changes were computed from.
    pub inputs: Vec<idem_io::manifest::InputFile>,
    /// Per partition whose new rows' digest the merge derives (see `KeyTest`): the
    /// rows it takes out of the files it rewrites and puts in.
    pub derived: BTreeMap<PartitionPath, Arc<Difference>>,
}

/// What the merge read and what it left alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MergeStats {
    /// Rows of the output (the changes).
    pub changes: u64,
    /// Data files of the live table.
    pub table_files: usize,
    /// Files read at all: those whose key statistics (or partition values) admit a
    /// changed key, and every file of a partition rewritten whole.
    pub files_read: usize,
    /// Files of affected partitions carried over without being read or rewritten.
    pub files_kept: usize,
    /// Whether the new digest was derived from the sums of the files read, hashing only
    /// the rows dropped and added (see `KeyTest`), not every row written.
    pub digest_derived: bool,
}

/// `owned` are the partitions whose rows `delete_missing` syncs (empty without it):
/// they are rewritten whole.
pub async fn prepare(
    job: &Job,
    ctx: &SessionContext,
    output_df: DataFrame,
    output: &SchemaRef,
    table: &Arc<dyn CommitBackend>,
    scope: Option<&str>,
    owned: &[PartitionPath],
) -> Result<MergePlan> {
    let exec = |e| Error::execution(&job.path, "merge: ", e);
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let lock = {
        let table = Arc::clone(table);
        crate::blocking(move || table.lock_writes())
            .await
            .map_err(storage)?
    };
    let local = table.keeps_files();
    if !local {
        // The table's files are read from its object store.
        let url = job.target.path.to_string_lossy();
        let store = idem_io::store::object_store(&url, &job.storage).map_err(storage)?;
        let base = datafusion::datasource::listing::ListingTableUrl::parse(url.as_ref())
            .map_err(exec)?
            .object_store();
        ctx.register_object_store(base.as_ref(), store);
    }

    let changes = Changes::compute(job, ctx, output_df, output).await?;
    let files = probe_live_files(job, table, &changes.probe, local).await?;
    // The merged output's copy of the changes is handed out once, so each batch is
    // freed once written; the table registered here serves the queries of `prepare`
    // (and the join, which keeps its own reference).
    let mut changes_once = ChangesOnce::new(Arc::clone(output), changes.batches.clone());
    let registered = MemTable::try_new(Arc::clone(output), vec![changes.batches]).map_err(exec)?;
    ctx.register_table("__idem_changes", Arc::new(registered))
        .map_err(exec)?;
    // The change set is in memory already: joins against it build its hash table once
    // and probe every partition of the table against it, instead of hash-partitioning
    // the whole table to match.
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        let optimizer = &mut state.config_mut().options_mut().optimizer;
        optimizer.hash_join_single_partition_threshold = usize::MAX;
        optimizer.hash_join_single_partition_threshold_rows = usize::MAX;
    }
    if !changes.clean {
        refuse_bad_keys(job, ctx).await?;
    }

    let router = Router::new(output, &job.target.partition_by);
    let mut stats = MergeStats {
        changes: changes.rows as u64,
        table_files: files.iter().map(|p| p.files.len()).sum(),
        ..Default::default()
    };
    let (semi_join, anti_join) = key_joins(job, ctx, changes.keys.as_ref());
    let affected =
        affected_partitions(job, ctx, output, &router, &files, owned, &semi_join).await?;
    let Split { read, kept } = split_files(&files, &affected, local, owned);
    stats.files_kept = kept.values().map(|(keep, _)| keep.len()).sum();
    // Files read at all: to find where changed keys live, or to rewrite.
    stats.files_read = files
        .iter()
        .flat_map(|p| p.files.iter())
        .filter(|f| f.may_match)
        .map(|f| &f.path)
        .chain(read.iter().flat_map(|(_, r)| r.iter()))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    // The new rows' digest is derived rather than hashed when the merge can tell the
    // rows it drops: an unpartitioned table tested by the bitmap, whose files read all
    // carry sums of the same schema.
    let derived = match (
        &changes.keys,
        job.target.partition_by.is_empty() && scope.is_none() && owned.is_empty(),
    ) {
        (Some(keys), true) => rewritten_sum(&files, &read, output, local)
            .map(|sum| (Arc::clone(keys), Arc::new(Difference::new(sum)))),
        _ => None,
    };
    stats.digest_derived = derived.is_some();
    let anti_join = match &derived {
        Some((keys, rows)) => {
            let test = KeyTest::dropped_rows(
                Arc::clone(keys),
                Arc::clone(rows),
                output,
                &job.target.key[0],
            )
            .map_err(|e| exec(e.into()))?;
            ctx.register_udf(ScalarUDF::new_from_impl(test));
            format!(
                "where not {DROPPED_ROWS}({})",
                columns_of(output, "t.").join(", ")
            )
        }
        None => anti_join,
    };
    let target = files_frame(ctx, &read, output, router.data_schema())
        .await
        .map_err(exec)?;
    ctx.register_table("__idem_target", target.into_view())
        .map_err(exec)?;
    changes_once.added = derived.as_ref().map(|(_, rows)| Arc::clone(rows));
    let df = merged(ctx, output, &anti_join, scope, changes_once)
        .await
        .map_err(exec)?;
    ctx.deregister_table("__idem_changes").map_err(exec)?;
    let versions = affected
        .iter()
        .map(|p| {
            let v = files
                .iter()
                .find(|f| &f.path == p)
                .and_then(|f| f.version.clone());
            (p.clone(), v)
        })
        .collect();
    Ok(MergePlan {
        df,
        affected,
        kept,
        stats,
        lock: Some(lock),
        versions,
        inputs: changes.inputs,
        derived: derived
            .map(|(_, rows)| (PartitionPath::root(), rows))
            .into_iter()
            .collect(),
    })
}

/// The new content of the affected partitions: the rows read (`__idem_target t`)
/// that `anti_join` keeps — outside `scope`, for `delete_missing` — plus every row
/// of the changes.
async fn merged(
    ctx: &SessionContext,
    output: &SchemaRef,
    anti_join: &str,
    scope: Option<&str>,
    changes_once: ChangesOnce,
) -> datafusion::error::Result<DataFrame> {
    let kept_rows = format!(
        "select {t} from __idem_target t {anti_join}",
        t = columns_of(output, "t.").join(", ")
    );
    // delete_missing: rows in the run's own scope are replaced by the output outright.
    let kept_rows = match scope {
        Some(scope) => format!("select * from ({kept_rows}) t where not coalesce({scope}, false)"),
        None => kept_rows,
    };
    let once = StreamingTable::try_new(Arc::clone(output), vec![Arc::new(changes_once)])?;
    ctx.register_table("__idem_changes_once", Arc::new(once))?;
    let merged = format!(
        "{kept_rows} union all select {} from __idem_changes_once",
        columns_of(output, "").join(", ")
    );
    ctx.sql(&merged).await
}

/// How a row of the table `t` is told to hold a changed key (a semi join) or not (an
/// anti join): by the key set's bit test, or by a join against the changes `c`.
fn key_joins(job: &Job, ctx: &SessionContext, keys: Option<&Arc<ChangedKeys>>) -> (String, String) {
    match keys {
        Some(keys) => {
            let test = format!("{CHANGED_KEY}(t.{})", ident(&job.target.key[0]));
            ctx.register_udf(ScalarUDF::new_from_impl(KeyTest::changed_key(Arc::clone(
                keys,
            ))));
            (format!("where {test}"), format!("where not {test}"))
        }
        None => {
            let on = job
                .target
                .key
                .iter()
                .map(|k| format!("t.{0} = c.{0}", ident(k)))
                .collect::<Vec<_>>()
                .join(" and ");
            (
                format!("left semi join __idem_changes c on {on}"),
                format!("left anti join __idem_changes c on {on}"),
            )
        }
    }
}

/// Per affected live partition: the files read and rewritten, and those kept.
struct Split {
    read: Vec<(PartitionPath, Vec<PathBuf>)>,
    /// The live files carried over unchanged, and the new manifest's generation.
    kept: BTreeMap<PartitionPath, (Vec<KeptFile>, u64)>,
}

/// The files that may hold a changed key are read and rewritten without the changed
/// rows; the others are kept (by hard link: on local disk only). A partition idem did
/// not write, or one `delete_missing` syncs (`owned`), is rewritten whole.
fn split_files(
    files: &[LivePartition],
    affected: &[PartitionPath],
    local: bool,
    owned: &[PartitionPath],
) -> Split {
    let mut read = Vec::new();
    let mut kept = BTreeMap::new();
    for p in files {
        if affected.binary_search(&p.path).is_err() {
            continue;
        }
        let keepable = local && p.manifest.is_some() && !owned.contains(&p.path);
        let mut keep = Vec::new();
        let mut rewrite = Vec::new();
        for f in &p.files {
            match (&f.entry, keepable && !f.may_match) {
                (Some(entry), true) if entry.sum.is_some() => {
                    // A zero-row file (a manifest carrier) holds nothing to keep.
                    if entry.rows > 0 {
                        keep.push(KeptFile {
                            path: f.path.clone(),
                            entry: entry.clone(),
                        });
                    }
                }
                _ => rewrite.push(f.path.clone()),
            }
        }
        if !rewrite.is_empty() {
            read.push((p.path.clone(), rewrite));
        }
        if !keep.is_empty() {
            let generation = p.manifest.as_ref().map_or(0, |m| m.generation) + 1;
            kept.insert(p.path.clone(), (keep, generation));
        }
    }
    Split { read, kept }
}

/// The table's columns, each prefixed (`t.`).
fn columns_of(schema: &Schema, prefix: &str) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| format!("{prefix}{}", ident(f.name())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type};
    use datafusion::execution::TaskContext;
    use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs};
    use datafusion::physical_plan::streaming::PartitionStream;

    fn changes(ids: Vec<Option<i64>>, names: Vec<&str>) -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, false),
        ]));
        let half = ids.len() / 2;
        let batch = |ids: &[Option<i64>], names: &[&str]| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(ids.to_vec())),
                    Arc::new(StringArray::from(names.to_vec())),
                ],
            )
            .unwrap()
        };
        // Split in two batches, so a repeat across batches must be seen too.
        let batches = vec![
            batch(&ids[..half], &names[..half]),
            batch(&ids[half..], &names[half..]),
        ];
        (schema, batches)
    }

    /// What the fast check of `prepare` concludes for `key`.
    fn clean(schema: &SchemaRef, batches: &[RecordBatch], key: &[&str]) -> bool {
        let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
        let probe = KeyProbe::new(batches, schema, &key, None).unwrap();
        keys_unique_and_present(&probe, batches, schema, &key).unwrap()
    }

    #[test]
    fn clean_change_sets_are_told_from_repeated_or_null_keys() {
        let (s, b) = changes(
            vec![Some(3), Some(1), Some(2), Some(4)],
            vec!["a", "b", "a", "b"],
        );
        assert!(clean(&s, &b, &["id"]));
        assert!(!clean(&s, &b, &["name"]));
        assert!(clean(&s, &b, &["id", "name"]));
        let (s, b) = changes(
            vec![Some(1), Some(2), Some(1), Some(4)],
            vec!["a", "b", "c", "d"],
        );
        assert!(!clean(&s, &b, &["id"]));
        assert!(clean(&s, &b, &["id", "name"]));
        let (s, b) = changes(
            vec![Some(1), Some(2), Some(1), Some(4)],
            vec!["a", "b", "a", "d"],
        );
        assert!(!clean(&s, &b, &["name", "id"]));
        let (s, b) = changes(
            vec![Some(1), None, Some(3), Some(4)],
            vec!["a", "b", "c", "d"],
        );
        assert!(!clean(&s, &b, &["id"]));
        assert!(!clean(&s, &b, &["id", "name"]));
    }

    /// What `__idem_changed_key` answers for `ids` against the change set `changed`
    /// (or `None`: the keys are left to the join).
    fn changed_key(changed: Vec<Option<i64>>, ids: Vec<Option<i64>>) -> Option<Vec<bool>> {
        let names = vec!["x"; changed.len()];
        let (schema, batches) = changes(changed, names);
        let keys = ChangedKeys::new(&batches, &schema, &["id".to_string()]).unwrap()?;
        let udf = ScalarUDF::new_from_impl(KeyTest::changed_key(Arc::new(keys)));
        let rows = ids.len();
        let args = ScalarFunctionArgs {
            args: vec![ColumnarValue::Array(Arc::new(Int64Array::from(ids)))],
            arg_fields: vec![Arc::new(Field::new("id", DataType::Int64, true))],
            number_rows: rows,
            return_field: Arc::new(Field::new("hit", DataType::Boolean, false)),
            config_options: Arc::new(Default::default()),
        };
        let out = udf.invoke_with_args(args).unwrap().to_array(rows).unwrap();
        Some(out.as_boolean().iter().map(|b| b.unwrap()).collect())
    }

    #[test]
    fn changed_keys_are_a_bit_per_value_of_their_range() {
        // Negative keys, a NULL among the changes, keys just outside the range, and a
        // NULL key in the table (which matches nothing).
        assert_eq!(
            changed_key(
                vec![Some(-3), Some(5), None, Some(64), Some(0)],
                vec![
                    Some(-4),
                    Some(-3),
                    Some(0),
                    Some(1),
                    Some(63),
                    Some(64),
                    Some(65),
                    None,
                    Some(i64::MIN),
                    Some(i64::MAX)
                ],
            ),
            Some(vec![
                false, true, true, false, false, true, false, false, false, false
            ])
        );
        // Sparse keys (a span of more than 64 bits per key) are joined instead.
        assert_eq!(
            changed_key(vec![Some(1), Some(1 << 40)], vec![Some(1)]),
            None
        );
        assert_eq!(
            changed_key(vec![Some(i64::MIN), Some(i64::MAX)], vec![]),
            None
        );
        assert_eq!(changed_key(vec![None, None], vec![]), None);
        // The bitmap also tells a clean change set, and gives its keys sorted.
        let keys = |ids: Vec<Option<i64>>| {
            let names = vec!["x"; ids.len()];
            let (schema, batches) = changes(ids, names);
            let keys = ChangedKeys::new(&batches, &schema, &["id".to_string()])
                .unwrap()
                .unwrap();
            let sorted = keys.sorted(&schema, "id").unwrap();
            let sorted: Vec<i64> = sorted.as_primitive::<Int64Type>().values().to_vec();
            (keys.unique_and_present, sorted)
        };
        assert_eq!(
            keys(vec![Some(5), Some(-3), Some(64), Some(0)]),
            (true, vec![-3, 0, 5, 64])
        );
        assert_eq!(
            keys(vec![Some(5), Some(1), Some(5), Some(2)]),
            (false, vec![1, 2, 5])
        );
        assert_eq!(
            keys(vec![Some(5), None, Some(2), Some(3)]),
            (false, vec![2, 3, 5])
        );
        // Only a single integer column qualifies.
        let (schema, batches) = changes(vec![Some(1), Some(2)], vec!["a", "b"]);
        let of = |key: &[&str]| {
            let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
            ChangedKeys::new(&batches, &schema, &key).unwrap().is_some()
        };
        assert!(of(&["id"]));
        assert!(!of(&["name"]));
        assert!(!of(&["id", "name"]));
    }

    #[tokio::test]
    async fn changes_are_streamed_once_and_a_second_read_is_an_error() {
        use futures::TryStreamExt;
        let (schema, batches) = changes(vec![Some(1), Some(2)], vec!["a", "b"]);
        let once = ChangesOnce::new(schema, batches.clone());
        let ctx = Arc::new(TaskContext::default());
        let first: Vec<RecordBatch> = once.execute(Arc::clone(&ctx)).try_collect().await.unwrap();
        assert_eq!(first, batches);
        let second: datafusion::error::Result<Vec<RecordBatch>> =
            once.execute(ctx).try_collect().await;
        assert!(second.unwrap_err().to_string().contains("read twice"));
    }

    #[test]
    fn float_keys_are_left_to_the_query() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Float64Array::from(vec![0.0, -0.0]))],
        )
        .unwrap();
        assert!(!clean(&schema, std::slice::from_ref(&batch), &["x"]));
        let two = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("x", DataType::Float64, false),
                Field::new("y", DataType::Float64, false),
            ])),
            vec![Arc::clone(batch.column(0)), Arc::clone(batch.column(0))],
        )
        .unwrap();
        assert!(!clean(&two.schema(), &[two], &["x", "y"]));
        let dict = |v: DataType| DataType::Dictionary(Box::new(DataType::Int32), Box::new(v));
        assert!(!equal_iff_same_bytes(&dict(DataType::Float32)));
        assert!(equal_iff_same_bytes(&dict(DataType::Utf8)));
    }
}
