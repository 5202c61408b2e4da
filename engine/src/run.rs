//! One run of a job for one logical date, in `replace_partitions` mode.
//!
//! Planning touches no storage: the job is parsed, the SQL planned, the determinism
//! guard and the output checks run, and only then is anything staged. Rows stream
//! from DataFusion through the router into one writer per partition, in a staging
//! area outside the table; every partition the output touches, and every partition the
//! window owns, is then compared with the live one by content digest and either left
//! alone (`unchanged`) or swapped in atomically. A failure before publishing leaves the
//! table as it was; a failure while publishing leaves each partition old or new.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use futures::StreamExt;
use idem_io::commit::{Checked, CommitBackend, PublishMode, Version};
use idem_io::digest::DigestState;
use idem_io::failpoint;
use idem_io::hive::PartitionPath;
use idem_io::manifest::{
    ColumnEntry, InputFile, LiveState, RunInfo, describe_schema, schema_fingerprint,
};
use idem_io::writer::{KeptFile, PartitionWriter, WriterOptions, WrittenPartition};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::job::{Job, Mode, OnSchemaChange};
use crate::params::{self, Var};
use crate::route::Router;
use crate::window::{Grain, TimeColumnKind, Window, interval_of, window_values};

/// Memory the buffered row groups of all partitions of a run may hold before the
/// largest is flushed early.
const WRITE_BUFFER_BUDGET: usize = 512 << 20;

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub date: String,
    pub vars: Vec<Var>,
    /// Skip the run when every partition its window owns is fresh (see `freshness`).
    pub skip_fresh: bool,
}

