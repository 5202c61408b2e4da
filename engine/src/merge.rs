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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef};
use arrow::row::{Row, RowConverter, Rows, SortField};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::Column;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::execution::context::SessionContext;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;
use idem_io::commit::{CommitBackend, Guard, Version};
use idem_io::digest::{Difference, DigestState, digest_batch, digest_columns};
use idem_io::hive::PartitionPath;
use idem_io::manifest::{LiveState, Manifest};
use idem_io::writer::KeptFile;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::file::metadata::ParquetMetaDataReader;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::route::Router;
use crate::sql::{first_value, ident, pretty};

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
    pub lock: Option<Guard>,
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
#[allow(clippy::too_many_arguments)]
pub async fn prepare(
    job: &Job,
    ctx: &SessionContext,
    output_df: DataFrame,
    output: &SchemaRef,
    table: &Arc<dyn CommitBackend>,
    scope: Option<&str>,
    owned: &[PartitionPath],
) -> Result<MergePlan> {
    let exec = |e: datafusion::error::DataFusionError| Error::Execution {
        path: job.path.clone(),
        message: format!("merge: {e}"),
    };
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
    let local = table.as_local().is_some();
    if !local {
        // The table's files are read from its object store.
        let url = job.target.path.to_string_lossy();
        let store = idem_io::store::object_store(&url, &job.storage).map_err(storage)?;
        let base = datafusion::datasource::listing::ListingTableUrl::parse(url.as_ref())
            .map_err(exec)?
            .object_store();
        ctx.register_object_store(base.as_ref(), store);
    }

    // The changes, computed once (and the files they came from, for the manifest).
    let plan = output_df.create_physical_plan().await.map_err(exec)?;
    let inputs = crate::session::inputs_of(&plan, job);
    let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
        .await
        .map_err(exec)?;
    let change_rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    // The changed keys, sorted per column: to prune the table's files by statistics,
    // and to show that most change sets are clean (only one that may not be is
    // queried for the NULL or repeated keys that explain why).
    // A single integer key whose changed values are dense enough is also a bitmap: the
    // anti join becomes a bit test per row of the table (see `ChangedKeys`), and the
    // bitmap gives the sorted keys and their check without a sort.
    let changed_keys =
        ChangedKeys::new(&batches, output, &job.target.key).map_err(|e| exec(e.into()))?;
    let sorted = changed_keys
        .as_ref()
        .map(|k| k.sorted(output, &job.target.key[0]));
    let sorted = sorted.transpose().map_err(|e| exec(e.into()))?;
    let probe =
        KeyProbe::new(&batches, output, &job.target.key, sorted).map_err(|e| exec(e.into()))?;
    let clean = match &changed_keys {
        Some(keys) => keys.unique_and_present,
        None => keys_unique_and_present(&probe, &batches, output, &job.target.key)
            .map_err(|e| exec(e.into()))?,
    };
    let changed_keys = changed_keys.filter(|_| clean).map(Arc::new);
    // The live files, each tested against the changes' keys (when there are any).
    let mut files = {
        let (table, depth) = (Arc::clone(table), job.target.partition_by.len());
        crate::blocking(move || {
            let files = live_files(table.as_ref(), depth)?;
            idem_io::failpoint::hit("merge_read")?;
            Ok(files)
        })
        .await
        .map_err(storage)?
    };
    if files.iter().any(|p| !p.files.is_empty()) {
        for p in files.iter_mut() {
            if !probe.partition_may_match(&p.path) {
                continue; // every file stays `may_match = false`
            }
            for f in p.files.iter_mut() {
                // Footers are read on local disk; an object store's files are all read.
                // A file gone since the listing was replaced by a newer version of its
                // partition: the merge is computed again on top of it.
                f.may_match = !local
                    || match probe.may_match(&f.path) {
                        Ok(may) => may,
                        Err(idem_io::Error::Io { source, .. })
                            if source.kind() == std::io::ErrorKind::NotFound =>
                        {
                            return Err(storage(idem_io::Error::Conflict {
                                partition: p.path.to_string(),
                            }));
                        }
                        Err(e) => return Err(storage(e)),
                    };
            }
        }
    }
    // The merged output's copy of the changes is handed out once, so each batch is
    // freed once written; the table registered here serves the queries of `prepare`
    // (and the join, which keeps its own reference).
    let mut changes_once = ChangesOnce {
        schema: Arc::clone(output),
        batches: std::sync::Mutex::new(Some(batches.clone())),
        added: None,
    };
    let changes = MemTable::try_new(Arc::clone(output), vec![batches]).map_err(exec)?;
    ctx.register_table("__idem_changes", Arc::new(changes))
        .map_err(exec)?;
    // The change set is in memory already: joins against it build its hash table once
    // and probe every partition of the table against it, instead of hash-partitioning
    // the whole table to match (W4: 10% less CPU, 8% less time).
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        let optimizer = &mut state.config_mut().options_mut().optimizer;
        optimizer.hash_join_single_partition_threshold = usize::MAX;
        optimizer.hash_join_single_partition_threshold_rows = usize::MAX;
    }

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
    let nulls = if clean {
        Vec::new()
    } else {
        sql(format!(
            "select * from __idem_changes where {any_null} limit 5"
        ))
        .await?
    };
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
    let dups = if clean {
        Vec::new()
    } else {
        sql(format!(
            "select {key_list}, count(*) as copies from __idem_changes group by {key_list} \
             having count(*) > 1 order by copies desc, {key_list} limit 5"
        ))
        .await?
    };
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
    let router = Router::new(output, partition_by);
    let mut stats = MergeStats {
        changes: change_rows as u64,
        table_files: files.iter().map(|p| p.files.len()).sum(),
        ..Default::default()
    };
    // How a row of the table `t` is told to hold a changed key: by the key set's bit
    // test, or by a join against the changes `c`.
    let (semi_join, anti_join) = match &changed_keys {
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
    };

    // The affected partitions: those the changes go to, and those where a file that may
    // hold a changed key does hold one (the key moves partition, or its row is updated).
    let mut affected: Vec<PartitionPath> = owned.to_vec();
    if partition_by.is_empty() {
        affected.push(PartitionPath::root());
    } else {
        let columns = |prefix: &str| {
            partition_by
                .iter()
                .map(|c| format!("{prefix}{}", ident(c)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut found = sql(format!(
            "select distinct {} from __idem_changes",
            columns("")
        ))
        .await?;
        let candidates: Vec<(PartitionPath, Vec<PathBuf>)> = files
            .iter()
            .map(|p| {
                let may: Vec<PathBuf> = p
                    .files
                    .iter()
                    .filter(|f| f.may_match)
                    .map(|f| f.path.clone())
                    .collect();
                (p.path.clone(), may)
            })
            .filter(|(_, may)| !may.is_empty())
            .collect();
        if !candidates.is_empty() {
            let probe = files_frame(ctx, &candidates, output, router.data_schema())
                .await
                .map_err(exec)?;
            ctx.register_table("__idem_probe", probe.into_view())
                .map_err(exec)?;
            found.extend(
                sql(format!(
                    "select distinct {} from __idem_probe t {semi_join}",
                    columns("t.")
                ))
                .await?,
            );
        }
        for b in &found {
            affected.extend(router.paths_of(b).map_err(|e| exec(e.into()))?);
        }
    }
    affected.sort();
    affected.dedup();

    // Per affected live partition: the files that may hold a changed key are read and
    // rewritten without the changed rows; the others are kept. A partition idem did
    // not write, or one delete_missing syncs, is rewritten whole.
    let mut read: Vec<(PartitionPath, Vec<PathBuf>)> = Vec::new();
    let mut kept = BTreeMap::new();
    for p in &files {
        if affected.binary_search(&p.path).is_err() {
            continue;
        }
        // Files are kept by hard link, on local disk only.
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
        stats.files_kept += keep.len();
        if !rewrite.is_empty() {
            read.push((p.path.clone(), rewrite));
        }
        if !keep.is_empty() {
            let generation = p.manifest.as_ref().map_or(0, |m| m.generation) + 1;
            kept.insert(p.path.clone(), (keep, generation));
        }
    }
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
        &changed_keys,
        partition_by.is_empty() && scope.is_none() && owned.is_empty(),
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

    // The new content: the rows read whose key the changes do not carry, plus every row
    // of the changes.
    let columns = columns_of(output, "");
    let t_columns = columns_of(output, "t.");
    let kept_rows = format!(
        "select {t} from __idem_target t {anti_join}",
        t = t_columns.join(", ")
    );
    // delete_missing: rows in the run's own scope are replaced by the output outright.
    let kept_rows = match scope {
        Some(scope) => format!("select * from ({kept_rows}) t where not coalesce({scope}, false)"),
        None => kept_rows,
    };
    changes_once.added = derived.as_ref().map(|(_, rows)| Arc::clone(rows));
    let once =
        StreamingTable::try_new(Arc::clone(output), vec![Arc::new(changes_once)]).map_err(exec)?;
    ctx.register_table("__idem_changes_once", Arc::new(once))
        .map_err(exec)?;
    let merged = format!(
        "{kept_rows} union all select {} from __idem_changes_once",
        columns.join(", ")
    );
    let df = ctx.sql(&merged).await.map_err(exec)?;
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
        lock,
        versions,
        inputs,
        derived: derived
            .map(|(_, rows)| (PartitionPath::root(), rows))
            .into_iter()
            .collect(),
    })
}

