//! A date's plan on a Ballista cluster, committed by idem.
//!
//! The client plans the run as it would locally (sources listed, the determinism guard,
//! the output's schema), then wraps the physical plan in [`IdemSinkExec`]: the rows are
//! hash-partitioned by the target's partition columns, so each partition is written
//! whole by one task, with idem's own writer (canonical digest sums, the manifest in
//! every footer). A task stages its partitions where the publishing client finds them
//! (the table's staging prefix on an object store) and returns a description of each:
//! partition, files, sizes, rows and digest. The client assembles the run from those
//! descriptions only, never from a listing, since a retried task leaves orphans; then
//! checks and publishes through the table's commit protocol as a local run does. What a
//! failed or retried task staged is never published, and the run's cleanup (or `gc`)
//! removes it.
//!
//! The scheduler and executors are Ballista's, started by `idem scheduler` and
//! `idem executor` with idem's codec ([`IdemCodec`]), UDFs and object stores.

mod codec;
mod serve;
mod sink;
mod stores;

pub use codec::IdemCodec;
pub use serve::{ExecutorOptions, SchedulerOptions, serve_executor, serve_scheduler};

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::SchemaRef;
use ballista_core::config::BallistaConfig;
use ballista_core::execution_plans::execute_physical_plan;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::TryStreamExt;
use idem_io::hive::PartitionPath;
use idem_io::manifest::{ColumnEntry, RunInfo};
use idem_io::writer::WrittenPartition;

use crate::error::{Error, Result};
use crate::job::Job;
use sink::{IdemSinkExec, SinkSpec, StagedDescription};

/// The error for a merge sent to a cluster.
pub const MERGE_REFUSED: &str = "mode = \"merge\" cannot run on a cluster yet: run it \
     without [execution] cluster (or --cluster), on this machine";

/// The error for a Delta table's job sent to a cluster.
pub const DELTA_REFUSED: &str = "format = \"delta\" cannot run on a cluster yet: run it \
     without [execution] cluster (or --cluster), on this machine";

/// Where a job's plan runs when not in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cluster {
    /// A scheduler and an executor in this process (Ballista's standalone mode): the
    /// whole distributed path on one machine, for tests and for trying it out.
    Standalone,
    /// The Ballista scheduler at `df://HOST:PORT`.
    Remote { host: String, port: u16 },
}

