//! Locks, as `flock`s on files under `_idem/<table>/`: one per live run in `locks/`
//! (its staging is not a dead run's while held), the table's write lock (merges) and
//! its publish lock (the fence of every publish). The kernel releases them when the
//! process dies, so a dead holder never blocks anyone.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::durable;
use crate::error::{Error, Result};
use crate::fs;

use super::LocalTable;

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
    pub(super) fn locks_dir(&self) -> PathBuf {
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
                // Which machine runs it, for a run on another machine to see.
                let _ = std::io::Write::write_all(&mut &file, machine().as_bytes());
                return Ok(RunLock { path, _file: file });
            }
        }
    }

    /// Refuses a table whose run lock `lock` was taken on another machine: the kernel
    /// there holds that lock, and this one cannot see it.
    pub(super) fn refuse_other_machine(lock: &Path) -> Result<()> {
        let Ok(theirs) = std::fs::read_to_string(lock) else {
            return Ok(());
        };
        let ours = machine();
        let field = |text: &str, name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let (their_host, their_boot) = (field(&theirs, "host "), field(&theirs, "boot "));
        let (our_host, our_boot) = (field(&ours, "host "), field(&ours, "boot "));
        // The same kernel (a container beside this one, a process naming its host
        // otherwise) shares this one's locks; the same host after a reboot is this
        // machine. Only another host on another kernel is another machine.
        let same_kernel = !our_boot.is_empty() && our_boot == their_boot;
        if their_host.is_empty() || their_host == our_host || same_kernel {
            return Ok(());
        }
        Err(Error::OtherHost {
            lock: lock.to_path_buf(),
            theirs: their_host,
            ours: our_host,
        })
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
    pub(super) fn lock_table(&self, name: &str) -> Result<std::fs::File> {
        durable::create_dir_all(&self.meta)?;
        let path = self.meta.join(name);
        let file = fs::open_or_create(&path).map_err(Error::io("create", &path))?;
        fs::flock(&file, &path, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Error::io("lock", &path)(e.into()))?;
        Ok(file)
    }
}

/// This machine, as a run lock names it: its host name and the boot of its kernel.
fn machine() -> String {
    format!(
        "host {}\nboot {}\n",
        crate::commit::hostname(),
        crate::commit::boot_id()
    )
}

/// Opens (creating) the lock file at `path` and locks it, waiting for it with `wait`.
/// `None` when another run holds it (without `wait`) or when the path no longer
/// names the file locked: a cleaner unlinked it between the open and the lock.
pub(super) fn lock_file(path: &Path, wait: bool) -> Result<Option<std::fs::File>> {
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
