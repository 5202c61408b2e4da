//! One run of a job for one logical date, in `replace_partitions` mode.
//!
//! Planning touches no storage: the job is parsed, the SQL planned, the determinism
//! guard and the output checks run, and only then is anything staged. Rows stream
//! from DataFusion through the router into one writer per partition, in a staging
//! area outside the table; every partition the output touches, and every partition the
//! window owns, is then compared with the live one by content digest and either left
//! alone (`unchanged`) or swapped in atomically. A failure before publishing leaves the
//! table as it was; a failure while publishing leaves each partition old or new.

mod explain;
pub mod fresh;
mod inline_views;
mod lifecycle;
pub mod plan;
pub mod profile;
mod publish;
pub mod report;
pub(crate) mod stage;
mod unchanged;

pub use plan::{Planned, plan, plan_unchecked};
pub use report::{Action, Observer, PartitionReport, Quiet, RunOptions, RunReport};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use idem_io::commit::{Checked, Version};
use idem_io::hive::PartitionPath;
use idem_io::manifest::{InputFile, RunInfo, describe_schema};

use crate::error::{Error, Result};
use crate::job::{Job, Mode};
use crate::route::Router;
use crate::session::inputs_of;
use crate::window::Window;
use explain::{dedupe_tie, explain, read_files_still_there};
use lifecycle::{Held, begin_run, end_run};
use plan::delete_scope;
use publish::{Publishing, owned_partitions, publish_all};
use stage::{Kept, finalize, stage};
use unchanged::{confirm_unchanged, may_confirm_unchanged};

/// Plans and executes a run, publishing its partitions; with `opts.profile`, the
/// report carries where its time went.
pub async fn run(job: &Job, opts: &RunOptions, observer: Arc<dyn Observer>) -> Result<RunReport> {
    if !opts.profile {
        return run_observed(job, opts, observer).await;
    }
    let profiler = profile::Profiler::start(observer);
    let mut report = run_observed(job, opts, Arc::clone(&profiler) as _).await?;
    report.profile = Some(profiler.finish(&report));
    Ok(report)
}

