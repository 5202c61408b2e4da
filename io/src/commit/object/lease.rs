//! Leases: a live run's mark (`_idem/<table>/leases/<run id>.json`) and the table's
//! locks, refreshed every `HEARTBEAT` while held and judged dead only on evidence: a
//! process gone on this machine, or a lease not refreshed for `DEAD_AFTER` by the
//! store's clock (`IDEM_LEASE_TIMEOUT`).

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::store::raw_key;

use super::ObjectTable;

/// A live run refreshes its lease this often; a lease not refreshed for `DEAD_AFTER`
/// belongs to a dead run (on another machine: on this one, a dead pid says so at once).
pub(super) const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

/// Generous against clock skew: the lease's age is the store's clock against ours.
/// Also how long a writer waits for a table's lock held by a live writer.
const DEAD_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// The shortest `IDEM_LEASE_TIMEOUT` honoured: six heartbeats.
const MIN_DEAD_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The longest `IDEM_LEASE_TIMEOUT` accepted: a year. A dead run's staging would wait
/// that long for `gc`; longer is a typo.
const MAX_DEAD_AFTER: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// The environment variable that sets [`dead_after`].
pub const LEASE_TIMEOUT_ENV: &str = "IDEM_LEASE_TIMEOUT";

/// `$IDEM_LEASE_TIMEOUT` as a duration (`None` when unset), raised to `MIN_DEAD_AFTER`;
/// an error saying what is wrong with any other value than whole seconds up to a year.
pub fn lease_timeout_from_env() -> std::result::Result<Option<std::time::Duration>, String> {
    let Ok(text) = std::env::var(LEASE_TIMEOUT_ENV) else {
        return Ok(None);
    };
    let secs: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{LEASE_TIMEOUT_ENV}={text:?} is not a whole number of seconds"))?;
    let after = std::time::Duration::from_secs(secs);
    if after > MAX_DEAD_AFTER {
        return Err(format!(
            "{LEASE_TIMEOUT_ENV}={secs} is more than a year ({} seconds)",
            MAX_DEAD_AFTER.as_secs()
        ));
    }
    Ok(Some(after.max(MIN_DEAD_AFTER)))
}

/// How long a lease must go unrefreshed before its run counts as dead:
/// `$IDEM_LEASE_TIMEOUT` seconds, else `DEAD_AFTER`; never less than `MIN_DEAD_AFTER`,
/// so a live run is not judged dead for one slow refresh (a heartbeat's request may
/// itself take tens of seconds against a throttling store). A value the CLI would
/// refuse counts as unset here.
pub(super) fn dead_after() -> std::time::Duration {
    static AFTER: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| {
        lease_timeout_from_env()
            .ok()
            .flatten()
            .unwrap_or(DEAD_AFTER)
    })
}

/// A run's lease: `_idem/<table>/leases/<run id>.json` (and the body of the write
/// lock). It says who holds it, precisely enough for another process to tell whether
/// the holder is alive without waiting for the lease to go stale.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Lease {
    /// Hostname and boot id: a pid is only meaningful on the same boot of the same
    /// machine.
    pub(super) host: String,
    #[serde(default)]
    pub(super) boot: String,
    /// The pid namespace (`/proc/self/ns/pid`): containers of one pod share a hostname
    /// and a kernel, but not their pids.
    #[serde(default)]
    pub(super) pidns: String,
    pub(super) pid: u32,
    /// The process's start time in clock ticks since boot: a pid reused by a later
    /// process does not make a dead holder look alive.
    #[serde(default)]
    pub(super) start: u64,
    /// A token of the holding process and one of the holding guard: within one
    /// process, a lease is alive exactly while its guard is.
    #[serde(default)]
    pub(super) process: u64,
    #[serde(default)]
    pub(super) holder: u64,
    /// How many times the lease was refreshed: each refresh writes new content, so its
    /// ETag changes (a store's ETag of equal content is equal) and a waiter that sees
    /// the lease unchanged for three heartbeats knows the holder stopped refreshing.
    #[serde(default)]
    pub(super) beat: u64,
}

pub(super) use crate::commit::{boot_id, hostname};

