//! Uploads of staged files under `staging/<run id>/`: multipart with a few chunks in
//! flight (bounded memory), each multipart upload recorded before its first part so a
//! failed or killed run's parts are aborted, never left behind.

use std::path::{Path, PathBuf};

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart, multipart::MultipartStore};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::store::raw_key;

use super::ObjectTable;

/// Multipart chunk size, and how many chunks may be in flight per upload.
pub(super) const CHUNK: usize = 8 << 20;

pub(super) const IN_FLIGHT: usize = 4;

/// A multipart upload in progress, recorded under `_idem/<table>/uploads/<run id>/` so
/// that the parts of a run killed mid-upload can be aborted by the next run or `gc`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct UploadRecord {
    key: String,
    id: String,
}

impl ObjectTable {
    pub(crate) async fn upload(&self, local: &Path, key: &ObjectPath, run_id: &str) -> Result<u64> {
        use tokio::io::AsyncReadExt;
        crate::fs::check("read", local).map_err(Error::io("read", local))?;
        let mut file = tokio::fs::File::open(local)
            .await
            .map_err(Error::io("open", local))?;
        let len = file
            .metadata()
            .await
            .map_err(Error::io("stat", local))?
            .len();
        if len <= CHUNK as u64 {
            // One plain put: nothing a killed process could leave half-uploaded.
            let bytes = tokio::fs::read(local)
                .await
                .map_err(Error::io("read", local))?;
            self.store
                .put(key, PutPayload::from(bytes))
                .await
                .map_err(self.err("upload", key))?;
            return Ok(len);
        }
        if let Some(mp) = &self.multipart {
            return self
                .upload_recorded(mp.as_ref(), &mut file, key, run_id)
                .await;
        }
        let upload = self
            .store
            .put_multipart(key)
            .await
            .map_err(self.err("upload", key))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, CHUNK);
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = match file.read(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(Error::io("read", local)(e));
                }
            };
            if n == 0 {
                break;
            }
            if let Err(e) = writer.wait_for_capacity(IN_FLIGHT).await {
                let _ = writer.abort().await;
                return Err(self.err("upload", key)(e));
            }
            writer.write(&buf[..n]);
            total += n as u64;
        }
        writer.finish().await.map_err(self.err("upload", key))?;
        Ok(total)
    }

    /// A multipart upload whose id is recorded first, parts at most `IN_FLIGHT` at a
    /// time (bounded memory); aborted (and its record removed) on failure.
    pub(super) async fn upload_recorded(
        &self,
        mp: &dyn MultipartStore,
        file: &mut tokio::fs::File,
        key: &ObjectPath,
        run_id: &str,
    ) -> Result<u64> {
        use tokio::io::AsyncReadExt;
        let id = mp
            .create_multipart(key)
            .await
            .map_err(self.err("start upload", key))?;
        let record = raw_key(format!(
            "{}/uploads/{run_id}/{:016x}.json",
            self.meta,
            xxhash_rust::xxh3::xxh3_64(key.as_ref().as_bytes())
        ));
        let body = serde_json::to_vec(&UploadRecord {
            key: key.to_string(),
            id: id.clone(),
        })
        .expect("record serializes");
        if let Err(e) = self.store.put(&record, PutPayload::from(body)).await {
            // Unrecorded, the upload could never be found again: abort it now. (Had
            // the put landed, the record names an upload that is gone, which is fine.)
            let _ = mp.abort_multipart(key, &id).await;
            return Err(self.err("record upload", &record)(e));
        }
        let result: Result<(Vec<object_store::multipart::PartId>, u64)> = async {
            let mut parts = Vec::new();
            let mut in_flight = futures::stream::FuturesOrdered::new();
            let mut total = 0u64;
            let mut index = 0;
            loop {
                let mut buf = vec![0u8; CHUNK];
                let mut filled = 0;
                while filled < CHUNK {
                    let n = file.read(&mut buf[filled..]).await.map_err(|e| Error::Io {
                        op: "read",
                        path: PathBuf::from(key.to_string()),
                        source: e,
                    })?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                if filled == 0 {
                    break;
                }
                buf.truncate(filled);
                total += filled as u64;
                let part = index;
                index += 1;
                in_flight.push_back(mp.put_part(key, &id, part, PutPayload::from(buf)));
                if in_flight.len() >= IN_FLIGHT {
                    use futures::StreamExt;
                    let done = in_flight.next().await.expect("in flight");
                    parts.push(done.map_err(self.err("upload part", key))?);
                    crate::failpoint::hit("after_upload_part")?;
                }
            }
            use futures::StreamExt;
            while let Some(done) = in_flight.next().await {
                parts.push(done.map_err(self.err("upload part", key))?);
                crate::failpoint::hit("after_upload_part")?;
            }
            Ok((parts, total))
        }
        .await;
        match result {
            Ok((parts, total)) => {
                mp.complete_multipart(key, &id, parts)
                    .await
                    .map_err(self.err("complete upload", key))?;
                // A record left behind names a completed upload: its abort finds
                // nothing, and the next cleaner removes it.
                if let Err(e) = self.delete_quiet(&record).await {
                    tracing::warn!(error = %e, "could not remove an upload's record");
                }
                Ok(total)
            }
            Err(e) => {
                // The record goes only once the upload is known to be gone; otherwise
                // the next run or `idem gc` aborts it from the record.
                if mp.abort_multipart(key, &id).await.is_ok() {
                    let _ = self.delete_quiet(&record).await;
                }
                Err(e)
            }
        }
    }

    /// Aborts the multipart uploads a dead run recorded and never finished.
    pub(super) async fn abort_recorded_uploads(&self, run_id: &str) -> Result<()> {
        let Some(mp) = &self.multipart else {
            return Ok(());
        };
        let prefix = raw_key(format!("{}/uploads/{run_id}", self.meta));
        for o in self.list_all(&prefix).await? {
            let Some((_, bytes)) = self.read("read", &o.location).await? else {
                continue; // removed since the listing
            };
            if let Ok(r) = serde_json::from_slice::<UploadRecord>(&bytes) {
                let key = raw_key(r.key.as_str());
                match mp.abort_multipart(&key, &r.id).await {
                    // An upload already completed or aborted is gone: nothing to do.
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    // Keep the record: the next cleaner aborts it.
                    Err(e) => {
                        tracing::warn!(error = %e, upload = %key, "could not abort an upload; kept its record to try again");
                        continue;
                    }
                }
            }
            self.delete_quiet(&o.location).await?;
        }
        Ok(())
    }
}

