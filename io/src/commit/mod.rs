//! Publishing staged partitions. A partition moves through the types
//! `WrittenPartition` (staged, invisible to readers) → [`Checked`] (every check passed,
//! made only by [`Checked::all`]) → [`Published`], each consumed by value, and
//! [`CommitBackend::publish`] requires the table's [`PublishGuard`], so nothing can
//! publish a partition that was not checked, or outside the publish fence. Backends
//! implement [`CommitBackend`]; `local` swaps directories with `renameat2`, `object`
//! commits a per-partition marker with a conditional put. A table is opened by
//! `table::open`, the one place that chooses its backend.
//!
//! The trait is synchronous: a local table's calls are system calls and `flock` waits,
//! an object-store table drives its requests on one runtime of its own from the
//! calling thread. Callers in async code make them from the blocking pool, never on a
//! runtime's worker (see [`crate::blocking`], which debug builds enforce).

pub mod delta;
pub mod local;
pub mod object;

/// This process's host as leases and lock files name it: `$IDEM_HOST`, else the
/// kernel's hostname.
pub fn hostname() -> String {
    if let Some(host) = std::env::var("IDEM_HOST")
        .ok()
        .filter(|h| !h.trim().is_empty())
    {
        return host.trim().to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// This boot of this machine's kernel.
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

use std::path::PathBuf;

use crate::error::Result;
use crate::hive::PartitionPath;
use crate::manifest::LiveState;
use crate::staged::WrittenPartition;

/// A staged partition whose checks have passed. The only way to make one is
/// [`Checked::all`], which runs the checks first.
#[derive(Debug)]
pub struct Checked(WrittenPartition);

impl Checked {
    /// Runs `checks` on the staged partitions of a run; when they pass, every one is
    /// checked, and when they fail, none is (the staged partitions are dropped, and
    /// the run's cleanup removes their files).
    pub async fn all<E>(
        staged: Vec<WrittenPartition>,
        checks: impl AsyncFnOnce(&[WrittenPartition]) -> std::result::Result<(), E>,
    ) -> std::result::Result<Vec<Checked>, E> {
        checks(&staged).await?;
        Ok(staged.into_iter().map(Checked).collect())
    }

    pub fn partition(&self) -> &WrittenPartition {
        &self.0
    }

    /// The partition, to be published even over a live partition of the same rows
    /// (`--rewrite`: new files for the same rows, after a change of writer settings).
    pub fn rewritten(mut self) -> Checked {
        self.0.rewrite = true;
        self
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
    /// Delta, `backfill --atomic`: the partition joins the range's one commit, made
    /// after the last date (or, when a date fails, never).
    Pending,
}

#[derive(Debug)]
pub struct Published {
    pub partition: PartitionPath,
    pub path: PathBuf,
    pub mode: PublishMode,
}

pub use crate::staged::Version;

/// Holds something of the table (a lock file, a lease an object store renews) until
/// dropped. Only a backend makes one.
macro_rules! guard {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[must_use = "the lock is released when this is dropped"]
        pub struct $name(#[allow(dead_code)] Box<dyn Send>);

        impl $name {
            pub(crate) fn new(held: impl Send + 'static) -> Self {
                Self(Box::new(held))
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($name))
            }
        }
    };
}

guard!(
    /// Run `run_id` is alive while this is held: no other run cleans up after it.
    RunGuard
);
guard!(
    /// Read-modify-write writers (merges) of the table wait for each other while this
    /// is held.
    WritesGuard
);
guard!(
    /// The fence of the publish step: every writer's publish waits for it, so the
    /// versions a run checks stay the live ones until its partitions are published.
    PublishGuard
);

/// A live partition's manifest and where each of its files is read right now.
pub type CommittedPartition = (PartitionPath, crate::manifest::Manifest, Vec<String>);

/// A table's storage and its commit protocol.
pub trait CommitBackend: Send + Sync {
    /// The table's path or URL, for messages.
    fn location(&self) -> String;
    /// Creates what the backend needs before a run stages anything.
    fn prepare(&self) -> Result<()>;
    /// Marks run `run_id` live until the returned guard is dropped, so no other run
    /// cleans up after it.
    fn lock_run(&self, run_id: &str) -> Result<RunGuard>;
    /// Removes (or rolls forward) what dead runs left; returns their run ids.
    fn clean_dead_runs(&self) -> Result<Vec<String>>;
    /// Runs whose staged work is still present (in progress, dead, or, on an object
    /// store, committed and not yet applied).
    fn staged_runs(&self) -> Result<Vec<String>>;
    /// Appends a restatement event to the table's log, never overwriting one.
    fn append_log(&self, event: &crate::log::Restatement) -> Result<()>;
    /// The table's restatement events, oldest first.
    fn log(&self) -> Result<Vec<crate::log::Restatement>>;
    /// Whether a new version of a partition can keep live files as they are (hard
    /// links) and read their footers in place, without a request per file: local disk.
    fn keeps_files(&self) -> bool {
        false
    }
    /// Serializes read-modify-write writers (merges) of the table while held.
    fn lock_writes(&self) -> Result<WritesGuard>;
    /// Serializes the publish step of every writer of the table while held: a run
    /// checks the versions its read-modify-write depends on and publishes all of its
    /// partitions under it, so no other publish falls in between.
    fn lock_publish(&self) -> Result<PublishGuard>;
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
    /// Every partition of the table at any depth, in order: idem's, and directories of
    /// Parquet files another tool wrote. An error names a table that does not exist.
    fn partitions(&self) -> Result<Vec<PartitionPath>>;
    /// The bytes the live files `names` of partition `p` take, footers included, where
    /// that needs no request per file; `None` elsewhere (the manifest's data bytes
    /// stand in).
    fn live_bytes(&self, p: &PartitionPath, names: &[String]) -> Option<u64> {
        let _ = (p, names);
        None
    }
    /// Every committed partition with the locations its files are read from right now,
    /// where a listing of the table may not show them exactly (an object store's
    /// commit not yet applied); `None` where a listing is exact, or the location holds
    /// no idem table.
    fn committed(&self) -> Result<Option<Vec<CommittedPartition>>> {
        Ok(None)
    }
    /// What the live partition holds; `None` when it does not exist.
    fn live_state(&self, p: &PartitionPath) -> Result<Option<LiveState>>;
    /// Makes a checked partition live atomically, replacing what was there; only
    /// under the table's publish fence.
    fn publish(&self, part: Checked, fence: &PublishGuard) -> Result<Published>;
    /// Moves a partition staged in this process's `staging_dir` to where the process
    /// that publishes it finds it: on an object store, its files are uploaded to the
    /// run's staging prefix and the local copies removed; on disk they stay where
    /// they are (the publishing process must see the same filesystem).
    fn stage_for_publisher(&self, part: WrittenPartition) -> Result<WrittenPartition> {
        Ok(part)
    }
    /// Makes what [`CommitBackend::publish`] published for run `run_id` visible, where
    /// a format commits a run's partitions together (Delta: one commit); returns the
    /// table's version after it, where the table has versions. Elsewhere each publish
    /// is already its own atomic step and this does nothing.
    fn finish_publish(&self, run_id: &str, fence: &PublishGuard) -> Result<Option<i64>> {
        let _ = (run_id, fence);
        Ok(None)
    }
    /// Moves what `publish` published for run `run_id` into the pending commit
    /// `batch`, which [`CommitBackend::finish_publish`] of `batch` commits with the
    /// other runs' partitions (Delta: a backfill as one snapshot). Only a table that
    /// commits runs together can.
    fn defer_publish(&self, run_id: &str, batch: &str) -> Result<()> {
        let _ = (run_id, batch);
        Err(crate::error::Error::Delta {
            table: self.location(),
            message: "only a Delta table commits several runs together".into(),
        })
    }
    /// Forgets the pending commit `id` (its runs failed): nothing of it becomes
    /// visible; files it moved into the table are orphans for vacuum.
    fn drop_pending(&self, id: &str) {
        let _ = id;
    }
    /// Removes a staged partition that will not be published.
    fn discard(&self, part: WrittenPartition) -> Result<()>;
    /// Removes what a run staged (after publishing, or after it failed).
    fn cleanup_run(&self, run_id: &str) -> Result<()>;
}
