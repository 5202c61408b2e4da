//! idem-engine: jobs, parameters, the determinism guard, routing, and runs.
//!
//! A job is a SQL transform of one logical date. The engine plans it with DataFusion,
//! refuses what would make two runs differ, streams the output into staged partitions
//! through `idem-io`, and publishes each atomically.

pub mod backfill;
pub mod checks;
pub mod cluster;
mod error;
mod exact_timestamps;
mod group_keys;
pub mod guard;
pub mod job;
pub mod key;
pub mod known_wrong;
pub mod merge;
pub mod params;
pub mod project;
pub mod route;
pub mod run;
pub mod session;
mod sql;
pub mod status;
pub mod table;
pub mod target;
pub mod units;
mod utc_date;
pub mod verify;
pub mod window;

pub use error::{Error, Result, exit};

/// Runs `f`, which makes synchronous storage calls (waits for locks, drives
/// object-store requests), on the runtime's blocking pool: a worker thread of the
/// runtime never waits for anything but a future (see `idem_io::blocking`).
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(move || idem_io::blocking::allowed(f)).await {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("a blocking storage task was cancelled: {e}"),
    }
}
