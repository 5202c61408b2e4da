//! `idem status TABLE`: what the table says about itself. Every fact comes from the
//! manifests in the partitions' Parquet footers; there is no other state to consult.

use std::path::{Path, PathBuf};

use idem_io::hive::PartitionPath;
use idem_io::manifest::{LiveState, read_partition};
use serde::Serialize;

use crate::error::{Error, Result};

#[derive(Clone, Debug, Serialize)]
pub struct PartitionStatus {
    pub partition: String,
    /// `managed` (files match the manifest), `pending` (an object store's commit whose
    /// files a plain lister does not see exactly yet: its apply is unfinished, or
    /// another tool put files beside them; idem reads the commit, and the next run or
    /// `idem gc` settles it), or `foreign` (not written by idem, or changed since).
    pub state: &'static str,
    pub rows: Option<u64>,
    pub files: usize,
    pub bytes: u64,
    pub digest: Option<String>,
    pub job: Option<String>,
    pub job_fingerprint: Option<String>,
    pub logical_date: Option<String>,
    pub run_id: Option<String>,
    pub idem_version: Option<String>,
    pub inputs: Option<usize>,
    /// Freshness: `current` when every recorded input is still as it was read,
    /// `changed` when one is gone, changed or has a new file beside it (the partition
    /// is stale), `none` when the partition read no input.
    pub input_state: Option<&'static str>,
    /// The first input found changed, when `input_state` is `changed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_input: Option<String>,
}

/// The status of a table on an object store, read through its partitions' markers
/// (storage options from the AWS_* environment).
fn remote_status(url: &str) -> idem_io::Result<TableStatus> {
    use idem_io::commit::CommitBackend;
    let table = idem_io::commit::object::ObjectTable::from_env(url)?;
    let mut partitions = Vec::new();
    for p in table.partitions()? {
        let s = match table.live_state(&p)? {
            Some(LiveState::Managed(m)) => managed_status(&p, *m, None),
            Some(LiveState::Unclean { manifest, .. }) => PartitionStatus {
                state: "pending",
                ..managed_status(&p, *manifest, None)
            },
            Some(LiveState::Foreign { files }) => foreign_status(&p, files.len(), 0),
            None => continue,
        };
        partitions.push(s);
    }
    Ok(TableStatus {
        table: url.to_string(),
        rows: partitions.iter().filter_map(|p| p.rows).sum(),
        bytes: partitions.iter().map(|p| p.bytes).sum(),
        partitions,
        staging: table.staged_runs()?,
    })
}

fn managed_status(
    p: &PartitionPath,
    m: idem_io::manifest::Manifest,
    bytes: Option<u64>,
) -> PartitionStatus {
    // No job here: object-store inputs are reached with the environment's options.
    let changed =
        crate::freshness::first_changed(&m.run.inputs, &m.run.sources, &|_| Default::default());
    let input_state = if m.run.inputs.is_empty() {
        "none"
    } else if changed.is_some() {
        "changed"
    } else {
        "current"
    };
    PartitionStatus {
        partition: p.to_string(),
        state: "managed",
        rows: Some(m.rows),
        files: m.files.len(),
        bytes: bytes.unwrap_or(m.data_bytes),
        digest: Some(m.digest),
        job: Some(m.run.job),
        job_fingerprint: Some(m.run.job_fingerprint),
        logical_date: Some(m.run.logical_date),
        run_id: Some(m.run.run_id),
        idem_version: Some(m.run.idem_version),
        inputs: Some(m.run.inputs.len()),
        input_state: Some(input_state),
        changed_input: changed,
    }
}

