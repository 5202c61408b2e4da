//! Filesystem steps that are durable when they return: the fsyncs are inside these
//! helpers so that no call site can forget one.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

/// fsyncs a directory, making the names created or removed in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let f = File::open(dir).map_err(Error::io("open directory", dir))?;
    f.sync_all().map_err(Error::io("fsync directory", dir))
}

/// fsyncs every file directly in `dir`, then `dir` itself: a staged partition made
/// durable before it is published.
pub fn sync_files_and_dir(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(Error::io("list", dir))?;
    for entry in entries {
        let path = entry.map_err(Error::io("list", dir))?.path();
        if path.is_file() {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(Error::io("fsync", &path))?;
        }
    }
    sync_dir(dir)
}

/// Creates `dir` and any missing parents, fsyncing each parent whose entries changed.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
    {
        create_dir_all(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => {
            if dir.exists() && !dir.is_dir() {
                return Err(Error::NotADirectory {
                    path: dir.to_path_buf(),
                });
            }
            return Err(Error::Io {
                op: "create directory",
                path: dir.to_path_buf(),
                source: e,
            });
        }
    }
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
    {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Removes a directory tree if it exists and makes the removal durable in its parent.
pub fn remove_dir_all(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Error::Io {
                op: "remove",
                path: dir.to_path_buf(),
                source: e,
            });
        }
    }
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}
