//! Publishing on a local filesystem by directory swap.
//!
//! A partition is visible iff its directory under the table root is live; staged files
//! live under `<parent>/_idem/<table>/staging/<run>/`, outside the table root, so no
//! reader that lists or globs the table ever sees them. A partition is written complete
//! into staging, fsynced when it is published (one found unchanged is discarded
//! unsynced), then swapped with the live directory in one
//! `renameat2(RENAME_EXCHANGE)` (or moved in with `RENAME_NOREPLACE` when new), and the
//! parent is fsynced. A crash between any two steps leaves the old partition or the
//! new one live, never a mix; what a dead run staged is left in its staging directory.

mod listing;
mod locks;
mod recover;
mod swap;
#[cfg(test)]
mod tests;

pub use locks::RunLock;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Checked, CommitBackend, PublishGuard, Published, RunGuard, Version, WritesGuard};
use crate::durable;
use crate::error::{Error, Result};
use crate::fs;
use crate::hive::PartitionPath;
use crate::manifest::{LiveState, read_partition};
use crate::staged::WrittenPartition;
use listing::{find_partitions, walk_local};

/// Name of idem's metadata directory, created beside the table (in its parent).
pub const META_DIR: &str = "_idem";

/// A table on the local filesystem.
#[derive(Clone, Debug)]
pub struct LocalTable {
    root: PathBuf,
    meta: PathBuf,
}