impl RunOptions {
    /// The `--var` values as text, as manifests record them.
    pub fn var_text(&self) -> BTreeMap<String, String> {
        self.vars
            .iter()
            .map(|v| (v.name.clone(), v.value.to_string()))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// New rows were published.
    Written,
    /// The new rows equal the live ones (same digest and schema): nothing was touched.
    Unchanged,
    /// The run owns the partition but produced no rows for it: it now holds none.
    Emptied,
    /// `--skip-fresh`: the partition was written by this job and idem version from
    /// inputs that have not changed since, so the run was skipped.
    Fresh,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Written => "written",
            Action::Unchanged => "unchanged",
            Action::Emptied => "emptied",
            Action::Fresh => "fresh",
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PartitionReport {
    pub partition: String,
    pub action: Action,
    pub rows: u64,
    pub bytes: u64,
    pub files: usize,
    pub digest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish: Option<PublishMode>,
    pub ms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub job: String,
    pub job_file: String,
    pub table: String,
    pub logical_date: String,
    pub run_id: String,
    pub partitions: Vec<PartitionReport>,
    pub rows: u64,
    pub bytes: u64,
    pub inputs: usize,
    pub elapsed_ms: u64,
    pub warnings: Vec<String>,
    /// For a merge: how many files it read and how many it kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<crate::merge::MergeStats>,
}

impl RunReport {
    /// The report of a run of `job` over `window` that left `partitions` as listed, with
    /// their totals; no elapsed time, warnings or merge figures yet.
    fn of(
        job: &Job,
        window: &Window,
        run_id: String,
        inputs: usize,
        partitions: Vec<PartitionReport>,
    ) -> RunReport {
        RunReport {
            job: job.name.clone(),
            job_file: job.path.display().to_string(),
            table: job.target.path.display().to_string(),
            logical_date: window.label(),
            run_id,
            rows: partitions.iter().map(|p| p.rows).sum(),
            bytes: partitions.iter().map(|p| p.bytes).sum(),
            inputs,
            partitions,
            elapsed_ms: 0,
            warnings: Vec::new(),
            merge: None,
        }
    }
}

/// Receives progress while a run executes (the CLI draws it).
pub trait Observer: Send + Sync {
    fn phase(&self, _phase: &str) {}
    fn rows(&self, _total: u64) {}
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

/// A run that has been planned and validated; nothing has been written yet.
pub struct Planned {
    job: Job,
    vars: BTreeMap<String, String>,
    window: Window,
    ctx: SessionContext,
    df: DataFrame,
    output: SchemaRef,
    time: Option<TimeColumn>,
}

impl Planned {
    pub fn window(&self) -> &Window {
        &self.window
    }

    pub fn output_schema(&self) -> &SchemaRef {
        &self.output
    }
}

/// Plans the SQL alone, without binding parameters or any check (for diagnostics).
pub async fn plan_unchecked(job: &Job) -> Result<DataFrame> {
    let ctx = crate::session::context(job).await?;
    ctx.sql(&job.sql).await.map_err(|e| Error::Sql {
        path: job.path.clone(),
        message: sql_message(&e),
    })
}

/// Plans a run: parses the date, plans the SQL with bound parameters, and checks
/// determinism and the output's shape. Touches no storage.
pub async fn plan(job: &Job, opts: &RunOptions) -> Result<Planned> {
    let window = Window::parse(job.target.grain, &opts.date)?.with_lookback(job.lookback);
    if job.target.path.exists() && !job.target.path.is_dir() {
        return Err(Error::JobInvalid {
            path: job.path.clone(),
            message: format!(
                "[target] path {} exists and is not a directory",
                job.target.path.display()
            ),
        });
    }
    let ctx = crate::session::context(job).await?;
    let sql_err = |e: datafusion::error::DataFusionError| Error::Sql {
        path: job.path.clone(),
        message: sql_message(&e),
    };
    let df = ctx.sql(&job.sql).await.map_err(sql_err)?;
    if !job.allow_nondeterministic {
        crate::guard::check(&job.path, df.logical_plan())?;
    }
    let values = params::values(&window, &opts.vars);
    let bound = params::bind(&job.path, df.logical_plan(), &values)?;
    let df = df.with_param_values(bound).map_err(sql_err)?;
    let output: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let time = check_output(job, &window, &output)?;
    // Every column the job names must be in the output.
    let named = job
        .target
        .key
        .iter()
        .map(|k| ("[target] key".to_string(), k.clone()))
        .chain(
            job.checks
                .columns()
                .into_iter()
                .map(|(check, c)| (format!("[checks] {check}"), c)),
        );
    for (by, column) in named {
        if output.field_with_name(&column).is_err() {
            let columns: Vec<&str> = output.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(Error::Output {
                path: job.path.clone(),
                message: format!(
                    "has no column `{column}`, which {by} names; its columns are: {}",
                    columns.join(", ")
                ),
            });
        }
    }
    // What the target holds, listed off the async workers.
    let (job2, output2) = (job.clone(), Arc::clone(&output));
    crate::blocking(move || {
        crate::target::check(&job2)?;
        check_schema_change(&job2, &output2)
    })
    .await?;
    Ok(Planned {
        job: job.clone(),
        vars: opts.var_text(),
        window,
        ctx,
        df,
        output,
        time,
    })
}

fn sql_message(e: &datafusion::error::DataFusionError) -> String {
    let s = e.to_string();
    s.strip_prefix("SQL error: ")
        .or_else(|| s.strip_prefix("Error during planning: "))
        .unwrap_or(&s)
        .to_string()
}

fn check_output(job: &Job, window: &Window, output: &SchemaRef) -> Result<Option<TimeColumn>> {
    let out_err = |message: String| Error::Output {
        path: job.path.clone(),
        message,
    };
    let names: Vec<&str> = output.fields().iter().map(|f| f.name().as_str()).collect();
    let mut seen = BTreeSet::new();
    for n in &names {
        if !seen.insert(*n) {
            return Err(out_err(format!(
                "has two columns named `{n}`; give them distinct aliases"
            )));
        }
    }
    for c in &job.target.partition_by {
        let Ok(field) = output.field_with_name(c) else {
            return Err(out_err(format!(
                "has no column `{c}`, which [target] partition_by needs; its columns are: {}",
                names.join(", ")
            )));
        };
        if field.data_type().is_nested()
            || matches!(
                field.data_type(),
                DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeBinary(_)
            )
        {
            return Err(out_err(format!(
                "partition column `{c}` has type {}, which cannot be a directory name",
                field.data_type()
            )));
        }
    }
    if names.len() == job.target.partition_by.len() {
        return Err(out_err(
            "has no columns besides the partition columns; nothing would be stored in the files"
                .into(),
        ));
    }
    for f in output.fields() {
        if job.target.partition_by.contains(f.name()) {
            continue;
        }
        idem_io::canonical::check_supported(f.name(), f.data_type())
            .map_err(|e| out_err(e.to_string()))?;
    }
    let kind_of = |c: &str| match output
        .field_with_name(c)
        .expect("checked above")
        .data_type()
    {
        DataType::Date32 | DataType::Date64 => TimeColumnKind::Date,
        DataType::Timestamp(..) => TimeColumnKind::Timestamp,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => TimeColumnKind::Text,
        _ => TimeColumnKind::Other,
    };
    // The time column: as the job says, else the first DATE or TIMESTAMP partition
    // column. A text column is never guessed: its values may not be dates at all
    // (`country`), or not in the grain's format (`20260604`).
    let partition_by = &job.target.partition_by;
    let tc = match &job.target.time_column {
        Some(tc) => tc.clone(),
        None => match partition_by
            .iter()
            .find(|c| matches!(kind_of(c), TimeColumnKind::Date | TimeColumnKind::Timestamp))
        {
            Some(c) => c.clone(),
            None => return Ok(None),
        },
    };
    let kind = kind_of(&tc);
    if window.grain == Grain::Hour && kind == TimeColumnKind::Date {
        return Err(out_err(format!(
            "partition column `{tc}` is a DATE but the job's grain is hour: each hourly run \
             would replace the whole day. Partition by an hour (a timestamp or a \
             YYYY-MM-DDTHH string) or set grain = \"day\""
        )));
    }
    Ok(Some(TimeColumn { name: tc, kind }))
}

/// The partition column that carries the logical date, and what its values look like.
#[derive(Clone, Debug)]
struct TimeColumn {
    name: String,
    kind: TimeColumnKind,
}

/// Plans and executes a run, publishing its partitions.
pub async fn run(job: &Job, opts: &RunOptions, observer: Arc<dyn Observer>) -> Result<RunReport> {
    let started = Instant::now();
    let fresh = if opts.skip_fresh || may_confirm_unchanged(job) {
        let (job2, opts2) = (job.clone(), opts.clone());
        crate::blocking(move || crate::freshness::fresh_partitions(&job2, &opts2)).await
    } else {
        Ok(None)
    };
    // `--skip-fresh` reports why freshness could not be judged; the confirmation of
    // an unchanged re-run just runs the normal way then.
    let fresh = match fresh {
        Err(e) if opts.skip_fresh => return Err(e),
        Err(_) => None,
        Ok(fresh) => fresh,
    };
    if opts.skip_fresh
        && let Some(fresh) = fresh
    {
        let window = Window::parse(job.target.grain, &opts.date)?.with_lookback(job.lookback);
        return Ok(RunReport {
            elapsed_ms: started.elapsed().as_millis() as u64,
            ..RunReport::of(job, &window, String::new(), 0, fresh)
        });
    }
    if may_confirm_unchanged(job)
        && let Some(fresh) = fresh
    {
        match confirm_unchanged(job, opts, &fresh, Arc::clone(&observer)).await {
            Ok(Some(mut report)) => {
                report.elapsed_ms = started.elapsed().as_millis() as u64;
                return Ok(report);
            }
            Ok(None) => tracing::info!("the output differs from the live partitions; writing"),
            // The run proper reports the error, with its diagnosis.
            Err(e) => tracing::info!(error = %e, "could not compare the output; writing"),
        }
    }
    // A merge publishes each partition only over the version it read; when another
    // writer (a replace run, or a merge whose lock lease expired) got there first,
    // the merge is computed again on top of it.
    let mut attempt = 0;
    loop {
        let planned = plan(job, opts).await?;
        match execute(planned, Arc::clone(&observer)).await {
            Err(Error::Storage {
                source: idem_io::Error::Conflict { partition },
                ..
            }) if attempt < MERGE_ATTEMPTS => {
                attempt += 1;
                tracing::info!(%partition, attempt, "another writer committed first; merging again");
            }
            Err(e) => return Err(e),
            Ok(mut report) => {
                report.elapsed_ms = started.elapsed().as_millis() as u64;
                return Ok(report);
            }
        }
    }
}

/// Whether a run may first be computed without staging (see [`confirm_unchanged`]):
/// not for a merge (it rewrites what it reads), a job that allows nondeterministic
/// functions (its rows differ every run), or a job with checks (they run on staged
/// files, every run).
fn may_confirm_unchanged(job: &Job) -> bool {
    job.target.mode == Mode::ReplacePartitions
        && !job.allow_nondeterministic
        && job.checks.is_empty()
}

/// A re-run of a date whose live partitions were all written by this job from inputs
/// that have not changed since (what `--skip-fresh` trusts without reading anything)
/// is computed once without staging: the output is routed and digested, and when
/// every partition the run owns is live, fresh and equal to the output (digest and
/// schema; no rows counts as empty), the run is `unchanged` without encoding, staging
/// or fsyncing a byte. Same rows, same verdict as the run proper, at the cost of the
/// query and the digest. `None` when any partition differs (an order-dependent query,
/// say), an owned one is missing, or the output has rows outside the owned ones: the
/// run then goes the normal way.
async fn confirm_unchanged(
    job: &Job,
    opts: &RunOptions,
    fresh: &[PartitionReport],
    observer: Arc<dyn Observer>,
) -> Result<Option<RunReport>> {
    let started = Instant::now();
    let planned = plan(job, opts).await?;
    observer.phase("verifying");
    let Planned {
        job,
        window,
        ctx,
        df,
        output,
        time,
        ..
    } = planned;
    let plan = df
        .create_physical_plan()
        .await
        .map_err(|e| Error::Execution {
            path: job.path.clone(),
            message: e.to_string(),
        })?;
    let (table, run_id, _lock) = begin_run(&job).await?;
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let root = table.location();
    let inputs = inputs_of(&plan, &job)
        .await
        .into_iter()
        .filter(|f| !f.path.starts_with(&root))
        .count();
    let compared = async {
        // What the full run would replace: every partition the window owns (the live
        // ones, and the window's own, created empty when missing), taken after the
        // dead-run cleanup as the full run takes it. Unless each is live and fresh, the
        // full run has something to write whatever the output: no query here.
        let fresh: Vec<String> = fresh.iter().map(|f| f.partition.clone()).collect();
        let (job2, table2, window2, time2) =
            (job.clone(), Arc::clone(&table), window, time.clone());
        let found = crate::blocking(move || {
            let owned = owned_partitions(&job2, table2.as_ref(), &window2, time2.as_ref())?;
            let mut live = Vec::with_capacity(owned.len());
            for p in &owned {
                match table2.live_state(p)? {
                    Some(LiveState::Managed(m)) if fresh.contains(&p.to_string()) => live.push(m),
                    _ => return Ok(None),
                }
            }
            Ok::<_, idem_io::Error>(Some((owned, live)))
        })
        .await
        .map_err(storage)?;
        let Some((owned, live)) = found.filter(|(owned, _)| !owned.is_empty()) else {
            return Ok(None);
        };
        let schema = schema_fingerprint(&describe_schema(&output, &job.target.partition_by));
        let router = Arc::new(Router::new(&output, &job.target.partition_by));
        let digests = drive(
            &job,
            &ctx,
            plan,
            router,
            observer.as_ref(),
            |rx, rows_seen| {
                let mut digests: BTreeMap<PartitionPath, DigestState> = BTreeMap::new();
                while let Some((p, batch)) = rx.blocking_recv() {
                    digests.entry(p).or_default().update(&batch);
                    rows_seen.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                }
                Ok(digests)
            },
        )
        .await?;
        // Rows outside the owned partitions are the full run's to warn about; a file
        // read by name that is gone may have read as no rows: the full run decides.
        if digests.keys().any(|p| owned.binary_search(p).is_err())
            || read_files_still_there(&ctx, &job).await.is_err()
        {
            return Ok(None);
        }
        let mut partitions = Vec::with_capacity(owned.len());
        for (p, m) in owned.into_iter().zip(live) {
            // An owned partition the output has no rows for is written with none.
            let digest = digests.get(&p).copied().unwrap_or_default();
            if m.digest != digest.finish() || m.schema_fingerprint != schema {
                return Ok(None);
            }
            let bytes = match table.as_local() {
                Some(local) => files_bytes(&local.partition_dir(&p), &m.files),
                None => m.data_bytes,
            };
            partitions.push(PartitionReport {
                partition: p.to_string(),
                action: Action::Unchanged,
                rows: m.rows,
                bytes,
                files: m.files.len(),
                digest: m.digest,
                publish: None,
                ms: 0,
            });
        }
        Ok::<_, Error>(Some(partitions))
    }
    .await;
    end_run(&table, &run_id, _lock).await;
    let Some(partitions) = compared? else {
        return Ok(None);
    };
    tracing::info!(
        partitions = partitions.len(),
        ms = started.elapsed().as_millis() as u64,
        "the output equals the live partitions; nothing staged"
    );
    Ok(Some(RunReport::of(
        &job, &window, run_id, inputs, partitions,
    )))
}

/// How often a merge is computed again after losing a commit to another writer.
const MERGE_ATTEMPTS: u32 = 8;

/// The run's UTC start (so ids sort by time), its pid, and 48 random bits: unique even
/// across machines writing one object-store table (where pids repeat, e.g. pid 1 in
/// every container).
fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = chrono::Utc::now();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(now.timestamp_subsec_nanos());
    format!(
        "{}-{}-{:012x}",
        now.format("%Y%m%dT%H%M%S%.3fZ"),
        std::process::id(),
        h.finish() & 0xffff_ffff_ffff
    )
}

/// Keeps a run marked live until dropped.
type RunGuard = Box<dyn std::any::Any + Send>;

/// Opens the target table for a run: checks it can be written, marks the run live
/// (the guard) and removes what dead runs left. Returns the table and the run's id.
async fn begin_run(job: &Job) -> Result<(Arc<dyn CommitBackend>, String, RunGuard)> {
    let job = job.clone();
    crate::blocking(move || {
        let storage = |source| Error::Storage {
            target: job.target.path.clone(),
            source,
        };
        let table = crate::table::open(&job)?;
        table.prepare().map_err(storage)?;
        let run_id = new_run_id();
        let lock = table.lock_run(&run_id).map_err(storage)?;
        let cleaned = table.clean_dead_runs().map_err(storage)?;
        if !cleaned.is_empty() {
            tracing::info!(runs = ?cleaned, "removed what dead runs left in staging");
        }
        Ok((table, run_id, lock))
    })
    .await
}

/// Removes what the run staged (whether it succeeded or not; a failure to remove it
/// does not undo a publish: the dead-run cleaner removes it later), then lets the run
/// be taken for dead.
async fn end_run(table: &Arc<dyn CommitBackend>, run_id: &str, guard: RunGuard) {
    let (table, run_id) = (Arc::clone(table), run_id.to_string());
    crate::blocking(move || {
        if let Err(e) = table.cleanup_run(&run_id) {
            tracing::warn!(error = %e, "could not remove this run's staging directory");
        }
        drop(guard);
    })
    .await
}

/// Fails the run as a conflict (computed again) when a file it read by name is gone:
/// it may have been read as no rows (see `session::ReadFiles`).
async fn read_files_still_there(ctx: &SessionContext, job: &Job) -> Result<()> {
    let (ctx, job) = (ctx.clone(), job.clone());
    crate::blocking(
        move || match crate::session::missing_read_file(&ctx, &job) {
            None => Ok(()),
            Some(file) => Err(Error::Storage {
                target: job.target.path.clone(),
                source: idem_io::Error::Conflict {
                    partition: format!("(a file it read, {file}, was replaced meanwhile)"),
                },
            }),
        },
    )
    .await
}

/// The input files a plan reads (their digests looked up where they belong to idem
/// tables, which reads storage).
async fn inputs_of(
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    job: &Job,
) -> Vec<InputFile> {
    let (plan, job) = (Arc::clone(plan), job.clone());
    crate::blocking(move || crate::session::inputs_of(&plan, &job)).await
}

/// Executes a planned run.
pub async fn execute(planned: Planned, observer: Arc<dyn Observer>) -> Result<RunReport> {
    let started = Instant::now();
    let Planned {
        job,
        vars: vars_text,
        window,
        ctx,
        df,
        output,
        time,
    } = planned;
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let exec_err = |e: datafusion::error::DataFusionError| Error::Execution {
        path: job.path.clone(),
        message: e.to_string(),
    };

    observer.phase("planning");
    let (table, run_id, run_guard) = begin_run(&job).await?;
    // What keeps this run live and its merge serialized: handed to the publish step
    // and back, so they are held until its last rename even if this future is dropped.
    let mut held: Vec<RunGuard> = vec![run_guard];
    let outcome = async {
        // A merge reads the table under the table's write lock and rewrites what it
        // affects; each partition is published only over the version it read.
        let mut merge_inputs = None;
        let mut merge_stats = None;
        let mut kept = Kept::default();
        let mut versions: Option<BTreeMap<PartitionPath, Option<Version>>> = None;
        let (df, merge_affected) = if job.target.mode == Mode::Merge {
            observer.phase("merging");
            let (scope, owned) = if job.target.delete_missing {
                let owned = if job.target.partition_by.is_empty() {
                    vec![PartitionPath::root()]
                } else {
                    // The window's partitions are rewritten even where no key matched.
                    let (job2, table2, window2, time2) =
                        (job.clone(), Arc::clone(&table), window, time.clone());
                    crate::blocking(move || {
                        owned_partitions(&job2, table2.as_ref(), &window2, time2.as_ref())
                    })
                    .await
                    .map_err(storage)?
                };
                (Some(delete_scope(&job, &window, time.as_ref())?), owned)
            } else {
                (None, Vec::new())
            };
            let m = match crate::merge::prepare(
                &job,
                &ctx,
                df,
                &output,
                &table,
                scope.as_deref(),
                &owned,
            )
            .await
            {
                Ok(m) => m,
                Err(e) => return Err(explain(&job, &ctx, e).await),
            };
            merge_inputs = Some(m.inputs);
            merge_stats = Some(m.stats);
            kept = Kept {
                files: m.kept,
                derived: m.derived,
            };
            versions = Some(m.versions);
            held.extend(m.lock);
            (m.df, Some(m.affected))
        } else {
            (df, None)
        };
        let kept = Arc::new(kept);
        let plan = match df.create_physical_plan().await {
            Ok(plan) => plan,
            Err(e) => return Err(explain(&job, &ctx, exec_err(e)).await),
        };
        let root = table.location();
        let inputs: Vec<InputFile> = match merge_inputs {
            Some(inputs) => inputs,
            None => inputs_of(&plan, &job).await,
        };
        let inputs: Vec<InputFile> = inputs
            .into_iter()
            .filter(|f| !f.path.starts_with(&root))
            .collect();
        let run_info = RunInfo {
            job: job.name.clone(),
            job_fingerprint: job.fingerprint.clone(),
            logical_date: window.label(),
            run_id: run_id.clone(),
            idem_version: env!("CARGO_PKG_VERSION").to_string(),
            vars: vars_text,
            sources: job.source_scopes(),
            inputs,
        };
        let schema_desc = describe_schema(&output, &job.target.partition_by);
        let inputs = run_info.inputs.len();
        let data_schema = Arc::clone(Router::new(&output, &job.target.partition_by).data_schema());

        let writers = match stage(
            &job,
            &table,
            &run_id,
            &ctx,
            plan,
            &output,
            &kept,
            observer.as_ref(),
        )
        .await
        {
            Ok(writers) => writers,
            Err(e @ Error::Execution { .. }) => {
                // A read that failed on a file a newer commit removed: computed again.
                read_files_still_there(&ctx, &job).await?;
                return Err(crate::session::diagnose_inputs(&job, &run_info.inputs).unwrap_or(e));
            }
            Err(e) => return Err(e),
        };
        read_files_still_there(&ctx, &job).await?;
        let (table2, job2, observer2, window2) = (
            Arc::clone(&table),
            job.clone(),
            Arc::clone(&observer),
            window,
        );
        // A replace run owns its window's partitions: checked again when it publishes.
        let ownership = match &merge_affected {
            None => Some((window, time.clone())),
            Some(_) => None,
        };
        let (mut staged, warnings) = crate::blocking(move || {
            finalize(
                &job2,
                table2.as_ref(),
                &window2,
                time.as_ref(),
                merge_affected.as_deref(),
                &kept,
                &data_schema,
                writers,
                &run_info,
                schema_desc,
                observer2.as_ref(),
            )
        })
        .await?;
        // A read-modify-write publishes each partition only over the version it read.
        if let Some(versions) = &versions {
            for w in staged.iter_mut() {
                w.expected = Some(versions.get(&w.partition).cloned().flatten());
            }
        }
        observer.phase("checking");
        crate::checks::run(&job, &job.checks, &output, &staged).await?;
        // Checks passed: only now can a partition become `Checked`.
        let checked: Vec<Checked> = staged.into_iter().map(Checked::new).collect();
        let (table2, job2, observer2) = (Arc::clone(&table), job.clone(), Arc::clone(&observer));
        let guards = std::mem::take(&mut held);
        let (published, guards) = crate::blocking(move || {
            let published = publish_all(
                &job2,
                table2.as_ref(),
                checked,
                ownership,
                warnings,
                observer2.as_ref(),
            );
            (published, guards)
        })
        .await;
        held = guards;
        let (partitions, warnings) = published?;
        Ok((partitions, warnings, merge_stats, inputs))
    }
    .await
    .map_err(|e| dedupe_tie(&job, e));
    end_run(&table, &run_id, Box::new(held)).await;
    let (partitions, warnings, merge_stats, inputs) = outcome?;

    Ok(RunReport {
        elapsed_ms: started.elapsed().as_millis() as u64,
        warnings,
        merge: merge_stats,
        ..RunReport::of(&job, &window, run_id, inputs, partitions)
    })
}

type Writers = BTreeMap<PartitionPath, PartitionWriter>;

/// Streams the plan's output into per-partition writers in the staging area.
#[allow(clippy::too_many_arguments)]
async fn stage(
    job: &Job,
    table: &Arc<dyn CommitBackend>,
    run_id: &str,
    ctx: &SessionContext,
    plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    output: &SchemaRef,
    kept: &Arc<Kept>,
    observer: &dyn Observer,
) -> Result<Writers> {
    observer.phase("writing");
    let router = Arc::new(Router::new(output, &job.target.partition_by));
    let data_schema = Arc::clone(router.data_schema());
    let table2 = Arc::clone(table);
    let run_id2 = run_id.to_string();
    let opts = job.target.writer.clone();
    let kept = Arc::clone(kept);
    let job_path = job.path.clone();
    drive(job, ctx, plan, router, observer, move |rx, rows_seen| {
        let mut writers: Writers = BTreeMap::new();
        while let Some((p, batch)) = rx.blocking_recv() {
            let w = match writers.get_mut(&p) {
                Some(w) => w,
                None => {
                    check_partition_name(&job_path, &p)?;
                    let w = new_writer(table2.as_ref(), &run_id2, &p, &data_schema, &opts, &kept)?;
                    writers.entry(p.clone()).or_insert(w)
                }
            };
            w.write(&batch).map_err(|source| Error::Write {
                target: table2.location().into(),
                partition: p.to_string(),
                source,
            })?;
            if rows_seen.fetch_add(batch.num_rows() as u64, Ordering::Relaxed) == 0 {
                failpoint::hit("after_first_batch").map_err(|source| Error::Storage {
                    target: table2.location().into(),
                    source,
                })?;
            }
            enforce_budget(&mut writers).map_err(|(partition, source)| Error::Write {
                target: table2.location().into(),
                partition,
                source,
            })?;
        }
        Ok(writers)
    })
    .await
}

/// Batches of one partition's data columns, from the plan to the consuming thread.
type Routed = tokio::sync::mpsc::Receiver<(PartitionPath, RecordBatch)>;

/// Executes `plan`, routes its batches to their partitions and hands them to `consume`
/// on a thread of its own (it encodes or digests on rayon), which counts the rows it
/// has taken in the counter it is given. Returns what `consume` returns, or the first
/// execution error.
async fn drive<T: Send + 'static>(
    job: &Job,
    ctx: &SessionContext,
    plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    router: Arc<Router>,
    observer: &dyn Observer,
    consume: impl FnOnce(&mut Routed, &AtomicU64) -> Result<T> + Send + 'static,
) -> Result<T> {
    let task_ctx = ctx.task_ctx();
    let partitions = plan.properties().output_partitioning().partition_count();
    // One batch waiting per producer (at most 8, as before): the consumer takes one at
    // a time, so a longer queue only holds more memory (W4: 224 → 202 MiB peak with 3
    // queued instead of 8, time unchanged over 8 alternating runs).
    let (tx, mut rx) =
        tokio::sync::mpsc::channel::<(PartitionPath, RecordBatch)>(partitions.clamp(2, 8));
    let rows_done = Arc::new(AtomicU64::new(0));
    let rows_seen = Arc::clone(&rows_done);
    // Open every output stream before the consumer starts, so a failure here leaves
    // nothing running that could still stage files.
    let streams = (0..partitions)
        .map(|i| plan.execute(i, Arc::clone(&task_ctx)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Execution {
            path: job.path.clone(),
            message: e.to_string(),
        })?;
    let consumer = std::thread::Builder::new()
        .name("idem-writer".into())
        .spawn(move || consume(&mut rx, &rows_seen))
        .expect("spawn writer thread");

    let mut producers = tokio::task::JoinSet::new();
    for mut stream in streams {
        let tx = tx.clone();
        let router = Arc::clone(&router);
        producers.spawn(async move {
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                for part in router.split(&batch)? {
                    if tx.send(part).await.is_err() {
                        // The consumer stopped; its own error is reported below.
                        return Ok(());
                    }
                }
            }
            Ok::<(), datafusion::error::DataFusionError>(())
        });
    }
    drop(tx);
    let mut exec_error = None;
    let mut ticker = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        tokio::select! {
            joined = producers.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    if exec_error.is_none() {
                        exec_error = Some(e);
                        producers.abort_all();
                    }
                }
                Some(Err(join)) if join.is_cancelled() => {}
                Some(Err(join)) => std::panic::resume_unwind(join.into_panic()),
            },
            _ = ticker.tick() => observer.rows(rows_done.load(Ordering::Relaxed)),
        }
    }
    let consumed = tokio::task::spawn_blocking(move || consumer.join())
        .await
        .expect("join writer")
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    observer.rows(rows_done.load(Ordering::Relaxed));
    if let Some(e) = exec_error {
        return Err(Error::Execution {
            path: job.path.clone(),
            message: e.to_string(),
        });
    }
    consumed
}

