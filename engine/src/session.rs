//! The DataFusion session of a run: sources registered as listing tables (Hive
//! partition columns declared or inferred, so `where created_date = $run_date` prunes
//! directories before any file is opened), idem's UDFs, and the settings idem relies on.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::datasource::TableProvider;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::json::JsonFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::cache::cache_manager::{
    CacheManager, CacheManagerConfig, FileMetadataCache, FileStatisticsCache,
};
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use idem_io::hive::PartitionPath;
use idem_io::manifest::InputFile;
use object_store::{ObjectMeta, ObjectStoreExt};

use crate::error::{Error, Result};
use crate::job::{Format, Job, Source};
use crate::key::IdemKey;

/// The files a run reads by name: an idem table's committed files (a source on an
/// object store), a merge's files of the table. DataFusion reads a file that is not
/// there as no rows at all, so after reading, the run checks that every one of them
/// still exists ([`missing_read_file`]): file names are never reused, so one that
/// exists after the read existed while it was read. One that is gone was removed by a
/// newer commit (or apply) meanwhile: the run is computed again.
#[derive(Debug, Default)]
pub struct ReadFiles(std::sync::Mutex<Vec<String>>);

impl ReadFiles {
    fn of(ctx: &SessionContext) -> Option<Arc<ReadFiles>> {
        ctx.state().config().get_extension::<ReadFiles>()
    }

    /// How many files the session has recorded so far.
    fn count(ctx: &SessionContext) -> usize {
        Self::of(ctx).map_or(0, |r| r.0.lock().expect("not poisoned").len())
    }

    /// Forgets the files recorded after the first `count` (a read that was abandoned
    /// and made again).
    fn forget_after(ctx: &SessionContext, count: usize) {
        if let Some(r) = Self::of(ctx) {
            r.0.lock().expect("not poisoned").truncate(count);
        }
    }
}

/// The first file the run read by name that is gone now, if any.
pub fn missing_read_file(ctx: &SessionContext, job: &Job) -> Option<String> {
    let files = ReadFiles::of(ctx)
        .map(|r| r.0.lock().expect("not poisoned").clone())
        .unwrap_or_default();
    files.into_iter().find(|f| {
        if idem_io::store::is_url(f) {
            idem_io::store::head(f, job.storage_for(f)).is_none()
        } else {
            idem_io::fs::metadata(std::path::Path::new(f)).is_err()
        }
    })
}

/// Builds the session for `job` with every source registered.
pub async fn context(job: &Job) -> Result<SessionContext> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let mut config = SessionConfig::new()
        .with_target_partitions(threads)
        .with_batch_size(32 * 1024)
        .with_information_schema(true)
        .with_extension(Arc::new(ReadFiles::default()));
    // Filters are not evaluated inside the Parquet decoder (DataFusion's default):
    // row-group and page statistics still skip what a filter rules out, and decoding
    // the rest and filtering after is cheaper for the filters jobs have (a status, a
    // join's keys probed row by row against a dimension).
    config.options_mut().execution.parquet.pushdown_filters = false;
    // Match globs against the whole path below their prefix (`raw/*/x.csv`), and read
    // the files of nested directories of a directory source.
    config
        .options_mut()
        .execution
        .listing_table_ignore_subdirectory = false;
    let ctx = guarded(config, runtime(job));
    ctx.add_optimizer_rule(Arc::new(crate::utc_date::UtcDateRule::new()));
    if job.execution.in_process() {
        ctx.add_optimizer_rule(Arc::new(crate::group_keys::PackGroupKeys));
    }
    ctx.register_udf(IdemKey::udf());
    ctx.register_udf(crate::key::DedupeUnique::udf());
    for s in &job.sources {
        let started = std::time::Instant::now();
        register(&ctx, job, s).await?;
        if idem_io::profile::enabled() {
            idem_io::profile::add_since(idem_io::profile::Counter::Listing, started);
        }
    }
    Ok(ctx)
}

/// A session of `config` and `runtime` with DataFusion's paths known to give wrong
/// rows closed (`known_wrong`): every session idem plans a query in, a run's, a
/// check's or `verify`'s.
pub(crate) fn guarded(mut config: SessionConfig, runtime: Arc<RuntimeEnv>) -> SessionContext {
    crate::known_wrong::switch_off(config.options_mut());
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_default_features()
        .with_physical_optimizer_rules(crate::known_wrong::physical_rules());
    if !crate::known_wrong::reenabled("timestamp_literal_truncation") {
        state = state.with_optimizer_rules(crate::exact_timestamps::optimizer_rules());
    }
    SessionContext::new_with_state(state.build())
}

