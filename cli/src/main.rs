//! The `idem` command line: parses arguments, calls the engine, renders results.
//!
//! Exit codes: 0 success; 1 the run failed while reading, computing or writing (the
//! table is left with every partition old or new); 2 bad input — arguments, job file,
//! SQL, or a determinism or layout check — and nothing was written; 3 a check on the
//! staged output failed and nothing was published; 4 `idem verify` found that two runs
//! of the same date differ.

mod render;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use idem_engine::job::Job;
use idem_engine::params::Var;
use idem_engine::run::{RunOptions, RunReport};

#[derive(Parser, Debug)]
#[command(
    name = "idem",
    version,
    about = "Idempotent batch pipelines: SQL transforms of a logical date, published atomically as Hive-partitioned Parquet."
)]
struct Cli {
    /// Log what idem does (-v info, -vv debug) to stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a job for one logical date and publish its partitions.
    Run(RunArgs),
    /// Run a job twice into scratch space and compare: is it deterministic?
    Verify(RunArgs),
    /// Run a job for every date of a range, newest first.
    Backfill(BackfillArgs),
    /// Show a table's partitions as their manifests describe them.
    Status(StatusArgs),
    /// Remove what dead runs left in a table's staging area (live runs are untouched).
    Gc(StatusArgs),
    /// Show a table's restatements: partitions rewritten with different rows.
    Log(StatusArgs),
    /// Print the jobs of a project folder in dependency order.
    Plan(ProjectArgs),
    /// List downstream partitions whose upstream inputs changed since they were written.
    Stale(ProjectArgs),
    /// Generate deterministic sample data.
    #[command(subcommand)]
    Gen(GenCommand),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The job file (TOML).
    job: PathBuf,
    /// The logical date: YYYY-MM-DD (day), YYYY-MM-DDTHH (hour), YYYY-MM (month).
    #[arg(long)]
    date: String,
    /// A SQL parameter, `name=value` or `name:type=value` (int, float, bool, date,
    /// timestamp); used in the SQL as $name.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BackfillArgs {
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
    /// Print JSON lines on stdout: a `start` and a `done`/`failed` event per date.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// The table's root directory.
    table: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ProjectArgs {
    /// A folder of job files.
    project: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum GenCommand {
    /// Raw orders, Hive-partitioned by created_date (Parquet).
    Orders {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "2026-06-01")]
        start: String,
        #[arg(long, default_value_t = 7)]
        days: u32,
        #[arg(long, default_value_t = 1000)]
        rows_per_day: u64,
        #[arg(long, default_value_t = 1000)]
        customers: u64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Customers as CSV (customer_id, email, country, signup_date).
    Customers {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1000)]
        customers: u64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let outcome = run(cli);
    if idem_io::fault::armed_from_env() {
        // For fault tests: how many storage calls the process made.
        let stats = idem_io::fault::stats();
        eprintln!(
            "{}: {} storage calls, fault fired: {}",
            idem_io::fault::ENV,
            stats.calls,
            stats.fired
        );
    }
    match outcome {
        Ok(code) => code,
        Err(err) => {
            let engine = err.downcast_ref::<idem_engine::Error>();
            // Engine errors already say what caused them; other errors carry context
            // layers worth printing in full.
            match engine {
                Some(e) => eprintln!("error: {e}"),
                None => eprintln!("error: {err:#}"),
            }
            ExitCode::from(engine.map_or(1, idem_engine::Error::exit_code))
        }
    }
}

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn parse_vars(vars: &[String]) -> Result<Vec<Var>, idem_engine::Error> {
    vars.iter().map(|v| Var::parse(v)).collect()
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => {
            let job = Job::load(&args.job)?;
            let opts = RunOptions {
                date: args.date.clone(),
                vars: parse_vars(&args.vars)?,
                skip_fresh: false,
            };
            let progress = render::Progress::new(!args.json && std::io::stderr().is_terminal());
            let report = runtime()?.block_on(idem_engine::run::run(
                &job,
                &opts,
                Arc::clone(&progress) as _,
            ));
            progress.finish();
            let report = report?;
            print_report(&report, args.json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Backfill(args) => backfill(args),
        Command::Verify(args) => {
            let job = Job::load(&args.job)?;
            let opts = RunOptions {
                date: args.date.clone(),
                vars: parse_vars(&args.vars)?,
                skip_fresh: false,
            };
            let report = runtime()?.block_on(idem_engine::verify::verify(&job, &opts))?;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                render::verify(&report);
            }
            Ok(if report.deterministic {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(4)
            })
        }
        Command::Status(args) => {
            let status = idem_engine::status::status(&args.table)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                render::status(&status);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gen(g) => gen_data(g),
        Command::Plan(args) => {
            let project = idem_engine::project::Project::load(&args.project)?;
            let plan = project.plan();
            if args.json {
                println!("{}", serde_json::to_string_pretty(&plan)?);
            } else {
                for e in &plan {
                    let from = if e.upstream.is_empty() {
                        "sources only".to_string()
                    } else {
                        format!("reads {}", e.upstream.join(", "))
                    };
                    println!("{}  ({})  {from}  -> {}", e.job, e.job_file, e.target);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Stale(args) => {
            let project = idem_engine::project::Project::load(&args.project)?;
            let stale = project.stale()?;
            if args.json {
                for s in &stale {
                    println!("{}", serde_json::to_string(s)?);
                }
            } else if stale.is_empty() {
                println!("nothing is stale");
            } else {
                for s in &stale {
                    println!(
                        "{} {} (logical date {}): {} changed ({})",
                        s.job, s.partition, s.logical_date, s.upstream, s.changed_input
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Log(args) => {
            let events = idem_engine::status::log(&args.table)?;
            if args.json {
                for e in &events {
                    println!("{}", serde_json::to_string(e)?);
                }
            } else if events.is_empty() {
                println!("no restatements");
            } else {
                for e in &events {
                    println!(
                        "{}  {}  {} rows -> {} rows  {} -> {}  ({} for {})",
                        e.run_id,
                        e.partition,
                        e.old_rows,
                        e.new_rows,
                        e.old_digest,
                        e.new_digest,
                        e.job,
                        e.logical_date
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc(args) => {
            let cleaned = idem_engine::status::gc(&args.table)?;
            if args.json {
                println!("{}", serde_json::json!({ "removed_runs": cleaned }));
            } else if cleaned.is_empty() {
                println!("nothing to clean");
            } else {
                println!(
                    "removed the staging of {} dead runs: {}",
                    cleaned.len(),
                    cleaned.join(", ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_report(report: &RunReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        render::report(report);
    }
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}

fn backfill(args: BackfillArgs) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Ctrl-C: start no further date and let the running ones finish (each publishes
    // atomically, so nothing is left half-done); a second Ctrl-C abandons them, which
    // is safe too: a killed run leaves every partition old or new.
    let flag = Arc::clone(&stop);
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            eprintln!(
                "interrupted: finishing the dates already running (Ctrl-C again to abandon them)"
            );
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!(
                    "abandoned; every partition is old or new, re-run the backfill to finish"
                );
                std::process::exit(130);
            }
        }
    });
    if args.job.is_dir() {
        return backfill_project(&rt, &args, stop);
    }
    if args.cascade {
        anyhow::bail!(
            "--cascade needs a project folder (a directory of job files), not a job file"
        );
    }
    let job = Job::load(&args.job)?;
    let dates =
        idem_engine::window::backfill_dates(job.target.grain, &args.from, &args.to, job.lookback)?;
    Ok(ExitCode::from(backfill_job(&rt, &job, dates, &args, stop)?))
}

/// A project: every job in dependency order. With `--cascade`, jobs that read other
/// jobs' tables run only for the dates whose partitions became stale.
fn backfill_project(
    rt: &tokio::runtime::Runtime,
    args: &BackfillArgs,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<ExitCode> {
    let project = idem_engine::project::Project::load(&args.job)?;
    let mut code = 0u8;
    for job in &project.jobs {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let downstream = !project.upstream[&job.name].is_empty();
        let dates = if args.cascade && downstream {
            let mut dates: Vec<String> = project
                .stale()?
                .into_iter()
                .filter(|s| s.job == job.name)
                .map(|s| s.logical_date)
                .collect();
            dates.sort_by(|a, b| b.cmp(a));
            dates.dedup();
            dates
        } else {
            idem_engine::window::backfill_dates(
                job.target.grain,
                &args.from,
                &args.to,
                job.lookback,
            )?
        };
        if dates.is_empty() {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"event": "nothing_stale", "job": job.name})
                );
            } else {
                println!("{}: nothing stale", job.name);
            }
            continue;
        }
        code = code.max(backfill_job(rt, job, dates, args, Arc::clone(&stop))?);
    }
    Ok(ExitCode::from(code))
}

/// Backfills one job over `dates` (newest first unless --oldest-first); returns the
/// exit code.
fn backfill_job(
    rt: &tokio::runtime::Runtime,
    job: &Job,
    mut dates: Vec<String>,
    args: &BackfillArgs,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<u8> {
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
        skip_fresh: args.skip_fresh,
        stop,
    };
    let json = args.json;
    let progress =
        render::BackfillProgress::new(dates.len(), !json && std::io::stderr().is_terminal());
    let events = Arc::clone(&progress);
    let on_event: Arc<dyn Fn(idem_engine::backfill::Event) + Send + Sync> = Arc::new(move |e| {
        if json {
            if let Ok(line) = serde_json::to_string(&e) {
                println!("{line}");
            }
        } else {
            events.event(&e);
        }
    });
    let started = std::time::Instant::now();
    let outcomes = rt.block_on(idem_engine::backfill::backfill(job, &opts, on_event));
    progress.finish();
    let mut summary = render::BackfillSummary::of(&outcomes, dates.len(), started.elapsed());
    summary.job = job.name.clone();
    summary.interrupted = opts.stop.load(std::sync::atomic::Ordering::SeqCst) && !args.fail_fast;
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        summary.print(&job.name);
    }
    let code = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err())
        .map(idem_engine::Error::exit_code)
        .max()
        .unwrap_or(if summary.not_run > 0 { 1 } else { 0 });
    Ok(code)
}

fn gen_data(g: GenCommand) -> anyhow::Result<ExitCode> {
    match g {
        GenCommand::Orders {
            out,
            start,
            days,
            rows_per_day,
            customers,
            seed,
        } => {
            let start = chrono::NaiveDate::parse_from_str(&start, "%Y-%m-%d")
                .with_context(|| format!("--start `{start}` is not YYYY-MM-DD"))?;
            let spec = idem_testdata::OrdersSpec {
                start,
                days,
                rows_per_day,
                customers,
                seed,
            };
            let files = idem_testdata::write_orders(&out, &spec)?;
            eprintln!("wrote {} files under {}", files.len(), out.display());
        }
        GenCommand::Customers {
            out,
            customers,
            seed,
        } => {
            let path = idem_testdata::write_customers_csv(&out, customers, seed)?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