/// What a merge carries into the partitions it rewrites.
#[derive(Default)]
struct Kept {
    /// Per partition, the live files carried over and the new manifest's generation.
    files: BTreeMap<PartitionPath, (Vec<KeptFile>, u64)>,
    /// Per partition, the digest of the rows written, derived by the merge from what
    /// it took out of and put into files whose sums are known.
    derived: BTreeMap<PartitionPath, Arc<idem_io::digest::Difference>>,
}

/// The longest directory name (and object key segment) file systems allow, in bytes.
const MAX_NAME: usize = 255;

/// A partition whose directory name no file system can hold is bad input, refused by
/// name before anything is staged for it.
fn check_partition_name(job: &std::path::Path, p: &PartitionPath) -> Result<()> {
    let rel = p.rel_path();
    match rel.iter().find(|s| s.len() > MAX_NAME) {
        None => Ok(()),
        Some(segment) => Err(Error::Partition {
            path: job.to_path_buf(),
            partition: p.to_string(),
            message: format!(
                "its directory name `{}…` is {} bytes long, more than the {MAX_NAME} a file \
                 system allows; partition by a shorter value (a date, a code, a hash)",
                segment
                    .to_string_lossy()
                    .chars()
                    .take(40)
                    .collect::<String>(),
                segment.len()
            ),
        }),
    }
}

