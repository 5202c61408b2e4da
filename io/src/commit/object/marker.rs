//! The commit: each partition's marker, replaced by a conditional put against the
//! version read (the atomic point). Of concurrent writers one wins each round; a loser
//! finds the same digest (nothing to do) or commits again on top of the winner.

use std::path::PathBuf;

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::commit::{PublishMode, Version};
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::manifest::Manifest;
use crate::staged::WrittenPartition;
use crate::store::raw_key;

use super::ObjectTable;

/// Rounds of the commit loop before giving up on a partition other writers keep moving.
pub(super) const COMMIT_ROUNDS: usize = 16;

/// The commit marker of one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub format: u32,
    /// One more than the previous marker's; names the partition's data files.
    pub seq: u64,
    pub run_id: String,
    /// Key prefix of the staged files the apply copies from.
    pub staging: String,
    /// Staged name → name in the partition.
    pub files: Vec<MarkerFile>,
    /// The partition's manifest, listing the files by their names in the partition.
    pub manifest: Manifest,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerFile {
    pub staged: String,
    pub name: String,
    pub size: u64,
}

impl ObjectTable {
    /// The partition's marker and the version to update it against.
    pub(super) async fn read_marker(
        &self,
        p: &PartitionPath,
    ) -> Result<Option<(Marker, UpdateVersion)>> {
        let key = self.marker_key(p);
        let Some((meta, bytes)) = self.read("read marker", &key).await? else {
            return Ok(None);
        };
        let version = UpdateVersion {
            e_tag: meta.e_tag,
            version: meta.version,
        };
        let marker: Marker = serde_json::from_slice(&bytes).map_err(|e| Error::BadManifest {
            path: PathBuf::from(format!("{}/{key}", self.url)),
            reason: e.to_string(),
        })?;
        Ok(Some((marker, version)))
    }

    pub(super) async fn publish_async(&self, written: &WrittenPartition) -> Result<PublishMode> {
        let p = &written.partition;
        let run_id = &written.manifest.run.run_id;
        let staging = self.staged_prefix(run_id, p);
        let files = match &written.uploaded {
            // Staged there by an executor of a cluster: the existence check below
            // makes sure they still are.
            Some(up) => up.files.clone(),
            None => {
                let mut files = Vec::with_capacity(written.manifest.files.len());
                for f in &written.manifest.files {
                    let key = raw_key(format!("{staging}/{}", f.name));
                    let size = self
                        .upload(&written.dir.join(&f.name), &key, run_id)
                        .await?;
                    files.push((f.name.clone(), size));
                }
                files
            }
        };
        crate::failpoint::hit("before_swap")?;
        for _ in 0..COMMIT_ROUNDS {
            // The staged files must still be there (no one took this run for dead):
            // a marker must never name files that exist nowhere.
            for (name, _) in &files {
                let key = raw_key(format!("{staging}/{name}"));
                self.store
                    .head(&key)
                    .await
                    .map_err(self.err("check staged file", &key))?;
            }
            let current = self.read_marker(p).await?;
            if let Some(expected) = &written.expected
                && current.as_ref().map(|(m, _)| marker_version(m)) != *expected
            {
                return Err(Error::Conflict {
                    partition: p.to_string(),
                });
            }
            if let Some((m, _)) = &current
                && m.run_id != *run_id
                && !written.rewrite
                && m.manifest.digest == written.manifest.digest
                && m.manifest.schema_fingerprint == written.manifest.schema_fingerprint
            {
                // Another writer published the same content: nothing to do but finish
                // its apply if it has not.
                self.apply(p, m).await?;
                self.delete_prefix(&raw_key(staging.as_str())).await?;
                return Ok(PublishMode::AlreadyLive);
            }
            let seq = current.as_ref().map_or(1, |(m, _)| m.seq + 1);
            let marker = new_marker(written, seq, run_id, &staging, &files);
            let mode = match &current {
                None => PutMode::Create,
                Some((_, v)) => PutMode::Update(v.clone()),
            };
            let key = self.marker_key(p);
            let body = PutPayload::from(serde_json::to_vec(&marker).expect("marker serializes"));
            let put = self
                .store
                .put_opts(&key, body, PutOptions::from(mode))
                .await;
            match put {
                Ok(_) => {}
                Err(e) => {
                    // The outcome is unknown until the marker is read back (a retried
                    // put can even report a conflict although it landed): until then,
                    // and whenever it stays unknown, this partition's staging is kept
                    // for the roll-forward (cleanup_run skips it).
                    self.ambiguous
                        .lock()
                        .expect("not poisoned")
                        .insert(staging.clone());
                    let now = self.read_marker(p).await?;
                    let ours = now.as_ref().is_some_and(|(m, _)| m.run_id == *run_id);
                    let conflict = matches!(
                        e,
                        object_store::Error::AlreadyExists { .. }
                            | object_store::Error::Precondition { .. }
                    );
                    if !ours && conflict {
                        // Settled: another commit is there and this one is not.
                        self.ambiguous
                            .lock()
                            .expect("not poisoned")
                            .remove(&staging);
                    }
                    if !ours {
                        if conflict && written.expected.is_some() {
                            return Err(Error::Conflict {
                                partition: p.to_string(),
                            });
                        }
                        if conflict {
                            continue; // another writer won this round
                        }
                        return Err(self.err("commit marker", &key)(e));
                    }
                }
            }
            crate::failpoint::hit("after_swap")?;
            self.apply(p, &marker).await?;
            return Ok(if current.is_none() {
                PublishMode::Created
            } else {
                PublishMode::Committed
            });
        }
        Err(Error::Contention {
            op: "commit (the partition's marker kept changing under this run)",
            location: format!("{}/{}", self.url, p.rel_path().display()),
            reason: "too many concurrent commits".into(),
        })
    }
}

pub(super) fn new_marker(
    written: &WrittenPartition,
    seq: u64,
    run_id: &str,
    staging: &str,
    files: &[(String, u64)],
) -> Marker {
    let mut manifest = written.manifest.clone();
    let mut out = Vec::with_capacity(files.len());
    for (i, (staged, size)) in files.iter().enumerate() {
        let name = format!("part-{seq:06}-{i:05}.parquet");
        if let Some(entry) = manifest.files.iter_mut().find(|f| f.name == *staged) {
            entry.name = name.clone();
        }
        out.push(MarkerFile {
            staged: staged.clone(),
            name,
            size: *size,
        });
    }
    Marker {
        format: 1,
        seq,
        run_id: run_id.to_string(),
        staging: staging.to_string(),
        files: out,
        manifest,
    }
}

/// A committed partition's version: its marker's sequence number.
pub(super) fn marker_version(m: &Marker) -> Version {
    Version(m.seq.to_string())
}
