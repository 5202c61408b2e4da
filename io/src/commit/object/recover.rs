//! Apply and roll-forward: copying a committed marker's staged files into the
//! partition and deleting what it superseded; rolling forward what dead runs
//! committed and removing what they only staged.

use object_store::ObjectStoreExt;

use super::lease::dead_after;
use super::marker::Marker;
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::store::raw_key;

use super::ObjectTable;

impl ObjectTable {
    /// Makes the partition hold exactly what `marker` lists: copies what is missing
    /// from its staged files, deletes what an older marker (or another tool) left.
    pub(super) async fn apply(&self, p: &PartitionPath, marker: &Marker) -> Result<()> {
        let prefix = self.partition_prefix(p);
        let present: Vec<String> = self
            .list_partition(p)
            .await?
            .into_iter()
            .filter_map(|o| o.location.filename().map(str::to_string))
            .collect();
        // A marker superseded meanwhile is not applied: its files would come back
        // after the newer apply removed them (a reader that found one missing would
        // find it again).
        if self
            .read_marker(p)
            .await?
            .is_none_or(|(now, _)| now.seq != marker.seq)
        {
            return Ok(());
        }
        for f in &marker.files {
            if present.contains(&f.name) {
                continue;
            }
            let from = raw_key(format!("{}/{}", marker.staging, f.staged));
            let to = raw_key(format!("{prefix}/{}", f.name));
            match self.store.copy(&from, &to).await {
                Ok(()) => {}
                // Another process applied this marker and removed the staged copy.
                Err(object_store::Error::NotFound { .. }) if self.store.head(&to).await.is_ok() => {
                }
                // A newer marker superseded this one (its apply removed these files).
                Err(object_store::Error::NotFound { .. })
                    if self
                        .read_marker(p)
                        .await?
                        .is_some_and(|(now, _)| now.seq != marker.seq) =>
                {
                    return Ok(());
                }
                Err(e) => return Err(self.err("copy into the partition", &to)(e)),
            }
        }
        crate::failpoint::hit("after_apply_copy")?;
        self.remove_superseded(p).await?;
        // A newer marker may have been committed meanwhile: its apply removes what this
        // one copied before it listed the partition; what this one copied later goes now.
        if let Some((now, _)) = self.read_marker(p).await?
            && now.seq != marker.seq
        {
            self.remove_superseded(p).await?;
        }
        let staged = raw_key(marker.staging.as_str());
        self.delete_prefix(&staged).await
    }

    /// Deletes the partition's objects that the current marker does not list: files of
    /// older markers, and anything another tool put there.
    ///
    /// A newer marker's files must survive: they are copied only after that marker is
    /// committed. So the marker is read before and after the listing, and the listing
    /// is trusted only when both reads agree (no commit happened before it ended, so
    /// every object it shows that the marker does not list is superseded or foreign).
    /// When they disagree, the newer marker's own apply does the cleaning.
    pub(super) async fn remove_superseded(&self, p: &PartitionPath) -> Result<()> {
        let Some((marker, _)) = self.read_marker(p).await? else {
            return Ok(());
        };
        let listed = self.list_partition(p).await?;
        let now = self.read_marker(p).await?;
        if now.is_none_or(|(m, _)| m.seq != marker.seq || m.run_id != marker.run_id) {
            return Ok(());
        }
        for o in listed {
            let name = o.location.filename().unwrap_or_default();
            if !marker.files.iter().any(|f| f.name == name) {
                self.delete_quiet(&o.location).await?;
            }
        }
        Ok(())
    }

    /// Rolls forward what dead runs committed but did not apply, and removes what they
    /// staged without committing (once older than an hour: a live run may be uploading).
    pub(super) async fn recover(&self) -> Result<Vec<String>> {
        // A probe lives for milliseconds: one older than a dead lease was left by a
        // killed process.
        let probes = raw_key(format!("{}/probe", self.meta));
        let stale = chrono::Utc::now() - dead_after();
        for o in self.list_all(&probes).await? {
            if o.last_modified < stale {
                self.delete_quiet(&o.location).await?;
            }
        }
        let staging = raw_key(format!("{}/staging", self.meta));
        let objects = self.list_all(&staging).await?;
        // run id → partition rel → newest modification
        let mut runs: std::collections::BTreeMap<
            String,
            std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>>,
        > = Default::default();
        for o in &objects {
            let Some(rest) = o
                .location
                .as_ref()
                .strip_prefix(staging.as_ref())
                .map(|r| r.trim_start_matches('/'))
            else {
                continue;
            };
            let Some((run, rest)) = rest.split_once('/') else {
                continue;
            };
            let Some((rel, _file)) = rest.rsplit_once('/') else {
                continue;
            };
            let newest = runs
                .entry(run.to_string())
                .or_default()
                .entry(rel.to_string())
                .or_insert(o.last_modified);
            *newest = (*newest).max(o.last_modified);
        }
        // Runs that were uploading (their parts are not listed as objects) or that died
        // before uploading anything: known by their upload records and leases.
        for dir in ["uploads", "leases"] {
            let prefix = raw_key(format!("{}/{dir}", self.meta));
            for o in self.list_all(&prefix).await? {
                let Some(rest) = o.location.as_ref().strip_prefix(prefix.as_ref()) else {
                    continue;
                };
                let rest = rest.trim_start_matches('/');
                let run = rest
                    .split_once('/')
                    .map(|(r, _)| r)
                    .or_else(|| rest.strip_suffix(".json"))
                    .unwrap_or(rest);
                runs.entry(run.to_string()).or_default();
            }
        }
        // Runs of this machine that staged locally and died before uploading (or whose
        // own cleanup failed): known by their local staging directories.
        match crate::fs::read_dir(&self.local) {
            Ok(dirs) => {
                for (run, file_type) in dirs {
                    if file_type.is_dir() {
                        runs.entry(run).or_default();
                    }
                }
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut cleaned = Vec::new();
        for (run, partitions) in runs {
            let alive = self.run_alive(&run).await?;
            if !alive {
                crate::failpoint::hit("gc_step")?;
                self.abort_recorded_uploads(&run).await?;
                // What it staged on this machine, if it ran here. The staging root is
                // shared by every user of the machine: one that cannot be removed
                // (another user's) must not stop this run.
                if let Err(e) = crate::durable::remove_dir_all(&self.local.join(&run)) {
                    tracing::warn!(error = %e, "could not remove a dead run's local staging");
                }
            }
            let mut removed_all = true;
            for (rel, _newest) in partitions {
                let p = if rel == "_table" {
                    PartitionPath::root()
                } else {
                    PartitionPath::parse(&rel)?
                };
                let prefix = raw_key(format!("{staging}/{run}/{rel}"));
                if alive {
                    removed_all = false; // a live run applies its own commit
                    continue;
                }
                match self.read_marker(&p).await? {
                    Some((m, _)) if m.run_id == run => self.apply(&p, &m).await?,
                    _ => {
                        // Never committed, or superseded: a late copy of its files
                        // into the partition goes too.
                        self.remove_superseded(&p).await?;
                        self.delete_prefix(&prefix).await?
                    }
                }
            }
            if removed_all && !alive {
                let lease = self.lease_key(&run);
                self.delete_quiet(&lease).await?;
                cleaned.push(run);
            }
        }
        Ok(cleaned)
    }
}
