//! Publishing on an object store (S3 and kin), where there is no directory rename.
//!
//! Layout, for a table at `s3://bucket/lake/fct_orders`:
//!
//! ```text
//! lake/fct_orders/dt=2026-06-01/part-000003-00000.parquet   data: seq 3, file 0
//! lake/_idem/fct_orders/markers/dt=2026-06-01.json           the partition's commit marker
//! lake/_idem/fct_orders/staging/<run id>/dt=2026-06-01/…     a run's uploaded files
//! lake/_idem/fct_orders/log/<run id>-<hash>.json             restatement events
//! ```
//!
//! A run writes each partition to a local staging directory (the same streaming writer
//! as on disk), then publishes it in three steps:
//!
//! 1. **Upload** the files under `staging/<run id>/` (multipart, a few chunks in flight:
//!    bounded memory; a failed upload is aborted, not left as orphaned parts).
//! 2. **Commit**: put the partition's marker with a conditional put — `PutMode::Create`
//!    when there is none, `PutMode::Update` against the version read. This is the atomic
//!    point: the marker names sequence number `seq`, the run, the staged files and the
//!    partition's manifest. Of concurrent writers exactly one wins each round; a loser
//!    re-reads the marker and either finds the same digest (the partition is already
//!    what it would write) or retries on top of the winner. An ambiguous answer (a lost
//!    response, reported as a conflict on retry) is settled by reading the marker back
//!    and comparing the run id.
//! 3. **Apply**: server-side copy of the staged files into the partition as
//!    `part-<seq>-<n>.parquet`, then delete every object of the partition that the
//!    marker does not list and whose `seq` is older (or that idem did not write), then
//!    delete the staged copies.
//!
//! Nothing uncommitted is ever written under the table root, and no file the live marker
//! lists is ever deleted: deletes only touch older sequence numbers, and sequence numbers
//! only grow. A run that dies after its commit leaves the apply half done; the next run
//! (or `idem gc`) rolls it forward from the staged copies. idem reads a partition
//! through its marker; a plain lister may see old and new files together only during
//! the apply (a few copies and deletes).

mod lease;
mod listing;
mod marker;
mod probe;
mod recover;
#[cfg(test)]
mod tests;
mod upload;

pub use lease::{LEASE_TIMEOUT_ENV, lease_timeout_from_env};
pub use marker::{Marker, MarkerFile};
pub use probe::{Probe, probe_conditional_writes};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{
    ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, multipart::MultipartStore,
};

use super::{
    Checked, CommitBackend, CommittedPartition, PublishGuard, Published, RunGuard, Version,
    WritesGuard,
};
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::log::Restatement;
use crate::manifest::LiveState;
use crate::staged::WrittenPartition;
use crate::store::raw_key;
use lease::lease_body;
use marker::marker_version;

/// A table on an object store.
#[derive(Clone)]
pub struct ObjectTable {
    url: String,
    store: Arc<dyn ObjectStore>,
    multipart: Option<Arc<dyn MultipartStore>>,
    /// Staging prefixes whose commit had an unknown outcome: never deleted by this run.
    ambiguous: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    root: ObjectPath,
    meta: ObjectPath,
    local: PathBuf,
    options: crate::store::StorageOptions,
}

impl std::fmt::Debug for ObjectTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectTable")
            .field("url", &self.url)
            .finish()
    }
}

