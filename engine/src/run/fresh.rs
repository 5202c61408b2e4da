//! `--skip-fresh`: whether a date's partitions are already what a run would write,
//! decided from their manifests alone, without planning or reading any data.
//!
//! A date is fresh when every live partition its window owns was written by this job
//! (same job fingerprint), this idem version and the same `--var` values, from inputs
//! that are unchanged: for files of an idem table, the partition they belong to still
//! has the digest it had when read; for other files, they are all still there with the
//! same size and modification time, with no new file beside them. A window that owns
//! no live partition, or whose partitions read no input, is never fresh: the run is
//! cheap there and decides for itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use idem_io::manifest::{InputFile, LiveState, SourceScope};
use idem_io::store::StorageOptions;

use super::report::{Action, PartitionReport, RunOptions};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::window::{Window, interval_of};

/// The owned partitions, reported `fresh`, when the whole window is fresh.
pub fn fresh_partitions(job: &Job, opts: &RunOptions) -> Result<Option<Vec<PartitionReport>>> {
    let window = Window::parse(job.target.grain, &opts.date)?.with_lookback(job.lookback);
    let table = crate::table::open(job)?;
    let Some(time_column) = job.target.time_column.as_deref().or(job
        .target
        .partition_by
        .first()
        .map(String::as_str))
    else {
        return Ok(None);
    };
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let vars = opts.var_text();
    let mut out = Vec::new();
    for p in table
        .live_partitions(job.target.partition_by.len())
        .map_err(storage)?
    {
        let Some(Some(value)) = p.value(time_column) else {
            continue;
        };
        if !interval_of(value).is_some_and(|iv| window.contains(iv)) {
            continue;
        }
        let Some(LiveState::Managed(m)) = table.live_state(&p).map_err(storage)? else {
            return Ok(None);
        };
        let same_run = m.run.job_fingerprint == job.fingerprint
            && m.run.idem_version == env!("CARGO_PKG_VERSION")
            && m.run.vars == vars;
        if !same_run
            || m.run.inputs.is_empty()
            || first_changed(&m.run.inputs, &m.run.sources, &|url| {
                job.storage_for(url).clone()
            })
            .is_some()
        {
            return Ok(None);
        }
        out.push(PartitionReport {
            partition: p.to_string(),
            action: Action::Fresh,
            rows: m.rows,
            bytes: table
                .live_bytes(&p, &m.file_names())
                .unwrap_or(m.data_bytes),
            files: m.files.len(),
            digest: m.digest.clone(),
            publish: None,
            ms: 0,
        });
    }
    Ok(if out.is_empty() { None } else { Some(out) })
}

/// The first recorded input that is gone or changed (size, mtime), or the first new
/// file beside them that a source of the run would read (`scopes`, as the run
/// recorded them; without them, any file); `None` when everything is as recorded.
/// `opts_for` gives the storage options reaching an object-store URL.
pub fn first_changed(
    inputs: &[InputFile],
    scopes: &BTreeMap<String, SourceScope>,
    opts_for: &dyn Fn(&str) -> StorageOptions,
) -> Option<String> {
    let read = |path: &str| {
        let name = path.rsplit('/').next().unwrap_or_default();
        if scopes.is_empty() {
            !name.starts_with(['.', '_'])
        } else {
            scopes.values().any(|s| s.reads(path))
        }
    };
    let mut by_dir: BTreeMap<&Path, BTreeSet<&str>> = BTreeMap::new();
    let mut idem_dirs: BTreeMap<&str, &str> = BTreeMap::new();
    let mut remote_dirs: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for f in inputs {
        // A file of an idem partition (on disk or an object store): compare the
        // partition's live digest, once per partition.
        if let (Some(digest), Some((dir, _))) = (&f.idem_digest, f.path.rsplit_once('/')) {
            idem_dirs.insert(dir, digest);
            continue;
        }
        if idem_io::store::is_url(&f.path) {
            // An object: its size and ETag, and no new object beside it.
            match idem_io::store::head(&f.path, &opts_for(&f.path)) {
                Some((size, etag)) if size == f.size && (f.etag.is_none() || etag == f.etag) => {}
                _ => return Some(f.path.clone()),
            }
            if let Some((dir, _)) = f.path.rsplit_once('/') {
                remote_dirs.entry(dir).or_default().insert(&f.path);
            }
            continue;
        }
        let path = Path::new(&f.path);
        let Ok(meta) = std::fs::metadata(path) else {
            return Some(f.path.clone());
        };
        let mtime = meta
            .modified()
            .ok()
            .map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339());
        if meta.len() != f.size || mtime != f.mtime {
            return Some(f.path.clone());
        }
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
        {
            by_dir.entry(dir).or_default().insert(name);
        }
    }
    for (dir, digest) in idem_dirs {
        if idem_io::table::partition_digest(dir, &opts_for(dir)).as_deref() != Some(digest) {
            return Some(dir.to_string());
        }
    }
    for (dir, urls) in remote_dirs {
        let Some(listed) = idem_io::store::list_dir(dir, &opts_for(dir)) else {
            return Some(dir.to_string());
        };
        for u in listed {
            if read(&u) && !urls.contains(u.as_str()) {
                return Some(u);
            }
        }
    }
    for (dir, names) in by_dir {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Some(dir.display().to_string());
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_file = e.file_type().map(|t| t.is_file()).unwrap_or(false);
            let path = e.path().display().to_string();
            if is_file && !names.contains(name.as_str()) && read(&path) {
                return Some(path);
            }
        }
    }
    None
}