/// The table's columns, each prefixed (`t.`).
fn columns_of(schema: &Schema, prefix: &str) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| format!("{prefix}{}", ident(f.name())))
        .collect()
}

/// The digest state of the unpartitioned table's files the merge rewrites, from their
/// manifest sums; `None` unless every one has a sum and was written with the output's
/// schema, as its footer's manifest says (a row read back then hashes as it did when
/// written; a file kept across a schema change carries its old schema). The footers
/// are read on local disk only: on an object store every row is hashed.
fn rewritten_sum(
    files: &[LivePartition],
    read: &[(PartitionPath, Vec<PathBuf>)],
    output: &Schema,
    local: bool,
) -> Option<DigestState> {
    if !local {
        return None;
    }
    let [(root, paths)] = read else {
        return None;
    };
    let live = files.iter().find(|p| &p.path == root)?;
    let fingerprint =
        idem_io::manifest::schema_fingerprint(&idem_io::manifest::describe_schema(output, &[]));
    if live.manifest.as_ref()?.schema_fingerprint != fingerprint {
        return None;
    }
    let mut sum = DigestState::default();
    for path in paths {
        let entry = live
            .files
            .iter()
            .find(|f| &f.path == path)?
            .entry
            .as_ref()?;
        let written = idem_io::manifest::read_from_file(path).ok()??;
        if written.schema_fingerprint != fingerprint {
            return None;
        }
        sum.merge(DigestState::from_parts(entry.rows, entry.sum.as_deref()?)?);
    }
    Some(sum)
}

