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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{
    ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion, WriteMultipart,
    multipart::MultipartStore,
};
use serde::{Deserialize, Serialize};

use super::{Checked, CommitBackend, Guard, PublishMode, Published, Version};
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::log::Restatement;
use crate::manifest::{LiveState, Manifest};
use crate::store::raw_key;
use crate::writer::WrittenPartition;

/// Multipart chunk size, and how many chunks may be in flight per upload.
const CHUNK: usize = 8 << 20;
const IN_FLIGHT: usize = 4;
/// Rounds of the commit loop before giving up on a partition other writers keep moving.
const COMMIT_ROUNDS: usize = 16;
/// A live run refreshes its lease this often; a lease not refreshed for `DEAD_AFTER`
/// belongs to a dead run (on another machine: on this one, a dead pid says so at once).
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);
/// Generous against clock skew: the lease's age is the store's clock against ours.
const DEAD_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// A run's lease: `_idem/<table>/leases/<run id>.json` (and the body of the write
/// lock). It says who holds it, precisely enough for another process to tell whether
/// the holder is alive without waiting for the lease to go stale.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Lease {
    /// Hostname and boot id: a pid is only meaningful on the same boot of the same
    /// machine.
    host: String,
    #[serde(default)]
    boot: String,
    /// The pid namespace (`/proc/self/ns/pid`): containers of one pod share a hostname
    /// and a kernel, but not their pids.
    #[serde(default)]
    pidns: String,
    pid: u32,
    /// The process's start time in clock ticks since boot: a pid reused by a later
    /// process does not make a dead holder look alive.
    #[serde(default)]
    start: u64,
    /// A token of the holding process and one of the holding guard: within one
    /// process, a lease is alive exactly while its guard is.
    #[serde(default)]
    process: u64,
    #[serde(default)]
    holder: u64,
    /// How many times the lease was refreshed: each refresh writes new content, so its
    /// ETag changes (a store's ETag of equal content is equal) and a waiter that sees
    /// the lease unchanged for three heartbeats knows the holder stopped refreshing.
    #[serde(default)]
    beat: u64,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The start time (field 22 of `/proc/PID/stat`, clock ticks after boot) of `pid`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesized and may hold spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// This process's token: random, so two processes never share one.
fn process_token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() | 1
    })
}

/// The holder tokens of the leases this process holds now.
fn held() -> &'static std::sync::Mutex<std::collections::BTreeSet<u64>> {
    static HELD: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeSet<u64>>> =
        std::sync::OnceLock::new();
    HELD.get_or_init(Default::default)
}

/// A holder of a lease in this process: alive (to every reader of its lease in this
/// process) until dropped.
struct Holder(u64);

impl Drop for Holder {
    fn drop(&mut self) {
        held().lock().expect("not poisoned").remove(&self.0);
    }
}

/// A lease body for a new holder in this process, registered as alive before the body
/// can be put anywhere.
fn lease_body() -> (Vec<u8>, Holder) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let holder = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    held().lock().expect("not poisoned").insert(holder);
    let pid = std::process::id();
    let body = serde_json::to_vec(&Lease {
        host: hostname(),
        boot: boot_id(),
        pidns: pid_namespace(),
        pid,
        start: start_time(pid).unwrap_or(0),
        process: process_token(),
        holder,
        beat: 0,
    })
    .expect("lease serializes");
    (body, Holder(holder))
}

/// The lease `body` refreshed once more (its `beat` counted up).
fn next_beat(body: &[u8]) -> Vec<u8> {
    match serde_json::from_slice::<Lease>(body) {
        Ok(mut lease) => {
            lease.beat += 1;
            serde_json::to_vec(&lease).expect("lease serializes")
        }
        Err(_) => body.to_vec(),
    }
}

/// Whether the lease `bytes`, last written at `modified` by the store's clock, belongs
/// to a dead holder: a guard of this process that is gone; a process of this host,
/// boot and pid namespace whose pid is gone (or names a later process); or any holder
/// whose lease was not refreshed for `DEAD_AFTER` by the store's clock (`store_now`:
/// this machine's clock corrected by the offset measured against the store).
fn lease_dead(
    bytes: &[u8],
    modified: chrono::DateTime<chrono::Utc>,
    store_now: chrono::DateTime<chrono::Utc>,
) -> bool {
    let Ok(lease) = serde_json::from_slice::<Lease>(bytes) else {
        return true;
    };
    if lease.process == process_token() {
        return !held().lock().expect("not poisoned").contains(&lease.holder);
    }
    let (here, boot, pidns) = (hostname(), boot_id(), pid_namespace());
    let same_namespace = !here.is_empty()
        && !boot.is_empty()
        && !pidns.is_empty()
        && lease.host == here
        && lease.boot == boot
        && lease.pidns == pidns;
    if same_namespace && process_gone(lease.pid, lease.start) {
        return true;
    }
    store_now - modified >= chrono::Duration::from_std(DEAD_AFTER).expect("fits")
}

