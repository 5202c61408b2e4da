//! idem-io: where idem's tables live and how partitions become visible.
//!
//! Knows nothing about jobs: it stages partitions, encodes them as Parquet with the
//! manifest in their footers, computes content digests, and publishes atomically.

pub mod blocking;
pub mod canonical;
pub mod commit;
pub mod digest;
pub mod durable;
pub mod empty_parquet;
mod encode;
mod error;
pub mod failpoint;
pub mod fault;
pub mod fs;
pub mod hive;
pub mod layout;
pub mod local_reads;
pub mod log;
pub mod manifest;
pub mod profile;
pub mod staged;
pub mod store;
pub mod table;
pub mod writer;
mod xxh3;

pub use error::{Error, Result, show_columns};