/// The changes, as the merged output's last input: a stream that gives each batch up
/// as it goes (W4: 204 → 181 MiB peak). Executed once; a second execution is an error, never an
/// empty change set.
#[derive(Debug)]
struct ChangesOnce {
    schema: SchemaRef,
    batches: std::sync::Mutex<Option<Vec<RecordBatch>>>,
    /// Where each batch is recorded as rows put in, when the digest is derived.
    added: Option<Arc<Difference>>,
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

/// The name of the merge's test of a key (`KeyTest::changed_key`).
const CHANGED_KEY: &str = "__idem_changed_key";

/// The keys of the changes for a single-column integer key, tested by
/// `__idem_changed_key(k)` (see `KeyTest`). The keys are a bitmap over their range, so each row of
/// the table is tested by one bit instead of probing a hash table built from a copy of
/// the changes (W4: 10% less CPU, median wall 0.89 → 0.77 s over 8 alternating runs).
/// Only built when the range takes at most 64 bits per key, the size of the keys
/// themselves; sparser keys are joined as before. Setting the bits also finds NULL and
/// repeated keys, and reading them back gives the keys sorted, so the statistics probe
/// needs no sort of its own (W4: median wall 0.80 → 0.75 s, 8 alternating runs).
#[derive(Debug)]
struct ChangedKeys {
    /// The key column's type.
    data_type: DataType,
    min: i64,
    /// Bit `v - min` is set for each key `v`.
    bits: Vec<u64>,
    /// Whether no key is NULL or repeated (found while the bits are set).
    unique_and_present: bool,
}

impl ChangedKeys {
    fn new(
        batches: &[RecordBatch],
        schema: &Schema,
        key: &[String],
    ) -> arrow::error::Result<Option<Self>> {
        let [key] = key else { return Ok(None) };
        let data_type = schema.field_with_name(key)?.data_type().clone();
        // The types every value of which is an i64.
        if !matches!(
            data_type,
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
        ) {
            return Ok(None);
        }
        let index = schema.index_of(key)?;
        let columns = batches
            .iter()
            .map(|b| arrow::compute::cast(b.column(index), &DataType::Int64))
            .collect::<arrow::error::Result<Vec<_>>>()?;
        let ints = || columns.iter().map(|c| c.as_primitive::<Int64Type>());
        let (Some(min), Some(max)) = (
            ints().filter_map(arrow::compute::min).min(),
            ints().filter_map(arrow::compute::max).max(),
        ) else {
            return Ok(None);
        };
        let keys: usize = columns.iter().map(|c| c.len() - c.null_count()).sum();
        let span = (max as i128 - min as i128 + 1) as u128;
        if span > (keys as u128 * 64).max(1 << 16) {
            return Ok(None);
        }
        let mut bits = vec![0u64; span.div_ceil(64) as usize];
        let mut unique_and_present = columns.iter().all(|c| c.null_count() == 0);
        for c in ints() {
            for v in c.iter().flatten() {
                let d = v.wrapping_sub(min) as u64;
                let (word, bit) = (&mut bits[(d / 64) as usize], 1 << (d % 64));
                unique_and_present &= *word & bit == 0;
                *word |= bit;
            }
        }
        Ok(Some(Self {
            data_type,
            min,
            bits,
            unique_and_present,
        }))
    }

