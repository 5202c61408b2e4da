//! Delta Lake tables (`format = "delta"`): a run's partitions are replaced by one Delta
//! commit, so any Delta reader (Spark, DuckDB, Polars, delta-rs, Trino) sees the table
//! before the run or after it, never in between.
//!
//! Layout, for a table at `lake/fct_orders`:
//!
//! ```text
//! lake/fct_orders/_delta_log/00000000000000000003.json    the table's commits
//! lake/fct_orders/dt=2026-06-01/part-1a2b3c4d-00000.parquet data, named by the write
//! lake/_idem/fct_orders/…                                  locks, staging, the log
//! ```
//!
//! A run stages each partition exactly as for a Hive table (the same writer, the
//! manifest in every footer). Publishing a partition records its `remove` actions
//! (every live file of the partition a merge did not keep) and `add` actions
//! (partition values, size, and statistics from the footers); its files stay staged.
//! When the run has published all its partitions, [`CommitBackend::finish_publish`]
//! moves their files into the table (a rename on disk, an upload on an object store)
//! under names no commit has used, where no Delta reader looks until a commit adds
//! them, and writes them as one commit: an overwrite whose predicate is the partitions'
//! `replaceWhere`, with idem's job, logical date, run id and digests in its
//! `commitInfo`. That commit is the atomic point; a crash before it leaves every
//! partition as it was (the moved files are orphans `idem vacuum` removes). The move
//! and the commit happen under the table's publish fence, which `idem vacuum` takes
//! too, so vacuum never deletes a file a commit is about to add. A `backfill --atomic`
//! keeps every date's staged files, under its own run lock, until its one commit.
//!
//! The live state is the latest snapshot: a partition's files are its `add` actions,
//! and its manifest is the newest generation among their footers, which must list
//! exactly those files (else the partition is foreign to idem and is simply replaced).
//! A partition whose rows equal the live ones is never published, so a re-run of
//! unchanged input writes no file and no commit: the table's version does not move.
//! An emptied partition's commit removes its files and adds none.
//!
//! Concurrency: idem's writers of one table still take its publish fence; any other
//! writer is met by Delta's optimistic concurrency. A commit that loses to a
//! conflicting one is planned again on the new snapshot: a partition the winner left
//! with this run's digest is dropped (unchanged), any other replaces what is live now.

mod stats;

use std::collections::{BTreeMap, HashMap};
use std::future::IntoFuture as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel as _;
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake_core::kernel::{Action, Add, MetadataExt as _, Remove, StructType, new_metadata};
use deltalake_core::logstore::{LogStoreRef, StorageConfig, default_logstore};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::table::state::DeltaTableState;
use deltalake_core::{DeltaTable, DeltaTableError};
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt};

use super::local::LocalTable;
use super::object::ObjectTable;
use super::{
    Checked, CommitBackend, CommittedPartition, PublishGuard, PublishMode, Published, RunGuard,
    Version, WritesGuard,
};
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::log::Restatement;
use crate::manifest::{LiveState, Manifest};
use crate::staged::WrittenPartition;

/// How many times a commit that lost to a conflicting one is planned again.
const REPLANS: usize = 8;

/// Put in the log's folder before the first commit's files move in, so a run that
/// crashes before that commit leaves a place the next run may still create the table
/// in (Delta readers skip names that are not commits or checkpoints).
const CREATING: &str = "_delta_log/.idem-creating";

/// Where the table's files are: a directory, or a prefix on an object store (whose
/// staging, uploads and leases idem's object-store backend handles).
enum Place {
    Local(LocalTable),
    Object(ObjectTable),
}

/// A Delta table, with idem's metadata (locks, staging, restatement log) beside it.
pub struct DeltaLake {
    place: Place,
    /// The table's URL as Delta names it (`file:///…`, `s3://…`).
    url: url::Url,
    log_store: LogStoreRef,
    /// The table's store, rooted at the table.
    store: Arc<dyn ObjectStore>,
    /// The latest snapshot read, updated from the log on every use.
    table: Mutex<Option<DeltaTable>>,
}

/// What each run (or batch of runs) has published and not committed yet, by table
/// URL and run or batch id: process-wide, as every run opens its own [`DeltaLake`].
type Pending = HashMap<(String, String), Vec<PendingPartition>>;

fn pending() -> std::sync::MutexGuard<'static, Pending> {
    static PENDING: std::sync::OnceLock<Mutex<Pending>> = std::sync::OnceLock::new();
    PENDING
        .get_or_init(Default::default)
        .lock()
        .expect("not poisoned")
}

impl std::fmt::Debug for DeltaLake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaLake")
            .field("url", &self.url.as_str())
            .finish()
    }
}

/// A published partition of a run, not committed yet.
#[derive(Clone, Debug)]
struct PendingPartition {
    partition: PartitionPath,
    manifest: Manifest,
    /// Where the files it adds wait, outside the table, until its commit moves them in
    /// (under the publish fence, which `idem vacuum` takes too).
    staged: PathBuf,
    /// The files it adds, by their path in the table.
    adds: Vec<Add>,
    /// Live files a merge kept as they are.
    kept: Vec<String>,
    /// For a merge: the live version of the partition its rows were computed from,
    /// which its commit must still find (another writer's commit in between is a
    /// conflict: its rows were not read). `None` for a replace.
    expected: Option<Option<Version>>,
    /// The arrow schema of the whole table it was written with (data and partition
    /// columns).
    schema: SchemaRef,
    restated: Option<Restatement>,
}

/// One live data file of the snapshot.
#[derive(Clone, Debug)]
struct LiveFile {
    /// Relative to the table root, decoded.
    path: String,
    size: i64,
    partition_values: HashMap<String, Option<String>>,
    /// The rows another writer marked deleted in it; a remove must name it too.
    deletion_vector: Option<deltalake_core::kernel::DeletionVectorDescriptor>,
}

impl LiveFile {
    fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    fn remove(&self, now: i64) -> Action {
        Action::Remove(Remove {
            path: self.path.clone(),
            data_change: true,
            deletion_timestamp: Some(now),
            extended_file_metadata: Some(true),
            partition_values: Some(self.partition_values.clone()),
            size: Some(self.size),
            deletion_vector: self.deletion_vector.clone(),
            tags: None,
            base_row_id: None,
            default_row_commit_version: None,
        })
    }
}

/// A Delta table's latest version as a reader sees it (see [`DeltaLake::scan`]).
#[derive(Debug)]
pub struct DeltaScan {
    /// The version read.
    pub version: i64,
    /// The columns stored in the data files (the partition columns left out).
    pub data_schema: SchemaRef,
    /// The partition columns, in order, with their types.
    pub partition_types: Vec<(String, DataType)>,
    /// The live files of each partition, as URLs (paths on disk).
    pub partitions: Vec<(PartitionPath, Vec<String>)>,
}

