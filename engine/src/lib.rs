//! idem-engine: jobs, parameters, the determinism guard, routing, and runs.
//!
//! A job is a SQL transform of one logical date. The engine plans it with DataFusion,
//! refuses what would make two runs differ, streams the output into staged partitions
//! through `idem-io`, and publishes each atomically.

pub mod backfill;
pub mod checks;
mod error;
pub mod freshness;
pub mod guard;
pub mod job;
pub mod key;
pub mod merge;
pub mod params;
pub mod project;
pub mod route;
pub mod run;
pub mod session;
mod sql;
pub mod status;
pub mod table;
mod utc_date;
pub mod verify;
pub mod window;

pub use error::{Error, Result};
