//! `idem backfill` and `idem dates`: a range of logical dates for a job or a project,
//! run here (all of it, or a worker's share with `--index` / `--shard`) or listed as
//! units for an orchestrator. A unit whose upstream unit failed is not run: it is
//! reported skipped, with the upstream failure as its reason.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use clap::Args;
use idem_engine::backfill::Outcome;
use idem_engine::job::Job;
use idem_engine::project::Project;
use idem_engine::units::{Pick, Unit};

use crate::{parse_vars, render, runtime};

#[derive(Args, Debug)]
pub struct BackfillArgs {
    /// A job file, or a project folder of job files (run in dependency order).
    job: PathBuf,
    /// With a project: jobs that read other jobs' tables run only for the dates whose
    /// partitions became stale.
    #[arg(long)]
    cascade: bool,
    /// First logical date (inclusive).
    #[arg(long)]
    from: String,
    /// Last logical date (inclusive).
    #[arg(long)]
    to: String,
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// Start with the oldest date (default: newest first).
    #[arg(long)]
    oldest_first: bool,
    /// Stop starting new dates after the first failure.
    #[arg(long)]
    fail_fast: bool,
    /// How many dates run at once (default: twice the number of CPUs, at most 4).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Skip dates whose partitions were written by this job and idem version from
    /// inputs that have not changed since.
    #[arg(long)]
    skip_fresh: bool,
    /// Publish every partition the runs compute, even those equal to the live ones
    /// (to apply changed writer settings such as compression or file size).
    #[arg(long)]
    rewrite: bool,
    /// A Delta table's job: commit every date's partitions in one Delta commit after
    /// the last date, so readers see the whole range change at once; when a date
    /// fails, nothing is committed.
    #[arg(long, conflicts_with_all = ["index", "shard", "cascade"])]
    atomic: bool,
    /// Run each date's plan on a Ballista cluster: `df://HOST:PORT` or `standalone`.
    /// Overrides the jobs' `[execution] cluster`.
    #[arg(long, value_name = "df://HOST:PORT")]
    cluster: Option<String>,
    /// Run only unit I of the range, as `idem dates` numbers them (from 0), after
    /// bringing the upstream units it reads up to date. `--index` without a value
    /// reads I from JOB_COMPLETION_INDEX, as Kubernetes Indexed Jobs set it.
    #[arg(
        long,
        value_name = "I",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with_all = ["shard", "cascade"]
    )]
    index: Option<String>,
    /// Run only shard K of N (K from 0): the units whose index modulo N is K, after
    /// bringing the upstream units they read up to date.
    #[arg(long, value_name = "K/N", conflicts_with = "cascade")]
    shard: Option<String>,
    /// Let a date whose sources have no file for its window empty partitions that
    /// hold rows (by default it refuses, exit 2, and names the sources and partitions).
    #[arg(long)]
    allow_missing_input: bool,
    /// Print JSON lines on stdout: a `start` and a `done`/`failed`/`skipped` event per
    /// date, and a `summary` per job.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub struct DatesArgs {
    /// A job file, or a project folder of job files.
    job: PathBuf,
    /// First logical date (inclusive).
    #[arg(long)]
    from: String,
    /// Last logical date (inclusive).
    #[arg(long)]
    to: String,
    /// Only the units that are not fresh (as --skip-fresh decides), and those that
    /// read one of them. Indices stay those of the whole range.
    #[arg(long)]
    stale: bool,
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// Print the units as one JSON array.
    #[arg(long)]
    pub(crate) json: bool,
}

fn load(path: &std::path::Path) -> Result<Project, idem_engine::Error> {
    if path.is_dir() {
        Project::load(path)
    } else {
        Ok(Project::one(Job::load(path)?))
    }
}