/// The latest snapshot, by partition.
struct Live {
    state: DeltaTableState,
    files: BTreeMap<PartitionPath, Vec<LiveFile>>,
}

impl Live {
    /// The version of partition `p` a read-modify-write must find again: its set of
    /// files (and their deletion vectors); `None` when it has none.
    fn version_of(&self, p: &PartitionPath) -> Option<Version> {
        let files = self.files.get(p)?;
        // A file's rows change with its deletion vector.
        let mut paths: Vec<String> = files
            .iter()
            .map(|f| match &f.deletion_vector {
                Some(dv) => format!("{}#{dv:?}", f.path),
                None => f.path.clone(),
            })
            .collect();
        paths.sort_unstable();
        Some(Version(format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(paths.join("\n").as_bytes())
        )))
    }
}

impl DeltaLake {
    /// One look at whether the place is this job's Delta table or could become one.
    fn check_layout_once(&self, partition_by: &[String]) -> Result<()> {
        if let Some(live) = self.live()? {
            let found = live.state.metadata().partition_columns().to_vec();
            if found != partition_by {
                return Err(Error::Layout {
                    table: self.location(),
                    problem: crate::layout::Problem::OtherLayout { found },
                });
            }
            return Ok(());
        }
        // No Delta log yet: the place must hold nothing a commit would hide, unless an
        // earlier run began creating the table here (its files are orphans).
        let creating = crate::store::block(self.store.head(&ObjectPath::from(CREATING)));
        if creating.is_ok() {
            return Ok(());
        }
        self.inner().check_layout(partition_by)?;
        match self.inner().partitions() {
            Ok(found) if !found.is_empty() => Err(Error::Layout {
                table: self.location(),
                problem: crate::layout::Problem::NotATable {
                    found: found.iter().take(3).map(|p| p.to_string()).collect(),
                },
            }),
            _ => Ok(()),
        }
    }

    /// The Delta table on local disk at `root` (which need not exist yet).
    pub fn local(root: &Path) -> Result<Self> {
        let table = LocalTable::new(root);
        let root = table.root().to_path_buf();
        let url = url::Url::from_directory_path(&root).map_err(|()| Error::Url {
            url: root.display().to_string(),
            reason: "not an absolute path".into(),
        })?;
        // Through the fault layer, as every object store idem builds: the log's reads
        // and its put-if-absent commits are calls a fault test reaches.
        let fs: Arc<dyn ObjectStore> = Arc::new(crate::fault::FaultStore::new(
            Arc::new(object_store::local::LocalFileSystem::new()),
            None,
        ));
        let prefix = ObjectPath::from_absolute_path(&root).map_err(|e| Error::Url {
            url: root.display().to_string(),
            reason: e.to_string(),
        })?;
        let store: Arc<dyn ObjectStore> = Arc::new(PrefixStore::new(fs.clone(), prefix));
        Ok(Self::with(Place::Local(table), url, store, fs))
    }

    /// The Delta table at `url` on an object store; runs stage under `local_staging`.
    pub fn object(
        url: &str,
        options: &crate::store::StorageOptions,
        local_staging: &Path,
    ) -> Result<Self> {
        let table = ObjectTable::new(url, options, local_staging)?;
        let (bucket, _) = crate::store::stores(url, options)?;
        let key = crate::store::key_of(url);
        let store: Arc<dyn ObjectStore> = Arc::new(PrefixStore::new(
            bucket.clone(),
            crate::store::raw_key(&key),
        ));
        let parsed = url::Url::parse(&format!("{}/", url.trim_end_matches('/'))).map_err(|e| {
            Error::Url {
                url: url.to_string(),
                reason: e.to_string(),
            }
        })?;
        Ok(Self::with(Place::Object(table), parsed, store, bucket))
    }

    fn with(
        place: Place,
        url: url::Url,
        store: Arc<dyn ObjectStore>,
        root: Arc<dyn ObjectStore>,
    ) -> Self {
        let log_store = default_logstore(store.clone(), root, &url, &StorageConfig::default());
        Self {
            place,
            url,
            log_store,
            store,
            table: Mutex::new(None),
        }
    }

    /// The key of run or batch `id`'s pending partitions of this table.
    fn key(&self, id: &str) -> (String, String) {
        (self.url.to_string(), id.to_string())
    }

    fn inner(&self) -> &dyn CommitBackend {
        match &self.place {
            Place::Local(t) => t,
            Place::Object(t) => t,
        }
    }

    fn delta_err<E: std::fmt::Display>(&self, what: &str) -> impl FnOnce(E) -> Error {
        let table = self.location();
        let what = what.to_string();
        move |e| Error::Delta {
            table,
            message: format!("{what}: {e}"),
        }
    }

    /// Whether a Delta log exists at the table: a commit or a checkpoint in
    /// `_delta_log/`.
    pub fn exists(&self) -> Result<bool> {
        let log = ObjectPath::from("_delta_log");
        let listed = match crate::store::block(self.store.list_with_delimiter(Some(&log))) {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(self.store_err("list", "_delta_log/", e)),
        };
        Ok(listed.objects.iter().any(|o| {
            o.location.filename().is_some_and(|n| {
                let version = n.split('.').next().unwrap_or_default();
                version.len() == 20
                    && version.bytes().all(|b| b.is_ascii_digit())
                    && (n.ends_with(".json") || n.contains(".checkpoint"))
            })
        }))
    }

    /// The latest snapshot, or `None` when there is no table yet.
    fn live(&self) -> Result<Option<Live>> {
        let mut cached = self.table.lock().expect("not poisoned");
        // Once the table was read, its log only grows: reading the new commits is
        // enough. Before, a listing tells whether there is a table at all.
        if cached.is_none() && !self.exists()? {
            return Ok(None);
        }
        let table = cached.get_or_insert_with(|| DeltaTable::new(self.log_store.clone()));
        crate::store::block(table.update_incremental(None))
            .map_err(self.delta_err("reading the log"))?;
        let state = table
            .snapshot()
            .map_err(self.delta_err("reading the log"))?
            .clone();
        let columns = state.metadata().partition_columns().to_vec();
        let mut files: BTreeMap<PartitionPath, Vec<LiveFile>> = BTreeMap::new();
        for f in state.log_data().iter() {
            let values = f.partition_values_map();
            let p = PartitionPath::new(
                columns
                    .iter()
                    .map(|c| (c.clone(), values.get(c).cloned().flatten()))
                    .collect(),
            );
            files.entry(p).or_default().push(LiveFile {
                path: f.path().into_owned(),
                size: f.size(),
                partition_values: values,
                deletion_vector: f.deletion_vector_descriptor(),
            });
        }
        Ok(Some(Live { state, files }))
    }