    /// The distinct keys in ascending order, as the key column's type.
    fn sorted(&self, schema: &Schema, key: &str) -> arrow::error::Result<ArrayRef> {
        let mut keys = Vec::new();
        for (w, &word) in self.bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let bit = word.trailing_zeros() as u64;
                keys.push(self.min.wrapping_add((w as u64 * 64 + bit) as i64));
                word &= word - 1;
            }
        }
        let keys: ArrayRef = Arc::new(arrow::array::Int64Array::from(keys));
        arrow::compute::cast(&keys, schema.field_with_name(key)?.data_type())
    }

    /// Whether each of `keys` is a changed key (never for NULL).
    fn hits(&self, keys: &ArrayRef) -> arrow::error::Result<BooleanArray> {
        let keys = arrow::compute::cast(keys, &DataType::Int64)?;
        let keys = keys.as_primitive::<Int64Type>();
        let values = keys.values();
        let hit = BooleanBuffer::collect_bool(values.len(), |i| self.contains(values[i]));
        let hit = match keys.nulls() {
            Some(valid) => &hit & valid.inner(),
            None => hit,
        };
        Ok(BooleanArray::new(hit, None))
    }

    fn contains(&self, v: i64) -> bool {
        let d = v.wrapping_sub(self.min) as u64;
        usize::try_from(d / 64)
            .ok()
            .and_then(|i| self.bits.get(i))
            .is_some_and(|w| w >> (d % 64) & 1 == 1)
    }
}

/// The name of the merge's test of a row (`KeyTest::dropped_rows`).
const DROPPED_ROWS: &str = "__idem_drop_changed";

