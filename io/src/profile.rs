//! Time counters for `idem run --profile`: process-wide, off unless [`enable`]d, and
//! then one clock read on each side of every measured step. They add up the time of
//! every thread that did the step, so they may exceed the run's wall time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// What is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Listing and inferring the schema of the sources (wall time, while planning).
    Listing,
    /// The writer thread waiting for the query's next rows (wall time).
    Waiting,
    /// The writer thread handing rows to the partition writers (wall time).
    Writing,
    /// Encoding columns into Parquet pages (thread time, on rayon).
    Encoding,
    /// Hashing rows into the digest (thread time, on rayon).
    Digest,
    /// `fsync` of files and directories (thread time).
    Fsync,
    /// Bytes of the input files a run reads (a count, not a time).
    InputBytes,
    /// Rows the query's scans produced (a count): those of the files it read that
    /// statistics did not rule out.
    InputRows,
}

const COUNTERS: usize = 8;

static ENABLED: AtomicBool = AtomicBool::new(false);
static VALUES: [AtomicU64; COUNTERS] = [const { AtomicU64::new(0) }; COUNTERS];

/// Starts measuring, from zero.
pub fn enable() {
    for v in &VALUES {
        v.store(0, Relaxed);
    }
    ENABLED.store(true, Relaxed);
}

/// Whether measuring is on.
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// Adds the time since `since` to `counter`.
pub fn add_since(counter: Counter, since: Instant) {
    add(counter, since.elapsed().as_nanos() as u64);
}

/// Adds `n` to `counter` (nanoseconds, or a count).
pub fn add(counter: Counter, n: u64) {
    VALUES[counter as usize].fetch_add(n, Relaxed);
}

/// Sets `counter` to `n` (the input bytes of the run's last plan, say).
pub fn set(counter: Counter, n: u64) {
    VALUES[counter as usize].store(n, Relaxed);
}

/// What `counter` holds: nanoseconds, or the count of [`Counter::InputBytes`] and
/// [`Counter::InputRows`].
pub fn value(counter: Counter) -> u64 {
    VALUES[counter as usize].load(Relaxed)
}

/// Runs `f`, adding its time to `counter` when measuring is on.
pub fn timed<T>(counter: Counter, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let started = Instant::now();
    let out = f();
    add_since(counter, started);
    out
}
