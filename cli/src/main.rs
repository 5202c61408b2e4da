//! The `idem` command line: parses arguments, calls the engine, renders results.
//!
//! Exit codes are a contract for retry policies (`idem_engine::exit`, docs/cli.md):
//! 0 success; 1 reading, writing or committing failed and a retry may succeed; 2 bad
//! input; 3 a check on the staged output failed; 4 `idem verify` found two runs of a
//! date differ; 5 the transform failed on the date's data. Only 1 is worth retrying.

mod backfill;
mod cluster;
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
    /// Run a job for every date of a range, newest first (a project: every job, in
    /// dependency order); with --index or --shard, a worker's share of the units.
    Backfill(backfill::BackfillArgs),
    /// List the (job, date) units a backfill of a range runs, in its order.
    Dates(backfill::DatesArgs),
    /// Show a table's partitions as their manifests describe them.
    Status(StatusArgs),
    /// Remove what dead runs left in a table's staging area (live runs are untouched).
    Gc(StatusArgs),
    /// Delete a Delta table's files that no version within the retention references
    /// (removed ones, and those crashed runs left), like Delta's VACUUM.
    Vacuum(VacuumArgs),
    /// Show a table's restatements: partitions rewritten with different rows.
    Log(StatusArgs),
    /// Print the jobs of a project folder in dependency order.
    Plan(ProjectArgs),
    /// List downstream partitions whose upstream inputs changed since they were written.
    Stale(ProjectArgs),
    /// Run a Ballista scheduler with idem's codec, for `--cluster df://HOST:PORT`.
    Scheduler(cluster::SchedulerArgs),
    /// Run a Ballista executor with idem's writer, UDFs and object stores.
    Executor(cluster::ExecutorArgs),
    /// Generate deterministic sample data.
    #[command(subcommand)]
    Gen(GenCommand),
}

impl Command {
    /// Whether the command prints JSON (`--json`).
    fn json(&self) -> bool {
        match self {
            Command::Run(a) | Command::Verify(a) => a.json,
            Command::Backfill(a) => a.json,
            Command::Dates(a) => a.json,
            Command::Status(a) | Command::Gc(a) | Command::Log(a) => a.json,
            Command::Vacuum(a) => a.json,
            Command::Plan(a) | Command::Stale(a) => a.json,
            Command::Scheduler(_) | Command::Executor(_) | Command::Gen(_) => false,
        }
    }
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
    /// Run the plan on a Ballista cluster: `df://HOST:PORT` (a scheduler, see `idem
    /// scheduler`) or `standalone` (one in this process). Overrides the job's
    /// `[execution] cluster`.
    #[arg(long, value_name = "df://HOST:PORT")]
    cluster: Option<String>,
    /// Publish every partition the run computes, even those whose rows equal the live
    /// ones (to apply changed writer settings such as compression or file size).
    #[arg(long)]
    rewrite: bool,
    /// Measure the run: the time of each stage (planning, listing, reading and
    /// computing, encoding, finishing files, checks, publishing), rows/s and bytes/s
    /// (`run` only).
    #[arg(long)]
    profile: bool,
    /// Let a run whose sources have no file for its window empty partitions that hold
    /// rows (by default it refuses, exit 2, and names the sources and partitions).
    #[arg(long)]
    allow_missing_input: bool,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// The table's root directory.
    table: PathBuf,
    #[arg(long)]
    json: bool,
}

/// The longest `--retain-hours`: a century.
const MAX_RETAIN_HOURS: u64 = 100 * 366 * 24;

#[derive(Args, Debug)]
struct VacuumArgs {
    /// The Delta table's root directory or URL.
    table: PathBuf,
    /// Keep files removed within this many hours (default: the table's
    /// delta.deletedFileRetentionDuration, seven days unless set). Readers holding an
    /// older version than this lose its files.
    #[arg(long, value_name = "HOURS", value_parser = clap::value_parser!(u64).range(0..=MAX_RETAIN_HOURS))]
    retain_hours: Option<u64>,
    /// List what would be deleted, delete nothing.
    #[arg(long)]
    dry_run: bool,
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
    let serving = matches!(cli.command, Command::Scheduler(_) | Command::Executor(_));
    init_tracing(cli.verbose, serving);
    let json = cli.command.json();
    // A setting read deep inside a run is checked before anything starts.
    let outcome = match idem_io::commit::object::lease_timeout_from_env() {
        Err(message) => Err(idem_engine::Error::Argument { message }.into()),
        Ok(_) => run(cli),
    };
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
            let message = match engine {
                Some(e) => e.to_string(),
                None => format!("{err:#}"),
            };
            eprintln!("error: {message}");
            let code = engine.map_or(1, idem_engine::Error::exit_code);
            if json {
                // A script reading stdout gets the failure in the same form as a report.
                println!(
                    "{}",
                    serde_json::json!({
                        "error": message,
                        "exit_code": code,
                        "partition": engine.and_then(idem_engine::Error::partition),
                    })
                );
            }
            ExitCode::from(code)
        }
    }
}

/// Logging to stderr. A run's errors reach the user through its own message, so
/// Ballista's log lines (a cluster's failed task, logged where it happens) show only
/// with `-v`; a scheduler or executor logs its cluster's life at info.
fn init_tracing(verbose: u8, serving: bool) {
    let level = match (verbose, serving) {
        (0, true) => "info",
        (0, false) => "warn,ballista_core=off,ballista_scheduler=off,ballista_executor=off",
        (1, _) => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

pub(crate) fn parse_vars(vars: &[String]) -> Result<Vec<Var>, idem_engine::Error> {
    vars.iter().map(|v| Var::parse(v)).collect()
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => {
            let mut job = Job::load(&args.job)?;
            job.allow_missing_input |= args.allow_missing_input;
            let opts = RunOptions {
                date: args.date.clone(),
                vars: parse_vars(&args.vars)?,
                skip_fresh: false,
                cluster: cluster::parse(args.cluster.as_deref())?,
                rewrite: args.rewrite,
                commit_with: None,
                profile: args.profile,
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
        Command::Backfill(args) => backfill::backfill(args),
        Command::Dates(args) => backfill::dates(args),
        Command::Verify(args) => {
            if args.profile {
                return Err(idem_engine::Error::Argument {
                    message: "--profile measures `idem run`, not `verify`".into(),
                }
                .into());
            }
            let job = Job::load(&args.job)?;
            let opts = RunOptions {
                date: args.date.clone(),
                vars: parse_vars(&args.vars)?,
                skip_fresh: false,
                cluster: cluster::parse(args.cluster.as_deref())?,
                ..Default::default()
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
                ExitCode::from(idem_engine::exit::NOT_DETERMINISTIC)
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
        Command::Scheduler(args) => cluster::scheduler(args),
        Command::Executor(args) => cluster::executor(args),
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
                    let missing = if e.allow_missing_input {
                        "  (empties partitions when its input is missing)"
                    } else {
                        ""
                    };
                    println!(
                        "{}  ({})  {from}  -> {}{missing}",
                        e.job, e.job_file, e.target
                    );
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
        Command::Vacuum(args) => {
            let retain = args
                .retain_hours
                .map(|h| std::time::Duration::from_secs(h * 3600));
            let files = idem_engine::status::vacuum(&args.table, retain, args.dry_run)?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "dry_run": args.dry_run, "files": files })
                );
            } else if files.is_empty() {
                println!("nothing to delete");
            } else {
                let verb = if args.dry_run {
                    "would delete"
                } else {
                    "deleted"
                };
                println!("{verb} {} files:", files.len());
                for f in &files {
                    println!("  {f}");
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
