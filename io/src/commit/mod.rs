//! Publishing staged partitions. A partition moves through the types
//! `WrittenPartition` (staged, invisible to readers) → [`Checked`] (every check passed)
//! → [`Published`], each consumed by value, so nothing can publish a partition that
//! was not checked. Backends implement [`CommitBackend`]; `local` swaps directories
//! with `renameat2`, `object` commits a per-partition marker with a conditional put.

pub mod local;
pub mod object;

use std::path::PathBuf;

use crate::error::Result;
use crate::hive::PartitionPath;
use crate::manifest::LiveState;
use crate::writer::WrittenPartition;

/// A staged partition whose checks have passed.
#[derive(Debug)]
pub struct Checked(WrittenPartition);

impl Checked {
    /// Marks a staged partition as checked. The engine calls this only after running
    /// the job's checks on it.
    pub fn new(partition: WrittenPartition) -> Self {
        Self(partition)
    }

    pub fn partition(&self) -> &WrittenPartition {
        &self.0
    }

    /// Gives the staged partition back (to discard it when it equals the live one).
    pub fn into_inner(self) -> WrittenPartition {
        self.0
    }
}

/// How a partition became live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PublishMode {
    /// `renameat2(RENAME_NOREPLACE)`: the partition did not exist.
    Created,
    /// `renameat2(RENAME_EXCHANGE)`: old and new contents swapped in one step.
    Exchanged,
    /// The filesystem has no `renameat2` flags: the old directory was renamed away and
    /// the new one renamed in; a reader listing between the two steps sees no partition.
    NonAtomicFallback,
    /// Object store: the partition's marker was replaced by a conditional put (the
    /// atomic point) and the files applied.
    Committed,
    /// Object store: another writer committed the same content first; nothing changed.
    AlreadyLive,
}

#[derive(Debug)]
pub struct Published {
    pub partition: PartitionPath,
    pub path: PathBuf,
    pub mode: PublishMode,
}

/// The version of a live partition, as a read-modify-write must find it again at
/// publish: every publish of the partition makes a new one (an object store's marker
/// sequence number; on disk, the identity of the partition's directory, which every
/// swap replaces).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub String);

/// A guard that holds something of the table (a lock, a lease) until dropped.
pub type Guard = Box<dyn std::any::Any + Send>;

/// A table's storage and its commit protocol.
pub trait CommitBackend: Send + Sync {
    /// The table's path or URL, for messages.
    fn location(&self) -> String;
    /// Creates what the backend needs before a run stages anything.
    fn prepare(&self) -> Result<()>;
    /// Marks run `run_id` live until the returned guard is dropped, so no other run
    /// cleans up after it.
    fn lock_run(&self, run_id: &str) -> Result<Box<dyn std::any::Any + Send>>;
    /// Removes (or rolls forward) what dead runs left; returns their run ids.
    fn clean_dead_runs(&self) -> Result<Vec<String>>;
    /// Appends a restatement event to the table's log, never overwriting one.
    fn append_log(&self, event: &crate::log::Restatement) -> Result<()>;
    /// The local implementation, for what only it supports (keeping files in a merge).
    fn as_local(&self) -> Option<&local::LocalTable> {
        None
    }
    /// Serializes read-modify-write writers (merges) of the table while held.
    fn lock_writes(&self) -> Result<Option<Guard>>;
    /// Serializes the publish step of every writer of the table while held (`None`
    /// where each partition's commit is its own fence, as on object stores): a run
    /// checks the versions its read-modify-write depends on and publishes all of its
    /// partitions under it, so no other publish falls in between.
    fn lock_publish(&self) -> Result<Option<Guard>> {
        Ok(None)
    }
    /// The version of the live partition, which a read-modify-write must still find
    /// at publish; `None` when the partition does not exist.
    fn live_version(&self, p: &PartitionPath) -> Result<Option<Version>>;
    /// Refuses a table root that holds anything but Parquet files and partition
    /// directories of the layout `partition_by` (and the `_SUCCESS` and `.crc` files
    /// Hadoop writers leave): a run replaces partitions whole, so anything else there
    /// would be destroyed. Foreign Parquet files inside a partition of that layout are
    /// fine: the run that owns the partition replaces them.
    fn check_layout(&self, partition_by: &[String]) -> Result<()>;
    /// Where data file `name` of partition `p` is read from: a path, or a URL.
    fn file_location(&self, p: &PartitionPath, name: &str) -> String;
    /// Where the live files `names` of partition `p` can be read right now (an object
    /// store's commit not yet applied still has them in staging).
    fn read_locations(&self, p: &PartitionPath, names: &[String]) -> Result<Vec<String>> {
        Ok(names.iter().map(|n| self.file_location(p, n)).collect())
    }
    /// Where a run stages partition `p` (outside the table root).
    fn staging_dir(&self, run_id: &str, p: &PartitionPath) -> PathBuf;
    /// Live partitions, found by listing `depth` levels of `col=value` directories.
    fn live_partitions(&self, depth: usize) -> Result<Vec<PartitionPath>>;
    /// What the live partition holds; `None` when it does not exist.
    fn live_state(&self, p: &PartitionPath) -> Result<Option<LiveState>>;
    /// Makes a checked partition live atomically, replacing what was there.
    fn publish(&self, part: Checked) -> Result<Published>;
    /// Removes a staged partition that will not be published.
    fn discard(&self, part: WrittenPartition) -> Result<()>;
    /// Removes what a run staged (after publishing, or after it failed).
    fn cleanup_run(&self, run_id: &str) -> Result<()>;
}
