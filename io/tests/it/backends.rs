//! The conformance suite of the commit backend trait: the same scenarios against
//! every backend — a local directory, object_store's in-memory store, an S3-compatible
//! server (moto) and Azure Blob Storage (Azurite) — one generated test per backend and
//! scenario, so a failure on one backend hides no other.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::record_batch::RecordBatch;
use idem_io::commit::local::LocalTable;
use idem_io::commit::object::ObjectTable;
use idem_io::commit::{Checked, CommitBackend, PublishMode, Version};
use idem_io::hive::PartitionPath;
use idem_io::manifest::{LiveState, RunInfo, describe_schema};
use idem_io::writer::{PartitionWriter, WriterOptions, WrittenPartition};

/// A table of one backend, in a place of its own.
struct Subject {
    table: Arc<dyn CommitBackend>,
    _dir: tempfile::TempDir,
}

fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn local() -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let table = LocalTable::new(&dir.path().join("t"));
    Subject {
        table: Arc::new(table),
        _dir: dir,
    }
}

fn object(url: String) -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let table = ObjectTable::new(&url, &Default::default(), dir.path()).unwrap();
    Subject {
        table: Arc::new(table),
        _dir: dir,
    }
}

fn memory() -> Subject {
    object(format!("memory://conformance/{}/t", unique("m")))
}

/// A bucket (or container) made once per process on the server at `endpoint`.
fn bucket(scheme: &str, endpoint: &str) -> String {
    static MADE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let name = format!("idem-conformance-{}", std::process::id());
    let mut made = MADE.lock().unwrap();
    if !made.contains(&format!("{scheme}{name}")) {
        idem_testdata::servers::create_bucket(endpoint, &format!("{scheme}://{name}/"));
        made.push(format!("{scheme}{name}"));
    }
    name
}

fn moto() -> Subject {
    let b = bucket("s3", idem_testdata::servers::s3_endpoint());
    object(format!("s3://{b}/{}/t", unique("s")))
}

#[cfg(feature = "azure")]
fn azurite() -> Subject {
    let b = bucket("az", idem_testdata::servers::azurite_endpoint());
    object(format!("az://{b}/{}/t", unique("a")))
}

