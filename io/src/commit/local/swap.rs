//! The atomic step: a staged partition directory swapped with the live one by one
//! `renameat2(RENAME_EXCHANGE)`, or moved in with `RENAME_NOREPLACE` when new; on a
//! filesystem without those flags, renamed away and in (a reader between the two steps
//! sees no partition, never a mix). A directory's identity is its version.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::RenameFlags;
use rustix::io::Errno;

use crate::commit::{PublishMode, Version};
use crate::durable;
use crate::error::{Error, Result};
use crate::fs;

use super::LocalTable;

impl LocalTable {
    pub(super) fn swap(&self, staged: &Path, live: &Path) -> Result<PublishMode> {
        let parent = live.parent().expect("partition has a parent");
        durable::create_dir_all(parent)?;
        // Another writer may create or remove the live directory between our attempts;
        // each attempt is atomic on its own, so retrying is safe.
        crate::failpoint::hit("before_swap")?;
        for _ in 0..8 {
            match fs::rename_with(staged, live, RenameFlags::NOREPLACE) {
                Ok(()) => {
                    self.sync_both(staged, live)?;
                    return Ok(PublishMode::Created);
                }
                Err(Errno::EXIST) | Err(Errno::NOTEMPTY) => {}
                Err(Errno::INVAL) | Err(Errno::NOSYS) => return self.fallback_swap(staged, live),
                Err(e) => return Err(rename_error(staged, live, e)),
            }
            match fs::rename_with(staged, live, RenameFlags::EXCHANGE) {
                Ok(()) => {
                    self.sync_both(staged, live)?;
                    crate::failpoint::hit("after_swap")?;
                    // `staged` now holds the old contents. The new partition is live and
                    // durable: failing to remove the old copy is not a failed publish
                    // (the dead-run cleaner removes it later).
                    if let Err(e) = durable::remove_dir_all(staged) {
                        tracing::warn!(error = %e, "could not remove the replaced partition copy");
                    }
                    return Ok(PublishMode::Exchanged);
                }
                Err(Errno::NOENT) => continue,
                Err(Errno::INVAL) | Err(Errno::NOSYS) => return self.fallback_swap(staged, live),
                Err(e) => return Err(rename_error(staged, live, e)),
            }
        }
        Err(Error::Contention {
            op: "publish (the live partition kept changing under this run)",
            location: live.display().to_string(),
            reason: "too many concurrent publishes".into(),
        })
    }

    /// Two plain renames, for filesystems without `renameat2` flags. Not atomic for a
    /// reader that lists between them; the run reports it.
    pub(super) fn fallback_swap(&self, staged: &Path, live: &Path) -> Result<PublishMode> {
        tracing::warn!(
            partition = %live.display(),
            "filesystem does not support renameat2 flags; publishing with two renames (not atomic for readers)"
        );
        // The old copy goes to the run's trash, which the dead-run cleaner restores
        // from when a crash between the two renames left no live partition.
        let rel = live.strip_prefix(&self.root).unwrap_or(Path::new(""));
        let run = staged
            .strip_prefix(self.meta.join("staging"))
            .ok()
            .and_then(|r| r.components().next())
            .map(|c| c.as_os_str().to_os_string())
            .unwrap_or_default();
        let trash = self.meta.join("trash").join(&run);
        let old = trash.join(rel).join("partition");
        // While the live directory is missing, no cleaner may restore a dead run's copy
        // into its place (it holds this lock to restore).
        let _swapping = self.lock_table("swaps.lock")?;
        let had_live = durable::exists(live)?;
        if had_live {
            durable::create_dir_all(old.parent().expect("trash has a parent"))?;
            fs::rename(live, &old).map_err(Error::io("rename", live))?;
        }
        if let Err(e) = fs::rename(staged, live) {
            if had_live {
                // Put the old partition back rather than leave none.
                let _ = fs::rename(&old, live);
            }
            return Err(Error::io("rename", staged)(e));
        }
        self.sync_both(staged, live)?;
        if let Err(e) = durable::remove_dir_all(&trash) {
            tracing::warn!(error = %e, "could not remove the replaced partition copy");
        }
        Ok(PublishMode::NonAtomicFallback)
    }

    pub(super) fn sync_both(&self, staged: &Path, live: &Path) -> Result<()> {
        durable::sync_dir(live.parent().expect("live has a parent"))?;
        if let Some(p) = staged.parent() {
            durable::sync_dir(p)?;
        }
        Ok(())
    }
}

impl LocalTable {
    /// The version of the partition directory at `dir`: its identity (device, inode,
    /// change time), which a swap or a fallback publish replaces with another
    /// directory's, and the names in it, which no two versions share (each writer
    /// names its files with a token of its own), so an inode the file system reuses
    /// within its timestamps' resolution still tells two versions apart. `None` when
    /// there is none.
    pub(super) fn dir_version(dir: &Path) -> Result<Option<Version>> {
        let m = match fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("stat", dir)(e)),
        };
        let mut names: Vec<String> = fs::read_dir(dir)?.into_iter().map(|(n, _)| n).collect();
        names.sort();
        let listing = xxhash_rust::xxh3::xxh3_64(names.join("/").as_bytes());
        Ok(Some(Version(format!(
            "{}:{}:{}.{:09}:{listing:016x}",
            m.dev(),
            m.ino(),
            m.ctime(),
            m.ctime_nsec()
        ))))
    }
}

pub(super) fn rename_error(staged: &Path, live: &Path, e: Errno) -> Error {
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