fn new_writer(
    table: &dyn CommitBackend,
    run_id: &str,
    p: &PartitionPath,
    data_schema: &SchemaRef,
    opts: &WriterOptions,
    kept: &Kept,
) -> Result<PartitionWriter> {
    let storage = |source| Error::Storage {
        target: table.location().into(),
        source,
    };
    let mut w = PartitionWriter::new(
        p.clone(),
        table.staging_dir(run_id, p),
        Arc::clone(data_schema),
        opts.clone(),
    )
    .map_err(storage)?;
    if let Some((files, generation)) = kept.files.get(p) {
        w.keep(files.clone(), *generation).map_err(storage)?;
    }
    if let Some(rows) = kept.derived.get(p) {
        w.derive_digest(Arc::clone(rows));
    }
    Ok(w)
}

/// Flushes the largest buffered row groups early when all partitions together hold
/// more than the budget, so a run over many partitions stays in bounded memory.
/// An error names the partition whose flush failed.
fn enforce_budget(writers: &mut Writers) -> std::result::Result<(), (String, idem_io::Error)> {
    loop {
        let total: usize = writers.values().map(|w| w.buffered_memory()).sum();
        if total <= WRITE_BUFFER_BUDGET {
            return Ok(());
        }
        let Some(largest) = writers.values_mut().max_by_key(|w| w.buffered_memory()) else {
            return Ok(());
        };
        largest
            .flush()
            .map_err(|e| (largest.partition().to_string(), e))?;
    }
}