impl Cluster {
    /// `df://HOST:PORT` or `standalone`.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s == "standalone" {
            return Ok(Cluster::Standalone);
        }
        let bad = || format!("`{s}` is neither `df://HOST:PORT` (a scheduler) nor `standalone`");
        let rest = s.strip_prefix("df://").ok_or_else(bad)?;
        let (host, port) = rest
            .trim_end_matches('/')
            .rsplit_once(':')
            .ok_or_else(bad)?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{s}`: the port `{port}` is not a number below 65536"))?;
        if host.is_empty() || host.contains('/') {
            return Err(bad());
        }
        Ok(Cluster::Remote {
            host: host.to_string(),
            port,
        })
    }

    /// The scheduler's gRPC URL, starting the in-process cluster when standalone.
    async fn scheduler_url(&self) -> std::result::Result<String, String> {
        match self {
            Cluster::Remote { host, port } => Ok(format!("http://{host}:{port}")),
            Cluster::Standalone => serve::standalone().await,
        }
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cluster::Standalone => f.write_str("standalone"),
            Cluster::Remote { host, port } => write!(f, "df://{host}:{port}"),
        }
    }
}

/// What a run on a cluster needs to know besides the plan.
pub(crate) struct ClusterRun<'a> {
    pub job: &'a Job,
    pub cluster: &'a Cluster,
    pub run: &'a RunInfo,
    pub schema: Vec<ColumnEntry>,
}

/// Executes `plan` on the cluster, each partition of the output written and staged by
/// one task, and returns the staged partitions as the tasks describe them.
pub(crate) async fn stage(
    r: ClusterRun<'_>,
    plan: Arc<dyn ExecutionPlan>,
    output: &SchemaRef,
) -> Result<Vec<WrittenPartition>> {
    let job = r.job;
    let failed = |message: String, code: u8| Error::Cluster {
        path: job.path.clone(),
        cluster: r.cluster.to_string(),
        message,
        code,
    };
    let fail = |message: String| {
        let code = code_of(&message);
        failed(readable(&message), code)
    };
    let spec = SinkSpec::new(job, r.run.clone(), r.schema);
    let tasks = job
        .execution
        .partitions
        .unwrap_or_else(|| plan.properties().output_partitioning().partition_count())
        .max(1);
    if let Some(what) = cannot_travel(&plan) {
        return Err(failed(what, crate::exit::BAD_INPUT));
    }
    let input = by_partition(plan, output, &job.target.partition_by, tasks)
        .map_err(|e| fail(format!("planning the write: {e}")))?;
    let sink: Arc<dyn ExecutionPlan> = Arc::new(IdemSinkExec::new(input, spec));
    let url = r.cluster.scheduler_url().await.map_err(&fail)?;
    let config = stores::session_config(&stores::stores_of(job));
    let codec = IdemCodec::default();
    let stream = execute_physical_plan::<PhysicalPlanNode>(
        url,
        &BallistaConfig::default(),
        sink,
        &codec,
        r.run.run_id.clone(),
        config,
    )
    .await
    .map_err(|e| fail(e.to_string()))?;
    let batches: Vec<_> = stream
        .try_collect()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut staged: BTreeMap<PartitionPath, (usize, WrittenPartition)> = BTreeMap::new();
    for batch in &batches {
        let col = batch.column(0).as_string::<i32>();
        for i in 0..col.len() {
            let d: StagedDescription = serde_json::from_str(col.value(i))
                .map_err(|e| fail(format!("a task's description does not parse: {e}")))?;
            let task = d.task;
            let w = d.into_staged().map_err(|(m, code)| failed(m, code))?;
            match staged.get(w.partition()) {
                None => {
                    staged.insert(w.partition().clone(), (task, w));
                }
                // Two attempts of one task both finished (the cluster ran it again
                // after losing an executor): either is the partition whole; the
                // other's files are never published, and the run's cleanup removes them.
                Some((first_task, first)) if *first_task == task && same_rows(first, &w) => {}
                Some((first_task, first)) if *first_task == task => {
                    return Err(failed(
                        format!(
                            "two attempts of task {task} wrote partition {} with different \
                             rows (digests {} and {}): the plan is not deterministic (see \
                             `idem verify`)",
                            w.partition(),
                            first.manifest().digest,
                            w.manifest().digest
                        ),
                        crate::exit::NOT_DETERMINISTIC,
                    ));
                }
                Some((first_task, _)) => {
                    return Err(fail(format!(
                        "tasks {first_task} and {task} both wrote partition {}; each partition \
                         must be written by one task",
                        w.partition()
                    )));
                }
            }
        }
    }
    Ok(staged.into_values().map(|(_, w)| w).collect())
}

/// Why `plan` cannot run on a Ballista 55 cluster, when it cannot: an uncorrelated
/// scalar subquery (`where v >= (select min(v) from t)`) is planned as a
/// `ScalarSubqueryExec` whose expressions do not survive the trip to an executor (each
/// task failed with "ScalarSubqueryExpr can only be deserialized as part of a
/// surrounding ScalarSubqueryExec", and the run with 1, as if a retry could help).
fn cannot_travel(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let mut found = false;
    let _ = plan.apply(|node| {
        found = node.name() == "ScalarSubqueryExec";
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found.then(|| {
        "the query holds a scalar subquery over a whole table (such as \
         `(select max(x) from t)`), which Ballista 55 cannot send to its executors; run \
         this job without --cluster, or write the subquery as a join"
            .to_string()
    })
}

/// The exit code a failure on the cluster deserves, from its text: the one idem's sink
/// put there, else what a local run gives the same failure (the data's fault, a dedupe
/// tie), else 1 (worth a retry: an executor lost, the store failing).
fn code_of(message: &str) -> u8 {
    if let Some(at) = message.rfind(sink::EXIT_TAG)
        && let Some(code) = message[at + sink::EXIT_TAG.len()..]
            .split(']')
            .next()
            .and_then(|c| c.parse().ok())
    {
        return code;
    }
    // Arrow's data errors, as displayed and as debug-printed (Ballista reports a
    // task's error in the latter form).
    const DATA: [&str; 13] = [
        "Cannot cast ",
        "Cast error",
        "CastError",
        "Parser error",
        "ParseError",
        "Compute error",
        "ComputeError",
        "Divide by zero",
        "DivideByZero",
        "Arithmetic overflow",
        "ArithmeticOverflow",
        "Invalid argument error",
        "InvalidArgumentError",
    ];
    // DataFusion's planning errors, as displayed and as debug-printed: the query
    // cannot run anywhere (a local run exits 2 for them too).
    const PLAN: [&str; 6] = [
        "Error during planning",
        "Plan(\"",
        "Schema error",
        "SchemaError(",
        "This feature is not implemented",
        "NotImplemented(\"",
    ];
    if message.contains("dedupe tie:") || PLAN.iter().any(|p| message.contains(p)) {
        crate::exit::BAD_INPUT
    } else if DATA.iter().any(|d| message.contains(d)) {
        crate::exit::DATA
    } else {
        crate::exit::RETRY
    }
}

/// A failure of the cluster's own machinery as its reader can act on it: the process
/// that could not be reached, at which address and why, or the executor that was lost;
/// else the text as it came. Ballista and tonic report these as debug-printed values
/// (`GrpcConnectionError("…tonic::transport::Error(Transport, ConnectError(…))")`),
/// quoted once more for each layer that carried them.
fn readable(message: &str) -> String {
    let mut text = message.to_string();
    while text.contains("\\\"") {
        text = text.replace("\\\"", "\"").replace("\\\\", "\\");
    }
    // The reason an OS gave for a refused or failed connection.
    let why = |from: &str| -> String {
        from.split_once("message: \"")
            .and_then(|(_, m)| m.split('"').next())
            .map(|m| m.to_lowercase())
            .unwrap_or_else(|| "the connection failed".into())
    };
    for lead in [
        "Error connecting to Ballista scheduler or executor at ",
        "Error connecting to Ballista executor at ",
    ] {
        if let Some((_, rest)) = text.split_once(lead) {
            let addr = rest.split(": ").next().unwrap_or(rest);
            return format!(
                "a task could not reach the cluster process at {addr} ({}): an executor \
                 was lost or cannot be reached from the others; nothing was published, \
                 and a retry runs the date again",
                why(rest)
            );
        }
    }
    if let Some((_, rest)) = text.split_once("ConnectError(\"tcp connect error\", ") {
        let addr = rest.split(',').next().unwrap_or(rest).trim();
        return format!(
            "cannot reach the scheduler at {addr} ({}): is it running, and reachable \
             from this machine?",
            why(rest)
        );
    }
    if let Some((_, rest)) = text.split_once("Shuffle fetch partition error from Executor ") {
        let executor = rest.split(',').next().unwrap_or(rest);
        let desc = rest.split_once("error desc: ").map_or(rest, |(_, d)| d);
        return format!(
            "executor {executor} was lost while its output was being read ({desc}); \
             nothing was published, and a retry runs the date again"
        );
    }
    message.to_string()
}

/// Whether two staged copies of a partition hold the same rows.
fn same_rows(a: &WrittenPartition, b: &WrittenPartition) -> bool {
    let (a, b) = (a.manifest(), b.manifest());
    a.digest == b.digest && a.rows == b.rows && a.schema_fingerprint == b.schema_fingerprint
}

/// `plan`'s rows routed so that each partition of the target goes to one task: hashed
/// on the directory name the router gives a row (`idem_partition`), or all to one
/// task for an unpartitioned table.
fn by_partition(
    plan: Arc<dyn ExecutionPlan>,
    output: &SchemaRef,
    partition_by: &[String],
    tasks: usize,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    if partition_by.is_empty() {
        return Ok(Arc::new(CoalescePartitionsExec::new(plan)));
    }
    let args = partition_by
        .iter()
        .map(|name| -> datafusion::error::Result<Arc<dyn PhysicalExpr>> {
            Ok(Arc::new(Column::new(name, output.index_of(name)?)))
        })
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    let udf = Arc::new(crate::route::PartitionOf::udf());
    let key = ScalarFunctionExpr::try_new(
        udf,
        args,
        &plan.schema(),
        Arc::new(datafusion::config::ConfigOptions::default()),
    )?;
    Ok(Arc::new(RepartitionExec::try_new(
        plan,
        Partitioning::Hash(vec![Arc::new(key)], tasks),
    )?))
}

impl StagedDescription {
    /// The staged partition this describes, or why it cannot be published and the exit
    /// code that deserves.
    fn into_staged(self) -> std::result::Result<WrittenPartition, (String, u8)> {
        let partition = PartitionPath::parse(&self.partition)
            .map_err(|e| (e.to_string(), crate::exit::BAD_INPUT))?;
        if self.uploaded.is_none() {
            // Staged on disk by the executor: this process must see the same files.
            for (name, size) in &self.files {
                let path = self.dir.join(name);
                match idem_io::fs::metadata(&path) {
                    Ok(m) if m.len() == *size => {}
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err((
                            format!("reading what a task staged, {}: {e}", path.display()),
                            crate::exit::RETRY,
                        ));
                    }
                    _ => {
                        return Err((
                            format!(
                                "executor {} staged {} for partition {partition}, which this \
                             machine does not see (or not whole); a local table needs its \
                             executors on this machine or a shared filesystem, else use a \
                             table on an object store",
                                self.host,
                                path.display()
                            ),
                            crate::exit::BAD_INPUT,
                        ));
                    }
                }
            }
        }
        Ok(WrittenPartition::staged_elsewhere(
            partition,
            self.dir,
            self.manifest,
            self.uploaded,
        ))
    }
}

/// Per object-store base URL (`s3://bucket`), the options the job reaches it with.
pub(crate) type Stores = BTreeMap<String, idem_io::store::StorageOptions>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_addresses_parse_or_say_what_is_expected() {
        assert_eq!(Cluster::parse("standalone"), Ok(Cluster::Standalone));
        assert_eq!(
            Cluster::parse("df://sched.internal:50050/"),
            Ok(Cluster::Remote {
                host: "sched.internal".into(),
                port: 50050
            })
        );
        assert_eq!(
            Cluster::parse("df://sched:50050").unwrap().to_string(),
            "df://sched:50050"
        );
        for bad in [
            "sched:50050",
            "http://sched:50050",
            "df://sched",
            "df://:1",
            "df://a/b:1",
        ] {
            let e = Cluster::parse(bad).unwrap_err();
            assert!(e.contains("df://HOST:PORT"), "{bad}: {e}");
        }
        let e = Cluster::parse("df://sched:99999").unwrap_err();
        assert!(e.contains("port `99999`"), "{e}");
    }

    #[test]
    fn the_clusters_own_failures_read_as_what_failed_where() {
        // As a client without a scheduler reports it (`--cluster df://127.0.0.1:1`).
        let no_scheduler = "Execution error: tonic::transport::Error(Transport, \
            ConnectError(ConnectError(\"tcp connect error\", 127.0.0.1:1, Os { code: 111, \
            kind: ConnectionRefused, message: \"Connection refused\" })))";
        assert_eq!(
            readable(no_scheduler),
            "cannot reach the scheduler at 127.0.0.1:1 (connection refused): is it \
             running, and reachable from this machine?"
        );
        assert_eq!(code_of(no_scheduler), crate::exit::RETRY);
        // A task's failure carried back through the scheduler, quoted once more.
        let lost = "Job failed: Task failed: GrpcConnectionError(\"Error connecting to \
            Ballista scheduler or executor at http://10.0.0.7:50052: \
            tonic::transport::Error(Transport, ConnectError(ConnectError(\\\"tcp connect \
            error\\\", 10.0.0.7:50052, Os { code: 111, kind: ConnectionRefused, message: \
            \\\"Connection refused\\\" })))\")";
        let text = readable(lost);
        assert!(
            text.starts_with(
                "a task could not reach the cluster process at http://10.0.0.7:50052 \
                 (connection refused): an executor was lost"
            ),
            "{text}"
        );
        assert_eq!(code_of(lost), crate::exit::RETRY);
        let fetch = "Shuffle fetch partition error from Executor exec-3, map_stage 2, \
            map_partition 0, error desc: broken pipe";
        assert_eq!(
            readable(fetch),
            "executor exec-3 was lost while its output was being read (broken pipe); \
             nothing was published, and a retry runs the date again"
        );
        // Anything else as it came.
        assert_eq!(readable("Cast error: x"), "Cast error: x");
    }

    #[test]
    fn compression_survives_the_trip_to_an_executor() {
        use parquet::basic::{Compression, GzipLevel, ZstdLevel};
        for c in [
            Compression::SNAPPY,
            Compression::UNCOMPRESSED,
            Compression::LZ4_RAW,
            Compression::ZSTD(ZstdLevel::try_new(7).unwrap()),
            Compression::GZIP(GzipLevel::try_new(2).unwrap()),
        ] {
            let text = crate::job::compression_text(c);
            assert_eq!(crate::job::parse_compression(&text), Ok(c), "{text}");
        }
    }
}