/// A UDF over `ChangedKeys`, in one of two forms:
///
/// * `__idem_changed_key(k)`: whether `k` is a changed key (never for NULL);
/// * `__idem_drop_changed(c_0, …, c_n)`, over every column of a row of the table: the
///   same test of its key, and the rows it answers `true` for (the rows the merge
///   drops) are recorded as taken out of the files read. With the changes recorded as
///   put in, that gives the digest of the new rows without hashing the rows kept,
///   which are most (W4: 0.9 M rows hashed instead of 5.1 M; median wall 1.13 → 0.90 s
///   over 6 alternating runs). Volatile: evaluated once per row read, never folded or
///   repeated; the writer checks that the rows it was given are as many as the files'
///   less those dropped plus those added.
#[derive(Debug)]
struct KeyTest {
    name: &'static str,
    signature: Signature,
    keys: Arc<ChangedKeys>,
    /// The key's position among the arguments.
    key: usize,
    /// Where the rows answered `true` are recorded as taken out.
    dropped: Option<Arc<Difference>>,
}

impl KeyTest {
    fn changed_key(keys: Arc<ChangedKeys>) -> Self {
        Self {
            name: CHANGED_KEY,
            signature: Signature::exact(vec![keys.data_type.clone()], Volatility::Immutable),
            keys,
            key: 0,
            dropped: None,
        }
    }

    /// Over the columns of `schema`, whose key column is `key`.
    fn dropped_rows(
        keys: Arc<ChangedKeys>,
        rows: Arc<Difference>,
        schema: &Schema,
        key: &str,
    ) -> arrow::error::Result<Self> {
        let types = schema.fields().iter().map(|f| f.data_type().clone());
        Ok(Self {
            name: DROPPED_ROWS,
            signature: Signature::exact(types.collect(), Volatility::Volatile),
            keys,
            key: schema.index_of(key)?,
            dropped: Some(rows),
        })
    }
}

// One instance per merge: equal only to itself.
impl PartialEq for KeyTest {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for KeyTest {}

impl std::hash::Hash for KeyTest {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.keys.min.hash(state);
    }
}

impl ScalarUDFImpl for KeyTest {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::common::Result<ColumnarValue> {
        let columns = ColumnarValue::values_to_arrays(&args.args)?;
        let hit = self.keys.hits(&columns[self.key])?;
        let dropped = hit.true_count();
        if let Some(rows) = self.dropped.as_ref().filter(|_| dropped > 0) {
            let columns = columns
                .iter()
                .map(|c| arrow::compute::filter(c, &hit))
                .collect::<arrow::error::Result<Vec<_>>>()?;
            rows.remove(digest_columns(&columns, dropped));
        }
        Ok(ColumnarValue::Array(Arc::new(hit)))
    }
}

/// A live partition and its data files, each marked by whether it may hold a changed key.
struct LivePartition {
    path: PartitionPath,
    /// `None` when idem did not write the partition (it is then rewritten whole).
    manifest: Option<Manifest>,
    files: Vec<LiveFile>,
    /// The version read before the files were.
    version: Option<Version>,
}

struct LiveFile {
    path: PathBuf,
    entry: Option<idem_io::manifest::FileEntry>,
    may_match: bool,
}

/// The live partitions and their files (none yet marked as possibly matching).
fn live_files(table: &dyn CommitBackend, depth: usize) -> idem_io::Result<Vec<LivePartition>> {
    let mut out = Vec::new();
    for path in table.live_partitions(depth)? {
        // The version first: a commit after it makes the publish fail, not go stale.
        let version = table.live_version(&path)?;
        let (manifest, names) = match table.live_state(&path)? {
            None => continue,
            Some(LiveState::Managed(m)) => {
                let listed: Vec<String> = m.files.iter().map(|f| f.name.clone()).collect();
                let names = table
                    .read_locations(&path, &listed)?
                    .into_iter()
                    .zip(&m.files)
                    .map(|(at, f)| (PathBuf::from(at), Some(f.clone())))
                    .collect();
                (Some(*m), names)
            }
            Some(LiveState::Foreign { files }) => (
                None,
                files.into_iter().map(|f| (f, None)).collect::<Vec<_>>(),
            ),
            // The commit's files, and Parquet another tool put beside them (as a
            // foreign partition's are read); not files of other commits of idem's.
            Some(LiveState::Unclean { manifest, extra }) => {
                let listed: Vec<String> = manifest.files.iter().map(|f| f.name.clone()).collect();
                let mut names: Vec<(PathBuf, Option<idem_io::manifest::FileEntry>)> = table
                    .read_locations(&path, &listed)?
                    .into_iter()
                    .map(|at| (PathBuf::from(at), None))
                    .collect();
                names.extend(
                    extra
                        .into_iter()
                        .filter(|f| {
                            let name = f.file_name().unwrap_or_default().to_string_lossy();
                            name.ends_with(".parquet")
                                && !idem_io::commit::object::written_by_idem(&name)
                        })
                        .map(|f| (f, None)),
                );
                (None, names)
            }
        };
        let files = names
            .into_iter()
            .map(|(path, entry)| LiveFile {
                path,
                entry,
                may_match: false,
            })
            .collect();
        out.push(LivePartition {
            path,
            manifest,
            files,
            version,
        });
    }
    Ok(out)
}

