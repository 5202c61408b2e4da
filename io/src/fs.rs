//! The one seam through which the write, publish, recovery and gc paths touch the
//! local filesystem. Each call asks [`crate::fault::point`] first, so a test can fail
//! (or "crash" at) every filesystem call of a run in turn; otherwise these are the
//! plain `std::fs` and `rustix` calls.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Write;
use std::path::Path;

use rustix::fs::{CWD, FlockOperation, RenameFlags, renameat_with};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::fault::{self, Verdict};

/// Runs `call` (operation `op` on `path`) under the fault plan.
fn guarded<T>(
    op: &str,
    path: &Path,
    call: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<T> {
    match fault::point(op, &path.display()) {
        Verdict::Proceed => call(),
        Verdict::Fail => Err(fault::io_error(op)),
        Verdict::Lose => {
            call()?;
            Err(fault::io_error(op))
        }
    }
}

/// A fault point for a call made elsewhere (an async read of a staged file).
pub fn check(op: &str, path: &Path) -> std::io::Result<()> {
    guarded(op, path, || Ok(()))
}

pub fn create_dir(path: &Path) -> std::io::Result<()> {
    guarded("create directory", path, || std::fs::create_dir(path))
}

pub fn remove_dir_all(path: &Path) -> std::io::Result<()> {
    guarded("remove", path, || std::fs::remove_dir_all(path))
}

pub fn remove_file(path: &Path) -> std::io::Result<()> {
    guarded("remove", path, || std::fs::remove_file(path))
}

pub fn rename(from: &Path, to: &Path) -> std::io::Result<()> {
    guarded("rename", from, || std::fs::rename(from, to))
}

/// `renameat2` with `flags` (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`); an injected fault
/// is `EIO`.
pub fn rename_with(from: &Path, to: &Path, flags: RenameFlags) -> std::result::Result<(), Errno> {
    match fault::point("rename", &from.display()) {
        Verdict::Proceed => renameat_with(CWD, from, CWD, to, flags),
        Verdict::Fail => Err(Errno::IO),
        Verdict::Lose => {
            renameat_with(CWD, from, CWD, to, flags)?;
            Err(Errno::IO)
        }
    }
}

pub fn hard_link(from: &Path, to: &Path) -> std::io::Result<()> {
    guarded("link", to, || std::fs::hard_link(from, to))
}

pub fn copy(from: &Path, to: &Path) -> std::io::Result<u64> {
    guarded("copy", to, || std::fs::copy(from, to))
}

pub fn metadata(path: &Path) -> std::io::Result<Metadata> {
    guarded("stat", path, || std::fs::metadata(path))
}

/// Opens an existing file (or directory) for reading.
pub fn open(path: &Path) -> std::io::Result<File> {
    guarded("open", path, || File::open(path))
}

/// Creates a new file; fails if one exists (two writers never share a file).
pub fn create_new(path: &Path) -> std::io::Result<File> {
    guarded("create", path, || {
        OpenOptions::new().write(true).create_new(true).open(path)
    })
}

/// Opens a file for appending.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    guarded("open", path, || OpenOptions::new().append(true).open(path))
}

/// Opens a file for writing, creating it if missing and keeping its contents.
pub fn open_or_create(path: &Path) -> std::io::Result<File> {
    guarded("create", path, || {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
    })
}

pub fn write(file: &mut File, path: &Path, buf: &[u8]) -> std::io::Result<usize> {
    guarded("write", path, || file.write(buf))
}

pub fn sync(file: &File, path: &Path) -> std::io::Result<()> {
    crate::profile::timed(crate::profile::Counter::Fsync, || {
        guarded("fsync", path, || file.sync_all())
    })
}

pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    guarded("read", path, || std::fs::read(path))
}

/// `flock` on `file` (at `path`); a wait for the lock is a blocking wait.
pub fn flock(file: &File, path: &Path, op: FlockOperation) -> std::result::Result<(), Errno> {
    if matches!(
        op,
        FlockOperation::LockExclusive | FlockOperation::LockShared
    ) {
        crate::blocking::check("waiting for a lock");
    }
    match fault::point("lock", &path.display()) {
        Verdict::Proceed => rustix::fs::flock(file, op),
        Verdict::Fail => Err(Errno::IO),
        Verdict::Lose => {
            rustix::fs::flock(file, op)?;
            Err(Errno::IO)
        }
    }
}

/// The entries of `dir`: name and type (not following symbolic links), in no order.
pub fn read_dir(dir: &Path) -> Result<Vec<(String, std::fs::FileType)>> {
    let listed = guarded("list", dir, || {
        std::fs::read_dir(dir)?
            .map(|e| {
                let e = e?;
                Ok((e.file_name().to_string_lossy().into_owned(), e.file_type()?))
            })
            .collect::<std::io::Result<Vec<_>>>()
    });
    listed.map_err(Error::io("list", dir))
}