/// The runtime of a session. DataFusion's list-files cache is off: on a miss it lists
/// a whole table to serve one partition's prefix, and then prunes every cached file
/// one by one (a second a day for a lake of a few thousand partitions); without it a
/// filter on the partition columns lists only their directories. The footer and
/// statistics caches are shared by the process's runs that reach the same stores (the
/// dates of a backfill re-read the same dimension files): DataFusion keys an entry by
/// the path within its store, so runs of other buckets or endpoints get caches of their
/// own, and an entry serves a file only while its size and modification time are the
/// ones it was read at.
fn runtime(job: &Job) -> Arc<RuntimeEnv> {
    type Caches = (Arc<FileStatisticsCache>, Arc<FileMetadataCache>);
    type Stores = Vec<(String, idem_io::store::StorageOptions)>;
    static SHARED: std::sync::LazyLock<
        std::sync::Mutex<std::collections::HashMap<Stores, Caches>>,
    > = std::sync::LazyLock::new(Default::default);
    let target = job.target.path.to_string_lossy();
    let mut stores: Stores = job
        .sources
        .iter()
        .map(|s| s.path.as_str())
        .chain(std::iter::once(target.as_ref()))
        .map(|path| match idem_io::store::store_base(path) {
            Some(base) if idem_io::store::is_url(path) => (base, job.storage_for(path).clone()),
            _ => ("file".to_string(), Default::default()),
        })
        .collect();
    stores.sort_by_key(|(base, options)| format!("{base} {options:?}"));
    stores.dedup();
    let (statistics, footers) = SHARED
        .lock()
        .expect("not poisoned")
        .entry(stores)
        .or_insert_with(|| {
            let shared = CacheManager::try_new(&CacheManagerConfig::default())
                .expect("the default caches are valid");
            (
                shared
                    .get_file_statistic_cache()
                    .expect("the default statistics cache is on"),
                shared.get_file_metadata_cache(),
            )
        })
        .clone();
    let caches = CacheManagerConfig::default()
        .with_list_files_cache_limit(0)
        .with_file_statistics_cache(Some(statistics))
        .with_file_metadata_cache(Some(footers));
    let runtime = RuntimeEnvBuilder::new()
        .with_cache_manager(caches)
        .build_arc()
        .expect("a runtime of the default settings and these caches is valid");
    // Local files are read through recycled buffers (see idem_io::local_reads), and a
    // listing fails on an empty `.parquet` file, naming it.
    runtime.register_object_store(
        datafusion::execution::object_store::ObjectStoreUrl::local_filesystem().as_ref(),
        Arc::new(idem_io::empty_parquet::RefuseEmpty::new(
            Arc::new(idem_io::local_reads::LocalReads::new()),
            "",
        )),
    );
    runtime
}

async fn register(ctx: &SessionContext, job: &Job, s: &Source) -> Result<()> {
    let err = |message: String| Error::Source {
        path: job.path.clone(),
        source_name: s.name.clone(),
        message,
    };
    // A failure of I/O or of the store while listing or reading the source is not
    // the job's fault: a retry may succeed.
    let failed = |message: String, unreachable: bool| source_error(job, s, message, unreachable);
    // Checked here, when the job is planned, not when it is loaded: in a project a
    // job's source may be another job's table that does not exist yet.
    let is_glob = s.path.contains(['*', '?', '[']);
    let remote = idem_io::store::is_url(&s.path);
    if remote {
        let store =
            idem_io::store::object_store(&s.path, &s.storage).map_err(|e| err(e.to_string()))?;
        let url = ListingTableUrl::parse(&s.path)
            .map_err(|e| err(format!("path {}: {e}", s.path)))?
            .object_store();
        // A listing of the source fails on an empty `.parquet` object, naming it.
        let store = Arc::new(idem_io::empty_parquet::RefuseEmpty::new(
            store,
            url.as_str(),
        ));
        ctx.register_object_store(url.as_ref(), store);
        if s.format == Format::Parquet && !is_glob {
            if let Some(frame) = delta_frame(ctx, job, s).await? {
                return register_provider(ctx, job, s, frame.into_view()).await;
            }
            // An idem table on an object store is read through its partitions'
            // markers, so a run never sees a partition mid-apply.
            // Its partitions as committed (marker reads), off the async workers; read
            // again when a file they name is gone by the time its footer is read (an
            // apply finished and removed the staged copy read from, or a newer commit
            // replaced the partition).
            let mut attempt = 0;
            while let Some(committed) = committed_partitions(s).await.map_err(|e| {
                failed(
                    format!("cannot read the files under {}: {e}", s.path),
                    crate::error::unreachable_cause(&e),
                )
            })? {
                let recorded = ReadFiles::count(ctx);
                match committed_frame(ctx, &committed, s).await {
                    Ok(frame) => return register_provider(ctx, job, s, frame.into_view()).await,
                    Err((e, unreachable)) => {
                        ReadFiles::forget_after(ctx, recorded);
                        if attempt == 3 || !any_gone(&committed, s).await {
                            return Err(failed(
                                format!("reading the idem table {}: {e}", s.path),
                                unreachable || attempt == 3,
                            ));
                        }
                        attempt += 1;
                    }
                }
            }
        }
    } else if s.format == Format::Parquet
        && !is_glob
        && std::path::Path::new(&s.path).join("_delta_log").is_dir()
    {
        let Some(frame) = delta_frame(ctx, job, s).await? else {
            return Err(err(format!(
                "{} has a `_delta_log` directory but no Delta table",
                s.path.trim_end_matches('/')
            )));
        };
        return register_provider(ctx, job, s, frame.into_view()).await;
    } else if !is_glob && !std::path::Path::new(&s.path).exists() {
        return Err(err(format!(
            "path {} does not exist",
            s.path.trim_end_matches('/')
        )));
    }
    let url = ListingTableUrl::parse(&s.path).map_err(|e| err(format!("path {}: {e}", s.path)))?;
    let format: Arc<dyn FileFormat> = match s.format {
        Format::Parquet => Arc::new(ParquetFormat::default()),
        Format::Csv => Arc::new(
            CsvFormat::default()
                .with_has_header(s.csv_header)
                .with_delimiter(s.csv_delimiter),
        ),
        Format::Json => Arc::new(JsonFormat::default()),
    };
    let extension = extension_of(s);
    let state = ctx.state();
    let mut options = ListingOptions::new(format).with_file_extension(extension.clone());
    let partition_cols: Vec<(String, DataType)> = match &s.partition_columns {
        Some(cols) => cols.clone(),
        None => options
            .infer_partitions(&state, &url)
            .await
            .map_err(|e| {
                let unreachable = crate::error::unreachable_cause(&e);
                failed(format!("listing {}: {e}", s.path), unreachable)
            })?
            .into_iter()
            .map(|c| (c, DataType::Utf8))
            .collect(),
    };
    options = options.with_table_partition_cols(partition_cols);
    let schema = infer_schema(&state, &url, &options, &extension)
        .await
        .map_err(|e| match e {
            Inference::NoFiles => err(format!(
                "{} {} (set `extension` if the files are named otherwise)",
                if extension.is_empty() {
                    "no files match".to_string()
                } else {
                    format!("no {extension} files under")
                },
                s.path
            )),
            Inference::Failed(e) => failed(
                format!("cannot read the files under {}: {e}", s.path),
                crate::error::unreachable_cause(&e),
            ),
        })?;
    let config = ListingTableConfig::new(url)
        .with_listing_options(options)
        .with_schema(schema);
    let table = ListingTable::try_new(config).map_err(|e| err(e.to_string()))?;
    register_provider(ctx, job, s, Arc::new(table)).await
}

