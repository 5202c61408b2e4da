//! The commit-protocol conformance suite: the same scenarios against every backend —
//! a local directory (renameat2 swap), an S3-compatible server (moto on 127.0.0.1) and
//! Azure Blob Storage (Azurite on 127.0.0.1), both with conditional-put markers. Each
//! test runs its scenario on all three.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;
use crate::s3::bucket;

/// A month job over the sample lake: seven daily partitions per run.
pub const MONTH_JOB: &str = r#"
name = "crashy"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = """
select order_id, customer_id, amount_usd, status, created_date as dt
from orders
where created_date >= $run_date and created_date < cast($run_end as date)
"""
[target]
path = "TARGET"
partition_by = ["dt"]
grain = "month"
row_group_rows = 200
"#;

const DAILY_JOB: &str = r#"
name = "daily"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = "select order_id, customer_id, amount_usd, status, created_date as dt from orders where created_date = $run_date"
[target]
path = "TARGET"
partition_by = ["dt"]
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Local,
    S3,
    Azure,
}

impl Backend {
    /// The URL scheme of an object-store backend.
    pub fn scheme(self) -> &'static str {
        match self {
            Backend::Local => "file",
            Backend::S3 => "s3",
            Backend::Azure => "az",
        }
    }

    /// The test server's endpoint, for the readers.
    pub fn endpoint(self) -> &'static str {
        match self {
            Backend::Local => "",
            Backend::S3 => s3_endpoint(),
            Backend::Azure => azurite_endpoint(),
        }
    }

    /// The environment a run needs to reach the backend's server.
    pub fn env(self) -> Vec<(&'static str, String)> {
        match self {
            Backend::Local => Vec::new(),
            Backend::S3 => s3_env(),
            Backend::Azure => az_env(),
        }
    }
}

/// A lake whose jobs write to one backend; `out/ref` is a local reference table of
/// the same month job. The second source state (B) is the same days regenerated with
/// another seed.
pub struct Table {
    pub lake: Lake,
    pub backend: Backend,
    pub bucket: String,
    /// The month job (table `crashy`), the daily job (table `daily`), and the month job
    /// writing the local reference table `out/ref`.
    pub job: String,
    pub daily_job: String,
    pub ref_job: String,
    b: tempfile::TempDir,
}

/// What the scenarios that apply to a cluster append to the month and daily jobs.
const ON_STANDALONE_CLUSTER: &str = "\n[execution]\ncluster = \"standalone\"\npartitions = 3\n";

impl Table {
    pub fn new(backend: Backend, tag: &str) -> Table {
        Table::with_execution(backend, tag, "")
    }

    /// A table whose month and daily jobs run their plans as `execution` (a job
    /// file's `[execution]` table) says; the reference job runs in the process.
    pub fn with_execution(backend: Backend, tag: &str, execution: &str) -> Table {
        let lake = Lake::new();
        let bucket = bucket(tag);
        if backend != Backend::Local {
            idem_testdata::servers::create_bucket(
                backend.endpoint(),
                &format!("{}://{bucket}/", backend.scheme()),
            );
        }
        let target = |name: &str| match backend {
            Backend::Local => format!("out/{name}"),
            _ => format!("{}://{bucket}/lake/{name}", backend.scheme()),
        };
        let job = lake.job(
            "crashy",
            &(MONTH_JOB.replace("TARGET", &target("crashy")) + execution),
        );
        let daily_job = lake.job(
            "daily",
            &(DAILY_JOB.replace("TARGET", &target("daily")) + execution),
        );
        let ref_job = lake.job("ref", &MONTH_JOB.replace("TARGET", "out/ref"));
        let b = tempfile::tempdir().unwrap();
        let spec = idem_testdata::OrdersSpec {
            seed: 9,
            ..Default::default()
        };
        idem_testdata::write_orders(b.path(), &spec).unwrap();
        Table {
            lake,
            backend,
            bucket,
            job,
            daily_job,
            ref_job,
            b,
        }
    }

    /// The table `name` (`crashy`, `daily`) as idem names it.
    pub fn target(&self, name: &str) -> String {
        match self.backend {
            Backend::Local => self.lake.join(&format!("out/{name}")).display().to_string(),
            _ => self.url(&format!("lake/{name}")),
        }
    }

