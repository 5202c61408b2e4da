//! Where a job may write. A run replaces partitions whole (an unpartitioned table's
//! root included), so before anything is created or moved the target must be a table
//! of the job's layout or nothing at all: never `/`, the working directory, a home
//! directory, a source's folder, or a directory holding anything but Parquet files and
//! partition directories of the layout. Each refusal names what it found.

use std::path::{Path, PathBuf};

use idem_io::Error as IoError;
use idem_io::layout::Problem;

use crate::error::{Error, Result};
use crate::job::Job;

/// Refuses a target that is not (and could not become) a table of the job's layout.
/// Synchronous: it lists the target (call it from blocking work).
pub fn check(job: &Job) -> Result<()> {
    let refuse = |message: String| Error::Target {
        path: job.path.clone(),
        target: job.target.path.display().to_string(),
        message,
    };
    if job.target.is_remote() {
        let target = job.target.path.to_string_lossy();
        for s in &job.sources {
            if !idem_io::store::is_url(&s.path) {
                continue;
            }
            let folder = static_prefix(&s.path);
            if inside(&folder, &target) {
                return Err(refuse(format!(
                    "it holds source `{}` ({}); a run would replace what it reads. Write \
                     the table somewhere else",
                    s.name, s.path
                )));
            }
            if inside(&target, &folder) {
                return Err(refuse(format!(
                    "it lies inside the folder of source `{}` ({}); the run would read its \
                     own table and staging. Write the table outside it",
                    s.name, s.path
                )));
            }
        }
    } else {
        local_places(job).map_err(refuse)?;
    }
    let table = crate::table::open(job)?;
    match table.check_layout(&job.target.partition_by) {
        Ok(()) => Ok(()),
        Err(IoError::Layout {
            problem: Problem::OtherLayout { found },
            ..
        }) => Err(Error::Partition {
            path: job.path.clone(),
            partition: found
                .first()
                .map(|c| format!("{c}=…"))
                .unwrap_or_else(|| "(table)".into()),
            message: format!(
                "the table {} is partitioned by {}, but the job partitions by {}; writing \
                 would mix two layouts. Change partition_by (or the SQL) to match, or write \
                 to a new table",
                job.target.path.display(),
                idem_io::show_columns(&found),
                idem_io::show_columns(&job.target.partition_by)
            ),
        }),
        Err(IoError::Layout {
            problem: Problem::NotATable { found },
            ..
        }) => Err(refuse(format!(
            "it is not a table of this job's layout (partition_by = [{}]): it holds {}. \
             idem replaces a table's partitions whole and would destroy them. Point \
             [target] path at a new or empty directory, or remove them",
            job.target
                .partition_by
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", "),
            found.join(", ")
        ))),
        Err(source) => Err(Error::Storage {
            target: job.target.path.clone(),
            source,
        }),
    }
}

/// The places on disk a target may never be: `/`, the working directory or a home
/// directory (or one holding them), a source's folder (or one holding it).
fn local_places(job: &Job) -> std::result::Result<(), String> {
    let target = real(&job.target.path);
    if target.parent().is_none() {
        return Err("it is the root directory".into());
    }
    if let Ok(cwd) = std::env::current_dir()
        && real(&cwd).starts_with(&target)
    {
        return Err(format!(
            "it is the working directory ({}) or holds it",
            cwd.display()
        ));
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty())
        && real(Path::new(&home)).starts_with(&target)
    {
        return Err(format!(
            "it is the home directory ({}) or holds it",
            Path::new(&home).display()
        ));
    }
    for s in &job.sources {
        if idem_io::store::is_url(&s.path) {
            continue;
        }
        let folder = real(&source_folder(&s.path));
        if folder.starts_with(&target) {
            return Err(format!(
                "it is the folder of source `{}` ({}) or holds it; a run would replace \
                 what it reads. Write the table somewhere else",
                s.name,
                folder.display()
            ));
        }
        // A directory source reads everything under it: a table inside it would be read
        // back by its own runs, staging included (`_idem/` sits beside the table).
        if s.path.ends_with('/') && target.starts_with(&folder) {
            return Err(format!(
                "it lies inside the folder of source `{}` ({}); the run would read its \
                 own table and staging. Write the table outside it",
                s.name,
                folder.display()
            ));
        }
    }
    Ok(())
}

/// The folder a local source reads: the directory itself, a glob's fixed prefix, or a
/// file's parent.
fn source_folder(path: &str) -> PathBuf {
    let fixed = static_prefix(path);
    let p = PathBuf::from(&fixed);
    if fixed.ends_with('/') || p.is_dir() {
        p
    } else {
        p.parent().map(Path::to_path_buf).unwrap_or(p)
    }
}

/// The part of a path or URL before its first glob character, cut at a `/`.
fn static_prefix(path: &str) -> String {
    match path.find(['*', '?', '[']) {
        Some(i) => path[..path[..i].rfind('/').map_or(0, |j| j + 1)].to_string(),
        None => path.to_string(),
    }
}

/// Whether the URL `path` lies in the table `table` (`s3://b/t` holds `s3://b/t/x`).
fn inside(path: &str, table: &str) -> bool {
    let table = table.trim_end_matches('/');
    path.trim_end_matches('/') == table || path.starts_with(&format!("{table}/"))
}

/// `p` with symbolic links resolved as far as it exists (the rest appended).
fn real(p: &Path) -> PathBuf {
    let mut existing = p.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return p.to_path_buf(),
        }
    }
    let mut out = std::fs::canonicalize(&existing).unwrap_or(existing);
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_are_cut_at_their_fixed_folder() {
        assert_eq!(static_prefix("/lake/raw/*/x.csv"), "/lake/raw/");
        assert_eq!(static_prefix("/lake/raw/"), "/lake/raw/");
        assert_eq!(static_prefix("s3://b/raw/2026-*.csv"), "s3://b/raw/");
        assert!(inside("s3://b/t/x/", "s3://b/t"));
        assert!(inside("s3://b/t", "s3://b/t/"));
        assert!(!inside("s3://b/tt/x", "s3://b/t"));
    }
}
