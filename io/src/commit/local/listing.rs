//! Walking a table directory: the partitions (directories of Parquet files under
//! `col=value` directories) and every entry a layout check judges.

use std::path::Path;

use crate::error::{Error, Result};
use crate::fs;
use crate::hive::PartitionPath;

/// The directories under `dir` (at `rel` in the table) that hold Parquet files,
/// reached through `col=value` directories.
pub(super) fn find_partitions(dir: &Path, rel: String, out: &mut Vec<PartitionPath>) -> Result<()> {
    let mut has_files = false;
    for (name, file_type) in fs::read_dir(dir)? {
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        if file_type.is_dir() && name.contains('=') {
            let sub = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            find_partitions(&dir.join(&name), sub, out)?;
        } else if file_type.is_file() && name.ends_with(".parquet") {
            has_files = true;
        }
    }
    if has_files {
        out.push(if rel.is_empty() {
            PartitionPath::root()
        } else {
            PartitionPath::parse(&rel)?
        });
    }
    Ok(())
}

/// The entries under a local directory, walking into every `col=value` directory (a
/// table of another layout is told by where its files sit) and into no other (a
/// wrong directory is reported without reading inside it).
pub(super) fn walk_local(root: &std::path::Path) -> Result<Vec<crate::layout::Entry>> {
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let listed = match crate::fs::read_dir(&dir) {
            Ok(l) => l,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                continue;
            }
            Err(e) => return Err(e),
        };
        for (name, file_type) in listed {
            let child_rel = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let kind = if file_type.is_dir() {
                crate::layout::Kind::Dir
            } else if file_type.is_file() {
                crate::layout::Kind::File
            } else {
                crate::layout::Kind::Other
            };
            if kind == crate::layout::Kind::Dir && crate::layout::column_of(&name).is_some() {
                stack.push((dir.join(&name), child_rel.clone()));
            }
            out.push(crate::layout::Entry {
                rel: child_rel,
                kind,
            });
        }
    }
    Ok(out)
}