impl ObjectTable {
    /// Describes the table at `url` (`s3://bucket/prefix/table`); its metadata lives in
    /// `s3://bucket/prefix/_idem/table/`, and runs stage their files locally under
    /// `local_staging` before uploading them.
    pub fn new(
        url: &str,
        options: &crate::store::StorageOptions,
        local_staging: &Path,
    ) -> Result<Self> {
        let url = url.trim_end_matches('/').to_string();
        let (store, multipart) = crate::store::stores(&url, options)?;
        let key = crate::store::key_of(&url);
        if key.is_empty() {
            return Err(Error::Url {
                url,
                reason: "a table needs a prefix inside the bucket (s3://bucket/table)".into(),
            });
        }
        let (parent, name) = match key.rsplit_once('/') {
            Some((p, n)) => (format!("{p}/"), n.to_string()),
            None => (String::new(), key.clone()),
        };
        let local = local_staging.join(format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(url.as_bytes())
        ));
        Ok(Self {
            root: raw_key(key.as_str()),
            meta: raw_key(format!("{parent}{}/{name}", super::local::META_DIR)),
            url,
            store,
            multipart,
            ambiguous: Default::default(),
            local,
            options: options.clone(),
        })
    }

    /// The key of the table's root in its bucket.
    pub(crate) fn root_key(&self) -> &ObjectPath {
        &self.root
    }

    fn block<T: Send>(&self, f: impl std::future::Future<Output = T> + Send) -> T {
        crate::store::block(f)
    }

    fn err(&self, op: &'static str, key: &ObjectPath) -> impl FnOnce(object_store::Error) -> Error {
        let url = format!(
            "{}/{}",
            crate::store::store_base(&self.url).unwrap_or_default(),
            key
        );
        move |source| Error::ObjectStore {
            op,
            url,
            source: Box::new(source),
        }
    }

    fn marker_key(&self, p: &PartitionPath) -> ObjectPath {
        let rel = p.rel_path().to_string_lossy().into_owned();
        let rel = if rel.is_empty() { "_table".into() } else { rel };
        raw_key(format!("{}/markers/{rel}.json", self.meta))
    }

    fn partition_prefix(&self, p: &PartitionPath) -> ObjectPath {
        let rel = p.rel_path().to_string_lossy().into_owned();
        if rel.is_empty() {
            self.root.clone()
        } else {
            raw_key(format!("{}/{rel}", self.root))
        }
    }

    fn lease_key(&self, run_id: &str) -> ObjectPath {
        raw_key(format!("{}/leases/{run_id}.json", self.meta))
    }

    fn staging_prefix(&self, run_id: &str) -> ObjectPath {
        raw_key(format!("{}/staging/{run_id}", self.meta))
    }

    /// The key prefix under which run `run_id` stages partition `p`'s files.
    fn staged_prefix(&self, run_id: &str, p: &PartitionPath) -> String {
        let rel = p.rel_path().to_string_lossy().into_owned();
        if rel.is_empty() {
            format!("{}/_table", self.staging_prefix(run_id))
        } else {
            format!("{}/{rel}", self.staging_prefix(run_id))
        }
    }

    /// The (small) object at `key` with its metadata; `None` when there is none.
    async fn read(
        &self,
        op: &'static str,
        key: &ObjectPath,
    ) -> Result<Option<(object_store::ObjectMeta, Vec<u8>)>> {
        let got = match self.store.get(key).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err(op, key)(e)),
        };
        let meta = got.meta.clone();
        let bytes = got.bytes().await.map_err(self.err(op, key))?;
        Ok(Some((meta, bytes.to_vec())))
    }

    /// Every object under `prefix`.
    /// The objects and "directories" directly under `prefix`.
    async fn list_level(&self, prefix: &ObjectPath) -> Result<object_store::ListResult> {
        self.store
            .list_with_delimiter(Some(prefix))
            .await
            .map_err(self.err("list", prefix))
    }

    async fn list_all(&self, prefix: &ObjectPath) -> Result<Vec<object_store::ObjectMeta>> {
        self.store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(self.err("list", prefix))
    }

    /// Deletes `key`; one already gone is fine.
    async fn delete_quiet(&self, key: &ObjectPath) -> Result<()> {
        match self.store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("delete", key)(e)),
        }
    }

    async fn delete_prefix(&self, prefix: &ObjectPath) -> Result<()> {
        let objects = self.list_all(prefix).await?;
        for o in objects {
            self.delete_quiet(&o.location).await?;
        }
        Ok(())
    }
}

impl CommitBackend for ObjectTable {
    fn location(&self) -> String {
        self.url.clone()
    }

    fn prepare(&self) -> Result<()> {
        self.block(self.check_conditional_writes())?;
        crate::durable::create_dir_all(&self.local)
    }

    fn lock_run(&self, run_id: &str) -> Result<RunGuard> {
        let key = self.lease_key(run_id);
        let (body, holder) = lease_body();
        let version = self.put_lease(&key, &body)?;
        self.hold(key, body, holder, version).map(RunGuard::new)
    }

    fn clean_dead_runs(&self) -> Result<Vec<String>> {
        self.block(self.recover())
    }

    fn staged_runs(&self) -> Result<Vec<String>> {
        ObjectTable::staged_runs(self)
    }

    fn log(&self) -> Result<Vec<Restatement>> {
        ObjectTable::log(self)
    }

    fn lock_writes(&self) -> Result<WritesGuard> {
        self.lock_table("writes.lock").map(WritesGuard::new)
    }

    fn lock_publish(&self) -> Result<PublishGuard> {
        self.lock_table("publish.lock").map(PublishGuard::new)
    }

    fn partitions(&self) -> Result<Vec<PartitionPath>> {
        ObjectTable::partitions(self)
    }

    fn committed(&self) -> Result<Option<Vec<CommittedPartition>>> {
        if !self.is_idem_table()? {
            return Ok(None);
        }
        ObjectTable::committed(self).map(Some)
    }

    fn check_layout(&self, partition_by: &[String]) -> Result<()> {
        let objects = self.block(self.list_all(&self.root))?;
        let entries: Vec<crate::layout::Entry> = objects
            .iter()
            .filter_map(|o| {
                let rel = o.location.as_ref().strip_prefix(self.root.as_ref())?;
                Some(crate::layout::Entry {
                    rel: rel.trim_start_matches('/').to_string(),
                    kind: crate::layout::Kind::File,
                })
            })
            .collect();
        crate::layout::check(&entries, partition_by).map_err(|problem| Error::Layout {
            table: self.url.clone(),
            problem,
        })
    }

    fn live_version(&self, p: &PartitionPath) -> Result<Option<Version>> {
        Ok(self
            .block(self.read_marker(p))?
            .map(|(m, _)| marker_version(&m)))
    }