/// The changes' key values, per key column, sorted, to test a file's min/max
/// statistics against.
struct KeyProbe {
    columns: Vec<ColumnProbe>,
}

struct ColumnProbe {
    name: String,
    data_type: DataType,
    converter: RowConverter,
    /// The non-null values, sorted, in the row format (whose byte order is the
    /// type's order).
    values: Rows,
}

impl KeyProbe {
    /// `sorted`: the first key column's non-null values, sorted, when known already.
    fn new(
        batches: &[RecordBatch],
        schema: &Schema,
        key: &[String],
        mut sorted: Option<ArrayRef>,
    ) -> arrow::error::Result<Self> {
        let mut columns = Vec::with_capacity(key.len());
        for k in key {
            let index = schema.index_of(k)?;
            let data_type = schema.field(index).data_type().clone();
            let values = match sorted.take() {
                Some(values) => values,
                None => {
                    let arrays: Vec<&dyn Array> =
                        batches.iter().map(|b| b.column(index).as_ref()).collect();
                    let all = if arrays.is_empty() {
                        arrow::array::new_empty_array(&data_type)
                    } else {
                        arrow::compute::concat(&arrays)?
                    };
                    let valid = arrow::compute::is_not_null(&all)?;
                    arrow::compute::sort(&arrow::compute::filter(&all, &valid)?, None)?
                }
            };
            let converter = RowConverter::new(vec![SortField::new(data_type.clone())])?;
            let values = converter.convert_columns(&[values])?;
            columns.push(ColumnProbe {
                name: k.clone(),
                data_type,
                converter,
                values,
            });
        }
        Ok(Self { columns })
    }

    /// Whether a partition may hold a key of the changes, by the values of the key
    /// columns that are partition columns (a key of `[dt, id]` matches only in the
    /// changes' `dt` partitions). A NULL value (the default partition) matches nothing.
    fn partition_may_match(&self, p: &PartitionPath) -> bool {
        self.columns.iter().all(|c| match p.value(&c.name) {
            None => true, // not a partition column
            Some(None) => false,
            Some(Some(v)) => {
                let text: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![v]));
                match c.rows_of(&text) {
                    Some((rows, present)) if present[0] => c.any_between(rows.row(0), rows.row(0)),
                    _ => true,
                }
            }
        })
    }

    /// Whether the file may hold a key of the changes: some row group whose min/max
    /// range, in every key column, contains a changed value of that column. A file
    /// without usable statistics may.
    fn may_match(&self, path: &std::path::Path) -> idem_io::Result<bool> {
        if self
            .columns
            .first()
            .is_some_and(|c| c.values.num_rows() == 0)
        {
            return Ok(false);
        }
        let file = idem_io::fs::open(path).map_err(|source| idem_io::Error::Io {
            op: "open",
            path: path.to_path_buf(),
            source,
        })?;
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .map_err(|source| idem_io::Error::ParquetRead {
                path: path.to_path_buf(),
                source,
            })?;
        let groups = meta.row_groups();
        if groups.is_empty() {
            return Ok(false);
        }
        let Ok(arrow_schema) = parquet::arrow::parquet_to_arrow_schema(
            meta.file_metadata().schema_descr(),
            meta.file_metadata().key_value_metadata(),
        ) else {
            return Ok(true);
        };
        let mut admits = vec![true; groups.len()];
        for c in &self.columns {
            if arrow_schema.column_with_name(&c.name).is_none() {
                continue; // a partition column, tested by the partition's value
            }
            let Ok(conv) = StatisticsConverter::try_new(
                &c.name,
                &arrow_schema,
                meta.file_metadata().schema_descr(),
            ) else {
                return Ok(true);
            };
            let (Ok(mins), Ok(maxes)) = (conv.row_group_mins(groups), conv.row_group_maxes(groups))
            else {
                return Ok(true);
            };
            let (Some((mins, min_ok)), Some((maxes, max_ok))) =
                (c.rows_of(&mins), c.rows_of(&maxes))
            else {
                return Ok(true);
            };
            for (g, admit) in admits.iter_mut().enumerate() {
                if !*admit || !min_ok[g] || !max_ok[g] {
                    continue; // no statistics: the group may hold anything
                }
                *admit = c.any_between(mins.row(g), maxes.row(g));
            }
        }
        Ok(admits.into_iter().any(|a| a))
    }
}