    /// What a reader of the table's latest version reads: its files by partition, the
    /// data columns' schema and the partition columns' types, as its log says (files
    /// another writer added included). `None` when there is no Delta table here.
    /// Refused for tables whose rows a plain Parquet read would get wrong: deletion
    /// vectors and column mapping.
    pub fn scan(&self) -> Result<Option<DeltaScan>> {
        let Some(live) = self.live()? else {
            return Ok(None);
        };
        let refuse = |what: &str| Error::DeltaUnsupported {
            table: self.location(),
            message: format!(
                "the table uses {what}, which idem does not read yet; read it with a \
                 Delta reader and give idem its rows as Parquet"
            ),
        };
        if let Some(feature) = features(&live.state, "reader")
            .into_iter()
            .find(|f| !READ.contains(&f.as_str()))
        {
            return Err(refuse(&format!("the Delta feature `{feature}`")));
        }
        if column_mapping(&live.state) {
            return Err(refuse("column mapping"));
        }
        if live
            .state
            .log_data()
            .iter()
            .any(|f| f.deletion_vector_descriptor().is_some())
        {
            return Err(refuse("deletion vectors"));
        }
        let schema = live.state.snapshot().arrow_schema();
        let columns = live.state.metadata().partition_columns().to_vec();
        let partition_types = columns
            .iter()
            .map(|c| {
                let dt = schema
                    .field_with_name(c)
                    .map(|f| f.data_type().clone())
                    .unwrap_or(DataType::Utf8);
                (c.clone(), dt)
            })
            .collect();
        let data_schema = Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .filter(|f| !columns.contains(f.name()))
                .cloned()
                .collect::<Vec<_>>(),
        ));
        let partitions = live
            .files
            .iter()
            .map(|(p, files)| {
                let urls = files.iter().map(|f| self.file_url(&f.path)).collect();
                (p.clone(), urls)
            })
            .collect();
        Ok(Some(DeltaScan {
            version: live.state.version() as i64,
            data_schema,
            partition_types,
            partitions,
        }))
    }

    /// Refuses a table with rules idem's commits would not keep: a table feature not in
    /// [`KEPT`], columns stored under other names (column mapping), no replacing
    /// (append-only), a change data feed to write, constraints, invariants, generated
    /// or identity columns to enforce.
    pub fn writable_or_absent(&self) -> Result<()> {
        match self.live()? {
            Some(live) => self.writable(&live.state),
            None => Ok(()),
        }
    }

    /// [`Self::writable_or_absent`] on a snapshot read.
    fn writable(&self, state: &DeltaTableState) -> Result<()> {
        let refuse = |what: String| Error::DeltaUnsupported {
            table: self.location(),
            message: format!(
                "the table has {what}, which idem's commits do not keep; write it with \
                 the tool that made it"
            ),
        };
        let mut listed = features(state, "reader");
        listed.extend(features(state, "writer"));
        if let Some(feature) = listed.into_iter().find(|f| !KEPT.contains(&f.as_str())) {
            return Err(refuse(format!("the Delta feature `{feature}`")));
        }
        let config = state.table_config();
        if column_mapping(state) {
            return Err(refuse("column mapping".into()));
        }
        if config.append_only == Some(true) {
            return Err(refuse(
                "delta.appendOnly set: its partitions cannot be replaced".into(),
            ));
        }
        if config.enable_change_data_feed == Some(true) {
            return Err(refuse(
                "a change data feed (delta.enableChangeDataFeed)".into(),
            ));
        }
        if let Some(key) = config
            .unknown_properties
            .keys()
            .find(|k| k.starts_with("delta.constraints."))
        {
            return Err(refuse(format!("a CHECK constraint ({key})")));
        }
        for field in state.schema().fields() {
            for (key, what) in [
                ("delta.invariants", "an invariant"),
                ("delta.generationExpression", "a generated column"),
                ("delta.identity.start", "an identity column"),
            ] {
                if field.metadata.contains_key(key) {
                    return Err(refuse(format!("{what} (`{}`)", field.name())));
                }
            }
        }
        Ok(())
    }

    /// The table's version now; `None` before its first commit.
    pub fn version(&self) -> Result<Option<i64>> {
        Ok(self.live()?.map(|l| l.state.version() as i64))
    }

    /// Deletes the data files no version within `retain` of now references: files
    /// removed longer ago than that, and files no commit ever added (a crashed run's)
    /// that are older. `None` keeps the table's `delta.deletedFileRetentionDuration`
    /// (seven days unless set). Returns the deleted paths (with `dry_run`, the paths
    /// it would delete). Like Delta's `VACUUM`, it records its own commits.
    pub fn vacuum(
        &self,
        retain: Option<std::time::Duration>,
        dry_run: bool,
    ) -> Result<Vec<String>> {
        if !self.exists()? {
            return Err(Error::Delta {
                table: self.location(),
                message: "there is no Delta log here; vacuum works on Delta tables (idem gc \
                          cleans a Parquet table's staging)"
                    .into(),
            });
        }
        // Under the publish fence: every file an idem commit adds is moved in under it,
        // just before that commit, so none is waiting in the table uncommitted now.
        let _fence = self.inner().lock_publish()?;
        let mut table = DeltaTable::new(self.log_store.clone());
        crate::store::block(table.load()).map_err(self.delta_err("reading the log"))?;
        let mut builder = table
            .vacuum()
            .with_mode(deltalake_core::operations::vacuum::VacuumMode::Full)
            .with_dry_run(dry_run);
        if let Some(retain) = retain {
            let retain = chrono::Duration::from_std(retain).map_err(|e| Error::Delta {
                table: self.location(),
                message: format!("retention: {e}"),
            })?;
            builder = builder
                .with_retention_period(retain)
                .with_enforce_retention_duration(false);
        }
        let (_, metrics) =
            crate::store::block(builder.into_future()).map_err(self.delta_err("vacuum"))?;
        let mut files = metrics.files_deleted;
        files.sort();
        Ok(files)
    }

    /// The commits of other writers that changed rows (an overwrite, delete, update,
    /// merge or restore), as restatement events: the partition is the commit's
    /// predicate (or `(table)`), the job its engine and operation, the run id its time
    /// and version. idem's own commits are logged by idem with their digests.
    fn foreign_changes(&self) -> Result<Vec<Restatement>> {
        use futures::TryStreamExt as _;
        if !self.exists()? {
            return Ok(Vec::new());
        }
        let mut table = DeltaTable::new(self.log_store.clone());
        crate::store::block(table.load()).map_err(self.delta_err("reading the log"))?;
        let latest = table.version().unwrap_or_default();
        let history: Vec<deltalake_core::kernel::CommitInfo> =
            crate::store::block(table.history(None).try_collect())
                .map_err(self.delta_err("reading the history"))?;
        let mut out = Vec::new();
        // Newest first, one per version.
        for (i, c) in history.iter().enumerate() {
            let version = latest.saturating_sub(i as u64);
            let engine = c.engine_info.clone().unwrap_or_default();
            if c.info.contains_key("idem") {
                continue;
            }
            let op = c.operation.clone().unwrap_or_default();
            let params = c.operation_parameters.clone().unwrap_or_default();
            let text = |k: &str| params.get(k).and_then(|v| v.as_str()).map(str::to_string);
            let changes_rows = match op.as_str() {
                "WRITE" | "CREATE OR REPLACE TABLE" => text("mode").as_deref() == Some("Overwrite"),
                "DELETE" | "UPDATE" | "MERGE" | "RESTORE" => true,
                _ => false,
            };
            if !changes_rows || version == 0 {
                continue;
            }
            let metric = |k: &str| {
                c.info
                    .get("operationMetrics")
                    .and_then(|m| m.get(k))
                    .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
            };
            let when = c
                .timestamp
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.format("%Y%m%dT%H%M%S%.3fZ").to_string())
                .unwrap_or_default();
            out.push(Restatement {
                partition: text("predicate").unwrap_or_else(|| "(table)".into()),
                old_digest: String::new(),
                new_digest: String::new(),
                old_rows: 0,
                new_rows: metric("num_added_rows")
                    .or_else(|| metric("numOutputRows"))
                    .unwrap_or_default(),
                job: format!(
                    "{} {op}",
                    if engine.is_empty() {
                        "another writer"
                    } else {
                        &engine
                    }
                ),
                job_fingerprint: String::new(),
                logical_date: String::new(),
                run_id: format!("{when}-delta-v{version}"),
                replaced_run_id: String::new(),
            });
        }
        Ok(out)
    }

    /// Reads the manifest of each of `files`' footers: the newest generation, when it
    /// lists exactly these files.
    fn manifest_of(&self, files: &[LiveFile]) -> Result<Option<Manifest>> {
        // Rows another writer deleted through a deletion vector are not what the
        // manifest's digest covers.
        if files.iter().any(|f| f.deletion_vector.is_some()) {
            return Ok(None);
        }
        let mut found = Vec::with_capacity(files.len());
        for f in files {
            let Some(m) = self.footer_manifest(f)? else {
                return Ok(None);
            };
            found.push(m);
        }
        Ok(crate::manifest::newest(found)
            .filter(|m| crate::manifest::lists_exactly(m, files.iter().map(LiveFile::name))))
    }

    /// The manifest in the footer of the live data file `f`.
    fn footer_manifest(&self, f: &LiveFile) -> Result<Option<Manifest>> {
        use parquet::file::{FOOTER_SIZE, metadata::FooterTail};
        let path = f.path.as_str();
        match &self.place {
            Place::Local(t) => match crate::manifest::read_from_file(&t.root().join(path)) {
                Ok(m) => Ok(m),
                Err(Error::ParquetRead { .. } | Error::BadManifest { .. }) => Ok(None),
                Err(e) => Err(e),
            },
            Place::Object(_) => crate::store::block(async {
                // The key as uploaded: the partition directory as written, not re-encoded.
                let key = crate::store::raw_key(path);
                // The log gives the file's size: one read of its tail holds the footer
                // of most files; a larger footer takes a second read.
                let size = f.size.max(0) as u64;
                let tail = size.min(256 << 10);
                let bytes = match self.store.get_range(&key, size - tail..size).await {
                    Ok(b) => b,
                    // A file the log names but the store lacks: not idem's whole.
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(self.store_err("read", path, e)),
                };
                let n = bytes.len();
                let Some(Ok(end)) = n
                    .checked_sub(FOOTER_SIZE)
                    .map(|at| FooterTail::try_new(bytes[at..].try_into().expect("8 bytes")))
                else {
                    return Ok(None);
                };
                let len = end.metadata_length() as u64;
                let footer = if len + 8 <= n as u64 {
                    bytes.slice(n - 8 - len as usize..n - 8)
                } else if len + 8 <= size {
                    self.store
                        .get_range(&key, size - 8 - len..size - 8)
                        .await
                        .map_err(|e| self.store_err("read", path, e))?
                } else {
                    return Ok(None);
                };
                let Ok(meta) =
                    parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&footer)
                else {
                    return Ok(None);
                };
                Ok(crate::manifest::manifest_of(&meta).ok().flatten())
            }),
        }
    }

    fn store_err(&self, op: &'static str, path: &str, e: object_store::Error) -> Error {
        Error::ObjectStore {
            op,
            url: format!("{}{path}", self.url),
            source: Box::new(e),
        }
    }

    fn file_url(&self, rel: &str) -> String {
        match &self.place {
            Place::Local(t) => t.root().join(rel).display().to_string(),
            Place::Object(_) => format!("{}{rel}", self.url),
        }
    }

    /// Moves the staged file `name` of `part` into the table at `rel`, durably, under a
    /// name no file has: a rename that refuses to replace on disk, an upload that
    /// refuses to overwrite on an object store.
    fn move_in(&self, p: &PendingPartition, id: &str, name: &str, rel: &str) -> Result<u64> {
        let from = p.staged.join(name);
        match &self.place {
            Place::Local(t) => {
                let to = t.root().join(rel);
                let dir = to.parent().expect("inside the table");
                crate::durable::create_dir_all(dir)?;
                let file = crate::fs::open(&from).map_err(Error::io("open", &from))?;
                crate::fs::sync(&file, &from).map_err(Error::io("fsync", &from))?;
                let len = file.metadata().map_err(Error::io("stat", &from))?.len();
                crate::fs::rename_with(&from, &to, rustix::fs::RenameFlags::NOREPLACE).map_err(
                    |e| {
                        if e == rustix::io::Errno::EXIST {
                            Error::Conflict {
                                partition: p.partition.to_string(),
                            }
                        } else {
                            Error::io("rename", &to)(e.into())
                        }
                    },
                )?;
                Ok(len)
            }
            Place::Object(t) => {
                let key = crate::store::raw_key(format!("{}/{rel}", t.root_key()));
                crate::store::block(t.upload(&from, &key, id))
            }
        }
    }

    /// Moves the files of pending partitions into the table, just before their commit
    /// and under the publish fence: no file of idem's waits in the table uncommitted
    /// while the fence is free, so `idem vacuum` (which takes it) never deletes one a
    /// commit is about to add. `id` is the run or batch that commits them.
    fn move_in_all(&self, id: &str, parts: &[PendingPartition]) -> Result<()> {
        if parts.iter().any(|p| !p.adds.is_empty()) && self.live()?.is_none() {
            crate::store::block(
                self.store
                    .put(&ObjectPath::from(CREATING), Default::default()),
            )
            .map_err(|e| self.store_err("create", CREATING, e))?;
        }
        let mut moved = Vec::new();
        for p in parts {
            for a in &p.adds {
                let name = a.path.rsplit('/').next().unwrap_or(&a.path);
                self.move_in(p, id, name, &a.path)?;
                moved.push(a.path.clone());
            }
        }
        self.sync_dirs(&moved)?;
        for p in parts {
            let _ = crate::durable::remove_dir_all(&p.staged);
        }
        Ok(())
    }

    /// Makes the files moved into partition directories durable (their directories'
    /// entries), on disk.
    fn sync_dirs(&self, rels: &[String]) -> Result<()> {
        if let Place::Local(t) = &self.place {
            let mut dirs: Vec<PathBuf> = rels
                .iter()
                .filter_map(|r| t.root().join(r).parent().map(Path::to_path_buf))
                .collect();
            dirs.sort();
            dirs.dedup();
            for d in dirs {
                crate::durable::sync_dir(&d)?;
            }
        }
        Ok(())
    }

    /// The whole table's arrow schema for a staged partition: its data file's columns
    /// and the partition columns, typed as the manifest records them.
    fn table_schema(part: &WrittenPartition) -> Result<(SchemaRef, SchemaRef)> {
        let first = part
            .manifest
            .files
            .first()
            .map(|f| part.dir.join(&f.name))
            .ok_or_else(|| Error::Delta {
                table: part.partition.to_string(),
                message: "a staged partition has no file".into(),
            })?;
        let file = crate::fs::open(&first).map_err(Error::io("open", &first))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|source| Error::ParquetRead {
            path: first.clone(),
            source,
        })?;
        let data = reader.schema().clone();
        let mut fields: Vec<Field> = Vec::new();
        for c in &part.manifest.schema {
            if c.partition {
                let t: DataType = c.data_type.parse().unwrap_or(DataType::Utf8);
                fields.push(Field::new(&c.name, t, true));
            } else if let Ok(f) = data.field_with_name(&c.name) {
                fields.push(f.clone());
            }
        }
        Ok((Arc::new(Schema::new(fields)), data))
    }

    /// The `replaceWhere` predicate of a set of partitions, as Spark and delta-rs take it.
    fn predicate(parts: &[PendingPartition]) -> Option<String> {
        let each: Vec<String> = parts
            .iter()
            .filter(|p| !p.partition.parts().is_empty())
            .map(|p| {
                p.partition
                    .parts()
                    .iter()
                    .map(|(c, v)| match v {
                        Some(v) => format!("{} = '{}'", ident(c), v.replace('\'', "''")),
                        None => format!("{} IS NULL", ident(c)),
                    })
                    .collect::<Vec<_>>()
                    .join(" AND ")
            })
            .collect();
        match each.len() {
            0 => None,
            1 => each.into_iter().next(),
            _ => Some(
                each.iter()
                    .map(|e| format!("({e})"))
                    .collect::<Vec<_>>()
                    .join(" OR "),
            ),
        }
    }

    /// Commits the run's pending partitions as one Delta commit; returns the version.
    fn commit(&self, run_id: &str, mut parts: Vec<PendingPartition>) -> Result<Option<i64>> {
        for attempt in 0..REPLANS {
            let live = self.live()?;
            // Planned on the snapshot read now. The first time, the run decided what to
            // publish under the fence; after losing to another commit, a partition
            // already holding this run's rows is dropped and the others replace
            // whatever is live now.
            let replan = attempt > 0;
            let now = chrono::Utc::now().timestamp_millis();
            let mut actions: Vec<Action> = Vec::new();
            let mut keep: Vec<PendingPartition> = Vec::new();
            for p in parts.iter() {
                let live_files: Vec<LiveFile> = live
                    .as_ref()
                    .and_then(|l| l.files.get(&p.partition).cloned())
                    .unwrap_or_default();
                let ours = p
                    .adds
                    .iter()
                    .all(|a| live_files.iter().any(|f| f.path == a.path))
                    && !p.adds.is_empty()
                    && live_files.len() == p.adds.len() + p.kept.len();
                if replan && ours {
                    // An earlier attempt of this very commit landed (a lost answer).
                    continue;
                }
                let same_rows = replan
                    && match self.manifest_of(&live_files)? {
                        Some(m) => {
                            m.digest == p.manifest.digest
                                && m.schema_fingerprint == p.manifest.schema_fingerprint
                        }
                        None => live_files.is_empty() && p.manifest.rows == 0,
                    };
                if same_rows && !live_files.is_empty() {
                    continue;
                }
                // A merge's partition changed since the merge read it (an append of
                // another writer, say): removing its files would drop rows the merge
                // never saw.
                if let Some(expected) = &p.expected
                    && live.as_ref().and_then(|l| l.version_of(&p.partition)) != *expected
                {
                    return Err(Error::Conflict {
                        partition: p.partition.to_string(),
                    });
                }
                let kept_still = p
                    .kept
                    .iter()
                    .all(|k| live_files.iter().any(|f| f.name() == k));
                if !kept_still {
                    return Err(Error::Conflict {
                        partition: p.partition.to_string(),
                    });
                }
                for f in &live_files {
                    if !p.kept.iter().any(|k| k == f.name()) {
                        actions.push(f.remove(now));
                    }
                }
                actions.extend(p.adds.iter().cloned().map(Action::Add));
                keep.push(p.clone());
            }
            if actions.is_empty() {
                return Ok(live.map(|l| l.state.version() as i64));
            }
            let schema = keep
                .last()
                .map(|p| p.schema.clone())
                .expect("a partition with actions");
            let kernel: StructType =
                schema
                    .as_ref()
                    .try_into_kernel()
                    .map_err(|e| Error::Delta {
                        table: self.location(),
                        message: format!("the output's schema has no Delta type: {e}"),
                    })?;
            let columns: Vec<String> = keep[0]
                .partition
                .parts()
                .iter()
                .map(|(c, _)| c.clone())
                .collect();
            let mut head: Vec<Action> = Vec::new();
            match live.as_ref() {
                None => {
                    // The oldest protocol that reads the table: 1/2, or 3/7 with the
                    // `timestampNtz` feature for a timestamp without a time zone.
                    let ntz = serde_json::to_string(&kernel)
                        .map_err(self.delta_err("the table's schema"))?
                        .contains("\"timestamp_ntz\"");
                    let protocol = if ntz {
                        serde_json::json!({
                            "minReaderVersion": 3,
                            "minWriterVersion": 7,
                            "readerFeatures": ["timestampNtz"],
                            "writerFeatures": ["timestampNtz"],
                        })
                    } else {
                        serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 2})
                    };
                    let protocol: deltalake_core::kernel::Protocol =
                        serde_json::from_value(protocol)
                            .map_err(self.delta_err("the table's protocol"))?;
                    let metadata =
                        new_metadata(&kernel, &columns, std::iter::empty::<(String, String)>())
                            .map_err(self.delta_err("the table's metadata"))?;
                    head.push(Action::Protocol(protocol));
                    head.push(Action::Metadata(metadata));
                }
                Some(l) => {
                    self.writable(&l.state)?;
                    if l.state.metadata().partition_columns() != columns {
                        return Err(Error::Layout {
                            table: self.location(),
                            problem: crate::layout::Problem::OtherLayout {
                                found: l.state.metadata().partition_columns().to_vec(),
                            },
                        });
                    }
                    let kernel = self.keeping_foreign_columns(&l.state, kernel)?;
                    if l.state.schema().as_ref() != &kernel {
                        let metadata = l
                            .state
                            .metadata()
                            .clone()
                            .with_schema(&kernel)
                            .map_err(self.delta_err("the table's metadata"))?;
                        head.push(Action::Metadata(metadata));
                    }
                }
            }
            head.extend(actions);
            let info = commit_info(run_id, &keep);
            let op = DeltaOperation::Write {
                mode: SaveMode::Overwrite,
                partition_by: (!columns.is_empty()).then(|| columns.clone()),
                predicate: Self::predicate(&keep),
            };
            crate::failpoint::hit("before_commit")?;
            let snapshot = live
                .as_ref()
                .map(|l| &l.state as &dyn deltalake_core::kernel::transaction::TableReference);
            let result = crate::store::block(
                // Checkpoints every `delta.checkpointInterval` commits (100 unless
                // set), so a reader of a table years of nightly runs old does not
                // replay every commit; old log entries expire as the table says.
                CommitBuilder::from(CommitProperties::default().with_create_checkpoint(true))
                    .with_actions(head)
                    .with_app_metadata(info)
                    .with_max_retries(REPLANS)
                    .build(snapshot, self.log_store.clone(), op)
                    .into_future(),
            );
            match result {
                Ok(done) => {
                    if live.is_none() {
                        let key = ObjectPath::from(CREATING);
                        let _ = crate::store::block(self.store.delete(&key));
                    }
                    for p in &keep {
                        if let Some(event) = &p.restated {
                            self.inner().append_log(event)?;
                        }
                    }
                    return Ok(Some(done.version() as i64));
                }
                Err(DeltaTableError::Transaction {
                    source: TransactionError::CommitConflict(_),
                })
                | Err(DeltaTableError::VersionAlreadyExists(_)) => {
                    // Another writer's commit touched these partitions: plan again on it.
                    parts = keep;
                    continue;
                }
                Err(e) => return Err(self.delta_err("committing")(e)),
            }
        }
        Err(Error::Conflict {
            partition: parts
                .first()
                .map(|p| p.partition.to_string())
                .unwrap_or_default(),
        })
    }
}