/// Completes every partition the run writes or owns in the staging area (footers with
/// the manifest, fsync). Publishes nothing.
#[allow(clippy::too_many_arguments)]
fn finalize(
    job: &Job,
    table: &dyn CommitBackend,
    window: &Window,
    time: Option<&TimeColumn>,
    merge_affected: Option<&[PartitionPath]>,
    kept: &Kept,
    data_schema: &SchemaRef,
    mut writers: Writers,
    run: &RunInfo,
    schema: Vec<ColumnEntry>,
    observer: &dyn Observer,
) -> Result<(Vec<WrittenPartition>, Vec<String>)> {
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let mut warnings = Vec::new();

    // Partitions the output touches must not be coarser than the window: replacing a
    // whole day with one hour's rows would drop the other hours.
    let window_checks = merge_affected.is_none();
    if let Some(tc) = time.map(|t| t.name.as_str()).filter(|_| window_checks) {
        for p in writers.keys() {
            let Some(Some(value)) = p.value(tc) else {
                continue;
            };
            let Some(iv) = interval_of(value) else {
                continue;
            };
            if iv.0 <= window.start
                && iv.1 >= window.end
                && (iv.0 < window.start || iv.1 > window.end)
            {
                return Err(Error::Partition {
                    path: job.path.clone(),
                    partition: p.to_string(),
                    message: format!(
                        "it covers more than the run's {} window {}; replacing it would drop \
                         rows of other runs. Partition by a value at the job's grain",
                        window.grain,
                        window.label()
                    ),
                });
            }
            if !window.contains(iv) {
                warnings.push(format!(
                    "the output has rows for {p}, outside the run's window {}; that partition was replaced by them",
                    window.label()
                ));
            }
        }
        if writers.keys().any(|p| p.is_null_anywhere()) {
            warnings.push(format!(
                "some rows have NULL in a partition column; they were written to the Hive default partition ({})",
                idem_io::hive::DEFAULT_PARTITION
            ));
        }
    }

    // Every partition the window owns is replaced, even with no rows.
    // A merge owns what it affects; a replace run owns its window.
    let owned = match merge_affected {
        Some(affected) => affected.to_vec(),
        None => owned_partitions(job, table, window, time).map_err(storage)?,
    };
    for p in owned {
        if writers.contains_key(&p) {
            continue;
        }
        let w = new_writer(
            table,
            &run.run_id,
            &p,
            data_schema,
            &job.target.writer,
            kept,
        )?;
        writers.insert(p, w);
    }

    observer.phase("finishing");
    let mut staged: Vec<WrittenPartition> = Vec::with_capacity(writers.len());
    for (p, w) in writers {
        staged.push(
            w.finish(run, schema.clone())
                .map_err(|source| Error::Write {
                    target: job.target.path.clone(),
                    partition: p.to_string(),
                    source,
                })?,
        );
    }
    failpoint::hit("after_stage").map_err(storage)?;
    Ok((staged, warnings))
}