    pub fn url(&self, rel: &str) -> String {
        format!("{}://{}/{rel}", self.backend.scheme(), self.bucket)
    }

    pub fn idem(&self, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
        let env = self.backend.env();
        let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend_from_slice(extra);
        idem_in(self.lake.path(), args, &all)
    }

    pub fn run_ok(&self, job: &str) -> Vec<Value> {
        self.ok(&["run", job, "--date", "2026-06", "--json"])
    }

    pub fn ok(&self, args: &[&str]) -> Vec<Value> {
        let out = self.idem(args, &[]);
        assert!(
            out.status.success(),
            "{:?} on {:?}: {}",
            args,
            self.backend,
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out)
    }

    pub fn switch_to_a(&self) {
        copy_dir(
            &repo_root().join("testdata/lake/raw/orders"),
            &self.lake.join("testdata/lake/raw/orders"),
        );
    }

    /// Replaces one day of the source with state B (or all days when `day` is None).
    pub fn switch_to_b(&self, day: Option<&str>) {
        let raw = self.lake.join("testdata/lake/raw/orders");
        match day {
            None => copy_dir(self.b.path(), &raw),
            Some(d) => copy_dir(
                &self.b.path().join(format!("created_date={d}")),
                &raw.join(format!("created_date={d}")),
            ),
        }
    }

    /// `idem status` of table `name`, every partition asserted managed.
    pub fn status(&self, name: &str) -> Value {
        let s = self.status_any(name);
        for p in s["partitions"].as_array().unwrap() {
            assert_eq!(p["state"], "managed", "{:?}: {p}", self.backend);
        }
        s
    }