pub fn dates(args: DatesArgs) -> anyhow::Result<ExitCode> {
    let jobs = load(&args.job)?;
    let mut units = jobs.units(&args.from, &args.to)?;
    let all = units.len();
    if args.stale {
        units = jobs.stale_units(units, &parse_vars(&args.vars)?)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&units)?);
    } else {
        for u in &units {
            let after = if u.after.is_empty() {
                String::new()
            } else {
                let list: Vec<String> = u.after.iter().map(usize::to_string).collect();
                format!("  after {}", list.join(","))
            };
            println!("{:>5}  {}  {}{after}", u.index, u.job, u.date);
        }
        eprintln!("{} of {all} units", units.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// A unit that did not succeed, as its dependents report it.
struct Blocked {
    job: String,
    date: String,
    code: u8,
    /// Why its dependents are skipped: the first upstream failure, named.
    reason: String,
}

pub fn backfill(args: BackfillArgs) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    // `stop`: start no further date (Ctrl-C, or a failure with --fail-fast);
    // `interrupted`: Ctrl-C, which leaves the backfill unfinished but not failed.
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    // Ctrl-C: start no further date and let the running ones finish (each publishes
    // atomically, so nothing is left half-done); a second Ctrl-C abandons them, which
    // is safe too: a killed run leaves every partition old or new.
    let (flag, ctrl_c) = (Arc::clone(&stop), Arc::clone(&interrupted));
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            ctrl_c.store(true, SeqCst);
            flag.store(true, SeqCst);
            eprintln!(
                "interrupted: finishing the dates already running (Ctrl-C again to abandon them)"
            );
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!(
                    "abandoned; every partition is old or new, re-run the backfill to finish"
                );
                std::process::exit(idem_engine::exit::INTERRUPTED.into());
            }
        }
    });
    if args.cascade && !args.job.is_dir() {
        anyhow::bail!(
            "--cascade needs a project folder (a directory of job files), not a job file"
        );
    }
    let mut jobs = load(&args.job)?;
    for job in &mut jobs.jobs {
        job.allow_missing_input |= args.allow_missing_input;
    }
    if args.atomic {
        let refuse = |message: &str| idem_engine::Error::JobInvalid {
            path: args.job.clone(),
            message: message.into(),
        };
        if args.job.is_dir() {
            return Err(refuse(
                "--atomic commits one job's range as one snapshot: pass a job file, not a \
                 project folder",
            )
            .into());
        }
        if jobs
            .jobs
            .iter()
            .any(|j| j.target.format != idem_io::table::Format::Delta)
        {
            return Err(refuse(
                "--atomic needs a Delta table (format = \"delta\" in [target]): a Parquet \
                 table publishes each partition by itself",
            )
            .into());
        }
    }
    let pick = match (&args.index, &args.shard) {
        (Some(i), _) => Some(Pick::index(i)?),
        (None, Some(s)) => Some(Pick::shard(s)?),
        (None, None) => None,
    };
    let worker = match pick {
        Some(pick) => Some(worker_units(&jobs, &args, pick)?),
        None => None,
    };
    let mut blocked: Vec<Blocked> = Vec::new();
    let mut code = 0u8;
    for job in &jobs.jobs {
        if stop.load(SeqCst) {
            if interrupted.load(SeqCst) {
                // Jobs were left unstarted: the backfill is not done.
                code = worse(code, idem_engine::exit::RETRY);
            }
            break;
        }
        // The dates to run for this job, each list with its --skip-fresh.
        let batches: Vec<(Vec<String>, bool)> = match &worker {
            Some(units) => worker_batches(units, job, args.skip_fresh),
            None if args.cascade && !jobs.upstream[&job.name].is_empty() => {
                let mut dates: Vec<String> = jobs
                    .stale()?
                    .into_iter()
                    .filter(|s| s.job == job.name)
                    .map(|s| s.logical_date)
                    .collect();
                dates.sort_by(|a, b| b.cmp(a));
                dates.dedup();
                if dates.is_empty() {
                    if args.json {
                        println!(
                            "{}",
                            serde_json::json!({"event": "nothing_stale", "job": job.name})
                        );
                    } else {
                        println!("{}: nothing stale", job.name);
                    }
                }
                vec![(dates, args.skip_fresh)]
            }
            None => vec![(
                idem_engine::window::backfill_dates(
                    job.target.grain,
                    &args.from,
                    &args.to,
                    job.lookback,
                )?,
                args.skip_fresh,
            )],
        };
        for (dates, skip_fresh) in batches {
            if dates.is_empty() {
                continue;
            }
            let (run, skipped) = skip_blocked(&jobs, job, dates, &blocked, args.json)?;
            for b in &skipped {
                code = worse(code, b.code);
            }
            let skipped_count = skipped.len();
            blocked.extend(skipped);
            let started = run.len();
            let outcomes = backfill_job(
                &rt,
                job,
                run,
                &args,
                skip_fresh,
                skipped_count,
                &Flags {
                    stop: Arc::clone(&stop),
                    interrupted: Arc::clone(&interrupted),
                },
            )?;
            for o in &outcomes {
                if let Err(e) = &o.result {
                    code = worse(code, e.exit_code());
                    let first = e.to_string();
                    let first = first.lines().next().unwrap_or_default().to_string();
                    blocked.push(Blocked {
                        job: job.name.clone(),
                        date: o.date.clone(),
                        code: e.exit_code(),
                        reason: format!(
                            "upstream `{}` failed for {} (exit {}): {first}",
                            job.name,
                            o.date,
                            e.exit_code()
                        ),
                    });
                }
            }
            if outcomes.len() < started && interrupted.load(SeqCst) {
                // Ctrl-C before every date started: not done, and not failed (after a
                // failure with --fail-fast, the code is that failure's).
                code = worse(code, idem_engine::exit::RETRY);
            }
        }
    }
    Ok(ExitCode::from(code))
}

/// The exit code of a backfill whose dates ended with `a` and `b`: 1 when either
/// failure may succeed on a retry (a retry policy must not give up on it because
/// another date failed for good), else the worse final code.
fn worse(a: u8, b: u8) -> u8 {
    use idem_engine::exit::RETRY;
    if a == RETRY || b == RETRY {
        RETRY
    } else {
        a.max(b)
    }
}

