//! The column writers of one row group, encoding on rayon with no barrier per batch.
//!
//! Encoding a batch column by column in parallel and waiting for every column before
//! taking the next batch leaves a core idle while the slowest column finishes (one
//! string column can take a third of a batch's work), and the query threads that
//! could use it wait for the writer's queue to drain: on two cores, a write ran at
//! about 80% of both. Here each field is a queue of arrays drained in order by at
//! most one rayon task at a time, so the fields of the next batches are encoded while
//! the slowest field of this one is; a writer waits only when a few batches are
//! queued, across all the partitions being written (memory stays bounded however many
//! there are), and when its row group closes.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_writer::{ArrowColumnWriter, compute_leaves};
use parquet::errors::ParquetError;

use crate::digest::{DigestState, digest_batch};

/// Batches queued at most, across every row group being encoded in the process,
/// before [`RowGroupEncoder::push`] waits.
const QUEUED_BATCHES: usize = 4;

/// Batches pushed and not yet wholly encoded, in the whole process.
static QUEUED: Pending = Pending {
    count: Mutex::new(0),
    changed: Condvar::new(),
};

/// A batch's hold on [`QUEUED`], shared by its arrays and its digest: released when
/// the last of them is done.
struct Queued;

impl Queued {
    fn new() -> Arc<Self> {
        QUEUED.wait_until_at_most(QUEUED_BATCHES - 1);
        QUEUED.add(1);
        Arc::new(Queued)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        QUEUED.done(1);
    }
}

pub(crate) struct RowGroupEncoder {
    fields: Vec<Arc<FieldEncoder>>,
    /// Arrays (and digests) queued or being encoded.
    pending: Arc<Pending>,
    /// The digest task's error.
    digest_error: Arc<Mutex<Option<ParquetError>>>,
    /// Whether an error was returned: the row group is unusable after it.
    failed: bool,
    /// The digest of the rows pushed so far (those counted only, and those hashed).
    digest: Arc<Mutex<DigestState>>,
    /// Rows pushed.
    pub rows: usize,
}

/// One field's writers (one per Parquet leaf) and the arrays waiting for them.
struct FieldEncoder {
    field: FieldRef,
    state: Mutex<FieldState>,
}

struct FieldState {
    /// `None` while a task encodes.
    writers: Option<Vec<ArrowColumnWriter>>,
    queue: VecDeque<(ArrayRef, Arc<Queued>)>,
    /// Whether a task drains the queue.
    running: bool,
    /// The first error, until reported; the field encodes nothing after it.
    error: Option<ParquetError>,
    failed: bool,
    /// The writers' memory and estimated encoded size after the last array.
    memory: usize,
    bytes: usize,
}

/// A count of work not yet done, and a wait for it to go down.
#[derive(Default)]
struct Pending {
    count: Mutex<usize>,
    changed: Condvar,
}

impl Pending {
    fn add(&self, n: usize) {
        *self.count.lock().expect("pending lock") += n;
    }

    fn done(&self, n: usize) {
        *self.count.lock().expect("pending lock") -= n;
        self.changed.notify_all();
    }

    /// Waits until at most `n` are pending.
    fn wait_until_at_most(&self, n: usize) {
        let count = self.count.lock().expect("pending lock");
        drop(
            self.changed
                .wait_while(count, |c| *c > n)
                .expect("pending lock"),
        );
    }
}

impl FieldEncoder {
    fn state(&self) -> MutexGuard<'_, FieldState> {
        self.state.lock().expect("field encoder lock")
    }

    /// Encodes the queued arrays in order, until the queue is empty. After an error,
    /// the arrays left are dropped unencoded.
    fn drain(self: Arc<Self>, pending: Arc<Pending>) {
        loop {
            let (array, queued, mut writers) = {
                let mut state = self.state();
                let Some((array, queued)) = state.queue.pop_front() else {
                    state.running = false;
                    return;
                };
                if state.failed {
                    drop(state);
                    pending.done(1);
                    continue;
                }
                let writers = state.writers.take().expect("one task per field");
                (array, queued, writers)
            };
            let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::profile::timed(crate::profile::Counter::Encoding, || {
                    let leaves = compute_leaves(&self.field, &array)?;
                    writers
                        .iter_mut()
                        .zip(&leaves)
                        .try_for_each(|(w, leaf)| w.write(leaf))
                })
            }))
            .unwrap_or_else(|_| {
                Err(ParquetError::General(format!(
                    "encoding column `{}` panicked",
                    self.field.name()
                )))
            });
            let mut state = self.state();
            state.memory = writers.iter().map(|w| w.memory_size()).sum();
            state.bytes = writers.iter().map(|w| w.get_estimated_total_bytes()).sum();
            state.writers = Some(writers);
            if let Err(e) = encoded {
                state.error.get_or_insert(e);
                state.failed = true;
            }
            drop(state);
            drop(queued);
            pending.done(1);
        }
    }
}

