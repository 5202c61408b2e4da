//! A run's life on its table: opened and prepared, marked live (so no other run
//! cleans up after it) and cleared of what dead runs left; at its end, its staging
//! removed and its mark dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_io::commit::{CommitBackend, RunGuard, WritesGuard};

use crate::error::{Error, Result};
use crate::job::Job;

/// The run's UTC start (so ids sort by time), its pid, and 48 random bits: unique even
/// across machines writing one object-store table (where pids repeat, e.g. pid 1 in
/// every container).
pub(super) fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = chrono::Utc::now();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(now.timestamp_subsec_nanos());
    format!(
        "{}-{}-{:012x}",
        now.format("%Y%m%dT%H%M%S%.3fZ"),
        std::process::id(),
        h.finish() & 0xffff_ffff_ffff
    )
}

/// What keeps a run live and, for a merge, the table's writers serialized.
pub(super) struct Held {
    pub(super) _run: RunGuard,
    pub(super) writes: Option<WritesGuard>,
}

/// Opens the target table for a run: checks it can be written, marks the run live
/// (the guard) and removes what dead runs left. Returns the table and the run's id.
pub(super) async fn begin_run(job: &Job) -> Result<(Arc<dyn CommitBackend>, String, RunGuard)> {
    let job = job.clone();
    crate::blocking(move || {
        let storage = |source| Error::Storage {
            target: job.target.path.clone(),
            source,
        };
        let table = crate::table::open(&job)?;
        table.prepare().map_err(storage)?;
        let run_id = new_run_id();
        let lock = table.lock_run(&run_id).map_err(storage)?;
        let cleaned = table.clean_dead_runs().map_err(storage)?;
        if !cleaned.is_empty() {
            tracing::info!(runs = ?cleaned, "removed what dead runs left in staging");
        }
        Ok((table, run_id, lock))
    })
    .await
}

/// Removes what the run staged (whether it succeeded or not; a failure to remove it
/// does not undo a publish: the dead-run cleaner removes it later), then lets the run
/// be taken for dead.
pub(super) async fn end_run(
    table: &Arc<dyn CommitBackend>,
    run_id: &str,
    guard: impl Send + 'static,
) {
    let (table, run_id) = (Arc::clone(table), run_id.to_string());
    crate::blocking(move || {
        if let Err(e) = table.cleanup_run(&run_id) {
            tracing::warn!(error = %e, "could not remove this run's staging directory");
        }
        drop(guard);
    })
    .await
}
