//! Opening a table: the one place that chooses its storage backend.
//!
//! A plain path (or `file://`) is a directory on local disk, published by directory
//! swap ([`LocalTable`]); a URL is a prefix on an object store, published through
//! per-partition markers ([`ObjectTable`], staged locally first under
//! [`local_staging_root`]). Everything else the engine and the CLI need from a table
//! is a method of [`CommitBackend`].

use std::path::Path;
use std::sync::Arc;

use crate::commit::CommitBackend;
use crate::commit::delta::DeltaLake;
use crate::commit::local::LocalTable;
use crate::commit::object::ObjectTable;
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::store::{StorageOptions, is_url, local_staging_root};

/// How a table's partitions are laid out and committed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Plain Hive-partitioned Parquet, each partition swapped in whole.
    #[default]
    Parquet,
    /// A Delta Lake table: each run's partitions replaced in one Delta commit.
    Delta,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Parquet => "parquet",
            Format::Delta => "delta",
        })
    }
}

/// The table at `location`: a local path, a `file://` URL, or an object-store URL
/// (reached with `opts` over the environment's settings); a Delta table when it has a
/// Delta log, else a Hive-partitioned one.
pub fn open(location: &str, opts: &StorageOptions) -> Result<Arc<dyn CommitBackend>> {
    let delta = delta_lake(location, opts)?;
    if delta.exists()? {
        return Ok(Arc::new(delta));
    }
    open_hive(location, opts)
}

/// The table at `location` as a job that writes `format` opens it: refused when the
/// table that is there has the other format.
pub fn open_as(
    location: &str,
    opts: &StorageOptions,
    format: Format,
) -> Result<Arc<dyn CommitBackend>> {
    let delta = delta_lake(location, opts)?;
    let found = if delta.exists()? {
        Format::Delta
    } else {
        Format::Parquet
    };
    if found == Format::Delta && format != Format::Delta {
        return Err(Error::IsDelta {
            table: location.to_string(),
        });
    }
    match format {
        Format::Delta => {
            delta.writable_or_absent()?;
            Ok(Arc::new(delta))
        }
        Format::Parquet => open_hive(location, opts),
    }
}

/// The latest version of the Delta table at `location` as a reader sees it (see
/// [`DeltaLake::scan`]); `None` when there is no Delta log there.
pub fn delta_scan(
    location: &str,
    opts: &StorageOptions,
) -> Result<Option<crate::commit::delta::DeltaScan>> {
    delta_lake(location, opts)?.scan()
}

/// `idem vacuum`: deletes the files of the Delta table at `location` that no version
/// within `retain` references (see [`DeltaLake::vacuum`]).
pub fn vacuum(
    location: &str,
    opts: &StorageOptions,
    retain: Option<std::time::Duration>,
    dry_run: bool,
) -> Result<Vec<String>> {
    delta_lake(location, opts)?.vacuum(retain, dry_run)
}

fn delta_lake(location: &str, opts: &StorageOptions) -> Result<DeltaLake> {
    if is_url(location) {
        return DeltaLake::object(location, opts, &local_staging_root());
    }
    let path = location.strip_prefix("file://").unwrap_or(location);
    DeltaLake::local(Path::new(path))
}

fn open_hive(location: &str, opts: &StorageOptions) -> Result<Arc<dyn CommitBackend>> {
    if is_url(location) {
        return Ok(Arc::new(ObjectTable::new(
            location,
            opts,
            &local_staging_root(),
        )?));
    }
    let path = location.strip_prefix("file://").unwrap_or(location);
    Ok(Arc::new(LocalTable::new(Path::new(path))))
}

/// The digest of the idem partition at `dir` — a local directory whose footers carry
/// its manifest, or a partition URL on an object store, read through its marker —
/// or `None` when `dir` is not (wholly) an idem partition.
pub fn partition_digest(dir: &str, opts: &StorageOptions) -> Option<String> {
    // The partition directories are the trailing `col=value` components.
    let mut root = dir.trim_end_matches('/');
    let mut rel: Vec<&str> = Vec::new();
    while let Some((parent, last)) = root.rsplit_once('/') {
        if !last.contains('=') {
            break;
        }
        rel.insert(0, last);
        root = parent;
    }
    let p = if rel.is_empty() {
        PartitionPath::root()
    } else {
        PartitionPath::parse(&rel.join("/")).ok()?
    };
    let table = open(root, opts).ok()?;
    let state = table.live_state(&p).ok()??;
    state.manifest().map(|m| m.digest.clone())
}

/// Records, on each input that is a file of an idem partition, that partition's digest
/// (see [`partition_digest`]); each partition is read once however many of its files
/// were read.
pub fn record_idem_digests(
    inputs: &mut [crate::manifest::InputFile],
    opts_for: &dyn Fn(&str) -> StorageOptions,
) {
    let mut digests: std::collections::HashMap<String, Option<String>> = Default::default();
    for f in inputs.iter_mut() {
        if !f.path.ends_with(".parquet") {
            continue;
        }
        let Some((dir, _)) = f.path.rsplit_once('/') else {
            continue;
        };
        f.idem_digest = digests
            .entry(dir.to_string())
            .or_insert_with(|| partition_digest(dir, &opts_for(dir)))
            .clone();
    }
}