impl DeltaLake {
    /// The schema a commit of rows of `output`'s schema leaves the table with: the
    /// output's columns, and every column of the table the output lacks (another
    /// writer's, say), which Delta readers read as NULL in the files idem adds. A
    /// column is never dropped from the table; one that cannot be NULL is refused.
    fn keeping_foreign_columns(
        &self,
        state: &DeltaTableState,
        output: StructType,
    ) -> Result<StructType> {
        let live = state.schema();
        let missing: Vec<_> = live
            .fields()
            .filter(|f| output.field(f.name()).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(output);
        }
        if let Some(f) = missing.iter().find(|f| !f.is_nullable()) {
            return Err(Error::DeltaUnsupported {
                table: self.location(),
                message: format!(
                    "the table has column `{}` (NOT NULL), which the output lacks; idem \
                     cannot add rows without it: select it in the SQL",
                    f.name()
                ),
            });
        }
        // The table's columns in its order (the output's definition where both have
        // one), then the output's new ones.
        let fields = live
            .fields()
            .map(|f| output.field(f.name()).unwrap_or(f).clone())
            .chain(
                output
                    .fields()
                    .filter(|f| live.field(f.name()).is_none())
                    .cloned(),
            );
        StructType::try_new(fields).map_err(self.delta_err("the table's schema"))
    }
}