/// Registers a source's rows under its name (through a deduplicating view when the
/// source has `dedupe`).
async fn register_provider(
    ctx: &SessionContext,
    job: &Job,
    s: &Source,
    table: Arc<dyn TableProvider>,
) -> Result<()> {
    let err = |message: String| Error::Source {
        path: job.path.clone(),
        source_name: s.name.clone(),
        message,
    };
    let Some(dedupe) = &s.dedupe else {
        ctx.register_table(s.name.as_str(), table)
            .map_err(|e| err(e.to_string()))?;
        return Ok(());
    };
    // Deduplicated: the source is a view keeping the newest row per key. A tie on
    // `latest_by` among a key's newest rows fails the run (never an arbitrary pick).
    let columns: Vec<String> = table
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    for c in dedupe.key.iter().chain(std::iter::once(&dedupe.latest_by)) {
        if !columns.contains(c) {
            return Err(err(format!(
                "dedupe names column `{c}`, which the source does not have; its columns are: {}",
                columns.join(", ")
            )));
        }
    }
    let raw = format!("__idem_raw_{}", s.name);
    ctx.register_table(raw.as_str(), table)
        .map_err(|e| err(e.to_string()))?;
    let q = crate::sql::ident;
    let key = dedupe
        .key
        .iter()
        .map(|k| q(k))
        .collect::<Vec<_>>()
        .join(", ");
    let latest = q(&dedupe.latest_by);
    let cols = columns.iter().map(|c| q(c)).collect::<Vec<_>>().join(", ");
    let key_text = dedupe
        .key
        .iter()
        .map(|k| format!("'{k}=', cast({} as varchar)", q(k)))
        .collect::<Vec<_>>()
        .join(", ' ', ");
    let sql = format!(
        "create view \"{name}\" as select {cols} from ( \
           select *, row_number() over (partition by {key} order by {latest} desc) as __idem_rn, \
                  count(*) over (partition by {key}, {latest}) as __idem_ties \
           from \"{raw}\") \
         where __idem_rn = 1 and idem_dedupe_unique(__idem_ties = 1, concat({key_text}), '{name}', '{latest_name}')",
        name = s.name,
        latest_name = dedupe.latest_by,
    );
    ctx.sql(&sql)
        .await
        .map_err(|e| err(format!("dedupe: {e}")))?;
    Ok(())
}

/// The committed partitions of the idem table `s` names on an object store (each with
/// its manifest and the URLs of its files), or `None` when it is not an idem table.
async fn committed_partitions(
    s: &Source,
) -> idem_io::Result<Option<Vec<idem_io::commit::CommittedPartition>>> {
    let (path, storage) = (s.path.clone(), s.storage.clone());
    crate::blocking(move || {
        let table = match idem_io::table::open(&path, &storage) {
            Ok(t) => t,
            // The store failed to answer whether a table is there: a retry may read it.
            Err(e @ idem_io::Error::ObjectStore { .. }) => return Err(e),
            Err(_) => return Ok(None),
        };
        table.committed()
    })
    .await
}

/// A source's failure: `unreachable` when the store or the disk failed (a retry may
/// succeed), else the job's or the data's fault.
fn source_error(job: &Job, s: &Source, message: String, unreachable: bool) -> Error {
    if unreachable {
        Error::SourceUnreachable {
            path: job.path.clone(),
            source_name: s.name.clone(),
            message,
        }
    } else {
        Error::Source {
            path: job.path.clone(),
            source_name: s.name.clone(),
            message,
        }
    }
}

/// The rows of the Delta table `s` names at its latest version, read through its log
/// (a listing would also read the files its commits removed), whoever wrote it; `None`
/// when there is no Delta table there. Partition columns are typed as the source
/// declares them, else as the table's schema does; files written before a column was
/// added read it as null.
async fn delta_frame(
    ctx: &SessionContext,
    job: &Job,
    s: &Source,
) -> Result<Option<datafusion::dataframe::DataFrame>> {
    let (path, storage) = (s.path.clone(), s.storage.clone());
    let scan = crate::blocking(move || idem_io::table::delta_scan(&path, &storage))
        .await
        .map_err(|e| {
            let message = match e {
                idem_io::Error::DeltaUnsupported { .. } => e.to_string(),
                _ => format!("cannot read the files under {}: {e}", s.path),
            };
            source_error(job, s, message, crate::error::unreachable_cause(&e))
        })?;
    let Some(scan) = scan else {
        return Ok(None);
    };
    let declared = |col: &str| {
        s.partition_columns
            .as_ref()
            .and_then(|cols| cols.iter().find(|(c, _)| c == col))
            .or_else(|| scan.partition_types.iter().find(|(c, _)| c == col))
            .map(|(_, dt)| dt.clone())
            .unwrap_or(DataType::Utf8)
    };
    let groups = scan
        .partitions
        .iter()
        .map(|(p, urls)| (p, urls.clone()))
        .collect();
    let frame = partition_files_frame(ctx, groups, Some(&scan.data_schema), declared)
        .await
        .map_err(|e| {
            let message = format!(
                "reading the Delta table {} at version {}: {e}",
                s.path, scan.version
            );
            source_error(job, s, message, crate::error::unreachable_cause(&e))
        })?;
    match frame {
        Some(frame) => Ok(Some(frame)),
        // A table with no live file: no rows, in the table's columns.
        None => {
            let mut fields: Vec<arrow::datatypes::FieldRef> =
                scan.data_schema.fields().iter().cloned().collect();
            fields.extend(
                scan.partition_types
                    .iter()
                    .map(|(c, _)| Arc::new(arrow::datatypes::Field::new(c, declared(c), true))),
            );
            let schema = Arc::new(arrow::datatypes::Schema::new(fields));
            let empty = datafusion::datasource::MemTable::try_new(schema, vec![vec![]])
                .and_then(|t| ctx.read_table(Arc::new(t)))
                .map_err(|e| source_error(job, s, e.to_string(), false))?;
            Ok(Some(empty))
        }
    }
}

