//! `idem scheduler` and `idem executor`: a Ballista cluster from this release, with
//! idem's codec, UDFs and object stores, for `--cluster df://HOST:PORT`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use idem_engine::cluster::{Cluster, ExecutorOptions, SchedulerOptions};

#[derive(Args, Debug)]
pub struct SchedulerArgs {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    #[arg(long, default_value_t = 50050)]
    port: u16,
    /// The host name executors and clients reach this scheduler at (default: --bind).
    #[arg(long)]
    external_host: Option<String>,
    /// Seconds without a heartbeat after which an executor is taken for dead and its
    /// tasks are run elsewhere.
    #[arg(long, default_value_t = 60)]
    executor_timeout: u64,
}

#[derive(Args, Debug)]
pub struct ExecutorArgs {
    /// The scheduler to serve, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:50050")]
    scheduler: String,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// The Arrow Flight port (shuffle data and results are fetched from it).
    #[arg(long, default_value_t = 50051)]
    port: u16,
    /// The gRPC port the scheduler pushes tasks to.
    #[arg(long, default_value_t = 50052)]
    grpc_port: u16,
    /// The host name the scheduler and other executors reach this one at (default:
    /// --bind).
    #[arg(long)]
    external_host: Option<String>,
    /// Tasks run at once (default: the number of CPUs).
    #[arg(long)]
    concurrent_tasks: Option<usize>,
    /// Where shuffle files are written (default: a temporary directory).
    #[arg(long)]
    work_dir: Option<String>,
    /// Seconds between heartbeats to the scheduler.
    #[arg(long, default_value_t = 5)]
    heartbeat: u64,
}

/// `--cluster`: bad text is bad input (exit 2).
pub fn parse(cluster: Option<&str>) -> Result<Option<Cluster>, idem_engine::Error> {
    cluster
        .map(|c| {
            Cluster::parse(c).map_err(|message| idem_engine::Error::Argument {
                message: format!("--cluster: {message}"),
            })
        })
        .transpose()
}

pub fn scheduler(args: SchedulerArgs) -> anyhow::Result<ExitCode> {
    let options = SchedulerOptions {
        external_host: args.external_host.unwrap_or_else(|| args.bind.clone()),
        bind_host: args.bind,
        port: args.port,
        executor_timeout_seconds: args.executor_timeout.max(1),
    };
    eprintln!(
        "idem scheduler listening on {}:{} (clients: --cluster df://{}:{})",
        options.bind_host, options.port, options.external_host, options.port
    );
    crate::runtime()?
        .block_on(idem_engine::cluster::serve_scheduler(options))
        .map_err(anyhow::Error::msg)
        .context("the scheduler stopped")?;
    Ok(ExitCode::SUCCESS)
}

pub fn executor(args: ExecutorArgs) -> anyhow::Result<ExitCode> {
    let (host, port) = args
        .scheduler
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| idem_engine::Error::Argument {
            message: format!("--scheduler `{}` is not HOST:PORT", args.scheduler),
        })?;
    let options = ExecutorOptions {
        bind_host: args.bind,
        external_host: args.external_host,
        port: args.port,
        grpc_port: args.grpc_port,
        scheduler_host: host,
        scheduler_port: port,
        concurrent_tasks: args
            .concurrent_tasks
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1),
        work_dir: args.work_dir,
        heartbeat_seconds: args.heartbeat.max(1),
    };
    eprintln!(
        "idem executor on {}:{} serving the scheduler at {}",
        options.bind_host, options.port, args.scheduler
    );
    crate::runtime()?
        .block_on(idem_engine::cluster::serve_executor(options))
        .map_err(anyhow::Error::msg)
        .context("the executor stopped")?;
    Ok(ExitCode::SUCCESS)
}