/// Publishes checked partitions: each is compared with the live one by digest and
/// schema and left alone when equal, else swapped in atomically.
fn publish_all(
    job: &Job,
    table: &dyn CommitBackend,
    checked: Vec<Checked>,
    ownership: Option<(Window, Option<TimeColumn>)>,
    mut warnings: Vec<String>,
    observer: &dyn Observer,
) -> Result<(Vec<PartitionReport>, Vec<String>)> {
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    failpoint::hit("before_publish").map_err(storage)?;
    // From here to the last partition, no other writer of the table publishes (on an
    // object store each partition's commit is its own fence instead): a merge finds
    // every partition it read still at the version it read, or publishes none.
    let _publishing = table.lock_publish().map_err(storage)?;
    for part in &checked {
        let written = part.partition();
        if let Some(expected) = &written.expected
            && table.live_version(&written.partition).map_err(storage)? != *expected
        {
            return Err(storage(idem_io::Error::Conflict {
                partition: written.partition.to_string(),
            }));
        }
    }
    // The partitions the run's window owns, as they are now: one another run created
    // since this run looked (a table of several partition columns) is owned too, and
    // the run is computed again to empty it.
    if let Some((window, time)) = &ownership {
        let staged: BTreeSet<&PartitionPath> =
            checked.iter().map(|c| &c.partition().partition).collect();
        let owned = owned_partitions(job, table, window, time.as_ref()).map_err(storage)?;
        if let Some(p) = owned.iter().find(|p| !staged.contains(p)) {
            return Err(storage(idem_io::Error::Conflict {
                partition: p.to_string(),
            }));
        }
    }
    // Decide per partition before publishing any, so a bad state aborts cleanly.
    let mut decisions = Vec::with_capacity(checked.len());
    for part in checked {
        let written = part.partition();
        let live = table.live_state(&written.partition).map_err(storage)?;
        let unchanged = matches!(
            &live,
            Some(LiveState::Managed(m))
                if m.digest == written.manifest.digest
                    && m.schema_fingerprint == written.manifest.schema_fingerprint
        );
        // A partition that had rows and now gets different ones is a restatement.
        let restated = match live.as_ref().and_then(LiveState::manifest) {
            Some(m)
                if m.rows > 0
                    && (m.digest != written.manifest.digest
                        || m.schema_fingerprint != written.manifest.schema_fingerprint) =>
            {
                Some(idem_io::log::Restatement {
                    partition: written.partition.to_string(),
                    old_digest: m.digest.clone(),
                    new_digest: written.manifest.digest.clone(),
                    old_rows: m.rows,
                    new_rows: written.manifest.rows,
                    job: written.manifest.run.job.clone(),
                    job_fingerprint: written.manifest.run.job_fingerprint.clone(),
                    logical_date: written.manifest.run.logical_date.clone(),
                    run_id: written.manifest.run.run_id.clone(),
                    replaced_run_id: m.run.run_id.clone(),
                })
            }
            _ => None,
        };
        // An object-store partition whose listing is not its commit's (extra or missing
        // files) is published again: that finishes the apply and removes the rest.
        let unclean = matches!(live, Some(LiveState::Unclean { .. }));
        decisions.push((part, unchanged, restated, unclean));
    }

    observer.phase("publishing");
    let mut reports = Vec::with_capacity(decisions.len());
    for (part, unchanged, restated, unclean) in decisions {
        let t = Instant::now();
        let written = part.partition();
        let name = written.partition.to_string();
        let rows = written.manifest.rows;
        let files = written.manifest.files.len();
        let digest = written.manifest.digest.clone();
        let bytes = staged_bytes(written);
        let (action, publish) = if unchanged {
            table.discard(part.into_inner()).map_err(storage)?;
            (Action::Unchanged, None)
        } else {
            let published = table.publish(part).map_err(storage)?;
            if published.mode == PublishMode::AlreadyLive && !unclean {
                // Another writer committed these very rows first.
                reports.push(PartitionReport {
                    partition: name,
                    action: Action::Unchanged,
                    rows,
                    bytes,
                    files,
                    digest,
                    publish: Some(published.mode),
                    ms: t.elapsed().as_millis() as u64,
                });
                continue;
            }
            if published.mode == PublishMode::NonAtomicFallback {
                warnings.push(format!(
                    "{name}: the filesystem does not support atomic directory exchange; \
                     published with two renames"
                ));
            }
            // Logged once the new partition is durable; a crash in between loses only
            // the event, and `idem stale` still sees the changed digest.
            if let Some(event) = restated {
                table.append_log(&event).map_err(storage)?;
            }
            failpoint::hit("after_publish_one").map_err(storage)?;
            let action = if rows == 0 {
                Action::Emptied
            } else {
                Action::Written
            };
            (action, Some(published.mode))
        };
        reports.push(PartitionReport {
            partition: name,
            action,
            rows,
            bytes,
            files,
            digest,
            publish,
            ms: t.elapsed().as_millis() as u64,
        });
    }
    Ok((reports, warnings))
}