/// Whether a file of `committed` is gone from the store now.
async fn any_gone(
    committed: &[(PartitionPath, idem_io::manifest::Manifest, Vec<String>)],
    s: &Source,
) -> bool {
    let urls: Vec<String> = committed
        .iter()
        .flat_map(|(_, _, urls)| urls.clone())
        .collect();
    let storage = s.storage.clone();
    crate::blocking(move || {
        urls.iter()
            .any(|u| idem_io::store::head(u, &storage).is_none())
    })
    .await
}

/// The rows of every committed partition of an idem table on an object store, with
/// its partition columns taken from the partition paths (typed as the source declares
/// them, else as text). A filter on them prunes whole partitions when the plan is
/// optimized.
async fn committed_frame(
    ctx: &SessionContext,
    committed: &[(PartitionPath, idem_io::manifest::Manifest, Vec<String>)],
    s: &Source,
) -> std::result::Result<datafusion::dataframe::DataFrame, (String, bool)> {
    let groups = committed
        .iter()
        .rev()
        .map(|(p, _, urls)| (p, urls.clone()))
        .collect();
    let declared = |col: &str| {
        s.partition_columns
            .as_ref()
            .and_then(|cols| cols.iter().find(|(c, _)| c == col))
            .map(|(_, dt)| dt.clone())
            .unwrap_or(DataType::Utf8)
    };
    partition_files_frame(ctx, groups, None, declared)
        .await
        .map_err(|e| (e.to_string(), crate::error::unreachable_cause(&e)))?
        .ok_or_else(|| {
            (
                "it has no committed partition with files".to_string(),
                false,
            )
        })
}

/// The rows of explicit files, partition by partition: the data columns (as `schema`
/// says, else as the files do), then the partition's columns with the values in its
/// path, typed by `partition_type`. `None` when there is no file.
pub(crate) async fn partition_files_frame(
    ctx: &SessionContext,
    groups: Vec<(&PartitionPath, Vec<String>)>,
    schema: Option<&arrow::datatypes::Schema>,
    partition_type: impl Fn(&str) -> DataType,
) -> datafusion::error::Result<Option<datafusion::dataframe::DataFrame>> {
    use datafusion::common::{Column, ScalarValue};
    use datafusion::execution::options::ParquetReadOptions;
    use datafusion::logical_expr::{Expr, lit};
    let mut frame: Option<datafusion::dataframe::DataFrame> = None;
    for (p, files) in groups {
        if files.is_empty() {
            continue;
        }
        let options = match schema {
            Some(schema) => ParquetReadOptions::default().schema(schema),
            None => ParquetReadOptions::default(),
        };
        if let Some(read) = ReadFiles::of(ctx) {
            read.0
                .lock()
                .expect("not poisoned")
                .extend(files.iter().cloned());
        }
        // Object URLs carry raw keys (`%3A` as written); DataFusion decodes a URL once.
        let files: Vec<String> = files
            .iter()
            .map(|f| {
                if idem_io::store::is_url(f) {
                    idem_io::store::datafusion_url(f)
                } else {
                    f.clone()
                }
            })
            .collect();
        let df = ctx.read_parquet(files, options).await?;
        let mut exprs: Vec<Expr> = df
            .schema()
            .fields()
            .iter()
            .map(|f| Expr::Column(Column::new_unqualified(f.name())))
            .collect();
        for (col, value) in p.parts() {
            let dt = partition_type(col);
            let v = match value {
                Some(v) => ScalarValue::try_from_string(v.clone(), &dt)?,
                None => ScalarValue::try_from(&dt)?,
            };
            exprs.push(lit(v).alias(col));
        }
        let df = df.select(exprs)?;
        frame = Some(match frame {
            None => df,
            Some(f) => f.union(df)?,
        });
    }
    Ok(frame)
}

enum Inference {
    NoFiles,
    Failed(datafusion::error::DataFusionError),
}

/// The source's schema, read from its newest file (the last path in sorted order, which
/// for date-partitioned sources is the latest day). DataFusion's own inference opens
/// every file, which for a lake of a few years means thousands of footers per run;
/// older files with fewer columns are adapted to this schema when read.
async fn infer_schema(
    state: &datafusion::execution::SessionState,
    url: &ListingTableUrl,
    options: &ListingOptions,
    extension: &str,
) -> std::result::Result<SchemaRef, Inference> {
    let store = state
        .runtime_env()
        .object_store(url)
        .map_err(Inference::Failed)?;
    let newest = if url.is_collection() {
        let ignore_subdirectory = state
            .config_options()
            .execution
            .listing_table_ignore_subdirectory;
        let wanted = |f: &object_store::path::Path| {
            f.as_ref().ends_with(extension) && url.contains(f, ignore_subdirectory)
        };
        let local = (url.scheme() == "file")
            .then(|| url.get_url().to_file_path().ok())
            .flatten();
        last_file(store.as_ref(), url.prefix(), local, wanted)
            .await
            .map_err(|e| Inference::Failed(e.into()))?
    } else {
        let mut files: Vec<ObjectMeta> = url
            .list_all_files(state, store.as_ref(), extension)
            .await
            .map_err(Inference::Failed)?
            .try_collect()
            .await
            .map_err(Inference::Failed)?;
        files.retain(|f| f.size > 0);
        files.into_iter().max_by(|a, b| a.location.cmp(&b.location))
    };
    let Some(newest) = newest else {
        return Err(Inference::NoFiles);
    };
    options
        .format
        .infer_schema(state, &store, std::slice::from_ref(&newest))
        .await
        .map_err(Inference::Failed)
}

