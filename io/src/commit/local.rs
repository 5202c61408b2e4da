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

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::RenameFlags;
use rustix::io::Errno;

use super::{Checked, CommitBackend, Guard, PublishMode, Published, Version};
use crate::durable;
use crate::error::{Error, Result};
use crate::fs;
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

    fn swap(&self, staged: &Path, live: &Path) -> Result<PublishMode> {
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

    fn sync_both(&self, staged: &Path, live: &Path) -> Result<()> {
        durable::sync_dir(live.parent().expect("live has a parent"))?;
        if let Some(p) = staged.parent() {
            durable::sync_dir(p)?;
        }
        Ok(())
    }
}

/// Held by a live run for as long as it runs: an exclusive `flock` on
/// `_idem/<table>/locks/<run id>.lock`. The kernel drops the lock when the process
/// dies, however it dies, so a lock that can be taken belongs to a dead run.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Unlink before the descriptor closes, so no cleaner takes a lock on a file
        // that a new run could still be creating.
        let _ = fs::remove_file(&self.path);
    }
}

impl LocalTable {
    fn locks_dir(&self) -> PathBuf {
        self.meta.join("locks")
    }

    /// Marks `run_id` as alive. Call before staging anything.
    pub fn lock_run(&self, run_id: &str) -> Result<RunLock> {
        let dir = self.locks_dir();
        durable::create_dir_all(&dir)?;
        let path = dir.join(format!("{run_id}.lock"));
        // A cleaner may lock the file first, judge the run dead and unlink the file:
        // the run then holds its lock on a file the path no longer names, and retries.
        loop {
            if let Some(file) = lock_file(&path, true)? {
                return Ok(RunLock { path, _file: file });
            }
        }
    }

    /// Serializes read-modify-write writers (merges) of this table: an exclusive
    /// `flock` on `_idem/<table>/writes.lock`, waited for, held until dropped.
    pub fn lock_writes(&self) -> Result<std::fs::File> {
        self.lock_table("writes.lock")
    }

    /// Serializes the publish step of every writer of this table: an exclusive `flock`
    /// on `_idem/<table>/publish.lock`, waited for, held until dropped. Held for the
    /// few renames and fsyncs of one run's partitions, never while a run computes.
    pub fn lock_publish(&self) -> Result<std::fs::File> {
        self.lock_table("publish.lock")
    }

    /// An exclusive `flock` on `_idem/<table>/<name>`, waited for, held until dropped.
    fn lock_table(&self, name: &str) -> Result<std::fs::File> {
        durable::create_dir_all(&self.meta)?;
        let path = self.meta.join(name);
        let file = fs::open_or_create(&path).map_err(Error::io("create", &path))?;
        fs::flock(&file, &path, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Error::io("lock", &path)(e.into()))?;
        Ok(file)
    }

    /// The version of the partition directory at `dir`: its identity (device, inode,
    /// change time), which a swap or a fallback publish replaces with another
    /// directory's, and the names in it, which no two versions share (each writer
    /// names its files with a token of its own), so an inode the file system reuses
    /// within its timestamps' resolution still tells two versions apart. `None` when
    /// there is none.
    fn dir_version(dir: &Path) -> Result<Option<Version>> {
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

/// Opens (creating) the lock file at `path` and locks it, waiting for it with `wait`.
/// `None` when another run holds it (without `wait`) or when the path no longer
/// names the file locked: a cleaner unlinked it between the open and the lock.
fn lock_file(path: &Path, wait: bool) -> Result<Option<std::fs::File>> {
    use rustix::fs::FlockOperation;
    // Read-only when it exists: a lock is taken on any descriptor, and a dead run's
    // file may belong to another user.
    let file = match fs::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::open_or_create(path).map_err(Error::io("create", path))?
        }
        Err(e) => return Err(Error::io("open", path)(e)),
    };
    let op = if wait {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    match fs::flock(&file, path, op) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) if !wait => return Ok(None),
        Err(e) => return Err(Error::io("lock", path)(e.into())),
    }
    let held = file.metadata().map_err(Error::io("stat", path))?;
    match fs::metadata(path) {
        Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => Ok(Some(file)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("stat", path)(e)),
    }
}

