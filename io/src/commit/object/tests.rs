//! Unit tests of the object-store backend's parts.

use super::lease::*;
use super::probe::*;
use super::upload::*;
use super::*;
use crate::manifest::seq_of;
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
    let stale = now - chrono::Duration::from_std(dead_after()).unwrap();
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
    let table = ObjectTable::new("memory://mp/mp-table", &Default::default(), dir.path()).unwrap();
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
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
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
