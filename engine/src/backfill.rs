//! `idem backfill`: one run per logical date of a range, newest first by default, at
//! most `concurrency` at once, in one process and runtime. A failed date does not stop
//! the others unless `fail_fast`; re-running a backfill redoes only what is needed,
//! because every run is idempotent (and `skip_fresh` skips dates whose partitions are
//! provably current). There is no "already done" table.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use serde::Serialize;

use crate::error::Error;
use crate::job::Job;
use crate::params::Var;
use crate::run::{Observer, Quiet, RunOptions, RunReport};

#[derive(Clone, Debug)]
pub struct BackfillOptions {
    /// In the order they are started.
    pub dates: Vec<String>,
    pub vars: Vec<Var>,
    pub concurrency: usize,
    pub fail_fast: bool,
    pub skip_fresh: bool,
    /// Run each date's plan on this cluster, over the job's `[execution] cluster`.
    pub cluster: Option<crate::cluster::Cluster>,
    /// Set (by a Ctrl-C handler, say) to start no further dates; running ones finish.
    pub stop: Arc<std::sync::atomic::AtomicBool>,
    /// `--rewrite`: every run publishes what it computes, even when unchanged.
    pub rewrite: bool,
    /// `--atomic` (Delta tables): every date's partitions are committed together, in
    /// one commit after the last date, or, when any date fails, not at all.
    pub atomic: bool,
}

/// What a backfill reports as it goes (the CLI prints these as JSON lines).
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Start {
        logical_date: String,
        running: usize,
        ms: u64,
    },
    Done {
        logical_date: String,
        report: Box<RunReport>,
        ms: u64,
    },
    Failed {
        logical_date: String,
        error: String,
        /// The partition the error names, when it names one.
        #[serde(skip_serializing_if = "Option::is_none")]
        partition: Option<String>,
        bad_input: bool,
        /// The exit code this failure gives (see `crate::exit`); only 1 is worth
        /// retrying.
        exit_code: u8,
        ms: u64,
    },
    /// `--atomic`: every date's partitions became visible in one commit; the table's
    /// version after it.
    Committed { version: Option<i64>, ms: u64 },
    /// `--atomic`: a date failed (or the range was interrupted), so nothing of the
    /// range was committed; the table is as it was. `failed` dates ended in an error,
    /// `not_run` never started, and the partitions of the other dates were discarded.
    Abandoned {
        failed: usize,
        not_run: usize,
        ms: u64,
    },
}

impl Event {
    /// The `failed` event of `logical_date` for the error `e`.
    fn failed(logical_date: String, e: &Error, ms: u64) -> Event {
        Event::Failed {
            logical_date,
            error: e.to_string(),
            partition: e.partition().map(str::to_string),
            bad_input: e.is_bad_input(),
            exit_code: e.exit_code(),
            ms,
        }
    }
}

pub struct Outcome {
    pub date: String,
    pub result: Result<RunReport, Error>,
}