impl LocalTable {
    fn restore_from_trash(&self, run_trash: &Path) -> Result<()> {
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
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn prepare(&self) -> Result<()> {
        LocalTable::prepare(self)
    }

    fn lock_run(&self, run_id: &str) -> Result<Box<dyn std::any::Any + Send>> {
        Ok(Box::new(LocalTable::lock_run(self, run_id)?))
    }

    fn clean_dead_runs(&self) -> Result<Vec<String>> {
        LocalTable::clean_dead_runs(self)
    }

    fn append_log(&self, event: &crate::log::Restatement) -> Result<()> {
        crate::log::append(&self.log_dir(), event)
    }

    fn as_local(&self) -> Option<&LocalTable> {
        Some(self)
    }

    fn lock_writes(&self) -> Result<Option<Guard>> {
        Ok(Some(Box::new(LocalTable::lock_writes(self)?)))
    }

    fn lock_publish(&self) -> Result<Option<Guard>> {
        Ok(Some(Box::new(LocalTable::lock_publish(self)?)))
    }

    fn live_version(&self, p: &PartitionPath) -> Result<Option<Version>> {
        Self::dir_version(&self.partition_dir(p))
    }

    fn check_layout(&self, partition_by: &[String]) -> Result<()> {
        let entries = crate::layout::walk_local(&self.root)?;
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

    fn live_state(&self, p: &PartitionPath) -> Result<Option<LiveState>> {
        let dir = self.partition_dir(p);
        if !durable::is_dir(&dir)? {
            return Ok(None);
        }
        read_partition(&dir).map(Some)
    }

    fn publish(&self, part: Checked) -> Result<Published> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Runs that start, stage and finish while others clean up after dead runs: no
    /// live run ever loses its staging directory (the cleaner holds a dead run's lock
    /// until its files and lock file are gone, so a run starting under that id waits).
    #[test]
    fn cleaners_never_remove_a_live_runs_staging() {
        let dir = tempfile::tempdir().unwrap();
        let table = LocalTable::new(&dir.path().join("t"));
        table.prepare().unwrap();
        let stop = AtomicBool::new(false);
        let lost = std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        table.clean_dead_runs().unwrap();
                    }
                });
            }
            let runners: Vec<_> = (0..2)
                .map(|t| {
                    let table = &table;
                    s.spawn(move || {
                        let mut lost = Vec::new();
                        for i in 0..1000 {
                            let run = format!("run-{t}-{i}");
                            let lock = table.lock_run(&run).unwrap();
                            let staged = table.meta_dir().join("staging").join(&run);
                            let made = durable::create_dir_all(&staged.join("dt=1"));
                            std::thread::yield_now();
                            if made.is_err() || !staged.join("dt=1").is_dir() {
                                lost.push(run.clone());
                            }
                            table.cleanup_run(&run).unwrap();
                            drop(lock);
                        }
                        lost
                    })
                })
                .collect();
            let lost: Vec<_> = runners.into_iter().map(|r| r.join()).collect();
            stop.store(true, Ordering::Relaxed);
            lost.into_iter()
                .flat_map(|r| r.expect("a runner panicked"))
                .collect::<Vec<String>>()
        });
        assert!(lost.is_empty(), "live runs lost their staging: {lost:?}");
    }

    /// The publish by two renames (filesystems without `renameat2` flags) leaves the
    /// live directory missing for a moment, which is what a cleaner takes for a dead
    /// run's crash between those renames: it must not put a dead run's old copy there.
    #[test]
    fn cleaners_never_restore_into_a_fallback_swap_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let table = LocalTable::new(&dir.path().join("t"));
        table.prepare().unwrap();
        let live = table.root().join("dt=1");
        durable::create_dir_all(&live).unwrap();
        std::fs::write(live.join("v1"), "").unwrap();
        // A dead run's copy of the partition, left in its trash by a crash.
        let stale = table.meta_dir().join("trash/dead/dt=1/partition");
        durable::create_dir_all(&stale).unwrap();
        std::fs::write(stale.join("v0"), "").unwrap();
        // A live run between the two renames of `fallback_swap`, as it holds them.
        let swapping = table.lock_table("swaps.lock").unwrap();
        let old = dir.path().join("v1-copy");
        std::fs::rename(&live, &old).unwrap();
        std::thread::scope(|s| {
            let cleaner = s.spawn(|| table.clean_dead_runs().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert!(!live.exists(), "restored over a swap in progress");
            let staged = dir.path().join("v2");
            durable::create_dir_all(&staged).unwrap();
            std::fs::write(staged.join("v2"), "").unwrap();
            std::fs::rename(&staged, &live).unwrap();
            drop(swapping);
            assert_eq!(cleaner.join().unwrap(), ["dead"]);
        });
        let names: Vec<_> = std::fs::read_dir(&live)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["v2"]);
        assert!(!table.meta_dir().join("trash/dead").exists());
    }
}
