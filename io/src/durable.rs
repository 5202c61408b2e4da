//! Filesystem steps that are durable when they return: the fsyncs are inside these
//! helpers so that no call site can forget one. Every call goes through [`crate::fs`].

use std::path::Path;

use crate::error::{Error, Result};
use crate::fs;

/// fsyncs a directory, making the names created or removed in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let f = fs::open(dir).map_err(Error::io("open directory", dir))?;
    fs::sync(&f, dir).map_err(Error::io("fsync directory", dir))
}

/// fsyncs every file directly in `dir`, then `dir` itself: a staged partition made
/// durable before it is published.
pub fn sync_files_and_dir(dir: &Path) -> Result<()> {
    let mut names = fs::read_dir(dir)?;
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, file_type) in names {
        if file_type.is_file() {
            let path = dir.join(name);
            fs::open(&path)
                .and_then(|f| fs::sync(&f, &path))
                .map_err(Error::io("fsync", &path))?;
        }
    }
    sync_dir(dir)
}

/// Creates `dir` and any missing parents, fsyncing each parent whose entries changed.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    if is_dir(dir)? {
        return Ok(());
    }
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
    {
        create_dir_all(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if is_dir(dir)? {
                return Ok(());
            }
            return Err(Error::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        Err(e) => {
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

/// Whether `path` is a directory (`false` when it does not exist).
pub fn is_dir(path: &Path) -> Result<bool> {
    match fs::metadata(path) {
        Ok(m) => Ok(m.is_dir()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("stat", path)(e)),
    }
}

/// Whether something exists at `path`.
pub fn exists(path: &Path) -> Result<bool> {
    match fs::metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("stat", path)(e)),
    }
}

/// Removes a directory tree if it exists and makes the removal durable in its parent.
pub fn remove_dir_all(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
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