/// The table features idem's commits keep: those of the legacy writer versions, each
/// refused by [`DeltaLake::writable`] when a table puts it to use (an append-only
/// table, constraints, a change data feed...), timestamps without a time zone, which
/// idem writes, and deletion vectors, which idem's removes name. Any other feature
/// the protocol lists (row tracking, domain metadata, clustering, v2 checkpoints,
/// Iceberg compatibility, type widening, in-commit timestamps, variants, collations,
/// column defaults, checkpoint protection, catalog-managed tables, and whatever comes
/// next) asks writers for work idem does not do, and is refused before anything is
/// written.
const KEPT: [&str; 9] = [
    "appendOnly",
    "invariants",
    "checkConstraints",
    "changeDataFeed",
    "generatedColumns",
    "columnMapping",
    "identityColumns",
    "timestampNtz",
    "deletionVectors",
];

/// The reader features a table read as a source may list: timestamps without a time
/// zone, v2 checkpoints (which the log reader reads), a vacuum protocol check (nothing
/// for a reader to do), and column mapping and deletion vectors, which
/// [`DeltaLake::scan`] refuses when a table uses them. Writer features ask nothing of
/// a reader.
const READ: [&str; 5] = [
    "timestampNtz",
    "v2Checkpoint",
    "vacuumProtocolCheck",
    "columnMapping",
    "deletionVectors",
];