/// Whether the process `pid` that started at `start` (0: unknown) is gone: no process
/// has the pid (a signal to it finds none), or the one that has it started at another
/// time (the pid was reused). A process this one may not signal, or whose start time
/// cannot be read (`/proc` mounted with `hidepid`), counts as alive.
fn process_gone(pid: u32, start: u64) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return true;
    };
    if let Err(rustix::io::Errno::SRCH) = rustix::process::test_kill_process(pid) {
        return true;
    }
    start != 0 && start_time(pid.as_raw_nonzero().get() as u32).is_some_and(|s| s != start)
}

/// What this machine's clock is ahead of the store's, per store, measured on a lease
/// this process wrote (its last-modified time against the local time of the write).
fn clock_offsets() -> &'static std::sync::Mutex<std::collections::HashMap<String, chrono::Duration>>
{
    static OFFSETS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, chrono::Duration>>,
    > = std::sync::OnceLock::new();
    OFFSETS.get_or_init(Default::default)
}

/// The version a put left: the only one a later update of that object may replace.
fn version_of(r: &object_store::PutResult) -> UpdateVersion {
    UpdateVersion {
        e_tag: r.e_tag.clone(),
        version: r.version.clone(),
    }
}

/// Keeps a run's lease fresh until dropped, then removes it.
struct LeaseGuard {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _holder: Holder,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        drop(self.stop.take());
        // Waiting for the lease's removal is a blocking wait: on an async worker the
        // thread finishes on its own (the lease is dead to every reader once the
        // holder is gone).
        if let Some(t) = self.thread.take()
            && crate::blocking::may_block()
        {
            let _ = t.join();
        }
    }
}

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

/// Whether `store` enforces the conditional writes the commit protocol stands on:
/// a second create-if-absent of one key must fail with `AlreadyExists`, and an update
/// against a version that is not the object's must fail with `Precondition`. Some
/// S3-compatible servers accept the headers and ignore them; on such a store two
/// writers could both "win" a partition, so idem refuses to write there. Leaves
/// nothing behind at `key`.
pub async fn probe_conditional_writes(
    store: &dyn ObjectStore,
    key: &ObjectPath,
) -> std::result::Result<(), Probe> {
    let put = |mode: PutMode| {
        store.put_opts(
            key,
            PutPayload::from_static(b"idem probe"),
            PutOptions::from(mode),
        )
    };
    let verdict = async {
        put(PutMode::Create).await.map_err(Probe::Failed)?;
        match put(PutMode::Create).await {
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Ok(_) => {
                return Err(Probe::Ignored(
                    "a second create-if-absent of one key succeeded",
                ));
            }
            Err(object_store::Error::NotImplemented { .. }) => {
                return Err(Probe::Ignored("create-if-absent is not implemented"));
            }
            Err(e) => return Err(Probe::Failed(e)),
        }
        let stale = UpdateVersion {
            e_tag: Some("\"00000000000000000000000000000000\"".into()),
            version: Some("1".into()),
        };
        match put(PutMode::Update(stale)).await {
            Err(object_store::Error::Precondition { .. }) => Ok(()),
            Ok(_) => Err(Probe::Ignored(
                "an update against a stale version succeeded",
            )),
            Err(object_store::Error::NotImplemented { .. }) => {
                Err(Probe::Ignored("update-if-match is not implemented"))
            }
            Err(e) => Err(Probe::Failed(e)),
        }
    }
    .await;
    store.delete(key).await.ok();
    verdict
}

/// Why a store failed [`probe_conditional_writes`].
#[derive(Debug)]
pub enum Probe {
    /// The store answered, and does not enforce conditional writes: a verdict.
    Ignored(&'static str),
    /// A request failed (network, permissions): no verdict.
    Failed(object_store::Error),
}

/// A multipart upload in progress, recorded under `_idem/<table>/uploads/<run id>/` so
/// that the parts of a run killed mid-upload can be aborted by the next run or `gc`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct UploadRecord {
    key: String,
    id: String,
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