fn staged_bytes(part: &WrittenPartition) -> u64 {
    files_bytes(&part.dir, &part.manifest.files)
}

/// The sizes of a partition's files in `dir`, footers included; a file that cannot be
/// looked at counts its manifest's data bytes.
fn files_bytes(dir: &std::path::Path, files: &[idem_io::manifest::FileEntry]) -> u64 {
    files
        .iter()
        .map(|f| {
            std::fs::metadata(dir.join(&f.name))
                .map(|m| m.len())
                .unwrap_or(f.data_bytes)
        })
        .sum()
}

/// The partitions the run's window owns: live ones whose time value lies in the window,
/// and, for a table partitioned by the time column alone, the window's own values. An
/// unpartitioned table is owned whole by every run.
fn owned_partitions(
    job: &Job,
    table: &dyn CommitBackend,
    window: &Window,
    time: Option<&TimeColumn>,
) -> idem_io::Result<Vec<PartitionPath>> {
    if job.target.partition_by.is_empty() {
        return Ok(vec![PartitionPath::root()]);
    }
    let Some(TimeColumn {
        name: tc,
        kind: time_kind,
    }) = time
    else {
        return Ok(Vec::new());
    };
    let (tc, time_kind) = (tc.as_str(), *time_kind);
    let mut owned = BTreeSet::new();
    for p in table.live_partitions(job.target.partition_by.len())? {
        if p.columns()
            .ne(job.target.partition_by.iter().map(String::as_str))
        {
            continue;
        }
        if let Some(Some(v)) = p.value(tc)
            && let Some(iv) = interval_of(v)
            && window.contains(iv)
        {
            owned.insert(p);
        }
    }
    if job.target.partition_by.len() == 1 {
        for v in window_values(window, time_kind) {
            owned.insert(PartitionPath::new(vec![(tc.to_string(), Some(v))]));
        }
    }
    Ok(owned.into_iter().collect())
}