/// The last non-empty file under `prefix`, in the order of full paths, whose path
/// `wanted` accepts: found by listing one directory at a time from the last entry down, so a
/// lake of thousands of partition directories costs two or three listings, not a
/// walk of the tree (it is the walk when no file qualifies). `local` is the
/// directory `prefix` names on this machine, listed without the store: the local
/// store's listing opens every subdirectory to guard against symlink loops, which
/// is most of its cost on a partitioned lake and not needed one level at a time.
async fn last_file(
    store: &dyn object_store::ObjectStore,
    prefix: &object_store::path::Path,
    local: Option<std::path::PathBuf>,
    wanted: impl Fn(&object_store::path::Path) -> bool,
) -> object_store::Result<Option<ObjectMeta>> {
    let mut stack = vec![children(store, Dir::new(prefix.clone(), local)).await?];
    while let Some(level) = stack.last_mut() {
        match level.pop() {
            None => {
                stack.pop();
            }
            Some(Entry::File(f)) => {
                if f.size > 0 && wanted(&f.location) {
                    return Ok(Some(f));
                }
            }
            // Stated only when its name is wanted: other files are never opened.
            Some(Entry::LocalFile(location)) if wanted(&location) => {
                match store.head(&location).await {
                    Ok(f) if f.size > 0 => return Ok(Some(f)),
                    // Removed since it was listed: as if it had not been there.
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Some(Entry::LocalFile(_)) => {}
            Some(Entry::Dir(d)) => {
                let below = children(store, d).await?;
                stack.push(below);
            }
        }
    }
    Ok(None)
}

/// A directory of a source: its store path, and its path on this machine when local,
/// with the (device, inode) of every local directory above it on the way down (a
/// symlink back to one of them is a loop, not descended).
struct Dir {
    path: object_store::path::Path,
    local: Option<std::path::PathBuf>,
    above: Vec<(u64, u64)>,
}

impl Dir {
    fn new(path: object_store::path::Path, local: Option<std::path::PathBuf>) -> Self {
        Self {
            path,
            local,
            above: Vec::new(),
        }
    }
}

enum Entry {
    Dir(Dir),
    File(ObjectMeta),
    /// A local file not yet stated.
    LocalFile(object_store::path::Path),
}

/// The entries of `dir`, sorted so that the last one holds the last path: a
/// directory sorts by its path and a `/`, which every path below it starts with.
async fn children(
    store: &dyn object_store::ObjectStore,
    dir: Dir,
) -> object_store::Result<Vec<Entry>> {
    let mut entries: Vec<(String, Entry)> = match dir.local {
        Some(local) => crate::blocking(move || local_children(&local, dir.above))
            .await
            .map_err(|source| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(source),
            })?,
        None => {
            let listed = store.list_with_delimiter(Some(&dir.path)).await?;
            listed
                .common_prefixes
                .into_iter()
                .map(|d| (format!("{d}/"), Entry::Dir(Dir::new(d, None))))
                .chain(
                    listed
                        .objects
                        .into_iter()
                        .map(|f| (f.location.to_string(), Entry::File(f))),
                )
                .collect()
        }
    };
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries.into_iter().map(|(_, e)| e).collect())
}

