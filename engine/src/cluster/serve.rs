//! Ballista's scheduler and executor with idem's codec, UDFs and object stores: the
//! processes `idem scheduler` and `idem executor` run, and the in-process cluster of
//! `--cluster standalone`.

use std::sync::Arc;

use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::{BallistaCodec, BallistaLogicalExtensionCodec};
use ballista_core::{ConfigProducer, RuntimeProducer};
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::SessionBuilder;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::registry::FunctionRegistry;
use datafusion::prelude::SessionConfig;

use super::codec::{IdemCodec, udfs};
use super::stores;

fn config_producer() -> ConfigProducer {
    Arc::new(|| stores::session_config(&Default::default()))
}

fn runtime_producer() -> RuntimeProducer {
    Arc::new(stores::runtime)
}

/// A scheduler's session for a job: the job's settings, its object stores, idem's UDFs.
fn session_builder() -> SessionBuilder {
    Arc::new(|config: SessionConfig| {
        let runtime = stores::runtime(&config)?;
        let mut state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .with_runtime_env(runtime)
            .build();
        for f in udfs() {
            state.register_udf(Arc::new(f))?;
        }
        Ok(state)
    })
}

fn function_registry() -> BallistaFunctionRegistry {
    let mut registry = BallistaFunctionRegistry::default();
    for f in udfs() {
        registry
            .scalar_functions
            .insert(f.name().to_string(), Arc::new(f));
    }
    registry
}

fn codec() -> BallistaCodec {
    BallistaCodec::new(
        Arc::new(BallistaLogicalExtensionCodec::default()),
        Arc::new(IdemCodec::default()),
    )
}

/// Where `idem scheduler` listens and how soon it gives up on a silent executor.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    pub bind_host: String,
    /// The host executors and clients reach it at.
    pub external_host: String,
    pub port: u16,
    /// An executor silent this long is taken for dead, and its tasks run elsewhere.
    pub executor_timeout_seconds: u64,
}

/// Runs a scheduler until the process is stopped.
pub async fn serve_scheduler(o: SchedulerOptions) -> Result<(), String> {
    let config = SchedulerConfig {
        bind_host: o.bind_host.clone(),
        external_host: o.external_host.clone(),
        bind_port: o.port,
        executor_timeout_seconds: o.executor_timeout_seconds,
        expire_dead_executor_interval_seconds: o.executor_timeout_seconds.div_ceil(4).max(1),
        override_config_producer: Some(config_producer()),
        override_session_builder: Some(session_builder()),
        override_logical_codec: Some(Arc::new(BallistaLogicalExtensionCodec::default())),
        override_physical_codec: Some(Arc::new(IdemCodec::default())),
        ..SchedulerConfig::default()
    };
    let address = format!("{}:{}", o.bind_host, o.port)
        .parse()
        .map_err(|e| format!("{}:{}: {e}", o.bind_host, o.port))?;
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| e.to_string())?;
    start_server(cluster, address, Arc::new(config))
        .await
        .map_err(|e| e.to_string())
}

/// Where `idem executor` listens, which scheduler it serves, and how much it runs at once.
#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    pub bind_host: String,
    /// The host the scheduler and other executors reach it at.
    pub external_host: Option<String>,
    /// Arrow Flight (shuffle and result fetches).
    pub port: u16,
    /// Its gRPC service (push scheduling).
    pub grpc_port: u16,
    pub scheduler_host: String,
    pub scheduler_port: u16,
    /// Tasks run at once.
    pub concurrent_tasks: usize,
    /// Where shuffle files go.
    pub work_dir: Option<String>,
    /// How often it tells the scheduler it is alive.
    pub heartbeat_seconds: u64,
}

/// Runs an executor until the process is stopped.
pub async fn serve_executor(o: ExecutorOptions) -> Result<(), String> {
    let config = ExecutorProcessConfig {
        bind_host: o.bind_host,
        external_host: o.external_host,
        port: o.port,
        grpc_port: o.grpc_port,
        scheduler_host: o.scheduler_host,
        scheduler_port: o.scheduler_port,
        vcores: o.concurrent_tasks,
        work_dir: o.work_dir,
        executor_heartbeat_interval_seconds: o.heartbeat_seconds,
        print_thread_info: false,
        override_config_producer: Some(config_producer()),
        override_runtime_producer: Some(runtime_producer()),
        override_function_registry: Some(Arc::new(function_registry())),
        override_logical_codec: Some(Arc::new(BallistaLogicalExtensionCodec::default())),
        override_physical_codec: Some(Arc::new(IdemCodec::default())),
        ..ExecutorProcessConfig::default()
    };
    start_executor_process(Arc::new(config))
        .await
        .map_err(|e| e.to_string())
}

/// The URL of this process's in-process cluster, started on first use (and again when
/// the runtime it ran on has ended).
pub(super) async fn standalone() -> Result<String, String> {
    static URL: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let cached = URL.lock().expect("not poisoned").clone();
    if let Some(url) = cached
        && SchedulerGrpcClient::connect(url.clone()).await.is_ok()
    {
        return Ok(url);
    }
    let addr = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        session_builder(),
        config_producer(),
        codec(),
    )
    .await
    .map_err(|e| format!("starting the in-process scheduler: {e}"))?;
    let url = format!("http://localhost:{}", addr.port());
    let mut attempts = 0;
    let scheduler = loop {
        match SchedulerGrpcClient::connect(url.clone()).await {
            Ok(s) => break s,
            Err(e) if attempts == 50 => {
                return Err(format!(
                    "the in-process scheduler at {url} does not answer: {e}"
                ));
            }
            Err(_) => {
                attempts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    let tasks = std::thread::available_parallelism().map_or(2, |n| n.get());
    ballista_executor::new_standalone_executor_from_builder(
        scheduler,
        tasks,
        config_producer(),
        runtime_producer(),
        codec(),
        function_registry(),
    )
    .await
    .map_err(|e| format!("starting the in-process executor: {e}"))?;
    *URL.lock().expect("not poisoned") = Some(url.clone());
    Ok(url)
}
