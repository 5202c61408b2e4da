//! Staging: rows stream from DataFusion through the router into one writer per
//! partition, within a memory budget (the largest partition's buffered row groups are
//! flushed early), and each partition is finished into a staged directory outside the
//! table, with its manifest in the footers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::execution::context::SessionContext;
use futures::StreamExt;
use idem_io::commit::CommitBackend;
use idem_io::failpoint;
use idem_io::hive::PartitionPath;
use idem_io::manifest::{ColumnEntry, RunInfo};
use idem_io::writer::{KeptFile, PartitionWriter, WriterOptions, WrittenPartition};

use super::plan::TimeColumn;
use super::publish::owned_partitions;
use super::report::Observer;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::route::Router;
use crate::window::{Window, interval_of};

/// Memory the buffered row groups of all partitions of a run may hold before the
/// largest is flushed early.
pub(crate) const WRITE_BUFFER_BUDGET: usize = 512 << 20;

pub(crate) type Writers = BTreeMap<PartitionPath, PartitionWriter>;

/// Streams the plan's output into per-partition writers in the staging area.
#[allow(clippy::too_many_arguments)]
pub(super) async fn stage(
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
        use idem_io::profile::{Counter, timed};
        let mut writers: Writers = BTreeMap::new();
        let mut budget = Budget::default();
        while let Some(parts) = timed(Counter::Waiting, || rx.blocking_recv()) {
            let handed = std::time::Instant::now();
            for (p, batch) in parts {
                let w = match writers.get_mut(&p) {
                    Some(w) => w,
                    None => {
                        check_partition_name(&job_path, &p)?;
                        let w =
                            new_writer(table2.as_ref(), &run_id2, &p, &data_schema, &opts, &kept)?;
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
                let rows = batch.num_rows();
                budget
                    .written(&mut writers, rows)
                    .map_err(|(partition, source)| Error::Write {
                        target: table2.location().into(),
                        partition,
                        source,
                    })?;
            }
            if idem_io::profile::enabled() {
                idem_io::profile::add_since(Counter::Writing, handed);
            }
        }
        Ok(writers)
    })
    .await
}

/// The parts of one query batch, each a batch of one partition's data columns, from
/// the plan to the consuming thread. One message a query batch, not a part: routed
/// into thousands of partitions, a batch is thousands of parts, and a message each
/// woke the consumer (or a producer) for every part.
pub(super) type Routed = tokio::sync::mpsc::Receiver<Vec<(PartitionPath, RecordBatch)>>;