/// The table features the protocol names for `who` (`reader`, `writer`), as it
/// spells them; none for a table of the legacy versions, whose features idem knows.
fn features(state: &DeltaTableState, who: &str) -> Vec<String> {
    let protocol = serde_json::to_value(state.protocol()).unwrap_or_default();
    protocol[format!("{who}Features")]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

/// Whether the table stores its columns under names other than its schema's.
fn column_mapping(state: &DeltaTableState) -> bool {
    // The mode as the protocol spells it: `none`, `id` or `name`.
    let mode = state.table_config().column_mapping_mode;
    mode.is_some_and(|m| serde_json::to_value(m).ok() != Some("none".into()))
}

/// What a commit records of idem, in its `commitInfo`.
fn commit_info(run_id: &str, parts: &[PendingPartition]) -> HashMap<String, serde_json::Value> {
    let run = parts.first().map(|p| &p.manifest.run);
    let dates: std::collections::BTreeSet<&str> = parts
        .iter()
        .map(|p| p.manifest.run.logical_date.as_str())
        .collect();
    let partitions: Vec<serde_json::Value> = parts
        .iter()
        .map(|p| {
            serde_json::json!({
                "partition": p.partition.to_string(),
                "digest": p.manifest.digest,
                "rows": p.manifest.rows,
                "logicalDate": p.manifest.run.logical_date,
                "runId": p.manifest.run.run_id,
            })
        })
        .collect();
    let mut info = HashMap::new();
    info.insert(
        "idem".into(),
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "job": run.map(|r| r.job.clone()).unwrap_or_default(),
            "jobFingerprint": run.map(|r| r.job_fingerprint.clone()).unwrap_or_default(),
            "logicalDates": dates,
            "runId": run_id,
            "partitions": partitions,
        }),
    );
    info
}

