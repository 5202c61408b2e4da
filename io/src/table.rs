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
use crate::commit::local::LocalTable;
use crate::commit::object::ObjectTable;
use crate::error::Result;
use crate::hive::PartitionPath;
use crate::store::{StorageOptions, is_url, local_staging_root};

/// The table at `location`: a local path, a `file://` URL, or an object-store URL
/// (reached with `opts` over the environment's settings).
pub fn open(location: &str, opts: &StorageOptions) -> Result<Arc<dyn CommitBackend>> {
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