/// A local directory's entries under their store paths, as the local store lists
/// them: symlinks followed, only directories and regular files (no FIFO is ever
/// opened), names it cannot represent and its own in-progress files (`name#123`)
/// left out. No entries when `dir` is one of the directories `above`
/// it (a symlink loop).
fn local_children(
    dir: &std::path::Path,
    mut above: Vec<(u64, u64)>,
) -> std::io::Result<Vec<(String, Entry)>> {
    use std::os::unix::fs::MetadataExt;
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    // A directory removed since its parent was listed holds nothing, as for the
    // local store's listing.
    let itself = match std::fs::metadata(dir) {
        Err(e) if gone(&e) => return Ok(Vec::new()),
        other => other?,
    };
    let id = (itself.dev(), itself.ino());
    if above.contains(&id) {
        return Ok(Vec::new());
    }
    above.push(id);
    let entries = match std::fs::read_dir(dir) {
        Err(e) if gone(&e) => return Ok(Vec::new()),
        other => other?,
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = match entry {
            Err(e) if gone(&e) => continue,
            other => other?,
        };
        let path = entry.path();
        let mut kind = entry.file_type()?;
        if kind.is_symlink() {
            match std::fs::metadata(&path) {
                Ok(m) => kind = m.file_type(),
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        let Ok(location) = object_store::path::Path::from_absolute_path(&path) else {
            continue;
        };
        if kind.is_dir() {
            let below = Dir {
                path: location.clone(),
                local: Some(path),
                above: above.clone(),
            };
            out.push((format!("{location}/"), Entry::Dir(below)));
        } else if kind.is_file() && local_store_lists(&location) {
            out.push((location.to_string(), Entry::LocalFile(location)));
        }
    }
    Ok(out)
}

/// Whether the local store lists a file of this name: not its own staged uploads,
/// named `name#123`.
fn local_store_lists(location: &object_store::path::Path) -> bool {
    match location.filename().and_then(|n| n.split_once('#')) {
        Some((_, suffix)) => suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_digit()),
        None => location.filename().is_some(),
    }
}

/// The suffix of the files a source reads: as configured, else the format's for a
/// directory, and none for a file or a glob.
fn extension_of(s: &Source) -> String {
    match (&s.extension, s.path.ends_with('/')) {
        (Some(e), _) => e.clone(),
        (None, true) => s.format.extension().into(),
        (None, false) => String::new(),
    }
}

/// Every file of every source, for diagnosing a failure that happened before the
/// plan's own file list was known (DataFusion reads footers while planning).
pub async fn all_source_files(ctx: &SessionContext, job: &Job) -> Vec<InputFile> {
    let state = ctx.state();
    let mut out = Vec::new();
    for s in &job.sources {
        let Ok(url) = ListingTableUrl::parse(&s.path) else {
            continue;
        };
        let Ok(store) = state.runtime_env().object_store(&url) else {
            continue;
        };
        let ext = extension_of(s);
        let Ok(stream) = url.list_all_files(&state, store.as_ref(), &ext).await else {
            continue;
        };
        let files: Vec<ObjectMeta> = stream.try_collect().await.unwrap_or_default();
        for f in files {
            out.push(InputFile {
                source: s.name.clone(),
                path: url_of(url.object_store().as_str(), &f.location),
                size: f.size,
                mtime: None,
                etag: None,
                idem_digest: None,
            });
        }
    }
    out.sort();
    out
}

/// The files a physical plan will read (after partition pruning), sorted, with their
/// sizes and modification times: recorded in the manifest as the run's inputs.
pub async fn inputs_of(plan: &Arc<dyn ExecutionPlan>, job: &Job) -> Vec<InputFile> {
    // Reading an input's idem digest may wait for an object store: off the workers.
    let (plan, job) = (Arc::clone(plan), job.clone());
    crate::blocking(move || inputs_now(&plan, &job)).await
}

fn inputs_now(plan: &Arc<dyn ExecutionPlan>, job: &Job) -> Vec<InputFile> {
    let mut out = Vec::new();
    collect_inputs(plan, job, &mut out);
    out.sort();
    out.dedup();
    idem_io::table::record_idem_digests(&mut out, &|url| job.storage_for(url).clone());
    out
}

fn collect_inputs(plan: &Arc<dyn ExecutionPlan>, job: &Job, out: &mut Vec<InputFile>) {
    if let Some(exec) = plan.downcast_ref::<DataSourceExec>()
        && let Some(scan) = exec.data_source().downcast_ref::<FileScanConfig>()
    {
        for group in &scan.file_groups {
            for f in group.files() {
                let path = url_of(scan.object_store_url.as_str(), &f.object_meta.location);
                let source = job
                    .sources
                    .iter()
                    .find(|s| holds(s, &path))
                    .map(|s| s.name.clone())
                    .unwrap_or_default();
                out.push(InputFile {
                    source,
                    path,
                    size: f.object_meta.size,
                    mtime: Some(f.object_meta.last_modified.to_rfc3339()),
                    etag: f.object_meta.e_tag.clone(),
                    idem_digest: None,
                });
            }
        }
    }
    for child in plan.children() {
        collect_inputs(child, job, out);
    }
}

/// Whether the file at `path` (as [`url_of`] names it) belongs to the source `s`: it
/// is the source's file, lies under its directory, or matches its glob.
fn holds(s: &Source, path: &str) -> bool {
    if s.path.contains(['*', '?', '[']) {
        return glob::Pattern::new(&s.path).is_ok_and(|p| p.matches(path));
    }
    let dir = s.path.trim_end_matches('/');
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The job's sources the transform reads, subqueries included: those a table scan of
/// the logical plan names (directly, or through the view that deduplicates them).
pub fn sources_scanned<'a>(
    job: &'a Job,
    plan: &datafusion::logical_expr::LogicalPlan,
) -> Vec<&'a Source> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::LogicalPlan;
    let mut scanned = std::collections::BTreeSet::new();
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            scanned.insert(scan.table_name.table().to_string());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    job.sources
        .iter()
        .filter(|s| {
            scanned.contains(&s.name) || scanned.contains(&format!("__idem_raw_{}", s.name))
        })
        .collect()
}

/// A file's path as the job names it: `/abs/path` on the local filesystem, else the
/// store's URL and the key (`s3://bucket/raw/x.parquet`).
fn url_of(store: &str, location: &object_store::path::Path) -> String {
    if store.starts_with("file://") {
        format!("/{location}")
    } else {
        format!("{}/{location}", store.trim_end_matches('/'))
    }
}

/// After a failed execution `e`, finds an input file that cannot be read, so the error
/// can name it: DataFusion's decoding errors do not say which file they came from. A
/// file that cannot be opened is reported only when the failure was not the data's:
/// it is then the likelier cause. When a page could not be decoded, each Parquet file
/// whose footer reads is decoded whole, to find the one that fails (an object on an
/// object store is fetched whole for it).
pub async fn diagnose_inputs(job: &Job, inputs: &[InputFile], e: &Error) -> Option<Error> {
    let data_fault = e.is_data_error();
    // A page that would not decode, a footer the Arrow schema would not read from, or
    // a decoder that panicked on what it read.
    let text = e.to_string();
    let undecodable = e
        .find_source::<arrow::error::ArrowError>()
        .is_some_and(|a| matches!(a, arrow::error::ArrowError::ParquetError(_)))
        || e.find_source::<parquet::errors::ParquetError>().is_some()
        || text.contains("Parquet error")
        || text.contains("Out of range of file")
        || text.contains("panicked");
    for input in inputs {
        let Some(source) = job.sources.iter().find(|s| s.name == input.source) else {
            continue;
        };
        // A file that cannot be opened (gone, too many open files) is I/O, which a
        // retry may not meet; one whose content cannot be read is the file's fault.
        let checked = if idem_io::store::is_url(&input.path) {
            object_bytes(job, &input.path)
                .await
                .map(|bytes| content_problem(source.format, bytes, undecodable))
                .map_err(|e| format!("object {} cannot be read: {e}", input.path))
        } else {
            std::fs::File::open(&input.path)
                .map(|file| content_problem(source.format, file, undecodable))
                .map_err(|e| format!("file {} cannot be opened: {e}", input.path))
        };
        let problem = match checked {
            Ok(problem) => problem,
            Err(_) if data_fault => continue,
            Err(message) => {
                return Some(Error::SourceUnreachable {
                    path: job.path.clone(),
                    source_name: source.name.clone(),
                    message,
                });
            }
        };
        if let Some(problem) = problem {
            return Some(Error::Source {
                path: job.path.clone(),
                source_name: source.name.clone(),
                message: format!("file {} cannot be read: {problem}", input.path),
            });
        }
    }
    None
}