/// The in-process client reaches a server through its usual environment variables:
/// without them, the test runs itself again with them. `true` when it did.
fn rerun_with(test: &str, env: Vec<(&'static str, String)>) -> bool {
    if std::env::var_os("IDEM_CONFORMANCE_CHILD").is_some() {
        return false;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .envs(env)
        .env("IDEM_CONFORMANCE_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

fn batch(ids: std::ops::Range<i64>, tag: &str) -> RecordBatch {
    let names: Vec<String> = ids.clone().map(|i| format!("{tag}-{i}")).collect();
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef,
        ),
        ("name", Arc::new(StringArray::from(names)) as ArrayRef),
    ])
    .unwrap()
}

/// Stages partition `p` for run `run` with the rows of `b`.
fn stage(t: &dyn CommitBackend, run: &str, p: &PartitionPath, b: &RecordBatch) -> WrittenPartition {
    let mut w = PartitionWriter::new(
        p.clone(),
        t.staging_dir(run, p),
        b.schema(),
        WriterOptions::default(),
    )
    .unwrap();
    w.write(b).unwrap();
    let info = RunInfo {
        job: "conformance".into(),
        run_id: run.into(),
        ..Default::default()
    };
    w.finish(&info, describe_schema(&b.schema(), &[])).unwrap()
}

fn day(value: &str) -> PartitionPath {
    PartitionPath::new(vec![("dt".into(), Some(value.into()))])
}

/// Publishes `b` as partition `p` in a run of its own; the publish mode.
fn publish(t: &dyn CommitBackend, p: &PartitionPath, b: &RecordBatch) -> PublishMode {
    publish_expecting(t, p, b, None).unwrap()
}

/// A staged partition that passed no checks (these tests have none).
fn checked(written: WrittenPartition) -> Checked {
    let all = Checked::all(vec![written], async |_| Ok::<_, ()>(()));
    futures::executor::block_on(all).unwrap().remove(0)
}

fn publish_expecting(
    t: &dyn CommitBackend,
    p: &PartitionPath,
    b: &RecordBatch,
    expected: Option<Option<Version>>,
) -> idem_io::Result<PublishMode> {
    let run = unique("run");
    t.prepare().unwrap();
    let guard = t.lock_run(&run).unwrap();
    let mut written = stage(t, &run, p, b);
    if let Some(version) = expected {
        written = written.expecting(version);
    }
    let fence = t.lock_publish().unwrap();
    let published = t.publish(checked(written), &fence).map(|p| p.mode);
    drop(fence);
    t.cleanup_run(&run).unwrap();
    drop(guard);
    published
}

fn managed(t: &dyn CommitBackend, p: &PartitionPath) -> idem_io::manifest::Manifest {
    match t.live_state(p).unwrap() {
        Some(LiveState::Managed(m)) => *m,
        other => panic!("{p}: {other:?}"),
    }
}

fn digest(b: &RecordBatch) -> String {
    idem_io::digest::digest_batch(b).finish()
}

// The scenarios.

fn a_published_partition_reads_back_whole(t: &dyn CommitBackend) {
    let p = day("2026-06-01");
    let b = batch(0..100, "a");
    assert_eq!(t.live_version(&p).unwrap(), None);
    assert_eq!(publish(t, &p, &b), PublishMode::Created);
    let m = managed(t, &p);
    assert_eq!((m.digest, m.rows), (digest(&b), 100));
    assert_eq!(t.live_partitions(1).unwrap(), vec![p.clone()]);
    assert!(t.live_version(&p).unwrap().is_some());
    assert!(t.clean_dead_runs().unwrap().is_empty());
}

fn a_new_version_replaces_the_old_and_moves_the_version(t: &dyn CommitBackend) {
    let p = day("2026-06-01");
    publish(t, &p, &batch(0..10, "a"));
    let v1 = t.live_version(&p).unwrap();
    let b = batch(5..30, "b");
    let mode = publish(t, &p, &b);
    assert!(
        matches!(mode, PublishMode::Exchanged | PublishMode::Committed),
        "{mode:?}"
    );
    assert_eq!(managed(t, &p).digest, digest(&b));
    assert_ne!(t.live_version(&p).unwrap(), v1);
}

fn a_publish_over_a_version_it_did_not_read_is_a_conflict(t: &dyn CommitBackend) {
    let p = day("2026-06-01");
    publish(t, &p, &batch(0..10, "a"));
    let read = t.live_version(&p).unwrap();
    // Another writer publishes meanwhile.
    let other = batch(0..10, "other");
    publish(t, &p, &other);
    let late = publish_expecting(t, &p, &batch(0..10, "late"), Some(read));
    assert!(
        matches!(late, Err(idem_io::Error::Conflict { .. })),
        "{late:?}"
    );
    assert_eq!(managed(t, &p).digest, digest(&other));
    // Over the version it did read, it publishes.
    let now = t.live_version(&p).unwrap();
    let b = batch(0..10, "merged");
    publish_expecting(t, &p, &b, Some(now)).unwrap();
    assert_eq!(managed(t, &p).digest, digest(&b));
    // A partition expected not to exist, that exists: a conflict too.
    let created = publish_expecting(t, &day("2026-06-02"), &b, Some(None)).unwrap();
    assert_eq!(created, PublishMode::Created);
    let again = publish_expecting(t, &day("2026-06-02"), &b, Some(None));
    assert!(
        matches!(again, Err(idem_io::Error::Conflict { .. })),
        "{again:?}"
    );
}

fn dead_runs_are_cleaned_and_live_ones_are_not(t: &dyn CommitBackend) {
    t.prepare().unwrap();
    let p = day("2026-06-01");
    let (dead, live) = (unique("dead"), unique("live"));
    let dead_guard = t.lock_run(&dead).unwrap();
    let _staged = stage(t, &dead, &p, &batch(0..10, "d"));
    let live_guard = t.lock_run(&live).unwrap();
    let staged = stage(t, &live, &p, &batch(0..10, "l"));
    drop(dead_guard); // the dead run: gone without cleaning up
    let cleaned = t.clean_dead_runs().unwrap();
    assert_eq!(cleaned, vec![dead.clone()]);
    // The live run publishes what it staged.
    let fence = t.lock_publish().unwrap();
    t.publish(checked(staged), &fence).unwrap();
    drop(fence);
    assert_eq!(managed(t, &p).digest, digest(&batch(0..10, "l")));
    t.cleanup_run(&live).unwrap();
    drop(live_guard);
    assert!(t.clean_dead_runs().unwrap().is_empty());
}

fn partition_values_come_back_exactly(t: &dyn CommitBackend) {
    let values = [
        "2026-06-04 01:00:00",
        "a/b=c%d",
        "100%",
        "é 日本 🦀",
        "#?*[]{}^",
        "..",
    ];
    for (i, v) in values.iter().enumerate() {
        publish(t, &day(v), &batch(i as i64..i as i64 + 3, "v"));
    }
    let mut expected: Vec<PartitionPath> = values.iter().map(|v| day(v)).collect();
    expected.sort();
    assert_eq!(t.live_partitions(1).unwrap(), expected);
    for v in values {
        managed(t, &day(v));
    }
}

fn a_root_holding_other_things_is_refused(t: &dyn CommitBackend) {
    let p = day("2026-06-01");
    publish(t, &p, &batch(0..3, "a"));
    t.check_layout(&["dt".into()]).unwrap();
    let wrong = t.check_layout(&["region".into()]);
    assert!(
        matches!(wrong, Err(idem_io::Error::Layout { .. })),
        "{wrong:?}"
    );
    // Something else beside the partitions.
    let location = t.location();
    if idem_io::store::is_url(&location) {
        let store = idem_io::store::object_store(&location, &Default::default()).unwrap();
        let key =
            idem_io::store::raw_key(format!("{}/notes.txt", idem_io::store::key_of(&location)));
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                use object_store::ObjectStoreExt;
                store
                    .put(&key, object_store::PutPayload::from_static(b"mine"))
                    .await
                    .unwrap();
            });
    } else {
        std::fs::write(std::path::Path::new(&location).join("notes.txt"), "mine").unwrap();
    }
    let refused = t.check_layout(&["dt".into()]).unwrap_err().to_string();
    assert!(refused.contains("notes.txt (a file)"), "{refused}");
}