pub(super) fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The start time (field 22 of `/proc/PID/stat`, clock ticks after boot) of `pid`.
pub(super) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is parenthesized and may hold spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// This process's token: random, so two processes never share one.
pub(super) fn process_token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() | 1
    })
}

/// The holder tokens of the leases this process holds now.
pub(super) fn held() -> &'static std::sync::Mutex<std::collections::BTreeSet<u64>> {
    static HELD: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeSet<u64>>> =
        std::sync::OnceLock::new();
    HELD.get_or_init(Default::default)
}

/// A holder of a lease in this process: alive (to every reader of its lease in this
/// process) until dropped.
pub(super) struct Holder(u64);

impl Drop for Holder {
    fn drop(&mut self) {
        held().lock().expect("not poisoned").remove(&self.0);
    }
}

/// A lease body for a new holder in this process, registered as alive before the body
/// can be put anywhere.
pub(super) fn lease_body() -> (Vec<u8>, Holder) {
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
pub(super) fn next_beat(body: &[u8]) -> Vec<u8> {
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
pub(super) fn lease_dead(
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
    store_now - modified
        >= chrono::Duration::from_std(dead_after()).unwrap_or(chrono::Duration::MAX)
}

/// Whether the process `pid` that started at `start` (0: unknown) is gone: no process
/// has the pid (a signal to it finds none), or the one that has it started at another
/// time (the pid was reused). A process this one may not signal, or whose start time
/// cannot be read (`/proc` mounted with `hidepid`), counts as alive.
pub(super) fn process_gone(pid: u32, start: u64) -> bool {
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
pub(super) fn clock_offsets()
-> &'static std::sync::Mutex<std::collections::HashMap<String, chrono::Duration>> {
    static OFFSETS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, chrono::Duration>>,
    > = std::sync::OnceLock::new();
    OFFSETS.get_or_init(Default::default)
}

/// The version a put left: the only one a later update of that object may replace.
pub(super) fn version_of(r: &object_store::PutResult) -> UpdateVersion {
    UpdateVersion {
        e_tag: r.e_tag.clone(),
        version: r.version.clone(),
    }
}

/// Keeps a run's lease fresh until dropped, then removes it.
pub(super) struct LeaseGuard {
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

impl ObjectTable {
    /// Whether the run that staged `run_id` is alive: its lease is fresh, and when it
    /// ran on this host, its process still exists.
    pub(super) async fn run_alive(&self, run_id: &str) -> Result<bool> {
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
    pub(super) async fn acquire(&self, name: &str, body: &[u8]) -> Result<UpdateVersion> {
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
                return Err(Error::Contention {
                    op: "wait for the table's lock (held by a live writer)",
                    location: format!("{}/{key}", self.url),
                    reason: String::from_utf8_lossy(&holder).into_owned(),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Holds the table lock `name` (see [`Self::acquire`]) until the guard drops.
    pub(super) fn lock_table(&self, name: &str) -> Result<LeaseGuard> {
        let (body, holder) = lease_body();
        let version = self.block(self.acquire(name, &body))?;
        let key = raw_key(format!("{}/{name}", self.meta));
        self.hold(key, body, holder, version)
    }

    /// The store's clock now, as best this process knows it (see [`clock_offsets`]).
    pub(super) fn store_now(&self) -> chrono::DateTime<chrono::Utc> {
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
    pub(super) async fn measure_clock(
        &self,
        key: &ObjectPath,
        written_at: chrono::DateTime<chrono::Utc>,
    ) {
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
    pub(super) fn hold(
        &self,
        key: ObjectPath,
        body: Vec<u8>,
        holder: Holder,
        version: UpdateVersion,
    ) -> Result<LeaseGuard> {
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
        Ok(LeaseGuard {
            stop: Some(tx),
            thread: Some(thread),
            _holder: holder,
        })
    }

    /// Writes a run's lease (overwriting: the run id is its own) and measures the
    /// store's clock on it; the version written.
    pub(super) fn put_lease(&self, key: &ObjectPath, body: &[u8]) -> Result<UpdateVersion> {
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
}
