//! The operator that ends a run's plan on a cluster: each task routes its rows to one
//! writer per partition, finishes the partitions (footers with the manifest), stages
//! them where the publishing client finds them, and returns one description per
//! partition. It publishes nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::StringArray;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::StreamExt;
use idem_io::hive::PartitionPath;
use idem_io::manifest::{ColumnEntry, Manifest, RunInfo};
use idem_io::staged::Uploaded;
use idem_io::writer::{PartitionWriter, WriterOptions};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::Job;
use crate::route::Router;
use crate::run::stage::{Budget, check_partition_name};

/// What a task needs to stage a run's partitions: the table, the run, and how its
/// files are encoded. Travels with the plan, as JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SinkSpec {
    job_path: PathBuf,
    table: String,
    storage: idem_io::store::StorageOptions,
    partition_by: Vec<String>,
    compression: String,
    row_group_rows: usize,
    target_file_bytes: u64,
    run: RunInfo,
    schema: Vec<ColumnEntry>,
}

impl SinkSpec {
    pub(crate) fn new(job: &Job, run: RunInfo, schema: Vec<ColumnEntry>) -> Self {
        let w = &job.target.writer;
        Self {
            job_path: job.path.clone(),
            table: job.target.path.to_string_lossy().into_owned(),
            storage: job.storage.clone(),
            partition_by: job.target.partition_by.clone(),
            compression: crate::job::compression_text(w.compression),
            row_group_rows: w.row_group_rows,
            target_file_bytes: w.target_file_bytes,
            run,
            schema,
        }
    }

    fn writer_options(&self) -> Result<WriterOptions> {
        let compression =
            crate::job::parse_compression(&self.compression).map_err(|m| Error::JobInvalid {
                path: self.job_path.clone(),
                message: format!("compression `{}`: {m}", self.compression),
            })?;
        Ok(WriterOptions {
            compression,
            row_group_rows: self.row_group_rows,
            target_file_bytes: self.target_file_bytes,
        })
    }
}

/// What a task staged for one partition: the publishing client builds the run from
/// these alone.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StagedDescription {
    /// The partition's relative path (`dt=2026-06-04`; empty for the table root).
    pub(crate) partition: String,
    /// Where the task wrote the files (on disk; gone once uploaded).
    pub(crate) dir: PathBuf,
    /// The manifest in every footer: files, rows, digest sums, the partition's digest.
    pub(crate) manifest: Manifest,
    /// Each file's name and size, footer included.
    pub(crate) files: Vec<(String, u64)>,
    /// Where the files are on the table's object store.
    pub(crate) uploaded: Option<Uploaded>,
    /// The executor's host, for messages.
    pub(crate) host: String,
    /// The task (the sink's partition) that wrote it: every attempt of one task writes
    /// the same partitions.
    pub(crate) task: usize,
}

/// Ends the text of a task's error with the exit code a local run would give it.
pub(super) const EXIT_TAG: &str = "[idem exit code ";

/// The one column of the sink's output: a JSON [`StagedDescription`] per row.
fn output_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "staged",
        DataType::Utf8,
        false,
    )]))
}

/// Writes and stages every partition of its input, one task per input partition.
#[derive(Debug)]
pub(crate) struct IdemSinkExec {
    input: Arc<dyn ExecutionPlan>,
    spec: Arc<SinkSpec>,
    properties: Arc<PlanProperties>,
}

impl IdemSinkExec {
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>, spec: SinkSpec) -> Self {
        let partitions = input.properties().output_partitioning().partition_count();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(output_schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self {
            input,
            spec: Arc::new(spec),
            properties: Arc::new(properties),
        }
    }

    pub(crate) fn spec(&self) -> &SinkSpec {
        &self.spec
    }
}

impl DisplayAs for IdemSinkExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IdemSinkExec: table={}, run={}",
            self.spec.table, self.spec.run.run_id
        )
    }
}

impl ExecutionPlan for IdemSinkExec {
    fn name(&self) -> &str {
        "IdemSinkExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "IdemSinkExec has one input".into(),
            ));
        }
        Ok(Arc::new(IdemSinkExec::new(
            children.swap_remove(0),
            (*self.spec).clone(),
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let spec = Arc::clone(&self.spec);
        let task = async move {
            write_task(spec, partition, input).await.map_err(|e| {
                // The client gets the text alone: it reads the exit code back from it.
                DataFusionError::Execution(format!("{e} {}{}]", EXIT_TAG, e.exit_code()))
            })
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            output_schema(),
            futures::stream::once(task),
        )))
    }
}