/// Executes `plan`, routes its batches to their partitions and hands them to `consume`
/// on a thread of its own (it encodes or digests on rayon), which counts the rows it
/// has taken in the counter it is given. Returns what `consume` returns, or the first
/// execution error.
pub(super) async fn drive<T: Send + 'static>(
    job: &Job,
    ctx: &SessionContext,
    plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    router: Arc<Router>,
    observer: &dyn Observer,
    consume: impl FnOnce(&mut Routed, &AtomicU64) -> Result<T> + Send + 'static,
) -> Result<T> {
    let task_ctx = ctx.task_ctx();
    let partitions = plan.properties().output_partitioning().partition_count();
    // One batch waiting per producer (at most 8): the consumer takes one at a time, so
    // a longer queue only holds more memory.
    let (tx, mut rx) = tokio::sync::mpsc::channel(partitions.clamp(2, 8));
    let rows_done = Arc::new(AtomicU64::new(0));
    let rows_seen = Arc::clone(&rows_done);
    // Open every output stream before the consumer starts, so a failure here leaves
    // nothing running that could still stage files.
    let streams = (0..partitions)
        .map(|i| plan.execute(i, Arc::clone(&task_ctx)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::execution(&job.path, "", e))?;
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
                let parts = router.split(&batch?)?;
                if !parts.is_empty() && tx.send(parts).await.is_err() {
                    // The consumer stopped; its own error is reported below.
                    return Ok(());
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
        return Err(Error::execution(&job.path, "", e));
    }
    consumed
}

/// What a merge carries into the partitions it rewrites.
#[derive(Default)]
pub(super) struct Kept {
    /// Per partition, the live files carried over and the new manifest's generation.
    pub(super) files: BTreeMap<PartitionPath, (Vec<KeptFile>, u64)>,
    /// Per partition, the digest of the rows written, derived by the merge from what
    /// it took out of and put into files whose sums are known.
    pub(super) derived: BTreeMap<PartitionPath, Arc<idem_io::digest::Difference>>,
}

/// The longest directory name (and object key segment) file systems allow, in bytes.
pub(crate) const MAX_NAME: usize = 255;

/// A partition whose directory name no file system can hold is bad input, refused by
/// name before anything is staged for it.
pub(crate) fn check_partition_name(job: &std::path::Path, p: &PartitionPath) -> Result<()> {
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

pub(super) fn new_writer(
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

/// When the budget is checked. Summing the buffered memory takes a lock per column of
/// every open partition, and over thousands of partitions every batch is routed as
/// thousands of parts of a few rows: checked after every part, a 1 M-row day into
/// 5,000 partitions spent 137 s there. With many partitions it is checked once per
/// [`Self::ROWS`] rows routed (a quarter of a query batch, already in memory);
/// with few, after every part.
#[derive(Default)]
pub(crate) struct Budget {
    rows: usize,
}

impl Budget {
    const ROWS: usize = 8192;
    const FEW_PARTITIONS: usize = 64;

    /// After `rows` more rows were written to `writers`: enforces the budget when due.
    pub(crate) fn written(
        &mut self,
        writers: &mut Writers,
        rows: usize,
    ) -> std::result::Result<(), (String, idem_io::Error)> {
        self.rows += rows;
        if writers.len() > Self::FEW_PARTITIONS && self.rows < Self::ROWS {
            return Ok(());
        }
        self.rows = 0;
        enforce_budget(writers)
    }
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
pub(super) fn finalize(
    job: &Job,
    table: &dyn CommitBackend,
    window: &Window,
    time: Option<&TimeColumn>,
    merge_affected: Option<&[PartitionPath]>,
    kept: &Kept,
    data_schema: &SchemaRef,
    mut writers: Writers,
    elsewhere: Vec<WrittenPartition>,
    staging_id: &str,
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
        for p in writers
            .keys()
            .chain(elsewhere.iter().map(|w| w.partition()))
        {
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
        if writers
            .keys()
            .chain(elsewhere.iter().map(|w| w.partition()))
            .any(|p| p.is_null_anywhere())
        {
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
        if writers.contains_key(&p) || elsewhere.iter().any(|w| *w.partition() == p) {
            continue;
        }
        let w = new_writer(table, staging_id, &p, data_schema, &job.target.writer, kept)?;
        writers.insert(p, w);
    }

    observer.phase("finishing");
    let mut staged: Vec<WrittenPartition> = elsewhere;
    staged.extend(
        finish_all(writers, run, &schema).map_err(|(partition, source)| Error::Write {
            target: job.target.path.clone(),
            partition,
            source,
        })?,
    );
    failpoint::hit("after_stage").map_err(storage)?;
    Ok((staged, warnings))
}

/// Finishes every writer, a few at a time, in partition order. With thousands of
/// small partitions the time goes to creating, writing and closing thousands of
/// files, each a few system calls that wait on the file system: several threads keep
/// it busy. After an error no more are started; the error names its partition.
fn finish_all(
    writers: Writers,
    run: &RunInfo,
    schema: &[ColumnEntry],
) -> std::result::Result<Vec<WrittenPartition>, (String, idem_io::Error)> {
    const THREADS: usize = 4;
    let total = writers.len();
    let queue = std::sync::Mutex::new(writers.into_iter().enumerate());
    let failed = std::sync::atomic::AtomicBool::new(false);
    let finished = std::thread::scope(|s| {
        let finisher = || {
            let mut out = Vec::new();
            while !failed.load(Ordering::Relaxed) {
                let next = queue.lock().expect("finish queue").next();
                let Some((i, (p, w))) = next else { break };
                match w.finish(run, schema.to_vec()) {
                    Ok(written) => out.push((i, written)),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err((i, p.to_string(), e));
                    }
                }
            }
            Ok(out)
        };
        let threads: Vec<_> = (0..THREADS.min(total))
            .map(|_| {
                std::thread::Builder::new()
                    .name("idem-finish".into())
                    .spawn_scoped(s, finisher)
                    .expect("spawn a finishing thread")
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Vec<_>>()
    });
    let mut done = Vec::with_capacity(total);
    let mut errors = Vec::new();
    for f in finished {
        match f {
            Ok(out) => done.extend(out),
            Err(e) => errors.push(e),
        }
    }
    if let Some((_, partition, e)) = errors.into_iter().min_by_key(|(i, ..)| *i) {
        return Err((partition, e));
    }
    done.sort_unstable_by_key(|(i, _)| *i);
    Ok(done.into_iter().map(|(_, w)| w).collect())
}