impl ColumnProbe {
    /// Statistics values in the probe's row format, and which of them are present;
    /// `None` when they cannot be compared (then the file is read).
    fn rows_of(&self, stats: &ArrayRef) -> Option<(Rows, Vec<bool>)> {
        let stats = arrow::compute::cast(stats, &self.data_type).ok()?;
        let rows = self.converter.convert_columns(&[Arc::clone(&stats)]).ok()?;
        let present = (0..stats.len()).map(|i| stats.is_valid(i)).collect();
        Some((rows, present))
    }

    /// Whether no value repeats (bytewise equality in the row format, which for floats
    /// is not SQL's: `-0.0 = 0.0`, so they never count as distinct here).
    fn distinct(&self) -> bool {
        equal_iff_same_bytes(&self.data_type)
            && (1..self.values.num_rows()).all(|i| self.values.row(i - 1) != self.values.row(i))
    }

    /// Whether some changed value lies in `[min, max]` (a binary search).
    fn any_between(&self, min: Row<'_>, max: Row<'_>) -> bool {
        let (mut lo, mut hi) = (0, self.values.num_rows());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.values.row(mid) < min {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo < self.values.num_rows() && self.values.row(lo) <= max
    }
}

/// Whether two values of type `t` are equal in SQL exactly when their encodings in the
/// row format are: not for floats (`-0.0 = 0.0`), nested or NULL types.
fn equal_iff_same_bytes(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, values) => equal_iff_same_bytes(values),
        t => !t.is_floating() && !t.is_nested() && !t.is_null(),
    }
}

/// Whether every row of the changes has a key without NULLs that no other row has,
/// by sorting the keys in the row format: a single-column key's sort is the probe's,
/// a longer key's rows are sorted here. Only for keys whose equality is bytewise in
/// that format (not floats, where `-0.0 = 0.0`); `false` means "not shown", and the
/// caller asks the query engine.
fn keys_unique_and_present(
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

/// The rows of the given files, partition by partition, with the partition columns
/// taken from the paths, in the output's column order.
async fn files_frame(
    ctx: &SessionContext,
    groups: &[(PartitionPath, Vec<PathBuf>)],
    output: &SchemaRef,
    data_schema: &SchemaRef,
) -> datafusion::error::Result<DataFrame> {
    let groups: Vec<(&PartitionPath, Vec<String>)> = groups
        .iter()
        .map(|(p, files)| {
            let files = files.iter().map(|f| f.to_string_lossy().into_owned());
            (p, files.collect())
        })
        .collect();
    let typed = |col: &str| {
        output
            .field_with_name(col)
            .map(|f| f.data_type().clone())
            .unwrap_or(DataType::Utf8)
    };
    match crate::session::partition_files_frame(ctx, groups, Some(data_schema), typed).await? {
        Some(frame) => frame.select(
            output
                .fields()
                .iter()
                .map(|f| Expr::Column(Column::new_unqualified(f.name())))
                .collect::<Vec<_>>(),
        ),
        None => ctx.read_batch(RecordBatch::new_empty(Arc::clone(output))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::Field;

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
        let once = ChangesOnce {
            schema,
            batches: std::sync::Mutex::new(Some(batches.clone())),
            added: None,
        };
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