fn foreign_status(p: &PartitionPath, files: usize, bytes: u64) -> PartitionStatus {
    PartitionStatus {
        partition: p.to_string(),
        state: "foreign",
        rows: None,
        files,
        bytes,
        digest: None,
        job: None,
        job_fingerprint: None,
        logical_date: None,
        run_id: None,
        idem_version: None,
        inputs: None,
        input_state: None,
        changed_input: None,
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub partitions: Vec<PartitionStatus>,
    pub rows: u64,
    pub bytes: u64,
    /// Runs whose staging directories are still present (in progress, or dead).
    pub staging: Vec<String>,
}

pub fn status(root: &Path) -> Result<TableStatus> {
    let table_err = |message: String| Error::Table {
        path: root.to_path_buf(),
        message,
    };
    let url = root.to_string_lossy();
    if idem_io::store::is_url(&url) {
        return remote_status(&url).map_err(|e| table_err(e.to_string()));
    }
    if !root.is_dir() {
        return Err(table_err(if root.exists() {
            "is not a directory".into()
        } else {
            "does not exist".into()
        }));
    }
    let mut leaves = Vec::new();
    find_partitions(root, root, &mut leaves).map_err(|e| table_err(e.to_string()))?;
    leaves.sort();
    let mut partitions = Vec::new();
    for (rel, dir) in leaves {
        let p = PartitionPath::parse(&rel).map_err(|e| table_err(e.to_string()))?;
        let files =
            idem_io::manifest::list_parquet_files(&dir).map_err(|e| table_err(e.to_string()))?;
        let bytes: u64 = files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        let state = read_partition(&dir).map_err(|e| table_err(e.to_string()))?;
        let s = match state {
            LiveState::Managed(m) => managed_status(&p, *m, Some(bytes)),
            // Only object stores have commits apart from their files.
            LiveState::Foreign { .. } | LiveState::Unclean { .. } => {
                foreign_status(&p, files.len(), bytes)
            }
        };
        partitions.push(s);
    }
    let table = idem_io::commit::local::LocalTable::new(root);
    let mut staging: Vec<String> = std::fs::read_dir(table.meta_dir().join("staging"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    staging.sort();
    Ok(TableStatus {
        table: root.display().to_string(),
        rows: partitions.iter().filter_map(|p| p.rows).sum(),
        bytes: partitions.iter().map(|p| p.bytes).sum(),
        partitions,
        staging,
    })
}

/// Directories holding Parquet files, reached through `col=value` directories.
fn find_partitions(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, PathBuf)>,
) -> std::io::Result<()> {
    let mut has_files = false;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let ft = e.file_type()?;
        if ft.is_dir() && name.contains('=') {
            find_partitions(root, &e.path(), out)?;
        } else if ft.is_file() && name.ends_with(".parquet") {
            has_files = true;
        }
    }
    if has_files {
        let rel = dir
            .strip_prefix(root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push((rel, dir.to_path_buf()));
    }
    Ok(())
}

/// `idem gc TABLE`: removes what dead runs left in the table's staging area. Runs that
/// are alive (their lock is held) are left alone, so this is safe while jobs run.
pub fn gc(root: &Path) -> Result<Vec<String>> {
    use idem_io::commit::CommitBackend;
    let storage = |source| Error::Storage {
        target: root.to_path_buf(),
        source,
    };
    let url = root.to_string_lossy();
    if idem_io::store::is_url(&url) {
        // Rolls forward what dead runs committed, removes what they only staged.
        let table = idem_io::commit::object::ObjectTable::from_env(&url).map_err(storage)?;
        return table.clean_dead_runs().map_err(storage);
    }
    let table = idem_io::commit::local::LocalTable::new(root);
    table.clean_dead_runs().map_err(storage)
}

/// `idem log TABLE`: the table's restatement events, oldest first.
pub fn log(root: &Path) -> Result<Vec<idem_io::log::Restatement>> {
    let url = root.to_string_lossy();
    if idem_io::store::is_url(&url) {
        return idem_io::commit::object::ObjectTable::from_env(&url)
            .and_then(|t| t.log())
            .map_err(|source| Error::Storage {
                target: root.to_path_buf(),
                source,
            });
    }
    let table = idem_io::commit::local::LocalTable::new(root);
    idem_io::log::read(&table.log_dir()).map_err(|source| Error::Storage {
        target: root.to_path_buf(),
        source,
    })
}