/// From the task to its writing thread: a partition's rows, or the end of the input
/// (without which the thread abandons what it wrote: the input failed).
enum Msg {
    Rows(PartitionPath, RecordBatch),
    End,
}

/// Runs one task: routes the input's rows to a thread that writes and stages them.
async fn write_task(
    spec: Arc<SinkSpec>,
    task: usize,
    mut input: SendableRecordBatchStream,
) -> Result<RecordBatch> {
    let exec = |e: DataFusionError| Error::execution(&spec.job_path, "", e);
    let router = Router::new(&input.schema(), &spec.partition_by);
    let data_schema = Arc::clone(router.data_schema());
    let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(2);
    let spec2 = Arc::clone(&spec);
    let writer = std::thread::Builder::new()
        .name("idem-sink".into())
        .spawn(move || idem_io::blocking::allowed(|| write_attempt(&spec2, task, data_schema, rx)))
        .expect("spawn the sink's writer thread");
    let mut failed = None;
    'input: while let Some(batch) = input.next().await {
        let parts = match batch.and_then(|b| router.split(&b).map_err(DataFusionError::from)) {
            Ok(parts) => parts,
            Err(e) => {
                failed = Some(exec(e));
                break;
            }
        };
        for (p, rows) in parts {
            if tx.send(Msg::Rows(p, rows)).await.is_err() {
                break 'input; // the writer failed; its error is returned below
            }
        }
    }
    if failed.is_none() {
        let _ = tx.send(Msg::End).await;
    }
    drop(tx);
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .expect("join the sink's writer")
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    if let Some(e) = failed {
        return Err(e);
    }
    let described: Vec<String> = written?
        .iter()
        .map(|d| serde_json::to_string(d).expect("description serializes"))
        .collect();
    Ok(RecordBatch::try_new(
        output_schema(),
        vec![Arc::new(StringArray::from(described))],
    )
    .expect("one text column"))
}

/// Random: no two attempts of a task stage into one directory.
fn attempt_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// The writing thread of a task attempt: writes into a staging directory of the
/// attempt's own (a retried task writes beside the attempt it replaces, never into its
/// files), which it removes unless it holds what a local table publishes.
fn write_attempt(
    spec: &SinkSpec,
    task: usize,
    data_schema: SchemaRef,
    rx: tokio::sync::mpsc::Receiver<Msg>,
) -> Result<Vec<StagedDescription>> {
    let table =
        idem_io::table::open(&spec.table, &spec.storage).map_err(|source| Error::Storage {
            target: PathBuf::from(&spec.table),
            source,
        })?;
    let attempt = format!("{}/task-{task}-{:016x}", spec.run.run_id, attempt_token());
    let written = check_version(spec)
        .and_then(|()| check_inputs(spec))
        .and_then(|()| write_partitions(spec, task, table.as_ref(), &attempt, data_schema, rx));
    let dir = table.staging_dir(&attempt, &PartitionPath::root());
    let described_on_disk = written
        .as_ref()
        .is_ok_and(|d| d.iter().any(|d| d.uploaded.is_none()));
    if !described_on_disk {
        let _ = idem_io::fs::remove_dir_all(&dir);
    }
    written
}

/// An executor writes files a client of its own release describes: the manifest, the
/// digest and the file layout are part of idem's on-disk contract.
fn check_version(spec: &SinkSpec) -> Result<()> {
    let here = env!("CARGO_PKG_VERSION");
    if spec.run.idem_version == here {
        return Ok(());
    }
    Err(Error::Cluster {
        path: spec.job_path.clone(),
        cluster: idem_io::commit::hostname(),
        message: format!(
            "this executor runs idem {here} and the client idem {}: run the cluster from \
             the clients' release",
            spec.run.idem_version
        ),
        code: crate::exit::BAD_INPUT,
    })
}

