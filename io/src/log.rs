//! The table's restatement log: one JSON file per event under `_idem/<table>/log/`,
//! created exclusively (never overwritten, so concurrent writers cannot clobber each
//! other) and fsynced. An event records that a partition which had rows was rewritten
//! with a different digest, so downstream jobs and people can tell.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::durable;
use crate::error::{Error, Result};
use crate::fs;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restatement {
    pub partition: String,
    pub old_digest: String,
    pub new_digest: String,
    pub old_rows: u64,
    pub new_rows: u64,
    pub job: String,
    pub job_fingerprint: String,
    pub logical_date: String,
    pub run_id: String,
    /// The run id of the rewritten partition's previous writer.
    pub replaced_run_id: String,
}

/// The event's file (or object) name: the run id, which starts with the run's UTC
/// start time, and a hash of the partition.
pub fn file_name(event: &Restatement) -> String {
    let key = xxhash_rust::xxh3::xxh3_64(event.partition.as_bytes());
    format!("{}-{key:016x}.json", event.run_id)
}

/// Appends an event to the log in `dir`: written whole under a temporary name, then
/// renamed into place without replacing, so a crash never leaves a torn event, and a
/// retried append of the same event finds it there.
pub fn append(dir: &Path, event: &Restatement) -> Result<()> {
    durable::create_dir_all(dir)?;
    let name = file_name(event);
    let path = dir.join(&name);
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = fs::create_new(&temp).map_err(Error::io("create", &temp))?;
        let json = serde_json::to_vec(event).expect("event serializes");
        let mut done = 0;
        while done < json.len() {
            done += fs::write(&mut f, &temp, &json[done..]).map_err(Error::io("write", &temp))?;
        }
        fs::sync(&f, &temp).map_err(Error::io("fsync", &temp))
    })();
    let placed = written.and_then(|()| {
        match fs::rename_with(&temp, &path, rustix::fs::RenameFlags::NOREPLACE) {
            Ok(()) => Ok(()),
            // The same event (run and partition), appended by an earlier attempt.
            Err(rustix::io::Errno::EXIST) => Ok(()),
            Err(e) => Err(Error::io("rename", &temp)(e.into())),
        }
    });
    if fs::metadata(&temp).is_ok() {
        let _ = fs::remove_file(&temp);
    }
    placed?;
    durable::sync_dir(dir)
}

/// Every event in `dir`, oldest first (file names start with the run id, which starts
/// with the run's UTC start time).
pub fn read(dir: &Path) -> Result<Vec<Restatement>> {
    let mut names: Vec<_> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", dir)(e)),
    };
    names.sort();
    names
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).map_err(Error::io("read", p))?;
            serde_json::from_slice(&bytes).map_err(|e| Error::BadManifest {
                path: p.clone(),
                reason: e.to_string(),
            })
        })
        .collect()
}