    /// The table at `url`, configured from the environment alone (for commands that
    /// have no job file: `idem status`, `gc`, `log`, and reading inputs' digests).
    pub fn from_env(url: &str) -> Result<Self> {
        Self::new(
            url,
            &crate::store::StorageOptions::default(),
            &crate::store::local_staging_root(),
        )
    }

    /// Every partition of the table, at any depth: those with a marker, and the
    /// directories holding data files another tool wrote.
    pub fn partitions(&self) -> Result<Vec<PartitionPath>> {
        Ok(self.block(self.scan())?.into_iter().collect())
    }

    /// The partitions at every depth, from one listing of the markers and one of the
    /// table's objects.
    async fn scan(&self) -> Result<std::collections::BTreeSet<PartitionPath>> {
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
    pub fn is_idem_table(&self) -> Result<bool> {
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
    pub fn committed(&self) -> Result<Vec<(PartitionPath, Manifest, Vec<String>)>> {
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
    async fn committed_file(
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
    pub fn log(&self) -> Result<Vec<Restatement>> {
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
    pub fn staged_runs(&self) -> Result<Vec<String>> {
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

    /// Probes the store once per process, bucket and options (see
    /// [`probe_conditional_writes`]); a store that ignores conditional writes is refused
    /// with the reason. Only answers are remembered: a failed request is reported as
    /// such, and the next run probes again.
    async fn check_conditional_writes(&self) -> Result<()> {
        type Verdicts = std::collections::HashMap<
            (String, crate::store::StorageOptions),
            std::result::Result<(), &'static str>,
        >;
        static VERDICTS: std::sync::OnceLock<std::sync::Mutex<Verdicts>> =
            std::sync::OnceLock::new();
        let store_key = (
            crate::store::store_base(&self.url).unwrap_or_default(),
            self.options.clone(),
        );
        let verdicts = VERDICTS.get_or_init(Default::default);
        let known = verdicts
            .lock()
            .expect("not poisoned")
            .get(&store_key)
            .copied();
        let verdict = match known {
            Some(v) => v,
            None => {
                let key = self.probe_key();
                let v = match probe_conditional_writes(self.store.as_ref(), &key).await {
                    Ok(()) => Ok(()),
                    Err(Probe::Ignored(reason)) => Err(reason),
                    Err(Probe::Failed(e)) => {
                        return Err(self.err("probe conditional writes at", &key)(e));
                    }
                };
                verdicts.lock().expect("not poisoned").insert(store_key, v);
                v
            }
        };
        verdict.map_err(|reason| Error::Url {
            url: self.url.clone(),
            reason: format!(
                "this store does not enforce conditional writes ({reason}), which idem's \
                 commit needs to be safe against concurrent writers; refusing to write"
            ),
        })
    }

    /// A key of its own for each probe (runs of a backfill may probe at once) under
    /// `_idem/<table>/probe/`; `recover` removes any a killed process left.
    fn probe_key(&self) -> ObjectPath {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        raw_key(format!(
            "{}/probe/{:016x}-{}-{}",
            self.meta,
            xxhash_rust::xxh3::xxh3_64(format!("{}/{}", hostname(), boot_id()).as_bytes()),
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ))
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

    /// Whether the run that staged `run_id` is alive: its lease is fresh, and when it
    /// ran on this host, its process still exists.
    async fn run_alive(&self, run_id: &str) -> Result<bool> {
        let key = self.lease_key(run_id);
        Ok(match self.read("read lease", &key).await? {
            None => false,
            Some((meta, bytes)) => !lease_dead(&bytes, meta.last_modified, self.store_now()),
        })
    }

    /// Takes the table lock `_idem/<table>/<name>` (`writes.lock` for a merge,
    /// `publish.lock` for any publish): created only if absent; a dead holder's lock is
    /// taken over by a conditional overwrite of the version read, so two waiters cannot
    /// both win. A holder is dead on evidence (see [`lease_dead`]), or when its lock has
    /// not changed for three heartbeats as this process's own clock measures it (no
    /// other machine's clock is compared). Returns the version it wrote.
    async fn acquire(&self, name: &str, body: &[u8]) -> Result<UpdateVersion> {
        let key = raw_key(format!("{}/{name}", self.meta));
        let started = std::time::Instant::now();
        type Stamp = (Option<String>, chrono::DateTime<chrono::Utc>);
        let mut seen: Option<(Stamp, std::time::Instant)> = None;
        loop {
            let create = PutOptions::from(PutMode::Create);
            match self
                .store
                .put_opts(&key, PutPayload::from(body.to_vec()), create)
                .await
            {
                Ok(r) => return Ok(version_of(&r)),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(self.err("take the lock", &key)(e)),
            }
            let Some((meta, holder)) = self.read("read the lock", &key).await? else {
                continue;
            };
            let stamp = (meta.e_tag.clone(), meta.last_modified);
            let unchanged_for = match &seen {
                Some((seen_stamp, since)) if *seen_stamp == stamp => since.elapsed(),
                _ => {
                    seen = Some((stamp, std::time::Instant::now()));
                    std::time::Duration::ZERO
                }
            };
            if lease_dead(&holder, meta.last_modified, self.store_now())
                || unchanged_for >= 3 * HEARTBEAT
            {
                let version = UpdateVersion {
                    e_tag: meta.e_tag.clone(),
                    version: meta.version.clone(),
                };
                let take = PutOptions::from(PutMode::Update(version));
                match self
                    .store
                    .put_opts(&key, PutPayload::from(body.to_vec()), take)
                    .await
                {
                    Ok(r) => return Ok(version_of(&r)),
                    Err(
                        object_store::Error::Precondition { .. }
                        | object_store::Error::AlreadyExists { .. }
                        | object_store::Error::NotFound { .. },
                    ) => continue,
                    Err(e) => return Err(self.err("take over the lock", &key)(e)),
                }
            }
            if started.elapsed() > DEAD_AFTER {
                return Err(Error::Io {
                    op: "wait for the table's lock (held by a live writer)",
                    path: PathBuf::from(format!("{}/{key}", self.url)),
                    source: std::io::Error::other(String::from_utf8_lossy(&holder).into_owned()),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Holds the table lock `name` (see [`Self::acquire`]) until the guard drops.
    fn lock_table(&self, name: &str) -> Result<Guard> {
        let (body, holder) = lease_body();
        let version = self.block(self.acquire(name, &body))?;
        let key = raw_key(format!("{}/{name}", self.meta));
        self.hold(key, body, holder, version)
    }

    /// The store's clock now, as best this process knows it (see [`clock_offsets`]).
    fn store_now(&self) -> chrono::DateTime<chrono::Utc> {
        let base = crate::store::store_base(&self.url).unwrap_or_default();
        let offset = clock_offsets()
            .lock()
            .expect("not poisoned")
            .get(&base)
            .copied()
            .unwrap_or_default();
        chrono::Utc::now() - offset
    }

    /// Measures this machine's clock against the store's on the object `key` it has
    /// just written, once per store and process.
    async fn measure_clock(&self, key: &ObjectPath, written_at: chrono::DateTime<chrono::Utc>) {
        let base = crate::store::store_base(&self.url).unwrap_or_default();
        if clock_offsets()
            .lock()
            .expect("not poisoned")
            .contains_key(&base)
        {
            return;
        }
        if let Ok(meta) = self.store.head(key).await {
            // The store stamped the object between the request and its answer.
            let offset = written_at - meta.last_modified;
            clock_offsets()
                .lock()
                .expect("not poisoned")
                .insert(base, offset);
        }
    }

    /// Keeps `key` holding `body` (refreshed every `HEARTBEAT`, each time only over
    /// the version it wrote last, `version`) until the guard drops, then deletes it if
    /// it is still this holder's. A refresh that finds another version means the lease
    /// was taken over (this holder was judged dead): it stops, and never writes over
    /// the new holder.
    fn hold(
        &self,
        key: ObjectPath,
        body: Vec<u8>,
        holder: Holder,
        version: UpdateVersion,
    ) -> Result<Guard> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let table = self.clone();
        let thread = std::thread::Builder::new()
            .name("idem-lease".into())
            .spawn(move || {
                let mut version = Some(version);
                let mut body = body;
                // Refresh until the guard is dropped (the sender closes), then remove.
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(HEARTBEAT)
                {
                    let Some(current) = version.clone() else {
                        continue; // taken over: nothing more to refresh
                    };
                    let next = next_beat(&body);
                    let put = table.block(async {
                        let update = PutOptions::from(PutMode::Update(current));
                        table
                            .store
                            .put_opts(&key, PutPayload::from(next.clone()), update)
                            .await
                    });
                    match put {
                        Ok(r) => {
                            version = Some(version_of(&r));
                            body = next;
                        }
                        Err(
                            object_store::Error::Precondition { .. }
                            | object_store::Error::NotFound { .. },
                        ) => {
                            tracing::warn!(lease = %key, "this run's lease was taken over; it no longer holds it");
                            version = None;
                        }
                        Err(e) => tracing::warn!(error = %e, "could not refresh a lease"),
                    }
                }
                // Only if it is still this holder's: a holder taken for dead may have
                // been replaced (the lock taken over).
                if version.is_some() {
                    table.block(async {
                        if let Ok(Some((_, now))) = table.read("read lease", &key).await
                            && now == body
                        {
                            let _ = table.store.delete(&key).await;
                        }
                    });
                }
            })
            .map_err(Error::io("start the lease thread for", self.url.clone()))?;
        Ok(Box::new(LeaseGuard {
            stop: Some(tx),
            thread: Some(thread),
            _holder: holder,
        }))
    }

    /// Writes a run's lease (overwriting: the run id is its own) and measures the
    /// store's clock on it; the version written.
    fn put_lease(&self, key: &ObjectPath, body: &[u8]) -> Result<UpdateVersion> {
        let body = PutPayload::from(body.to_vec());
        self.block(async {
            let written_at = chrono::Utc::now();
            let r = self
                .store
                .put(key, body)
                .await
                .map_err(self.err("write lease", key))?;
            self.measure_clock(key, written_at).await;
            Ok(version_of(&r))
        })
    }

    fn staging_prefix(&self, run_id: &str) -> ObjectPath {
        raw_key(format!("{}/staging/{run_id}", self.meta))
    }

    /// The partition's marker and the version to update it against.
    async fn read_marker(&self, p: &PartitionPath) -> Result<Option<(Marker, UpdateVersion)>> {
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

    /// Every object directly in a partition (not in deeper partitions): its data files,
    /// and anything else a plain lister of the partition would meet.
    async fn list_partition(&self, p: &PartitionPath) -> Result<Vec<object_store::ObjectMeta>> {
        let prefix = self.partition_prefix(p);
        Ok(self.list_level(&prefix).await?.objects)
    }

    async fn upload(&self, local: &Path, key: &ObjectPath, run_id: &str) -> Result<u64> {
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
    async fn upload_recorded(
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
    async fn abort_recorded_uploads(&self, run_id: &str) -> Result<()> {
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

    /// Makes the partition hold exactly what `marker` lists: copies what is missing
    /// from its staged files, deletes what an older marker (or another tool) left.
    async fn apply(&self, p: &PartitionPath, marker: &Marker) -> Result<()> {
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
    async fn remove_superseded(&self, p: &PartitionPath) -> Result<()> {
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

    async fn publish_async(&self, written: &WrittenPartition) -> Result<PublishMode> {
        let p = &written.partition;
        let run_id = &written.manifest.run.run_id;
        let rel = p.rel_path().to_string_lossy().into_owned();
        let staging = if rel.is_empty() {
            format!("{}/_table", self.staging_prefix(run_id))
        } else {
            format!("{}/{rel}", self.staging_prefix(run_id))
        };
        let mut files = Vec::with_capacity(written.manifest.files.len());
        for f in &written.manifest.files {
            let key = raw_key(format!("{staging}/{}", f.name));
            let size = self
                .upload(&written.dir.join(&f.name), &key, run_id)
                .await?;
            files.push((f.name.clone(), size));
        }
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
        Err(Error::Io {
            op: "commit (the partition's marker kept changing under this run)",
            path: PathBuf::from(format!("{}/{rel}", self.url)),
            source: std::io::Error::other("too many concurrent commits"),
        })
    }

    /// Rolls forward what dead runs committed but did not apply, and removes what they
    /// staged without committing (once older than an hour: a live run may be uploading).
    async fn recover(&self) -> Result<Vec<String>> {
        // A probe lives for milliseconds: one older than a dead lease was left by a
        // killed process.
        let probes = raw_key(format!("{}/probe", self.meta));
        let stale = chrono::Utc::now() - DEAD_AFTER;
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

fn new_marker(
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
fn marker_version(m: &Marker) -> Version {
    Version(m.seq.to_string())
}

/// Whether `name` is the name of a data file an idem commit copied into a partition.
pub fn written_by_idem(name: &str) -> bool {
    seq_of(name).is_some()
}

/// The sequence number in a data file's name, `part-000003-00000.parquet` → 3 (six
/// digits at least: `part-1234567-00000.parquet` follows `part-999999-…`).
fn seq_of(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("part-")?;
    let (seq, rest) = rest.split_once('-')?;
    let index = rest.strip_suffix(".parquet")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if seq.len() < 6 || !digits(seq) || !digits(index) {
        return None;
    }
    seq.parse().ok()
}

impl CommitBackend for ObjectTable {
    fn location(&self) -> String {
        self.url.clone()
    }

    fn prepare(&self) -> Result<()> {
        self.block(self.check_conditional_writes())?;
        crate::durable::create_dir_all(&self.local)
    }

    fn lock_run(&self, run_id: &str) -> Result<Guard> {
        let key = self.lease_key(run_id);
        let (body, holder) = lease_body();
        let version = self.put_lease(&key, &body)?;
        self.hold(key, body, holder, version)
    }

    fn clean_dead_runs(&self) -> Result<Vec<String>> {
        self.block(self.recover())
    }

    fn lock_writes(&self) -> Result<Option<Guard>> {
        self.lock_table("writes.lock").map(Some)
    }

    fn lock_publish(&self) -> Result<Option<Guard>> {
        self.lock_table("publish.lock").map(Some)
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

    fn publish(&self, part: Checked) -> Result<Published> {
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

impl ObjectTable {
    /// Removes what run `run_id` uploaded to staging that no marker names.
    fn remove_unnamed_staging(&self, run_id: &str) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(pidns: &str, pid: u32, start: u64, process: u64, holder: u64) -> Vec<u8> {
        serde_json::to_vec(&Lease {
            host: hostname(),
            boot: boot_id(),
            pidns: pidns.into(),
            pid,
            start,
            process,
            holder,
            beat: 0,
        })
        .unwrap()
    }

    /// Liveness is judged by the evidence at hand, and only by the lease's age where
    /// there is none: a process in another pid namespace of the same host and kernel
    /// (another container of a pod) is not taken for dead because its pid is not ours.
    #[test]
    fn a_lease_is_dead_only_on_evidence() {
        let now = chrono::Utc::now();
        let (ours, me) = (pid_namespace(), std::process::id());
        let my_start = start_time(me).unwrap();
        // No such pid here, but another pid namespace: alive until stale.
        assert!(!lease_dead(&lease("pid:[1]", 4_000_000, 1, 7, 1), now, now));
        let stale = now - chrono::Duration::from_std(DEAD_AFTER).unwrap();
        assert!(lease_dead(
            &lease("pid:[1]", 4_000_000, 1, 7, 1),
            stale,
            now
        ));
        // Our namespace: a pid that is gone, or reused by a later process, is dead.
        assert!(lease_dead(&lease(&ours, 4_000_000, 1, 7, 1), now, now));
        assert!(lease_dead(&lease(&ours, me, my_start + 1, 7, 1), now, now));
        assert!(!lease_dead(&lease(&ours, me, my_start, 7, 1), now, now));
        // This process: alive exactly while the holder is.
        let (body, holder) = lease_body();
        assert!(!lease_dead(&body, now, now));
        drop(holder);
        assert!(lease_dead(&body, now, now));
        // Unreadable: dead.
        assert!(lease_dead(b"{", now, now));
    }

    /// A multipart upload whose record cannot be written is aborted at once (nothing
    /// could find it later); an upload whose abort fails keeps its record, so the next
    /// run or `idem gc` aborts it.
    #[test]
    fn multipart_uploads_are_never_left_unrecorded() {
        // Faults are counted only on this test's paths and keys (`mp-table`).
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("mp-table.parquet");
        std::fs::write(&big, vec![7u8; CHUNK + 1]).unwrap();
        let table =
            ObjectTable::new("memory://mp/mp-table", &Default::default(), dir.path()).unwrap();
        let key = raw_key("mp-table/big.parquet");
        let uploads = |t: &ObjectTable| {
            on_runtime(async {
                let records = t.list_all(&raw_key("_idem/mp-table/uploads")).await;
                records.unwrap().len()
            })
        };
        // The calls: read the staged file (1), start the upload (2), record it (3),
        // two parts (4, 5), complete (6), remove the record (7, which is not a failed
        // upload: the record names a completed upload, which aborts to nothing).
        for (fail, kept) in [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 1), (7, 1)] {
            crate::fault::arm_in(&["mp-table"], crate::fault::Mode::Fail, fail);
            let uploaded = on_runtime(table.upload(&big, &key, "r1"));
            let seen = crate::fault::disarm();
            assert!(seen.fired, "call {fail}: {seen:?}");
            assert_eq!(uploaded.is_ok(), fail == 7, "call {fail}: {uploaded:?}");
            assert_eq!(uploads(&table), kept, "failing call {fail}");
            if fail == 6 {
                // Recorded, not completed: the next cleaner aborts it; an abort that
                // fails (its third call) keeps the record for the one after.
                crate::fault::arm_in(&["mp-table"], crate::fault::Mode::Fail, 3);
                on_runtime(table.abort_recorded_uploads("r1")).unwrap();
                assert!(crate::fault::disarm().fired);
                assert_eq!(uploads(&table), 1);
                on_runtime(table.abort_recorded_uploads("r1")).unwrap();
                assert_eq!(uploads(&table), 0);
            }
            if fail == 7 {
                on_runtime(table.delete_prefix(&raw_key("_idem/mp-table/uploads"))).unwrap();
            }
        }
    }

    #[test]
    fn data_file_names_carry_the_sequence_number() {
        assert_eq!(seq_of("part-000003-00000.parquet"), Some(3));
        assert_eq!(seq_of("part-999999-00000.parquet"), Some(999_999));
        assert_eq!(seq_of("part-1000000-00002.parquet"), Some(1_000_000));
        assert_eq!(seq_of("part-000003-x.parquet"), None);
        assert_eq!(seq_of("part-00000a-00000.parquet"), None);
        assert_eq!(seq_of("part-00000.parquet"), None);
        assert_eq!(seq_of("part-3-00000.parquet"), None);
        assert_eq!(seq_of("x.parquet"), None);
    }

    /// A store that takes the conditional-write headers and ignores them, as some
    /// S3-compatible servers do: its puts overwrite (every put, or only updates when
    /// `.1` is true: creates are still checked).
    #[derive(Debug)]
    struct Unconditional(object_store::memory::InMemory, bool);

    impl std::fmt::Display for Unconditional {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Unconditional")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for Unconditional {
        async fn put_opts(
            &self,
            location: &ObjectPath,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            let opts = match opts.mode {
                PutMode::Create if self.1 => opts,
                _ => PutOptions::default(),
            };
            self.0.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            location: &ObjectPath,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }
        async fn get_opts(
            &self,
            location: &ObjectPath,
            options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.0.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<'static, object_store::Result<ObjectPath>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<ObjectPath>> {
            self.0.delete_stream(locations)
        }
        fn list(
            &self,
            prefix: Option<&ObjectPath>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.0.list(prefix)
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&ObjectPath>,
        ) -> object_store::Result<object_store::ListResult> {
            self.0.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &ObjectPath,
            to: &ObjectPath,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }

    fn on_runtime<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_store_that_enforces_conditional_writes_passes_the_probe_and_keeps_nothing() {
        let store = object_store::memory::InMemory::new();
        let key = ObjectPath::from("t/_idem/probe/1");
        on_runtime(async {
            assert!(probe_conditional_writes(&store, &key).await.is_ok());
            let left: Vec<_> = store.list(None).try_collect().await.unwrap();
            assert!(left.is_empty(), "{left:?}");
        });
    }

    #[test]
    fn a_store_that_ignores_conditional_writes_is_refused() {
        let key = ObjectPath::from("t/_idem/probe/1");
        let all = Unconditional(object_store::memory::InMemory::new(), false);
        let verdict = on_runtime(probe_conditional_writes(&all, &key));
        assert!(
            matches!(
                verdict,
                Err(Probe::Ignored(
                    "a second create-if-absent of one key succeeded"
                ))
            ),
            "{verdict:?}"
        );
        let updates = Unconditional(object_store::memory::InMemory::new(), true);
        let verdict = on_runtime(probe_conditional_writes(&updates, &key));
        assert!(
            matches!(
                verdict,
                Err(Probe::Ignored(
                    "an update against a stale version succeeded"
                ))
            ),
            "{verdict:?}"
        );
    }
}
