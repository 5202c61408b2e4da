//! Publishing on a local filesystem by directory swap.
//!
//! A partition is visible iff its directory under the table root is live; staged files
//! live under `<parent>/_idem/<table>/staging/<run>/`, outside the table root, so no
//! reader that lists or globs the table ever sees them. A partition is written complete
//! into staging, fsynced, then swapped with the live directory in one
//! `renameat2(RENAME_EXCHANGE)` (or moved in with `RENAME_NOREPLACE` when new), and the
//! parent is fsynced. A crash between any two steps leaves the old partition or the
//! new one live, never a mix; what a dead run staged is left in its staging directory.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{CWD, RenameFlags, renameat_with};
use rustix::io::Errno;

use super::{Checked, CommitBackend, PublishMode, Published};
use crate::durable;
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::manifest::{LiveState, read_partition};
use crate::writer::WrittenPartition;

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

    /// Creates the metadata directory and checks that staging and table share a
    /// filesystem, so the swap can be a rename. The table root itself is created only
    /// when the first partition is published: a run that fails earlier leaves no trace
    /// under the table's path.
    pub fn prepare(&self) -> Result<()> {
        if self.root.exists() && !self.root.is_dir() {
            return Err(Error::NotADirectory {
                path: self.root.clone(),
            });
        }
        let staging = self.meta.join("staging");
        durable::create_dir_all(&staging)?;
        let dev = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.dev())
                .map_err(Error::io("stat", p))
        };
        // The root, or the nearest ancestor that exists (where it will be created).
        let mut anchor = self.root.as_path();
        while !anchor.exists() {
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

    fn swap(&self, staged: &Path, live: &Path) -> Result<PublishMode> {
        let parent = live.parent().expect("partition has a parent");
        durable::create_dir_all(parent)?;
        // Another writer may create or remove the live directory between our attempts;
        // each attempt is atomic on its own, so retrying is safe.
        for _ in 0..8 {
            match renameat_with(CWD, staged, CWD, live, RenameFlags::NOREPLACE) {
                Ok(()) => {
                    self.sync_both(staged, live)?;
                    return Ok(PublishMode::Created);
                }
                Err(Errno::EXIST) | Err(Errno::NOTEMPTY) => {}
                Err(Errno::INVAL) | Err(Errno::NOSYS) => return self.fallback_swap(staged, live),
                Err(e) => return Err(rename_error(staged, live, e)),
            }
            match renameat_with(CWD, staged, CWD, live, RenameFlags::EXCHANGE) {
                Ok(()) => {
                    self.sync_both(staged, live)?;
                    // `staged` now holds the old contents.
                    durable::remove_dir_all(staged)?;
                    return Ok(PublishMode::Exchanged);
                }
                Err(Errno::NOENT) => continue,
                Err(Errno::INVAL) | Err(Errno::NOSYS) => return self.fallback_swap(staged, live),
                Err(e) => return Err(rename_error(staged, live, e)),
            }
        }
        Err(Error::Io {
            op: "publish (the live partition kept changing under this run)",
            path: live.to_path_buf(),
            source: std::io::Error::other("too many concurrent publishes"),
        })
    }

    /// Two plain renames, for filesystems without `renameat2` flags. Not atomic for a
    /// reader that lists between them; the run reports it.
    fn fallback_swap(&self, staged: &Path, live: &Path) -> Result<PublishMode> {
        tracing::warn!(
            partition = %live.display(),
            "filesystem does not support renameat2 flags; publishing with two renames (not atomic for readers)"
        );
        let old = staged.with_extension("old");
        if live.exists() {
            std::fs::rename(live, &old).map_err(Error::io("rename", live))?;
        }
        std::fs::rename(staged, live).map_err(Error::io("rename", staged))?;
        self.sync_both(staged, live)?;
        durable::remove_dir_all(&old)?;
        Ok(PublishMode::NonAtomicFallback)
    }

    fn sync_both(&self, staged: &Path, live: &Path) -> Result<()> {
        durable::sync_dir(live.parent().expect("live has a parent"))?;
        if let Some(p) = staged.parent() {
            durable::sync_dir(p)?;
        }
        Ok(())
    }
}

fn rename_error(staged: &Path, live: &Path, e: Errno) -> Error {
    if e == Errno::XDEV {
        return Error::CrossDevice {
            staging: staged.to_path_buf(),
            table: live.to_path_buf(),
        };
    }
    Error::Io {
        op: "swap partition into",
        path: live.to_path_buf(),
        source: e.into(),
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

impl CommitBackend for LocalTable {
    fn staging_dir(&self, run_id: &str, p: &PartitionPath) -> PathBuf {
        self.meta.join("staging").join(run_id).join(p.rel_path())
    }

    fn live_partitions(&self, depth: usize) -> Result<Vec<PartitionPath>> {
        let mut out = Vec::new();
        if depth == 0 {
            if self.root.is_dir() {
                out.push(PartitionPath::root());
            }
            return Ok(out);
        }
        let mut frontier = vec![(self.root.clone(), String::new())];
        for level in 0..depth {
            let mut next = Vec::new();
            for (dir, rel) in frontier {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(Error::io("list", &dir)(e)),
                };
                for entry in entries {
                    let entry = entry.map_err(Error::io("list", &dir))?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                    if !is_dir
                        || name.starts_with('.')
                        || name.starts_with('_')
                        || !name.contains('=')
                    {
                        continue;
                    }
                    let rel = if rel.is_empty() {
                        name
                    } else {
                        format!("{rel}/{name}")
                    };
                    next.push((entry.path(), rel));
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

    fn live_state(&self, p: &PartitionPath) -> Result<Option<LiveState>> {
        let dir = self.partition_dir(p);
        if !dir.is_dir() {
            return Ok(None);
        }
        read_partition(&dir).map(Some)
    }

    fn publish(&self, part: Checked) -> Result<Published> {
        let written = part.0;
        let live = self.partition_dir(&written.partition);
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
