//! The read side of an object-store table: its partitions (from the markers and the
//! objects another tool wrote), each committed partition's files where they are read
//! right now, the restatement log, and the runs with staged work.

use std::path::PathBuf;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::marker::{Marker, MarkerFile};
use crate::commit::CommittedPartition;
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::log::Restatement;
use crate::store::raw_key;

use super::ObjectTable;

impl ObjectTable {
    /// Every partition of the table, at any depth: those with a marker, and the
    /// directories holding data files another tool wrote.
    pub(super) fn partitions(&self) -> Result<Vec<PartitionPath>> {
        Ok(self.block(self.scan())?.into_iter().collect())
    }

    /// The partitions at every depth, from one listing of the markers and one of the
    /// table's objects.
    pub(super) async fn scan(&self) -> Result<std::collections::BTreeSet<PartitionPath>> {
        let mut out = std::collections::BTreeSet::new();
        let markers = raw_key(format!("{}/markers", self.meta));
        for o in self.list_all(&markers).await? {
            let Some(rel) = o
                .location
                .as_ref()
                .strip_prefix(markers.as_ref())
                .and_then(|r| r.trim_start_matches('/').strip_suffix(".json"))
            else {
                continue;
            };
            out.insert(if rel == "_table" {
                PartitionPath::root()
            } else {
                PartitionPath::parse(rel)?
            });
        }
        // Partitions another tool wrote (no marker): directories of `col=value` names.
        for o in self.list_all(&self.root).await? {
            let Some(rel) = o
                .location
                .as_ref()
                .strip_prefix(self.root.as_ref())
                .map(|r| r.trim_start_matches('/'))
            else {
                continue;
            };
            let dirs = rel.rsplit_once('/').map_or("", |(d, _)| d);
            if dirs.is_empty() {
                out.insert(PartitionPath::root());
            } else if dirs.split('/').all(|d| d.contains('=')) {
                out.insert(PartitionPath::parse(dirs)?);
            }
        }
        Ok(out)
    }

    /// Whether the prefix holds an idem table (it has partition markers).
    pub(super) fn is_idem_table(&self) -> Result<bool> {
        self.block(async {
            let markers = raw_key(format!("{}/markers", self.meta));
            let mut listed = self.store.list(Some(&markers));
            use futures::StreamExt;
            match listed.next().await {
                None => Ok(false),
                Some(Ok(_)) => Ok(true),
                Some(Err(e)) => Err(self.err("list", &markers)(e)),
            }
        })
    }

    /// Every committed partition read through its marker: the manifest, and the URL of
    /// each file it lists — in the partition, or still in staging while the commit's
    /// apply has not copied it (so a reader never sees a half-applied partition).
    pub(super) fn committed(&self) -> Result<Vec<CommittedPartition>> {
        let base = crate::store::store_base(&self.url).unwrap_or_default();
        let mut out = Vec::new();
        for p in self.partitions()? {
            let found = self.block(async {
                let Some((m, _)) = self.read_marker(&p).await? else {
                    return Ok::<_, Error>(None);
                };
                let mut urls = Vec::with_capacity(m.files.len());
                for f in &m.files {
                    let key = self.committed_file(&p, &m, f).await?;
                    urls.push(format!("{base}/{key}"));
                }
                Ok(Some((m.manifest, urls)))
            })?;
            if let Some((m, urls)) = found {
                out.push((p, m, urls));
            }
        }
        Ok(out)
    }

    /// Where a committed file is read right now: in the partition, or while the
    /// apply has not copied it there, its staged copy. Only a file that is not there
    /// (not a failed request) sends the reader to staging.
    pub(super) async fn committed_file(
        &self,
        p: &PartitionPath,
        m: &Marker,
        f: &MarkerFile,
    ) -> Result<ObjectPath> {
        let live = raw_key(format!("{}/{}", self.partition_prefix(p), f.name));
        match self.store.head(&live).await {
            Ok(_) => Ok(live),
            Err(object_store::Error::NotFound { .. }) => {
                Ok(raw_key(format!("{}/{}", m.staging, f.staged)))
            }
            Err(e) => Err(self.err("look up", &live)(e)),
        }
    }

    /// The table's restatement events, oldest first.
    pub(super) fn log(&self) -> Result<Vec<Restatement>> {
        self.block(async {
            let prefix = raw_key(format!("{}/log", self.meta));
            let mut objects = self.list_all(&prefix).await?;
            objects.sort_by(|a, b| a.location.cmp(&b.location));
            let mut out = Vec::with_capacity(objects.len());
            for o in objects {
                let Some((_, bytes)) = self.read("read", &o.location).await? else {
                    continue; // removed since the listing
                };
                out.push(
                    serde_json::from_slice(&bytes).map_err(|e| Error::BadManifest {
                        path: PathBuf::from(o.location.to_string()),
                        reason: e.to_string(),
                    })?,
                );
            }
            Ok(out)
        })
    }

    /// Runs with staged uploads still present (in progress, dead, or not yet applied).
    pub(super) fn staged_runs(&self) -> Result<Vec<String>> {
        self.block(async {
            let staging = raw_key(format!("{}/staging", self.meta));
            Ok(self
                .list_level(&staging)
                .await?
                .common_prefixes
                .iter()
                .filter_map(|p| p.filename().map(str::to_string))
                .collect())
        })
    }

    /// Every object directly in a partition (not in deeper partitions): its data files,
    /// and anything else a plain lister of the partition would meet.
    pub(super) async fn list_partition(
        &self,
        p: &PartitionPath,
    ) -> Result<Vec<object_store::ObjectMeta>> {
        let prefix = self.partition_prefix(p);
        Ok(self.list_level(&prefix).await?.objects)
    }
}