/// The live table's schema must be the output's unless the job allows a change: a
/// retyped column would otherwise leave partitions that readers cannot union.
fn check_schema_change(job: &Job, output: &SchemaRef) -> Result<()> {
    if job.target.on_schema_change == OnSchemaChange::Allow {
        return Ok(());
    }
    let Ok(table) = crate::table::open(job) else {
        return Ok(());
    };
    let Ok(mut partitions) = table.live_partitions(job.target.partition_by.len()) else {
        return Ok(());
    };
    // The newest partition (last in path order) speaks for the table.
    partitions.reverse();
    let live = partitions.iter().find_map(|p| match table.live_state(p) {
        Ok(Some(state)) => state.manifest().map(|m| (p.clone(), Box::new(m.clone()))),
        _ => None,
    });
    let Some((partition, manifest)) = live else {
        return Ok(());
    };
    let new = describe_schema(output, &job.target.partition_by);
    let key = |c: &ColumnEntry| (c.name.clone(), c.data_type.clone(), c.partition);
    if manifest.schema.iter().map(key).eq(new.iter().map(key)) {
        return Ok(());
    }
    let mut names: Vec<&str> = manifest.schema.iter().map(|c| c.name.as_str()).collect();
    for c in &new {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    let find = |cols: &[ColumnEntry], n: &str| {
        cols.iter()
            .find(|c| c.name == n)
            .map(|c| c.data_type.clone())
    };
    let width = names.iter().map(|n| n.len()).max().unwrap_or(6).max(6);
    let mut table_text = format!("  {:<width$}  {:<24}  output\n", "column", "table");
    for n in names {
        let (old, now) = (find(&manifest.schema, n), find(&new, n));
        let note = match (&old, &now) {
            (None, Some(_)) => "  <- added",
            (Some(_), None) => "  <- dropped",
            (Some(a), Some(b)) if a != b => "  <- retyped",
            _ => "",
        };
        let line = format!(
            "  {:<width$}  {:<24}  {:<24}{note}",
            n,
            old.as_deref().unwrap_or("-"),
            now.as_deref().unwrap_or("-"),
        );
        table_text.push_str(line.trim_end());
        table_text.push('\n');
    }
    Err(Error::Partition {
        path: job.path.clone(),
        partition: partition.to_string(),
        message: format!(
            "the output's schema differs from the table's ({}):\n{table_text}\
             Fix the SQL, or set on_schema_change = \"allow\" in [target] to write the new schema \
             (partitions this run does not replace keep the old one until rewritten)",
            job.target.path.display()
        ),
    })
}

/// Turns an execution error from before the plan's file list is known into what the
/// user must fix, where it is one: a dedupe tie, or a source file that cannot be read
/// (DataFusion reads footers while planning, and its errors do not name the file).
/// An error reading a file that a newer commit removed since is a conflict: the run
/// is computed again.
async fn explain(job: &Job, ctx: &SessionContext, e: Error) -> Error {
    let e = dedupe_tie(job, e);
    if !matches!(e, Error::Execution { .. }) {
        return e;
    }
    if let Err(conflict) = read_files_still_there(ctx, job).await {
        return conflict;
    }
    let files = crate::session::all_source_files(ctx, job).await;
    crate::session::diagnose_inputs(job, &files).unwrap_or(e)
}

/// A dedupe tie surfaces from DataFusion as an execution error; it is bad input.
fn dedupe_tie(job: &Job, e: Error) -> Error {
    match &e {
        Error::Execution { message, .. } if message.contains(crate::key::DEDUPE_TIE) => {
            let start = message.find(crate::key::DEDUPE_TIE).unwrap_or(0);
            let text = message[start..]
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            Error::Output {
                path: job.path.clone(),
                message: format!("cannot be computed: {text}"),
            }
        }
        _ => e,
    }
}

/// The SQL predicate (over the table aliased `t`) of the rows a `delete_missing` merge
/// owns: its window on the time column, or everything in an unpartitioned table.
fn delete_scope(job: &Job, window: &Window, time: Option<&TimeColumn>) -> Result<String> {
    if job.target.partition_by.is_empty() {
        return Ok("true".into());
    }
    let err = || Error::JobInvalid {
        path: job.path.clone(),
        message: "[target] delete_missing needs a DATE or TIMESTAMP partition column (or \
                  time_column) to define the window it syncs"
            .into(),
    };
    let Some(tc) = time else {
        return Err(err());
    };
    let col = format!("t.{}", crate::sql::ident(&tc.name));
    match tc.kind {
        TimeColumnKind::Date => Ok(format!(
            "({col} >= cast('{}' as date) and {col} < cast('{}' as date))",
            window.start.date(),
            window.end.date()
        )),
        TimeColumnKind::Timestamp => Ok(format!(
            "({col} >= cast('{}' as timestamp) and {col} < cast('{}' as timestamp))",
            window.start.format("%Y-%m-%dT%H:%M:%S"),
            window.end.format("%Y-%m-%dT%H:%M:%S")
        )),
        _ => Err(err()),
    }
}