impl LocalTable {
    /// Describes the table at `root` (which need not exist yet); its metadata lives in
    /// `<parent>/_idem/<table name>/`.
    pub fn new(root: &Path) -> Self {
        let root = absolute(root);
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "table".into());
        let parent = root
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| "/".into());
        let meta = parent.join(META_DIR).join(name);
        Self { root, meta }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn meta_dir(&self) -> &Path {
        &self.meta
    }

    /// Where the table's restatement log lives.
    pub fn log_dir(&self) -> PathBuf {
        self.meta.join("log")
    }

    /// Creates the metadata directory and checks that staging and table share a
    /// filesystem, so the swap can be a rename. The table root itself is created only
    /// when the first partition is published: a run that fails earlier leaves no trace
    /// under the table's path.
    pub fn prepare(&self) -> Result<()> {
        if durable::exists(&self.root)? && !durable::is_dir(&self.root)? {
            return Err(Error::NotADirectory {
                path: self.root.clone(),
            });
        }
        let staging = self.meta.join("staging");
        durable::create_dir_all(&staging)?;
        let dev = |p: &Path| {
            fs::metadata(p)
                .map(|m| m.dev())
                .map_err(Error::io("stat", p))
        };
        // The root, or the nearest ancestor that exists (where it will be created).
        let mut anchor = self.root.as_path();
        while !durable::exists(anchor)? {
            anchor = anchor.parent().unwrap_or(Path::new("/"));
        }
        if dev(anchor)? != dev(&staging)? {
            return Err(Error::CrossDevice {
                staging,
                table: self.root.clone(),
            });
        }
        Ok(())
    }

    pub fn partition_dir(&self, p: &PartitionPath) -> PathBuf {
        self.root.join(p.rel_path())
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

impl CommitBackend for LocalTable {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn prepare(&self) -> Result<()> {
        LocalTable::prepare(self)
    }

    fn lock_run(&self, run_id: &str) -> Result<RunGuard> {
        Ok(RunGuard::new(LocalTable::lock_run(self, run_id)?))
    }

    fn clean_dead_runs(&self) -> Result<Vec<String>> {
        LocalTable::clean_dead_runs(self)
    }

    fn staged_runs(&self) -> Result<Vec<String>> {
        let mut runs: Vec<String> = match fs::read_dir(&self.meta.join("staging")) {
            Ok(entries) => entries.into_iter().map(|(name, _)| name).collect(),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        runs.sort();
        Ok(runs)
    }

    fn append_log(&self, event: &crate::log::Restatement) -> Result<()> {
        crate::log::append(&self.log_dir(), event)
    }

    fn log(&self) -> Result<Vec<crate::log::Restatement>> {
        crate::log::read(&self.log_dir())
    }

    fn keeps_files(&self) -> bool {
        true
    }

    fn lock_writes(&self) -> Result<WritesGuard> {
        Ok(WritesGuard::new(LocalTable::lock_writes(self)?))
    }

    fn lock_publish(&self) -> Result<PublishGuard> {
        Ok(PublishGuard::new(LocalTable::lock_publish(self)?))
    }

    fn live_version(&self, p: &PartitionPath) -> Result<Option<Version>> {
        Self::dir_version(&self.partition_dir(p))
    }

    fn check_layout(&self, partition_by: &[String]) -> Result<()> {
        let entries = walk_local(&self.root)?;
        crate::layout::check(&entries, partition_by).map_err(|problem| Error::Layout {
            table: self.root.display().to_string(),
            problem,
        })
    }

    fn file_location(&self, p: &PartitionPath, name: &str) -> String {
        self.partition_dir(p).join(name).display().to_string()
    }

    fn staging_dir(&self, run_id: &str, p: &PartitionPath) -> PathBuf {
        self.meta.join("staging").join(run_id).join(p.rel_path())
    }

    fn live_partitions(&self, depth: usize) -> Result<Vec<PartitionPath>> {
        let mut out = Vec::new();
        if depth == 0 {
            if durable::is_dir(&self.root)? {
                out.push(PartitionPath::root());
            }
            return Ok(out);
        }
        let mut frontier = vec![(self.root.clone(), String::new())];
        for level in 0..depth {
            let mut next = Vec::new();
            for (dir, rel) in frontier {
                let entries = match fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(Error::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                for (name, file_type) in entries {
                    if !file_type.is_dir()
                        || name.starts_with('.')
                        || name.starts_with('_')
                        || !name.contains('=')
                    {
                        continue;
                    }
                    let path = dir.join(&name);
                    let rel = if rel.is_empty() {
                        name
                    } else {
                        format!("{rel}/{name}")
                    };
                    next.push((path, rel));
                }
            }
            frontier = next;
            if level + 1 == depth {
                for (_, rel) in &frontier {
                    out.push(PartitionPath::parse(rel)?);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn partitions(&self) -> Result<Vec<PartitionPath>> {
        if !durable::is_dir(&self.root)? {
            return Err(if self.root.exists() {
                Error::NotADirectory {
                    path: self.root.clone(),
                }
            } else {
                Error::Missing {
                    path: self.root.clone(),
                }
            });
        }
        let mut out = Vec::new();
        find_partitions(&self.root, String::new(), &mut out)?;
        // In the order of their directories' names, as a listing shows them.
        out.sort_by_cached_key(|p| p.rel_path().to_string_lossy().into_owned());
        Ok(out)
    }

    fn live_bytes(&self, p: &PartitionPath, names: &[String]) -> Option<u64> {
        // A file gone since it was listed (a concurrent swap) counts nothing.
        let dir = self.partition_dir(p);
        Some(
            names
                .iter()
                .filter_map(|n| std::fs::metadata(dir.join(n)).ok())
                .map(|m| m.len())
                .sum(),
        )
    }

    fn live_state(&self, p: &PartitionPath) -> Result<Option<LiveState>> {
        let dir = self.partition_dir(p);
        if !durable::is_dir(&dir)? {
            return Ok(None);
        }
        read_partition(&dir).map(Some)
    }

    fn publish(&self, part: Checked, _fence: &PublishGuard) -> Result<Published> {
        let written = part.0;
        let live = self.partition_dir(&written.partition);
        // A read-modify-write publishes only over the version it read (the caller
        // holds the publish lock, so nothing can move in between).
        if let Some(expected) = &written.expected
            && Self::dir_version(&live)? != *expected
        {
            return Err(Error::Conflict {
                partition: written.partition.to_string(),
            });
        }
        // The live directory goes whole: anything in it but data files (a directory, a
        // file someone put there while the run computed) is refused, not destroyed.
        let entries: Vec<crate::layout::Entry> = match fs::read_dir(&live) {
            Ok(listed) => listed
                .into_iter()
                .map(|(name, t)| crate::layout::Entry {
                    rel: name,
                    kind: if t.is_dir() {
                        crate::layout::Kind::Dir
                    } else if t.is_file() {
                        crate::layout::Kind::File
                    } else {
                        crate::layout::Kind::Other
                    },
                })
                .collect(),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        crate::layout::check(&entries, &[]).map_err(|problem| Error::Layout {
            table: live.display().to_string(),
            problem,
        })?;
        // The staged files become durable only now that they are to be published.
        durable::sync_files_and_dir(&written.dir)?;
        let mode = self.swap(&written.dir, &live)?;
        Ok(Published {
            partition: written.partition,
            path: live,
            mode,
        })
    }

    fn discard(&self, part: WrittenPartition) -> Result<()> {
        durable::remove_dir_all(&part.dir)
    }

    fn cleanup_run(&self, run_id: &str) -> Result<()> {
        durable::remove_dir_all(&self.meta.join("staging").join(run_id))
    }
}