    fn read_locations(&self, p: &PartitionPath, names: &[String]) -> Result<Vec<String>> {
        let base = crate::store::store_base(&self.url).unwrap_or_default();
        self.block(async {
            let marker = self.read_marker(p).await?.map(|(m, _)| m);
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let committed = marker
                    .as_ref()
                    .and_then(|m| m.files.iter().find(|f| &f.name == name).map(|f| (m, f)));
                let key = match committed {
                    Some((m, f)) => self.committed_file(p, m, f).await?,
                    None => raw_key(format!("{}/{name}", self.partition_prefix(p))),
                };
                out.push(format!("{base}/{key}"));
            }
            Ok(out)
        })
    }

    fn file_location(&self, p: &PartitionPath, name: &str) -> String {
        let rel = p.rel_path().to_string_lossy().into_owned();
        if rel.is_empty() {
            format!("{}/{name}", self.url)
        } else {
            format!("{}/{rel}/{name}", self.url)
        }
    }

    fn staging_dir(&self, run_id: &str, p: &PartitionPath) -> PathBuf {
        self.local.join(run_id).join(p.rel_path())
    }

    fn live_partitions(&self, depth: usize) -> Result<Vec<PartitionPath>> {
        Ok(self
            .block(self.scan())?
            .into_iter()
            .filter(|p| p.parts().len() == depth)
            .collect())
    }

    fn live_state(&self, p: &PartitionPath) -> Result<Option<LiveState>> {
        self.block(async {
            let marker = self.read_marker(p).await?;
            let files = self.list_partition(p).await?;
            let base = crate::store::store_base(&self.url).unwrap_or_default();
            let url =
                |o: &object_store::ObjectMeta| PathBuf::from(format!("{base}/{}", o.location));
            let Some((m, _)) = marker else {
                if files.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(LiveState::Foreign {
                    files: files.iter().map(url).collect(),
                }));
            };
            // Committed; clean only when a plain lister sees exactly the marker's files.
            let mut listed: Vec<&str> =
                files.iter().filter_map(|o| o.location.filename()).collect();
            listed.sort_unstable();
            let mut expected: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
            expected.sort_unstable();
            if listed == expected {
                return Ok(Some(LiveState::Managed(Box::new(m.manifest))));
            }
            let extra = files
                .iter()
                .filter(|o| {
                    let name = o.location.filename().unwrap_or_default();
                    !m.files.iter().any(|f| f.name == name)
                })
                .map(url)
                .collect();
            Ok(Some(LiveState::Unclean {
                manifest: Box::new(m.manifest),
                extra,
            }))
        })
    }

    fn publish(&self, part: Checked, _fence: &PublishGuard) -> Result<Published> {
        let written = part.0;
        let mode = self.block(self.publish_async(&written))?;
        let _ = crate::durable::remove_dir_all(&written.dir);
        Ok(Published {
            path: PathBuf::from(format!(
                "{}/{}",
                self.url,
                written.partition.rel_path().display()
            )),
            partition: written.partition,
            mode,
        })
    }

    fn stage_for_publisher(&self, mut part: WrittenPartition) -> Result<WrittenPartition> {
        let run_id = part.manifest.run.run_id.clone();
        let staging = self.staged_prefix(&run_id, &part.partition);
        let files = self.block(async {
            let mut files = Vec::with_capacity(part.manifest.files.len());
            for f in &part.manifest.files {
                let key = raw_key(format!("{staging}/{}", f.name));
                let size = self.upload(&part.dir.join(&f.name), &key, &run_id).await?;
                files.push((f.name.clone(), size));
            }
            Ok::<_, Error>(files)
        })?;
        crate::durable::remove_dir_all(&part.dir)?;
        let base = crate::store::store_base(&self.url).unwrap_or_default();
        part.uploaded = Some(crate::staged::Uploaded {
            url: format!("{base}/{staging}"),
            files,
        });
        Ok(part)
    }

    fn discard(&self, part: WrittenPartition) -> Result<()> {
        crate::durable::remove_dir_all(&part.dir)
    }

    fn cleanup_run(&self, run_id: &str) -> Result<()> {
        // Every step is tried; the first failure is reported (what is left, a dead-run
        // cleaner removes).
        let local = crate::durable::remove_dir_all(&self.local.join(run_id));
        let uploads = self.block(self.abort_recorded_uploads(run_id));
        let staged = self.remove_unnamed_staging(run_id);
        local.and(uploads).and(staged)
    }

    fn append_log(&self, event: &Restatement) -> Result<()> {
        let key = raw_key(format!(
            "{}/log/{}",
            self.meta,
            crate::log::file_name(event)
        ));
        let body = PutPayload::from(serde_json::to_vec(event).expect("event serializes"));
        self.block(async {
            match self
                .store
                .put_opts(&key, body, PutOptions::from(PutMode::Create))
                .await
            {
                // A retried put that had landed: the event is there.
                Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(self.err("append to the log", &key)(e)),
            }
        })
    }
}