/// A column name as a predicate names it: bare when it is a plain identifier.
fn ident(c: &str) -> String {
    let plain = c
        .chars()
        .next()
        .is_some_and(|ch| ch.is_ascii_alphabetic() || ch == '_')
        && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
    if plain {
        c.to_string()
    } else {
        format!("\"{}\"", c.replace('"', "\"\""))
    }
}

impl CommitBackend for DeltaLake {
    fn location(&self) -> String {
        self.inner().location()
    }

    fn prepare(&self) -> Result<()> {
        self.writable_or_absent()?;
        self.inner().prepare()
    }

    fn lock_run(&self, run_id: &str) -> Result<RunGuard> {
        self.inner().lock_run(run_id)
    }

    fn clean_dead_runs(&self) -> Result<Vec<String>> {
        self.inner().clean_dead_runs()
    }

    fn staged_runs(&self) -> Result<Vec<String>> {
        self.inner().staged_runs()
    }

    fn append_log(&self, event: &Restatement) -> Result<()> {
        // Logged when the run's commit lands (see `finish_publish`).
        let mut pending = pending();
        if let Some(p) = pending.get_mut(&self.key(&event.run_id)).and_then(|parts| {
            parts
                .iter_mut()
                .find(|p| p.partition.to_string() == event.partition)
        }) {
            p.restated = Some(event.clone());
            return Ok(());
        }
        drop(pending);
        self.inner().append_log(event)
    }

    fn log(&self) -> Result<Vec<Restatement>> {
        let mut events = self.inner().log()?;
        events.extend(self.foreign_changes()?);
        events.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        Ok(events)
    }

    fn keeps_files(&self) -> bool {
        self.inner().keeps_files()
    }

    fn lock_writes(&self) -> Result<WritesGuard> {
        self.inner().lock_writes()
    }

    fn lock_publish(&self) -> Result<PublishGuard> {
        self.inner().lock_publish()
    }

    fn live_version(&self, p: &PartitionPath) -> Result<Option<Version>> {
        Ok(self.live()?.and_then(|l| l.version_of(p)))
    }

    fn check_layout(&self, partition_by: &[String]) -> Result<()> {
        match self.check_layout_once(partition_by) {
            // Another run may have begun creating the table between this one's looks:
            // its marker (or its first commit) made `_delta_log/` appear after the
            // marker was looked for. Looking again finds the marker or the log.
            Err(Error::Layout {
                problem: crate::layout::Problem::NotATable { .. },
                ..
            }) => self.check_layout_once(partition_by),
            other => other,
        }
    }

    fn file_location(&self, p: &PartitionPath, name: &str) -> String {
        let rel = p.rel_path().to_string_lossy().into_owned();
        if rel.is_empty() {
            self.file_url(name)
        } else {
            self.file_url(&format!("{rel}/{name}"))
        }
    }

    fn read_locations(&self, p: &PartitionPath, names: &[String]) -> Result<Vec<String>> {
        let live = self.live()?;
        let files = live.as_ref().and_then(|l| l.files.get(p));
        Ok(names
            .iter()
            .map(
                |n| match files.and_then(|fs| fs.iter().find(|f| f.name() == n)) {
                    Some(f) => self.file_url(&f.path),
                    None => self.file_location(p, n),
                },
            )
            .collect())
    }

    fn staging_dir(&self, run_id: &str, p: &PartitionPath) -> PathBuf {
        self.inner().staging_dir(run_id, p)
    }

    fn live_partitions(&self, depth: usize) -> Result<Vec<PartitionPath>> {
        Ok(self
            .live()?
            .map(|l| {
                l.files
                    .into_keys()
                    .filter(|p| p.parts().len() == depth)
                    .collect()
            })
            .unwrap_or_default())
    }

    fn partitions(&self) -> Result<Vec<PartitionPath>> {
        match self.live()? {
            Some(l) => Ok(l.files.into_keys().collect()),
            None => Err(Error::Missing {
                path: PathBuf::from(self.location()),
            }),
        }
    }

    fn live_bytes(&self, p: &PartitionPath, _names: &[String]) -> Option<u64> {
        let live = self.live().ok()??;
        Some(live.files.get(p)?.iter().map(|f| f.size as u64).sum())
    }

    fn committed(&self) -> Result<Option<Vec<CommittedPartition>>> {
        let Some(live) = self.live()? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for (p, files) in &live.files {
            // A partition another writer made is not idem's: the table is read through
            // a Delta reader then, never a listing.
            let Some(m) = self.manifest_of(files)? else {
                return Ok(None);
            };
            let urls = files.iter().map(|f| self.file_url(&f.path)).collect();
            out.push((p.clone(), m, urls));
        }
        Ok(Some(out))
    }

    fn live_state(&self, p: &PartitionPath) -> Result<Option<LiveState>> {
        let Some(live) = self.live()? else {
            return Ok(None);
        };
        let Some(files) = live.files.get(p) else {
            return Ok(None);
        };
        Ok(Some(match self.manifest_of(files)? {
            Some(m) => LiveState::Managed(Box::new(m)),
            None => LiveState::Foreign {
                files: files
                    .iter()
                    .map(|f| PathBuf::from(self.file_url(&f.path)))
                    .collect(),
            },
        }))
    }

