//! What dead runs left: their staging directories removed, and a fallback swap they
//! were in the middle of undone from its trash, so every partition is old or new.

use std::path::Path;

use super::locks::lock_file;
use crate::durable;
use crate::error::{Error, Result};
use crate::fs;

use super::LocalTable;

impl LocalTable {
    /// Removes what dead runs left behind: their staging directories (including old
    /// partition copies a run swapped out but did not remove) and lock files. Runs that
    /// are still alive are never touched. Returns the run ids cleaned.
    pub fn clean_dead_runs(&self) -> Result<Vec<String>> {
        let staging = self.meta.join("staging");
        let mut runs: Vec<String> = Vec::new();
        let trash = self.meta.join("trash");
        for (dir, want_dir) in [(&staging, true), (&trash, true), (&self.locks_dir(), false)] {
            let entries = match fs::read_dir(dir) {
                Ok(e) => e,
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (name, file_type) in entries {
                if file_type.is_dir() != want_dir {
                    continue; // not something a run creates here
                }
                let run = match (want_dir, name.strip_suffix(".lock")) {
                    (true, _) => name.clone(),
                    (false, Some(run)) => run.to_string(),
                    (false, None) => continue, // not a run's lock
                };
                if !runs.contains(&run) {
                    runs.push(run);
                }
            }
        }
        runs.sort();
        if !runs.is_empty() {
            durable::create_dir_all(&self.locks_dir())?;
        }
        let mut cleaned = Vec::new();
        for run in &runs {
            Self::refuse_other_machine(&self.locks_dir().join(format!("{run}.lock")))?;
        }
        for run in runs {
            let lock_path = self.locks_dir().join(format!("{run}.lock"));
            // Held until the lock file is gone, so a run starting under this id in the
            // meantime (its lock file created, not yet locked) waits in `lock_run`,
            // then finds its file unlinked and starts over. A run's staging directory
            // is created after its lock and removed before it, so one whose lock can
            // be taken (or created: a failed run unlinks its lock first) is dead.
            let Some(_dead) = lock_file(&lock_path, false)? else {
                continue; // alive, or its lock file replaced meanwhile
            };
            crate::failpoint::hit("gc_step")?;
            // A dead run may have died between the two renames of the fallback publish:
            // a partition whose live directory is missing gets its old copy back, unless
            // a live run is between its own two renames there.
            if durable::exists(&trash.join(&run))? {
                let _swaps = self.lock_table("swaps.lock")?;
                self.restore_from_trash(&trash.join(&run))?;
            }
            durable::remove_dir_all(&trash.join(&run))?;
            durable::remove_dir_all(&staging.join(&run))?;
            fs::remove_file(&lock_path).map_err(Error::io("remove", &lock_path))?;
            durable::sync_dir(&self.locks_dir())?;
            cleaned.push(run);
        }
        Ok(cleaned)
    }
}

impl LocalTable {
    pub(super) fn restore_from_trash(&self, run_trash: &Path) -> Result<()> {
        let mut stack = vec![run_trash.to_path_buf()];
        while let Some(dir) = stack.pop() {
            // An error here must stop the cleaner: it removes the trash next, which may
            // hold the only copy of a partition.
            let entries = fs::read_dir(&dir)?;
            for (name, file_type) in entries {
                let path = dir.join(&name);
                if name == "partition" {
                    let rel = dir.strip_prefix(run_trash).unwrap_or(Path::new(""));
                    let live = self.root.join(rel);
                    if !durable::exists(&live)? {
                        if let Some(parent) = live.parent() {
                            durable::create_dir_all(parent)?;
                        }
                        fs::rename(&path, &live).map_err(Error::io("restore", &live))?;
                        durable::sync_dir(live.parent().expect("live has a parent"))?;
                    }
                } else if file_type.is_dir() {
                    stack.push(path);
                }
            }
        }
        Ok(())
    }
}