/// The whole object at `url`, to diagnose it.
async fn object_bytes(
    job: &Job,
    url: &str,
) -> std::result::Result<impl parquet::file::reader::ChunkReader + 'static, String> {
    use object_store::ObjectStoreExt;
    let store =
        idem_io::store::object_store(url, job.storage_for(url)).map_err(|e| e.to_string())?;
    let key = idem_io::store::raw_key(idem_io::store::key_of(url));
    let got = store.get(&key).await.map_err(|e| e.to_string())?;
    got.bytes().await.map_err(|e| e.to_string())
}

/// What is wrong with the content of a source's file (on disk, or an object's bytes),
/// if anything: a footer that does not read, a page that does not decode (looked for
/// when `undecodable`), text that is not UTF-8.
fn content_problem<R: parquet::file::reader::ChunkReader + 'static>(
    format: Format,
    file: R,
    undecodable: bool,
) -> Option<String> {
    match format {
        Format::Parquet => parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .map(|_| ())
            .map_err(|e| e.to_string())
            .and_then(|()| {
                if undecodable {
                    decode_whole(file)
                } else {
                    Ok(())
                }
            })
            .err(),
        Format::Csv | Format::Json => file
            .get_bytes(0, file.len() as usize)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                std::str::from_utf8(&bytes)
                    .map(|_| ())
                    .map_err(|e| format!("not UTF-8 text ({e})"))
            })
            .err(),
    }
}

/// Reads every row of a Parquet file, batch by batch, to find a page that cannot be
/// decoded.
fn decode_whole<R: parquet::file::reader::ChunkReader + 'static>(
    file: R,
) -> std::result::Result<(), String> {
    quietly(move || {
        let metadata = arrow_metadata(&file)?;
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::new_with_metadata(
                file, metadata,
            )
            .build()
            .map_err(|e| e.to_string())?;
        for batch in reader {
            batch.map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

/// A Parquet file's footer as DataFusion reads it: with its page index, and the Arrow
/// schema stored in it decoded.
fn arrow_metadata<R: parquet::file::reader::ChunkReader>(
    file: &R,
) -> std::result::Result<parquet::arrow::arrow_reader::ArrowReaderMetadata, String> {
    let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
        .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
    parquet::arrow::arrow_reader::ArrowReaderMetadata::load(file, options)
        .map_err(|e| e.to_string())
}

/// `f`'s result, or its panic as an error: the Parquet decoder panics on some damaged
/// files (a footer length past the file's start, a bit width out of range).
fn quietly(f: impl FnOnce() -> std::result::Result<(), String>) -> std::result::Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panicked(p)))
}

/// A panic of the Parquet decoder, as what went wrong with the file.
fn panicked(panic: Box<dyn std::any::Any + Send>) -> String {
    let what = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    format!("the Parquet decoder failed on it ({what})")
}

/// What is wrong with the footer of the object `meta` names, read as DataFusion reads
/// it (the end of the object, then as much more as the footer says it needs); `None`
/// when it reads, or when the object cannot be fetched (that is I/O, not its content).
async fn footer_problem(
    store: &dyn object_store::ObjectStore,
    meta: &object_store::ObjectMeta,
) -> Option<String> {
    use object_store::ObjectStoreExt as _;
    use parquet::errors::ParquetError;
    let size = meta.size;
    let mut want = size.min(64 << 10);
    loop {
        let bytes = store
            .get_range(&meta.location, size - want..size)
            .await
            .ok()?;
        let parsed = std::panic::catch_unwind(|| {
            parquet::file::metadata::ParquetMetaDataReader::new()
                .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional)
                .try_parse_sized(&bytes, size)
        });
        match parsed {
            Ok(Ok(())) => return None,
            Ok(Err(ParquetError::NeedMoreData(n))) if (n as u64) > want && (n as u64) <= size => {
                want = n as u64;
            }
            Ok(Err(e)) => return Some(e.to_string()),
            Err(panic) => return Some(panicked(panic)),
        }
    }
}

/// [`diagnose_footers`] for the sources on object stores: the first `.parquet` object
/// whose footer does not read as DataFusion reads it.
pub async fn diagnose_object_footers(job: &Job) -> Option<Error> {
    use futures::TryStreamExt as _;
    let remote = job
        .sources
        .iter()
        .filter(|s| s.format == Format::Parquet && idem_io::store::is_url(&s.path));
    for source in remote {
        let Ok(store) = idem_io::store::object_store(&source.path, &source.storage) else {
            continue;
        };
        let Ok(base) = ListingTableUrl::parse(&source.path) else {
            continue;
        };
        // A glob's objects are under the folder before its first wildcard.
        let key = idem_io::store::key_of(&source.path);
        let fixed = key.split(['*', '?', '[']).next().unwrap_or_default();
        let folder = match fixed.rsplit_once('/') {
            Some((folder, _)) if fixed.len() < key.len() => folder,
            _ => key.as_str(),
        };
        let prefix = idem_io::store::raw_key(folder);
        let Ok(mut objects) = store.list(Some(&prefix)).try_collect::<Vec<_>>().await else {
            continue;
        };
        objects.retain(|o| o.location.as_ref().ends_with(".parquet"));
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        for meta in objects {
            let Some(problem) = footer_problem(store.as_ref(), &meta).await else {
                continue;
            };
            return Some(Error::Source {
                path: job.path.clone(),
                source_name: source.name.clone(),
                message: format!(
                    "file {} cannot be read: {problem}",
                    url_of(base.object_store().as_str(), &meta.location)
                ),
            });
        }
    }
    None
}