impl ObjectTable {
    /// Removes what run `run_id` uploaded to staging that no marker names.
    pub(super) fn remove_unnamed_staging(&self, run_id: &str) -> Result<()> {
        // Staged uploads no marker names are removed; those a marker names stay for
        // the roll-forward (their apply did not finish), as does anything whose marker
        // cannot be read now.
        self.block(async {
            let staging = self.staging_prefix(run_id);
            let objects = self.list_all(&staging).await?;
            let mut rels: Vec<String> = objects
                .iter()
                .filter_map(|o| {
                    let rest = o.location.as_ref().strip_prefix(staging.as_ref())?;
                    Some(rest.trim_start_matches('/').rsplit_once('/')?.0.to_string())
                })
                .collect();
            rels.sort();
            rels.dedup();
            for rel in rels {
                let p = if rel == "_table" {
                    PartitionPath::root()
                } else {
                    PartitionPath::parse(&rel)?
                };
                let prefix = format!("{staging}/{rel}");
                let unknown = self
                    .ambiguous
                    .lock()
                    .expect("not poisoned")
                    .contains(&prefix);
                if !unknown
                    && let Ok(m) = self.read_marker(&p).await
                    && m.is_none_or(|(m, _)| m.run_id != run_id)
                {
                    self.delete_prefix(&raw_key(format!("{staging}/{rel}")))
                        .await?;
                }
            }
            Ok(())
        })
    }
}