/// Runs every date; `on_event` sees starts and ends as they happen.
pub async fn backfill(
    job: &Job,
    opts: &BackfillOptions,
    on_event: Arc<dyn Fn(Event) + Send + Sync>,
) -> Vec<Outcome> {
    let started = Instant::now();
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::clone(&opts.stop);
    let concurrency = opts.concurrency.max(1);
    let batch = opts.atomic.then(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        format!("backfill-{}-{nanos}", std::process::id())
    });
    // The range's staged files wait for its one commit under the batch's own run lock,
    // so no other run's dead-run cleaner takes them for a dead run's.
    let mut held = None;
    if let Some(batch) = &batch {
        let (job2, batch2) = (job.clone(), batch.clone());
        match crate::blocking(move || hold_batch(&job2, &batch2)).await {
            Ok(h) => held = Some(h),
            Err(e) => {
                on_event(Event::failed(
                    "(commit)".into(),
                    &e,
                    started.elapsed().as_millis() as u64,
                ));
                return vec![Outcome {
                    date: "(commit)".into(),
                    result: Err(e),
                }];
            }
        }
    }
    let tasks = opts.dates.iter().cloned().map(|date| {
        let job = job.clone();
        let run_opts = RunOptions {
            date: date.clone(),
            vars: opts.vars.clone(),
            skip_fresh: opts.skip_fresh,
            cluster: opts.cluster.clone(),
            rewrite: opts.rewrite,
            commit_with: batch.clone(),
            profile: false,
        };
        let on_event = Arc::clone(&on_event);
        let running = Arc::clone(&running);
        let stop = Arc::clone(&stop);
        let fail_fast = opts.fail_fast;
        async move {
            use std::sync::atomic::Ordering::SeqCst;
            if stop.load(SeqCst) {
                return None;
            }
            let now = running.fetch_add(1, SeqCst) + 1;
            on_event(Event::Start {
                logical_date: date.clone(),
                running: now,
                ms: started.elapsed().as_millis() as u64,
            });
            let observer: Arc<dyn Observer> = Arc::new(Quiet);
            let handle =
                tokio::spawn(async move { crate::run::run(&job, &run_opts, observer).await });
            let result = handle.await.expect("a backfill run panicked");
            running.fetch_sub(1, SeqCst);
            let ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(report) => on_event(Event::Done {
                    logical_date: date.clone(),
                    report: Box::new(report.clone()),
                    ms,
                }),
                Err(e) => {
                    if fail_fast {
                        stop.store(true, SeqCst);
                    }
                    on_event(Event::failed(date.clone(), e, ms))
                }
            }
            Some(Outcome { date, result })
        }
    });
    let mut outcomes: Vec<Outcome> = futures::stream::iter(tasks)
        .buffer_unordered(concurrency)
        .filter_map(|o| async move { o })
        .collect()
        .await;
    if let (Some(batch), Some((table, guard))) = (batch, held) {
        let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
        let not_run = opts.dates.len() - outcomes.len();
        let all_ok = failed == 0 && not_run == 0;
        let (job2, batch2) = (job.clone(), batch.clone());
        let committed = crate::blocking(move || {
            let committed = commit_batch(&job2, table.as_ref(), &batch2, all_ok);
            if let Err(e) = table.cleanup_run(&batch2) {
                tracing::warn!(error = %e, "could not remove the range's staging directory");
            }
            drop(guard);
            committed
        })
        .await;
        let ms = started.elapsed().as_millis() as u64;
        match committed {
            Ok(Some(version)) => on_event(Event::Committed { version, ms }),
            Ok(None) => on_event(Event::Abandoned {
                failed,
                not_run,
                ms,
            }),
            Err(e) => {
                on_event(Event::failed("(commit)".into(), &e, ms));
                outcomes.push(Outcome {
                    date: "(commit)".into(),
                    result: Err(e),
                });
            }
        }
    }
    outcomes
}

/// The table of an `--atomic` backfill, prepared, and the batch's run lock.
fn hold_batch(
    job: &Job,
    batch: &str,
) -> Result<
    (
        Arc<dyn idem_io::commit::CommitBackend>,
        idem_io::commit::RunGuard,
    ),
    Error,
> {
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let table = crate::table::open(job)?;
    table.prepare().map_err(storage)?;
    let guard = table.lock_run(batch).map_err(storage)?;
    Ok((table, guard))
}

/// Commits an `--atomic` backfill's pending partitions in one commit when `all_ok`,
/// else forgets them; `Ok(None)` when forgotten.
fn commit_batch(
    job: &Job,
    table: &dyn idem_io::commit::CommitBackend,
    batch: &str,
    all_ok: bool,
) -> Result<Option<Option<i64>>, Error> {
    if !all_ok {
        table.drop_pending(batch);
        return Ok(None);
    }
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let fence = table.lock_publish().map_err(storage)?;
    let version = table.finish_publish(batch, &fence).map_err(storage)?;
    Ok(Some(version))
}