async fn run_observed(
    job: &Job,
    opts: &RunOptions,
    observer: Arc<dyn Observer>,
) -> Result<RunReport> {
    let started = Instant::now();
    let job = &on_cluster(job, opts)?;
    let fresh = if opts.skip_fresh || may_confirm_unchanged(job) {
        let (job2, opts2) = (job.clone(), opts.clone());
        crate::blocking(move || crate::run::fresh::fresh_partitions(&job2, &opts2)).await
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
        && !opts.rewrite
        && job.execution.cluster.is_none()
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

/// `job` with `--cluster` over its `[execution] cluster`; a merge is refused there.
fn on_cluster(job: &Job, opts: &RunOptions) -> Result<Job> {
    let mut job = job.clone();
    if let Some(cluster) = &opts.cluster {
        job.execution.cluster = Some(cluster.clone());
    }
    if job.execution.cluster.is_some() && job.target.mode == Mode::Merge {
        return Err(Error::JobInvalid {
            path: job.path.clone(),
            message: crate::cluster::MERGE_REFUSED.into(),
        });
    }
    if job.execution.cluster.is_some() && job.target.format == idem_io::table::Format::Delta {
        return Err(Error::JobInvalid {
            path: job.path.clone(),
            message: crate::cluster::DELTA_REFUSED.into(),
        });
    }
    Ok(job)
}

/// How often a merge is computed again after losing a commit to another writer.
const MERGE_ATTEMPTS: u32 = 8;

/// The run's physical plan; on a cluster, split into as many tasks per stage as
/// `[execution] partitions` says.
async fn physical_plan(
    job: &Job,
    df: datafusion::dataframe::DataFrame,
) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    match job.execution.partitions {
        Some(n) if job.execution.cluster.is_some() => {
            let (mut state, plan) = df.into_parts();
            state.config_mut().options_mut().execution.target_partitions = n;
            state.create_physical_plan(&plan).await
        }
        _ => on_this_machine(job, df.create_physical_plan().await?),
    }
}

/// A plan that runs in this process: its scans shed the unused buffers of
/// short-string columns. A cluster's plan is left as it is: it travels as DataFusion's
/// own operators.
fn on_this_machine(
    job: &Job,
    plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    if !job.execution.in_process() {
        return Ok(plan);
    }
    inline_views::above_scans(plan)
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
        rewrite,
        commit_with,
    } = planned;
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let exec_err = |e| Error::execution(&job.path, "", e);

    observer.phase("planning");
    // The sources the transform reads: one with no file for the window must not empty
    // a partition that holds rows without the user's say (`allow_missing_input`).
    let scanned: Vec<(String, String)> = crate::session::sources_scanned(&job, df.logical_plan())
        .into_iter()
        .map(|s| (s.name.clone(), s.path.clone()))
        .collect();
    let (table, run_id, run_guard) = begin_run(&job).await?;
    // What keeps this run live and its merge serialized: handed to the publish step
    // and back, so they are held until its last rename even if this future is dropped.
    let mut held = Some(Held {
        _run: run_guard,
        writes: None,
    });
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
            if let Some(h) = held.as_mut() {
                h.writes = m.lock;
            }
            (m.df, Some(m.affected))
        } else {
            (df, None)
        };
        let kept = Arc::new(kept);
        let planned =
            futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(physical_plan(&job, df)))
                .await;
        let plan = match planned {
            Ok(Ok(plan)) => plan,
            Ok(Err(e)) => return Err(explain(&job, &ctx, exec_err(e)).await),
            // DataFusion reads the inputs' footers while planning, and the Parquet
            // decoder panics on some damaged ones: the file is named if one is found.
            Err(_) => {
                let job2 = job.clone();
                let mut named =
                    crate::blocking(move || crate::session::diagnose_footers(&job2)).await;
                if named.is_none() {
                    named = crate::session::diagnose_object_footers(&job).await;
                }
                return Err(named.unwrap_or_else(|| {
                    exec_err(datafusion::error::DataFusionError::Execution(
                        "planning panicked while reading the inputs".into(),
                    ))
                }));
            }
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
        let missing_input: Vec<(String, String)> = scanned
            .into_iter()
            .filter(|(name, _)| {
                !job.allow_missing_input && !run_info.inputs.iter().any(|f| &f.source == name)
            })
            .collect();
        let schema_desc = describe_schema(&output, &job.target.partition_by);
        let inputs = run_info.inputs.len();
        if idem_io::profile::enabled() {
            let bytes = run_info.inputs.iter().map(|f| f.size).sum();
            idem_io::profile::set(idem_io::profile::Counter::InputBytes, bytes);
        }
        let data_schema = Arc::clone(Router::new(&output, &job.target.partition_by).data_schema());

        let rows_read = profile::RowsRead::watch(&plan);
        let staged = match &job.execution.cluster {
            None => stage(
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
            .map(|writers| {
                rows_read.record();
                (writers, Vec::new())
            }),
            Some(cluster) => {
                observer.phase("writing on the cluster");
                let r = crate::cluster::ClusterRun {
                    job: &job,
                    cluster,
                    run: &run_info,
                    schema: schema_desc.clone(),
                };
                crate::cluster::stage(r, plan, &output)
                    .await
                    .map(|staged| (Default::default(), staged))
            }
        };
        // On a cluster the executors' attempts stage under the run's directory: the
        // partitions this process writes (those the window owns and the output left
        // empty) go beside them, never around them.
        let staging_id = match &job.execution.cluster {
            None => run_id.clone(),
            Some(_) => format!("{run_id}/client"),
        };
        let (writers, staged_elsewhere) = match staged {
            Ok(writers) => writers,
            Err(e @ Error::Execution { .. }) => {
                // A read that failed on a file a newer commit removed: computed again.
                read_files_still_there(&ctx, &job).await?;
                return Err(crate::session::diagnose_inputs(&job, &run_info.inputs, &e)
                    .await
                    .unwrap_or(e));
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
                staged_elsewhere,
                &staging_id,
                &run_info,
                schema_desc,
                observer2.as_ref(),
            )
        })
        .await?;
        // A read-modify-write publishes each partition only over the version it read.
        if let Some(versions) = &versions {
            staged = staged
                .into_iter()
                .map(|w| {
                    let version = versions.get(w.partition()).cloned().flatten();
                    w.expecting(version)
                })
                .collect();
        }
        observer.phase("checking");
        let checked: Vec<Checked> = Checked::all(staged, async |staged| {
            crate::checks::run(&job, &job.checks, &output, staged).await
        })
        .await?;
        let (table2, job2, observer2) = (Arc::clone(&table), job.clone(), Arc::clone(&observer));
        let guards = held.take();
        let (published, guards) = crate::blocking(move || {
            let published = publish_all(
                &job2,
                table2.as_ref(),
                checked,
                ownership,
                warnings,
                observer2.as_ref(),
                &Publishing {
                    rewrite,
                    commit_with,
                    missing_input,
                    window: window.label(),
                },
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
    end_run(&table, &run_id, held).await;
    let (partitions, warnings, merge_stats, inputs) = outcome?;

    Ok(RunReport {
        elapsed_ms: started.elapsed().as_millis() as u64,
        warnings,
        merge: merge_stats,
        cluster: job.execution.cluster.as_ref().map(|c| c.to_string()),
        ..RunReport::of(&job, &window, run_id, inputs, partitions)
    })
}