fn concurrent_publishers_of_one_partition_all_land_whole(t: &dyn CommitBackend) {
    let p = day("2026-06-01");
    publish(t, &p, &batch(0..5, "first"));
    let batches: Vec<RecordBatch> = (0..4).map(|i| batch(0..50, &format!("w{i}"))).collect();
    std::thread::scope(|s| {
        for b in &batches {
            let p = &p;
            s.spawn(move || publish(t, p, b));
        }
    });
    let m = managed(t, &p);
    assert!(batches.iter().any(|b| digest(b) == m.digest));
    assert!(t.clean_dead_runs().unwrap().is_empty());
}

fn a_restatement_is_logged_once(t: &dyn CommitBackend) {
    t.prepare().unwrap();
    let event = idem_io::log::Restatement {
        partition: "dt=2026-06-01".into(),
        old_digest: "a".into(),
        new_digest: "b".into(),
        old_rows: 1,
        new_rows: 2,
        job: "j".into(),
        job_fingerprint: "f".into(),
        logical_date: "2026-06-01".into(),
        run_id: unique("run"),
        replaced_run_id: "r0".into(),
    };
    t.append_log(&event).unwrap();
    t.append_log(&event).unwrap(); // a retried append
    let location = t.location();
    let events = if idem_io::store::is_url(&location) {
        ObjectTable::new(&location, &Default::default(), &std::env::temp_dir())
            .unwrap()
            .log()
            .unwrap()
    } else {
        let local = LocalTable::new(std::path::Path::new(&location));
        idem_io::log::read(&local.log_dir()).unwrap()
    };
    assert_eq!(events, vec![event]);
}

macro_rules! conformance {
    ($($backend:ident: $make:expr, $env:expr;)*) => {$(
        mod $backend {
            use super::*;

            fn run(test: &str, scenario: fn(&dyn CommitBackend)) {
                if let Some(env) = $env && rerun_with(&format!("backends::{}::{test}", stringify!($backend)), env) {
                    return;
                }
                let subject = $make;
                scenario(subject.table.as_ref());
            }

            #[test]
            fn a_published_partition_reads_back_whole() {
                run("a_published_partition_reads_back_whole", super::a_published_partition_reads_back_whole)
            }
            #[test]
            fn a_new_version_replaces_the_old_and_moves_the_version() {
                run("a_new_version_replaces_the_old_and_moves_the_version", super::a_new_version_replaces_the_old_and_moves_the_version)
            }
            #[test]
            fn a_publish_over_a_version_it_did_not_read_is_a_conflict() {
                run("a_publish_over_a_version_it_did_not_read_is_a_conflict", super::a_publish_over_a_version_it_did_not_read_is_a_conflict)
            }
            #[test]
            fn dead_runs_are_cleaned_and_live_ones_are_not() {
                run("dead_runs_are_cleaned_and_live_ones_are_not", super::dead_runs_are_cleaned_and_live_ones_are_not)
            }
            #[test]
            fn partition_values_come_back_exactly() {
                run("partition_values_come_back_exactly", super::partition_values_come_back_exactly)
            }
            #[test]
            fn a_root_holding_other_things_is_refused() {
                run("a_root_holding_other_things_is_refused", super::a_root_holding_other_things_is_refused)
            }
            #[test]
            fn concurrent_publishers_of_one_partition_all_land_whole() {
                run("concurrent_publishers_of_one_partition_all_land_whole", super::concurrent_publishers_of_one_partition_all_land_whole)
            }
            #[test]
            fn a_restatement_is_logged_once() {
                run("a_restatement_is_logged_once", super::a_restatement_is_logged_once)
            }
        }
    )*};
}

fn no_env() -> Option<Vec<(&'static str, String)>> {
    None
}

fn s3_env() -> Option<Vec<(&'static str, String)>> {
    let mut env = idem_testdata::servers::s3_env();
    env.push((
        "IDEM_S3_ENDPOINT",
        idem_testdata::servers::s3_endpoint().to_string(),
    ));
    Some(env)
}

#[cfg(feature = "azure")]
fn az_env() -> Option<Vec<(&'static str, String)>> {
    let mut env = idem_testdata::servers::az_env();
    env.push((
        "IDEM_AZURITE_ENDPOINT",
        idem_testdata::servers::azurite_endpoint().to_string(),
    ));
    Some(env)
}

conformance! {
    local: local(), no_env();
    in_memory: memory(), no_env();
    moto: moto(), s3_env();
}

#[cfg(feature = "azure")]
conformance! {
    azurite: azurite(), az_env();
}