impl RowGroupEncoder {
    /// `writers` are the row group's leaf writers in schema order; `leaves` the number
    /// of leaves of each field of `fields`.
    pub(crate) fn new(
        fields: &[FieldRef],
        writers: Vec<ArrowColumnWriter>,
        leaves: &[usize],
    ) -> Self {
        let mut writers = writers.into_iter();
        let fields = fields
            .iter()
            .zip(leaves)
            .map(|(field, &n)| {
                Arc::new(FieldEncoder {
                    field: Arc::clone(field),
                    state: Mutex::new(FieldState {
                        writers: Some(writers.by_ref().take(n).collect()),
                        queue: VecDeque::new(),
                        running: false,
                        error: None,
                        failed: false,
                        memory: 0,
                        bytes: 0,
                    }),
                })
            })
            .collect();
        Self {
            fields,
            pending: Arc::default(),
            digest_error: Arc::default(),
            failed: false,
            digest: Arc::default(),
            rows: 0,
        }
    }

    /// Queues `batch` for encoding (and, when `hash`, for the digest; otherwise its
    /// rows are only counted). Waits while several batches are queued in the process.
    /// Returns the first encoding error met so far.
    pub(crate) fn push(&mut self, batch: &RecordBatch, hash: bool) -> Result<(), ParquetError> {
        self.first_error()?;
        let queued = Queued::new();
        self.rows += batch.num_rows();
        if hash {
            self.pending.add(1);
            let (digest, error, pending, batch, queued) = (
                Arc::clone(&self.digest),
                Arc::clone(&self.digest_error),
                Arc::clone(&self.pending),
                batch.clone(),
                Arc::clone(&queued),
            );
            rayon::spawn(move || {
                let hashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    crate::profile::timed(crate::profile::Counter::Digest, || digest_batch(&batch))
                }));
                match hashed {
                    Ok(d) => digest.lock().expect("digest lock").merge(d),
                    Err(_) => {
                        let e = ParquetError::General("computing the digest panicked".into());
                        error.lock().expect("digest lock").get_or_insert(e);
                    }
                }
                drop(queued);
                pending.done(1);
            });
        } else {
            self.digest
                .lock()
                .expect("digest lock")
                .merge(DigestState::unhashed(batch.num_rows()));
        }
        for (field, array) in self.fields.iter().zip(batch.columns()) {
            self.pending.add(1);
            let mut state = field.state();
            state
                .queue
                .push_back((Arc::clone(array), Arc::clone(&queued)));
            if !state.running {
                state.running = true;
                let (field, pending) = (Arc::clone(field), Arc::clone(&self.pending));
                rayon::spawn(move || field.drain(pending));
            }
        }
        Ok(())
    }

    /// The first error of a field or of the digest, once; after it, an error that
    /// says the row group failed.
    fn first_error(&mut self) -> Result<(), ParquetError> {
        if self.failed {
            return Err(ParquetError::General(
                "the row group failed to encode earlier".into(),
            ));
        }
        let digest = self.digest_error.lock().expect("digest lock").take();
        let first = digest.or_else(|| self.fields.iter().find_map(|f| f.state().error.take()));
        match first {
            Some(e) => {
                self.failed = true;
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Memory held by the writers, as of the arrays encoded so far.
    pub(crate) fn memory(&self) -> usize {
        self.fields.iter().map(|f| f.state().memory).sum()
    }

    /// The writers' estimated encoded size, as of the arrays encoded so far.
    pub(crate) fn estimated_bytes(&self) -> usize {
        self.fields.iter().map(|f| f.state().bytes).sum()
    }

    /// Waits for every queued array, and gives back the writers, in schema order, and
    /// the digest of the rows pushed.
    pub(crate) fn finish(mut self) -> Result<(Vec<ArrowColumnWriter>, DigestState), ParquetError> {
        self.pending.wait_until_at_most(0);
        self.first_error()?;
        let mut writers = Vec::new();
        for field in &self.fields {
            writers.extend(field.state().writers.take().expect("no task left"));
        }
        let digest = *self.digest.lock().expect("digest lock");
        Ok((writers, digest))
    }
}

impl Drop for RowGroupEncoder {
    /// An abandoned row group's tasks finish before its writer goes.
    fn drop(&mut self) {
        self.pending.wait_until_at_most(0);
    }
}