/// After planning panicked (the Parquet decoder does on some damaged footers while
/// DataFusion reads statistics), the first local Parquet file of the job's sources
/// whose footer does not read, as a bad-input error naming it (those on object stores:
/// [`diagnose_object_footers`]).
pub fn diagnose_footers(job: &Job) -> Option<Error> {
    for source in job.sources.iter().filter(|s| s.format == Format::Parquet) {
        if idem_io::store::is_url(&source.path) {
            continue;
        }
        let mut files = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(&source.path)];
        while let Some(dir) = dirs.pop() {
            if dir.is_file() {
                files.push(dir);
                continue;
            }
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "parquet") {
                    files.push(path);
                }
            }
        }
        files.sort();
        for path in files {
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let read = quietly(move || arrow_metadata(&file).map(|_| ()));
            if let Err(problem) = read {
                return Some(Error::Source {
                    path: job.path.clone(),
                    source_name: source.name.clone(),
                    message: format!("file {} cannot be read: {problem}", path.display()),
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use object_store::local::LocalFileSystem;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
    use proptest::prelude::*;

    use super::last_file;

    /// Names that sort around each other's prefixes: `a` < `a.parquet` < `a/…` < `a=1`
    /// < `ab`, and partition directories whose text order is not their numeric one.
    const NAMES: [&str; 8] = [
        "a",
        "a.parquet",
        "a=1",
        "a=10",
        "a=2",
        "ab",
        "b.parquet",
        "b.csv",
    ];

    fn tree() -> impl Strategy<Value = Vec<(Vec<usize>, bool)>> {
        prop::collection::vec(
            (prop::collection::vec(0..NAMES.len(), 1..4), any::<bool>()),
            0..24,
        )
    }

    /// A symlink back up the tree is not followed round: the descent ends, on the
    /// last file outside the loop.
    #[test]
    fn a_symlink_loop_ends_the_descent_there() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("t");
        std::fs::create_dir_all(root.join("b")).unwrap();
        std::fs::write(root.join("a.parquet"), b"x").unwrap();
        std::fs::write(root.join("b/c.parquet"), b"").unwrap();
        std::os::unix::fs::symlink(&root, root.join("b/loop")).unwrap();
        std::os::unix::fs::symlink(root.join("b"), root.join("zz")).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let prefix = Path::from_absolute_path(&root).unwrap();
        let found = runtime
            .block_on(last_file(
                &LocalFileSystem::new(),
                &prefix,
                Some(root.clone()),
                |_| true,
            ))
            .unwrap()
            .map(|f| f.location);
        assert_eq!(
            found,
            Some(Path::from_absolute_path(root.join("a.parquet")).unwrap())
        );
    }

    /// Only regular files are files: a FIFO that sorts last is neither opened (which
    /// would wait for a writer for ever) nor taken for the newest file.
    #[test]
    fn a_fifo_is_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("t");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a.parquet"), b"x").unwrap();
        for fifo in ["zz.parquet", "zzz.tmp"] {
            let made = std::process::Command::new("mkfifo")
                .arg(root.join(fifo))
                .status()
                .unwrap();
            assert!(made.success());
        }
        // On a thread of its own, so that a descent stuck on the FIFO fails the test
        // instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let at = root.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .build()
                .unwrap();
            let prefix = Path::from_absolute_path(&at).unwrap();
            let found = runtime
                .block_on(last_file(
                    &LocalFileSystem::new(),
                    &prefix,
                    Some(at),
                    |_| true,
                ))
                .unwrap()
                .map(|f| f.location);
            tx.send(found).unwrap();
        });
        let found = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the descent does not wait on a FIFO");
        assert_eq!(
            found,
            Some(Path::from_absolute_path(root.join("a.parquet")).unwrap())
        );
    }

    proptest! {
        /// The descent finds what sorting a listing of every file would: the last
        /// path among the files that qualify (here: not empty, a `.parquet` name), in
        /// a store and in a local directory.
        #[test]
        fn the_last_file_is_the_last_of_a_full_listing(files in tree()) {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .build()
                .unwrap();
            let wanted = |f: &Path| f.as_ref().ends_with(".parquet");
            let eligible = |f: &object_store::ObjectMeta| f.size > 0 && wanted(&f.location);
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("t");
            std::fs::create_dir(&root).unwrap();
            let memory = InMemory::new();
            for (segments, empty) in &files {
                let names: Vec<&str> = segments.iter().map(|&i| NAMES[i]).collect();
                let body: &'static [u8] = if *empty { b"" } else { b"x" };
                let key = format!("t/{}", names.join("/"));
                runtime
                    .block_on(memory.put(&Path::from(key), PutPayload::from_static(body)))
                    .unwrap();
                // On disk a name is a file or a directory, never both: the first wins.
                let file = names.iter().fold(root.clone(), |p, n| p.join(n));
                if std::fs::create_dir_all(file.parent().unwrap()).is_ok() && !file.exists() {
                    std::fs::write(&file, body).unwrap();
                }
            }
            let local = LocalFileSystem::new();
            let prefix = Path::from_absolute_path(&root).unwrap();
            let last_listed = |store: &dyn ObjectStore, prefix: &Path| {
                let all: Vec<_> = runtime
                    .block_on(futures::TryStreamExt::try_collect::<Vec<_>>(
                        store.list(Some(prefix)),
                    ))
                    .unwrap();
                all.into_iter()
                    .filter(eligible)
                    .map(|f| f.location)
                    .max_by(|a, b| a.as_ref().cmp(b.as_ref()))
            };
            let in_memory = runtime
                .block_on(last_file(&memory, &Path::from("t"), None, wanted))
                .unwrap()
                .map(|f| f.location);
            prop_assert_eq!(in_memory, last_listed(&memory, &Path::from("t")));
            let on_disk = runtime
                .block_on(last_file(&local, &prefix, Some(root.clone()), wanted))
                .unwrap()
                .map(|f| f.location);
            prop_assert_eq!(on_disk, last_listed(&local, &prefix));
        }
    }
}