    /// `idem status` of table `name`, whatever its partitions' states.
    pub fn status_any(&self, name: &str) -> Value {
        let out = self.idem(&["status", &self.target(name), "--json"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// partition -> digest of the month table read through its commits, partitions
    /// whose apply is unfinished included (`pending`: a plain lister may see old and
    /// new files there until the next run or `idem gc`).
    pub fn committed_digests(&self) -> BTreeMap<String, String> {
        let s = self.status_any("crashy");
        for p in s["partitions"].as_array().unwrap() {
            assert!(
                p["state"] == "managed"
                    || (self.backend != Backend::Local && p["state"] == "pending"),
                "{:?}: {p}",
                self.backend
            );
        }
        digests_of(&s)
    }

    /// partition -> digest of the month table, read as idem reads it.
    pub fn digests(&self) -> BTreeMap<String, String> {
        digests_of(&self.status("crashy"))
    }

    /// The clean-run digests of the current source state (a local run of the same job).
    pub fn reference(&self) -> BTreeMap<String, String> {
        self.run_ok(&self.ref_job);
        status_digests(&self.lake, "out/ref")
    }

    /// Keys under `rel` in the bucket.
    pub fn keys(&self, rel: &str) -> Vec<String> {
        readers(&["list", self.backend.endpoint(), &self.url(rel)])
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect()
    }

    /// Everything a run may touch, with content hashes (local) or keys (S3): equal
    /// before and after means nothing changed.
    fn everything(&self) -> Vec<String> {
        match self.backend {
            Backend::Local => snapshot(&self.lake.join("out/crashy"))
                .into_iter()
                .map(|(k, v)| format!("{k} {v:?}"))
                .collect(),
            _ => self.keys("lake/"),
        }
    }

    /// The data files of table `name`, relative to its root.
    pub fn data_files(&self, name: &str) -> Vec<String> {
        match self.backend {
            Backend::Local => snapshot(&self.lake.join(&format!("out/{name}")))
                .into_keys()
                .filter(|k| k.ends_with(".parquet"))
                .collect(),
            _ => self
                .keys(&format!("lake/{name}/"))
                .into_iter()
                .map(|k| k.trim_start_matches(&format!("lake/{name}/")).to_string())
                .collect(),
        }
    }

    /// What runs left staged for the month table.
    fn staged(&self) -> Vec<String> {
        match self.backend {
            Backend::Local => std::fs::read_dir(self.lake.join("out/_idem/crashy/staging"))
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default(),
            _ => self.keys("lake/_idem/crashy/staging/"),
        }
    }

    fn log_events(&self) -> usize {
        match self.backend {
            Backend::Local => std::fs::read_dir(self.lake.join("out/_idem/crashy/log"))
                .map(|rd| rd.count())
                .unwrap_or(0),
            _ => self.keys("lake/_idem/crashy/log/").len(),
        }
    }

    /// What a plain reader (DuckDB, Polars, pyarrow listing the table) sees.
    pub fn plain_rows(&self) -> Value {
        self.plain_rows_of("crashy")
    }

    /// What a plain reader sees of the daily table.
    pub fn plain_daily_rows(&self) -> Value {
        self.plain_rows_of("daily")
    }

    fn plain_rows_of(&self, name: &str) -> Value {
        match self.backend {
            Backend::Local => readers(&["table", &self.target(name)]),
            _ => {
                let dir = tempfile::tempdir().unwrap();
                readers(&[
                    "get",
                    self.backend.endpoint(),
                    &self.url(&format!("lake/{name}/")),
                    dir.path().to_str().unwrap(),
                ]);
                readers(&["table", dir.path().to_str().unwrap()])
            }
        }
    }

    /// The clean state: the digests are `expected`, every partition holds exactly its
    /// manifest's files (one each here), and nothing is staged.
    pub fn assert_clean(&self, expected: &BTreeMap<String, String>, context: &str) {
        assert_eq!(&self.digests(), expected, "{:?} {context}", self.backend);
        let data = self.data_files("crashy");
        assert_eq!(
            data.len(),
            expected.len(),
            "{:?} {context}: {data:?}",
            self.backend
        );
        assert!(
            self.staged().is_empty(),
            "{:?} {context}: staging left behind: {:?}",
            self.backend,
            self.staged()
        );
    }
}

fn digests_of(status: &Value) -> BTreeMap<String, String> {
    status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["partition"].as_str().unwrap().to_string(),
                p["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn twice_run_is_unchanged_and_one_changed_day_rewrites_one_partition(
    backend: Backend,
    execution: &str,
) {
    let t = Table::with_execution(backend, "twice", execution);
    let first = t.run_ok(&t.job);
    assert_eq!(actions(&first).len(), 7, "{backend:?}");
    // The report names where the plan ran.
    let ran_on = (!execution.is_empty()).then_some("standalone");
    assert_eq!(first[0]["cluster"].as_str(), ran_on, "{backend:?}");
    assert!(actions(&first).iter().all(|(_, a)| a == "written"));
    assert_eq!(t.digests(), t.reference(), "{backend:?}");
    assert_eq!(
        t.plain_rows(),
        readers(&["table", t.lake.join("out/ref").to_str().unwrap()]),
        "{backend:?}"
    );
    let before = t.everything();
    let again = t.run_ok(&t.job);
    assert!(
        actions(&again).iter().all(|(_, a)| a == "unchanged"),
        "{backend:?}"
    );
    assert_eq!(
        t.everything(),
        before,
        "{backend:?}: a re-run wrote something"
    );

    t.switch_to_b(Some("2026-06-03"));
    let changed = t.run_ok(&t.job);
    let written: Vec<_> = actions(&changed)
        .into_iter()
        .filter(|(_, a)| a != "unchanged")
        .collect();
    assert_eq!(
        written,
        vec![("dt=2026-06-03".into(), "written".into())],
        "{backend:?}"
    );
    t.assert_clean(&t.reference(), "after one changed day");
    assert_eq!(t.log_events(), 1, "{backend:?}: one restatement");
    let log = t.ok(&["log", &t.target("crashy"), "--json"]);
    assert_eq!(log.len(), 1, "{backend:?}: {log:?}");
    assert_eq!(log[0]["partition"], "dt=2026-06-03", "{backend:?}");
}

/// `--rewrite` publishes a partition equal to the live one again, in new files (what a
/// change of writer settings needs), with the same rows and digest; a plain re-run
/// after it is unchanged and writes nothing.
fn rewrite_publishes_the_same_rows_in_new_files(backend: Backend) {
    let t = Table::new(backend, "rewrite");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", &t.daily_job, "--date", "2026-06-02", "--json"];
        args.extend_from_slice(extra);
        t.ok(&args)
    };
    let first = run(&[]);
    assert_eq!(
        actions(&first),
        vec![("dt=2026-06-02".into(), "written".into())],
        "{backend:?}"
    );
    let (files, digests, rows) = (
        t.data_files("daily"),
        digests_of(&t.status("daily")),
        t.plain_daily_rows(),
    );
    let rewritten = run(&["--rewrite"]);
    assert_eq!(
        actions(&rewritten),
        vec![("dt=2026-06-02".into(), "written".into())],
        "{backend:?}: --rewrite must publish the equal partition"
    );
    let new_files = t.data_files("daily");
    assert_eq!(new_files.len(), files.len(), "{backend:?}: {new_files:?}");
    assert!(
        new_files.iter().all(|f| !files.contains(f)),
        "{backend:?}: --rewrite kept files {files:?} -> {new_files:?}"
    );
    assert_eq!(digests_of(&t.status("daily")), digests, "{backend:?}");
    assert_eq!(t.plain_daily_rows(), rows, "{backend:?}");
    let again = run(&[]);
    assert_eq!(
        actions(&again),
        vec![("dt=2026-06-02".into(), "unchanged".into())],
        "{backend:?}"
    );
    assert_eq!(t.data_files("daily"), new_files, "{backend:?}");
}

fn an_owned_day_without_rows_is_a_zero_row_partition_and_backfills_rerun_clean(
    backend: Backend,
    execution: &str,
) {
    let t = Table::with_execution(backend, "empty", execution);
    // 2026-06-09 has no source rows: the run still owns and publishes the day.
    let out = t.ok(&["run", &t.daily_job, "--date", "2026-06-09", "--json"]);
    assert_eq!(
        actions(&out),
        vec![("dt=2026-06-09".into(), "emptied".into())],
        "{backend:?}"
    );
    let s = t.status("daily");
    assert_eq!(s["partitions"][0]["rows"], 0, "{backend:?}: {s}");
    assert_eq!(t.data_files("daily").len(), 1, "{backend:?}");

    let backfill = |extra: &[&str]| {
        let mut args = vec![
            "backfill",
            &t.daily_job,
            "--from",
            "2026-06-01",
            "--to",
            "2026-06-07",
            "--json",
        ];
        args.extend_from_slice(extra);
        t.ok(&args)
    };
    let run = backfill(&[]);
    let written = actions(&run).iter().filter(|(_, a)| a == "written").count();
    assert_eq!(written, 7, "{backend:?}");
    let digests = digests_of(&t.status("daily"));
    let again = backfill(&[]);
    assert!(
        actions(&again).iter().all(|(_, a)| a == "unchanged"),
        "{backend:?}"
    );
    assert_eq!(digests_of(&t.status("daily")), digests, "{backend:?}");
    assert_eq!(t.data_files("daily").len(), 8, "{backend:?}");
    // Decided from the manifests alone: every date is fresh.
    let fresh = backfill(&["--skip-fresh"]);
    assert!(
        actions(&fresh).iter().all(|(_, a)| a == "fresh") && actions(&fresh).len() == 7,
        "{backend:?}: {:?}",
        actions(&fresh)
    );
}

fn a_failed_check_leaves_the_live_table_untouched(backend: Backend, execution: &str) {
    let t = Table::with_execution(backend, "chk", execution);
    t.run_ok(&t.job);
    let before = t.everything();
    t.switch_to_b(None);
    let strict = t.lake.job(
        "strict",
        &format!(
            "{}\n[checks]\nmin_rows = 100000\n",
            std::fs::read_to_string(t.lake.join(&t.job)).unwrap()
        ),
    );
    let out = t.idem(&["run", &strict, "--date", "2026-06"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{backend:?}: {err}");
    assert_eq!(t.everything(), before, "{backend:?}");
}

/// How a run is stopped at a failpoint: `abort()` inside the process at the point, or
/// SIGKILL from outside while it waits there (its other threads wherever they are).
#[derive(Clone, Copy, Debug)]
enum Crash {
    Abort,
    Kill,
}

/// Runs the month job and crashes it at the first hit of `point`; whether it got there.
fn crash_at(t: &Table, point: &str, how: Crash) -> bool {
    let hooks = tempfile::tempdir().unwrap();
    let spec = match how {
        Crash::Abort => format!("{point}=abort"),
        Crash::Kill => format!("{point}=pause:{}", hooks.path().display()),
    };
    let mut child = Command::new(bin())
        .args(["run", &t.job, "--date", "2026-06"])
        .current_dir(t.lake.path())
        .envs(t.backend.env())
        .env("IDEM_FAILPOINTS", spec)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let paused = hooks.path().join(format!("{point}.paused"));
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            // An abort dies by a signal; a run that exits never met the point.
            return !status.success() && status.code().is_none();
        }
        if paused.exists() {
            child.kill().unwrap();
            child.wait().unwrap();
            return true;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{point}: stuck"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Crashes a run at every failpoint of the write and publish path, by abort and by
/// SIGKILL while paused there: every partition is old or new after each, and the next
/// run (after `idem gc` for a commit left unapplied) ends in the clean-run state.
fn crash_at_every_failpoint_then_rerun(backend: Backend) {
    let t = Table::new(backend, "fp");
    let old = t.reference();
    t.run_ok(&t.job);
    t.switch_to_b(None);
    let new = t.reference();
    let mut points = FAILPOINTS.to_vec();
    if backend != Backend::Local {
        points.push("after_apply_copy");
    }
    for point in points {
        for how in [Crash::Abort, Crash::Kill] {
            let context = format!("{backend:?} {how:?} at {point}");
            assert!(
                crash_at(&t, point, how),
                "{context}: the run never got there"
            );
            for (p, d) in t.committed_digests() {
                assert!(d == old[&p] || d == new[&p], "{context}: {p} is neither");
            }
            if backend != Backend::Local && (point == "after_swap" || point == "after_apply_copy") {
                // Committed but not applied: `idem gc` rolls the apply forward.
                t.ok(&["gc", &t.target("crashy")]);
                assert_eq!(
                    t.data_files("crashy").len(),
                    7,
                    "{context}: gc did not apply"
                );
                assert!(t.staged().is_empty(), "{context}");
            }
            t.run_ok(&t.job);
            t.assert_clean(&new, &context);
            // Back to state A for the next crash.
            t.switch_to_a();
            t.run_ok(&t.job);
            assert_eq!(t.digests(), old, "{context}: back to A");
            t.switch_to_b(None);
        }
    }
}

/// SIGKILLs at random moments, an extra beside the kills placed at every failpoint: no
/// timing is asserted (where a kill lands depends on the machine), only that after
/// each the table is old or new per partition and the next run ends clean.
fn sigkill_at_random_moments_ends_clean(backend: Backend) {
    let kills: usize = std::env::var("IDEM_CONFORMANCE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let t = Table::new(backend, "kill");
    let a = t.reference();
    t.switch_to_b(None);
    let b = t.reference();
    t.switch_to_a();
    let start = Instant::now();
    t.run_ok(&t.job);
    let full = start.elapsed().as_micros() as u64;
    let mut rng = crate::crash::Lcg(20261201);
    let mut to_b = true;
    for i in 0..kills {
        if to_b {
            t.switch_to_b(None);
        } else {
            t.switch_to_a();
        }
        let (old, new) = if to_b { (&a, &b) } else { (&b, &a) };
        let delay = Duration::from_micros(rng.next() % (full + 1));
        let mut run = Command::new(bin());
        run.args(["run", &t.job, "--date", "2026-06"])
            .current_dir(t.lake.path())
            .envs(backend.env())
            .env_remove("IDEM_FAILPOINTS");
        kill_after(run, delay);
        let context = format!("{backend:?}: kill {i} after {delay:?}");
        for (p, d) in &t.committed_digests() {
            assert!(d == &old[p] || d == &new[p], "{context}: {p} is neither");
        }
        t.run_ok(&t.job);
        t.assert_clean(new, &context);
        to_b = !to_b;
    }
}

/// One test per backend and scenario, so a failure on one backend hides no other.
macro_rules! per_backend {
    ($($backend:ident: $variant:expr),*) => {$(
        mod $backend {
            use super::*;

            #[test]
            fn twice_run_is_unchanged_and_one_changed_day_rewrites_one_partition() {
                super::twice_run_is_unchanged_and_one_changed_day_rewrites_one_partition($variant, "")
            }

            #[test]
            fn an_owned_day_without_rows_is_a_zero_row_partition_and_backfills_rerun_clean() {
                super::an_owned_day_without_rows_is_a_zero_row_partition_and_backfills_rerun_clean($variant, "")
            }

            #[test]
            fn a_failed_check_leaves_the_live_table_untouched() {
                super::a_failed_check_leaves_the_live_table_untouched($variant, "")
            }

            #[test]
            fn crash_at_every_failpoint_then_rerun() {
                super::crash_at_every_failpoint_then_rerun($variant)
            }

            #[test]
            fn rewrite_publishes_the_same_rows_in_new_files() {
                super::rewrite_publishes_the_same_rows_in_new_files($variant)
            }

            #[test]
            fn sigkill_at_random_moments_ends_clean() {
                super::sigkill_at_random_moments_ends_clean($variant)
            }
        }
    )*};
}

per_backend!(local: Backend::Local, s3: Backend::S3, azure: Backend::Azure);

/// The scenarios that apply to a run on a cluster, on Ballista's in-process cluster:
/// the digests must equal a local run's (the reference table), and the table must be
/// left exactly as a local run leaves it.
macro_rules! on_standalone_cluster {
    ($($backend:ident: $variant:expr),*) => {$(
        mod $backend {
            use super::*;

            #[test]
            fn twice_run_is_unchanged_and_one_changed_day_rewrites_one_partition() {
                super::twice_run_is_unchanged_and_one_changed_day_rewrites_one_partition(
                    $variant,
                    ON_STANDALONE_CLUSTER,
                )
            }

            #[test]
            fn an_owned_day_without_rows_is_a_zero_row_partition_and_backfills_rerun_clean() {
                super::an_owned_day_without_rows_is_a_zero_row_partition_and_backfills_rerun_clean(
                    $variant,
                    ON_STANDALONE_CLUSTER,
                )
            }

            #[test]
            fn a_failed_check_leaves_the_live_table_untouched() {
                super::a_failed_check_leaves_the_live_table_untouched(
                    $variant,
                    ON_STANDALONE_CLUSTER,
                )
            }
        }
    )*};
}

mod standalone_cluster {
    use super::*;
    on_standalone_cluster!(local: Backend::Local, s3: Backend::S3);
}

/// A real process dies at its Nth storage call (`IDEM_FAULTS=crash@N`: abort there),
/// for every Nth call of a run that rewrites the month, spread over the whole run: the
/// in-process fault search simulates these deaths, this checks them for real.
fn a_process_dead_at_its_nth_storage_call_leaves_old_or_new(backend: Backend) {
    let t = Table::new(backend, "calls");
    let old = t.reference();
    t.run_ok(&t.job);
    t.switch_to_b(None);
    let new = t.reference();
    // How many calls an undisturbed rewrite makes (it is then undone).
    let out = t.idem(
        &["run", &t.job, "--date", "2026-06"],
        &[("IDEM_FAULTS", "count")],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let calls: u64 = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("IDEM_FAULTS: ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no call count in: {stderr}"));
    t.switch_to_a();
    t.run_ok(&t.job);
    t.switch_to_b(None);
    let deaths = 12;
    for k in 0..deaths {
        let n = 1 + k * calls / deaths;
        let context = format!("{backend:?}: death at call {n} of {calls}");
        let out = t.idem(
            &["run", &t.job, "--date", "2026-06"],
            &[("IDEM_FAULTS", &format!("crash@{n}"))],
        );
        assert_eq!(out.status.code(), None, "{context}: did not die");
        for (p, d) in t.committed_digests() {
            assert!(d == old[&p] || d == new[&p], "{context}: {p} is neither");
        }
        t.run_ok(&t.job);
        t.assert_clean(&new, &context);
        t.switch_to_a();
        t.run_ok(&t.job);
        t.switch_to_b(None);
    }
}

mod deaths {
    use super::*;

    #[test]
    fn local() {
        a_process_dead_at_its_nth_storage_call_leaves_old_or_new(Backend::Local)
    }

    #[test]
    fn s3() {
        a_process_dead_at_its_nth_storage_call_leaves_old_or_new(Backend::S3)
    }
}
