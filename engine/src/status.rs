//! `idem status TABLE`: what the table says about itself. Every fact comes from the
//! manifests in the partitions' Parquet footers; there is no other state to consult.

use std::path::Path;
use std::sync::Arc;

use idem_io::commit::CommitBackend;
use idem_io::hive::PartitionPath;
use idem_io::manifest::LiveState;
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

fn managed_status(
    p: &PartitionPath,
    m: idem_io::manifest::Manifest,
    bytes: Option<u64>,
) -> PartitionStatus {
    // No job here: object-store inputs are reached with the environment's options.
    let changed =
        crate::run::fresh::first_changed(&m.run.inputs, &m.run.sources, &|_| Default::default());
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

/// The table at `root`, reached with the environment's storage settings (these
/// commands have no job file).
fn open(root: &Path) -> idem_io::Result<Arc<dyn CommitBackend>> {
    idem_io::table::open(&root.to_string_lossy(), &Default::default())
}

pub fn status(root: &Path) -> Result<TableStatus> {
    let table_err = |source| Error::Table {
        path: root.to_path_buf(),
        source,
    };
    let table = open(root).map_err(table_err)?;
    let mut partitions = Vec::new();
    for p in table.partitions().map_err(table_err)? {
        let s = match table.live_state(&p).map_err(table_err)? {
            Some(LiveState::Managed(m)) => {
                let names = m.file_names();
                let bytes = table.live_bytes(&p, &names);
                managed_status(&p, *m, bytes)
            }
            // A commit whose apply is unfinished (object stores only).
            Some(LiveState::Unclean { manifest, .. }) => PartitionStatus {
                state: "pending",
                ..managed_status(&p, *manifest, None)
            },
            Some(LiveState::Foreign { files }) => {
                let names: Vec<String> = files
                    .iter()
                    .filter_map(|f| f.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect();
                let bytes = table.live_bytes(&p, &names).unwrap_or(0);
                foreign_status(&p, files.len(), bytes)
            }
            None => continue,
        };
        partitions.push(s);
    }
    Ok(TableStatus {
        table: root.display().to_string(),
        rows: partitions.iter().filter_map(|p| p.rows).sum(),
        bytes: partitions.iter().map(|p| p.bytes).sum(),
        partitions,
        staging: table.staged_runs().map_err(table_err)?,
    })
}

/// `idem gc TABLE`: removes what dead runs left in the table's staging area (on an
/// object store, rolls forward what they committed). Runs that are alive (their lock
/// is held) are left alone, so this is safe while jobs run.
pub fn gc(root: &Path) -> Result<Vec<String>> {
    open(root)
        .and_then(|t| t.clean_dead_runs())
        .map_err(|source| Error::Storage {
            target: root.to_path_buf(),
            source,
        })
}

/// `idem vacuum TABLE`: deletes the files of a Delta table that no version within
/// `retain` of now references (removed longer ago, or never committed by a crashed
/// run), keeping the table's own retention (seven days by default) when `None`.
pub fn vacuum(
    root: &Path,
    retain: Option<std::time::Duration>,
    dry_run: bool,
) -> Result<Vec<String>> {
    idem_io::table::vacuum(
        &root.to_string_lossy(),
        &Default::default(),
        retain,
        dry_run,
    )
    .map_err(|source| Error::Storage {
        target: root.to_path_buf(),
        source,
    })
}

/// `idem log TABLE`: the table's restatement events, oldest first.
pub fn log(root: &Path) -> Result<Vec<idem_io::log::Restatement>> {
    open(root)
        .and_then(|t| t.log())
        .map_err(|source| Error::Storage {
            target: root.to_path_buf(),
            source,
        })
}