/// The local files the client read, as this executor sees them: a local source is read
/// by every executor from its own disk, so each must see the client's files.
fn check_inputs(spec: &SinkSpec) -> Result<()> {
    for f in &spec.run.inputs {
        if idem_io::store::is_url(&f.path) && !f.path.starts_with("file://") {
            continue;
        }
        let path = f.path.strip_prefix("file://").unwrap_or(&f.path);
        let seen = match idem_io::fs::metadata(std::path::Path::new(path)) {
            Ok(m) => Some(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            // Not an answer about the file: the disk failed, worth a retry.
            Err(source) => {
                return Err(Error::Storage {
                    target: PathBuf::from(path),
                    source: idem_io::Error::io("stat", path)(source),
                });
            }
        };
        if seen != Some(f.size) {
            return Err(Error::Cluster {
                path: spec.job_path.clone(),
                cluster: idem_io::commit::hostname(),
                message: format!(
                    "executor {} does not see the input {path} as the client does ({}); \
                     local sources need executors on the client's machine or a shared \
                     filesystem, else put the sources on an object store",
                    idem_io::commit::hostname(),
                    match seen {
                        None => "it is missing there".to_string(),
                        Some(n) => format!("{n} bytes there, {} here", f.size),
                    }
                ),
                code: crate::exit::BAD_INPUT,
            });
        }
    }
    Ok(())
}

/// Writes the input's partitions, finishes and stages them for the publisher at the
/// end of the input, and describes them.
fn write_partitions(
    spec: &SinkSpec,
    task: usize,
    table: &dyn idem_io::commit::CommitBackend,
    attempt: &str,
    data_schema: SchemaRef,
    mut rx: tokio::sync::mpsc::Receiver<Msg>,
) -> Result<Vec<StagedDescription>> {
    let storage = |source| Error::Storage {
        target: PathBuf::from(&spec.table),
        source,
    };
    let opts = spec.writer_options()?;
    let mut writers: BTreeMap<PartitionPath, PartitionWriter> = BTreeMap::new();
    let mut budget = Budget::default();
    let mut first = true;
    let abandon = |writers: BTreeMap<PartitionPath, PartitionWriter>| {
        for w in writers.into_values() {
            let _ = w.abort();
        }
    };
    loop {
        let (p, rows) = match rx.blocking_recv() {
            Some(Msg::Rows(p, rows)) => (p, rows),
            Some(Msg::End) => break,
            None => {
                abandon(writers);
                return Err(Error::Cluster {
                    path: spec.job_path.clone(),
                    cluster: idem_io::commit::hostname(),
                    message: "the task's input ended early".into(),
                    code: crate::exit::RETRY,
                });
            }
        };
        if !writers.contains_key(&p) {
            if let Err(e) = check_partition_name(&spec.job_path, &p) {
                abandon(writers);
                return Err(e);
            }
            let dir = table.staging_dir(attempt, &p);
            match PartitionWriter::new(p.clone(), dir, Arc::clone(&data_schema), opts.clone()) {
                Ok(w) => writers.insert(p.clone(), w),
                Err(e) => {
                    abandon(writers);
                    return Err(storage(e));
                }
            };
        }
        let w = writers.get_mut(&p).expect("writer opened");
        let written = w.write(&rows).map_err(|source| Error::Write {
            target: PathBuf::from(&spec.table),
            partition: p.to_string(),
            source,
        });
        let flushed = written.and_then(|()| {
            budget
                .written(&mut writers, rows.num_rows())
                .map_err(|(partition, source)| Error::Write {
                    target: PathBuf::from(&spec.table),
                    partition,
                    source,
                })
        });
        let paused = flushed.and_then(|()| {
            if first {
                first = false;
                idem_io::failpoint::hit("after_first_batch").map_err(storage)?;
            }
            Ok(())
        });
        if let Err(e) = paused {
            abandon(writers);
            return Err(e);
        }
    }
    let host = idem_io::commit::hostname();
    let mut described = Vec::with_capacity(writers.len());
    for (p, w) in writers {
        let write_err = |source| Error::Write {
            target: PathBuf::from(&spec.table),
            partition: p.to_string(),
            source,
        };
        let staged = w
            .finish(&spec.run, spec.schema.clone())
            .map_err(write_err)?;
        let dir = staged.dir().to_path_buf();
        let staged = table.stage_for_publisher(staged).map_err(write_err)?;
        // Uploaded files come with their sizes; files left on disk are measured there.
        let files: Vec<(String, u64)> = match staged.uploaded() {
            Some(up) => up.files.clone(),
            None => staged
                .manifest()
                .files
                .iter()
                .map(|f| {
                    let path = dir.join(&f.name);
                    idem_io::fs::metadata(&path)
                        .map(|m| (f.name.clone(), m.len()))
                        .map_err(|source| write_err(idem_io::Error::io("stat", path)(source)))
                })
                .collect::<Result<_>>()?,
        };
        let manifest = staged.manifest().clone();
        described.push(StagedDescription {
            partition: p.rel_path().to_string_lossy().into_owned(),
            dir,
            manifest,
            files,
            uploaded: staged.uploaded().cloned(),
            host: host.clone(),
            task,
        });
    }
    idem_io::failpoint::hit("after_stage").map_err(storage)?;
    Ok(described)
}