/// A worker's units: those `pick` selects and the upstream units they read, by job
/// and whether the worker was asked for them (false: only to bring them up to date).
fn worker_units(
    jobs: &Project,
    args: &BackfillArgs,
    pick: Pick,
) -> anyhow::Result<Vec<(Unit, bool)>> {
    let units = jobs.units(&args.from, &args.to)?;
    let selected = idem_engine::units::select(&units, pick)?;
    let all = idem_engine::units::with_upstream(&units, &selected);
    Ok(all
        .into_iter()
        .map(|i| (units[i].clone(), selected.contains(&i)))
        .collect())
}

/// A worker's dates of `job`: the upstream ones it brings up to date (always with
/// --skip-fresh: a done upstream unit costs a manifest read), then its own.
fn worker_batches(units: &[(Unit, bool)], job: &Job, skip_fresh: bool) -> Vec<(Vec<String>, bool)> {
    let of = |own: bool| -> Vec<String> {
        units
            .iter()
            .filter(|(u, asked)| u.job == job.name && *asked == own)
            .map(|(u, _)| u.date.clone())
            .collect()
    };
    vec![(of(false), true), (of(true), skip_fresh)]
}

/// Splits `dates` of `job` into those to run and those skipped because a unit they
/// read did not succeed; reports the skipped ones.
fn skip_blocked(
    jobs: &Project,
    job: &Job,
    dates: Vec<String>,
    blocked: &[Blocked],
    json: bool,
) -> anyhow::Result<(Vec<String>, Vec<Blocked>)> {
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    for date in dates {
        let mut cause = None;
        for b in blocked {
            if jobs.reads(job, &date, jobs.job(&b.job), &b.date)? {
                cause = Some(b);
                break;
            }
        }
        let Some(b) = cause else {
            run.push(date);
            continue;
        };
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "event": "skipped",
                    "job": job.name,
                    "logical_date": date,
                    "upstream_job": b.job,
                    "upstream_date": b.date,
                    "exit_code": b.code,
                    "reason": b.reason,
                })
            );
        } else {
            println!("{}  {date}  SKIPPED: {}", job.name, b.reason);
        }
        skipped.push(Blocked {
            job: job.name.clone(),
            date,
            code: b.code,
            reason: b.reason.clone(),
        });
    }
    Ok((run, skipped))
}

/// What stops a backfill: `stop` (start no further date: Ctrl-C, or a failure with
/// --fail-fast) and whether it was Ctrl-C.
struct Flags {
    stop: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
}

/// Backfills one job over `dates` (newest first unless --oldest-first); returns what
/// each date did.
fn backfill_job(
    rt: &tokio::runtime::Runtime,
    job: &Job,
    mut dates: Vec<String>,
    args: &BackfillArgs,
    skip_fresh: bool,
    skipped: usize,
    flags: &Flags,
) -> anyhow::Result<Vec<Outcome>> {
    let vars = parse_vars(&args.vars)?;
    if args.oldest_first {
        dates.reverse();
    }
    // Two dates per CPU (at most 4): one date's serial steps (planning, listing, fsync,
    // publish) leave its cores idle, and another date fills them.
    let concurrency = args.concurrency.unwrap_or_else(|| {
        (2 * std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1))
        .min(4)
    });
    let opts = idem_engine::backfill::BackfillOptions {
        dates: dates.clone(),
        vars,
        concurrency,
        fail_fast: args.fail_fast,
        skip_fresh,
        cluster: crate::cluster::parse(args.cluster.as_deref())?,
        stop: Arc::clone(&flags.stop),
        rewrite: args.rewrite,
        atomic: args.atomic,
    };
    let json = args.json;
    let progress =
        render::BackfillProgress::new(dates.len(), !json && std::io::stderr().is_terminal());
    let events = Arc::clone(&progress);
    let abandoned = Arc::new(AtomicBool::new(false));
    let abandoned2 = Arc::clone(&abandoned);
    let on_event: Arc<dyn Fn(idem_engine::backfill::Event) + Send + Sync> = Arc::new(move |e| {
        if matches!(e, idem_engine::backfill::Event::Abandoned { .. }) {
            abandoned2.store(true, SeqCst);
        }
        if json {
            if let Ok(line) = serde_json::to_string(&e) {
                println!("{line}");
            }
        } else {
            events.event(&e);
        }
    });
    let started = std::time::Instant::now();
    let outcomes = if dates.is_empty() {
        Vec::new()
    } else {
        rt.block_on(idem_engine::backfill::backfill(job, &opts, on_event))
    };
    progress.finish();
    let mut summary = render::BackfillSummary::of(&outcomes, dates.len(), started.elapsed());
    summary.job = job.name.clone();
    summary.dates += skipped;
    summary.skipped = skipped;
    summary.interrupted = flags.interrupted.load(SeqCst);
    if abandoned.load(SeqCst) {
        summary.abandon();
    }
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        summary.print(&job.name);
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::worse;

    #[test]
    fn a_backfill_ends_retryable_when_any_date_may_succeed_on_a_retry() {
        assert_eq!(worse(1, 5), 1);
        assert_eq!(worse(5, 1), 1);
        assert_eq!(worse(0, 1), 1);
        assert_eq!(worse(2, 5), 5);
        assert_eq!(worse(3, 2), 3);
        assert_eq!(worse(0, 0), 0);
    }
}