    fn publish(&self, part: Checked, _fence: &PublishGuard) -> Result<Published> {
        let written = part.0;
        if written.uploaded.is_some() {
            return Err(Error::Delta {
                table: self.location(),
                message: "a Delta table cannot take partitions a cluster staged".into(),
            });
        }
        let live = self.live()?;
        if let Some(expected) = &written.expected
            && live.as_ref().and_then(|l| l.version_of(&written.partition)) != *expected
        {
            return Err(Error::Conflict {
                partition: written.partition.to_string(),
            });
        }
        let live_files: Vec<LiveFile> = live
            .as_ref()
            .and_then(|l| l.files.get(&written.partition).cloned())
            .unwrap_or_default();
        let (schema, data) = Self::table_schema(&written)?;
        let rel_dir = written.partition.rel_path().to_string_lossy().into_owned();
        let rel = |name: &str| {
            if rel_dir.is_empty() {
                name.to_string()
            } else {
                format!("{rel_dir}/{name}")
            }
        };
        let partition_values: HashMap<String, Option<String>> = written
            .partition
            .parts()
            .iter()
            .map(|(c, v)| (c.clone(), v.clone()))
            .collect();
        let mut adds = Vec::new();
        let mut kept = Vec::new();
        // An emptied partition adds nothing: its commit only removes.
        if written.manifest.rows > 0 {
            for f in &written.manifest.files {
                if live_files.iter().any(|l| l.name() == f.name) {
                    kept.push(f.name.clone());
                    continue;
                }
                let from = written.dir.join(&f.name);
                let stats = stats::of_file(&from, &data)?;
                let size = std::fs::metadata(&from)
                    .map_err(Error::io("stat", &from))?
                    .len();
                let path = rel(&f.name);
                adds.push(Add {
                    // Decoded: deltalake-core encodes it as the log records it.
                    path: path.clone(),
                    partition_values: partition_values.clone(),
                    size: size as i64,
                    modification_time: chrono::Utc::now().timestamp_millis(),
                    data_change: true,
                    stats: Some(stats),
                    tags: None,
                    deletion_vector: None,
                    base_row_id: None,
                    default_row_commit_version: None,
                    clustering_provider: None,
                });
            }
        }
        let path = PathBuf::from(self.file_location(&written.partition, ""));
        if adds.is_empty() && kept.is_empty() && live_files.is_empty() {
            // Nothing was there and nothing is: no commit.
            let _ = crate::durable::remove_dir_all(&written.dir);
            return Ok(Published {
                partition: written.partition,
                path,
                mode: PublishMode::AlreadyLive,
            });
        }
        pending()
            .entry(self.key(&written.manifest.run.run_id))
            .or_default()
            .push(PendingPartition {
                partition: written.partition.clone(),
                manifest: written.manifest,
                staged: written.dir.clone(),
                adds,
                kept,
                expected: written.expected,
                schema,
                restated: None,
            });
        Ok(Published {
            partition: written.partition,
            path,
            mode: PublishMode::Committed,
        })
    }

    fn finish_publish(&self, run_id: &str, _fence: &PublishGuard) -> Result<Option<i64>> {
        let parts = pending().remove(&self.key(run_id)).unwrap_or_default();
        if parts.is_empty() {
            return self.version();
        }
        // Several runs of one commit may have computed one partition (a lookback):
        // the one published last wins, as it would have committed last.
        let parts: Vec<PendingPartition> = {
            let mut last: BTreeMap<PartitionPath, PendingPartition> = BTreeMap::new();
            for p in parts {
                last.insert(p.partition.clone(), p);
            }
            last.into_values().collect()
        };
        self.move_in_all(run_id, &parts)?;
        self.commit(run_id, parts)
    }

    /// The run's partitions join the batch's commit; their files wait in the batch's
    /// staging (which the batch's own run lock keeps from the dead-run cleaner) once
    /// the run's staging is gone.
    fn defer_publish(&self, run_id: &str, batch: &str) -> Result<()> {
        let parts = pending().remove(&self.key(run_id)).unwrap_or_default();
        let mut moved = Vec::with_capacity(parts.len());
        for mut p in parts {
            let to = self
                .inner()
                .staging_dir(&format!("{batch}/{run_id}"), &p.partition);
            if let Some(parent) = to.parent() {
                crate::durable::create_dir_all(parent)?;
            }
            std::fs::rename(&p.staged, &to).map_err(Error::io("rename", &to))?;
            p.staged = to;
            moved.push(p);
        }
        pending().entry(self.key(batch)).or_default().extend(moved);
        Ok(())
    }

    fn drop_pending(&self, id: &str) {
        pending().remove(&self.key(id));
    }

    fn discard(&self, part: WrittenPartition) -> Result<()> {
        self.inner().discard(part)
    }

    fn cleanup_run(&self, run_id: &str) -> Result<()> {
        pending().remove(&self.key(run_id));
        self.inner().cleanup_run(run_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicates_quote_values_and_names() {
        let part = |parts: Vec<(&str, Option<&str>)>| PendingPartition {
            partition: PartitionPath::new(
                parts
                    .into_iter()
                    .map(|(c, v)| (c.to_string(), v.map(str::to_string)))
                    .collect(),
            ),
            manifest: serde_json::from_value(serde_json::json!({
                "format": 1, "partition": "", "files": [], "rows": 0, "data_bytes": 0,
                "schema": [], "schema_fingerprint": "", "digest": "", "job": "",
                "job_fingerprint": "", "logical_date": "", "run_id": "", "idem_version": "",
                "inputs": []
            }))
            .unwrap(),
            staged: PathBuf::new(),
            adds: vec![],
            kept: vec![],
            expected: None,
            schema: Arc::new(Schema::empty()),
            restated: None,
        };
        assert_eq!(
            DeltaLake::predicate(&[part(vec![("dt", Some("2026-06-01"))])]).as_deref(),
            Some("dt = '2026-06-01'")
        );
        assert_eq!(
            DeltaLake::predicate(&[
                part(vec![("dt", Some("a'b")), ("my col", None)]),
                part(vec![("dt", Some("x")), ("my col", Some("y"))]),
            ])
            .as_deref(),
            Some("(dt = 'a''b' AND \"my col\" IS NULL) OR (dt = 'x' AND \"my col\" = 'y')")
        );
        assert_eq!(DeltaLake::predicate(&[part(vec![])]), None);
    }
}
