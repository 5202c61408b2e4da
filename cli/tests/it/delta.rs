//! Delta Lake tables (`format = "delta"`), on local disk and on an S3-compatible server
//! (moto on 127.0.0.1): each scenario is checked through the Delta protocol by three
//! independent readers (the deltalake package, Polars, DuckDB's delta extension)
//! against a DuckDB oracle computed from the source, at every version, and the table's
//! version must not move when a re-run finds its input unchanged.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use crate::common::*;
use crate::conformance::{Backend, Table};

/// What turns the conformance jobs' targets into Delta tables (appended to [target]).
const DELTA: &str = "format = \"delta\"\n";

/// The rows the month job must publish for June 2026 (the days `days`, or all), as
/// DuckDB computes them from the source.
fn oracle(t: &Table, days: Option<&[&str]>) -> Value {
    let raw = t.lake.join("testdata/lake/raw/orders");
    let filter = match days {
        None => "created_date >= '2026-06-01' and created_date < '2026-07-01'".to_string(),
        Some(d) => format!(
            "created_date in ({})",
            d.iter()
                .map(|d| format!("'{d}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    readers(&[
        "duckdb",
        &format!(
            "select order_id, customer_id, amount_usd, status, created_date as dt \
             from read_parquet('{}/**/*.parquet', hive_partitioning = true) where {filter}",
            raw.display()
        ),
    ])
}

/// A local directory holding the table `name`: the table itself, or a copy of every
/// object under its prefix (a Delta reader reads it through the log either way).
fn local_copy(t: &Table, name: &str) -> (Option<tempfile::TempDir>, String) {
    match t.backend {
        Backend::Local => (None, t.target(name)),
        _ => {
            let dir = tempfile::tempdir().unwrap();
            readers(&[
                "get",
                t.backend.endpoint(),
                &t.url(&format!("lake/{name}/")),
                dir.path().to_str().unwrap(),
            ]);
            let path = dir.path().display().to_string();
            (Some(dir), path)
        }
    }
}

/// The rows of Delta table `name` at `version` (else the latest), as all three Delta
/// readers see them (they must agree).
fn delta_rows(t: &Table, name: &str, version: Option<u64>) -> Value {
    let (_keep, dir) = local_copy(t, name);
    let v = version.map(|v| v.to_string());
    let mut args = vec!["delta", dir.as_str()];
    args.extend(v.as_deref());
    readers(&args)
}

/// The Delta table's version, history (newest first) and live files, per deltalake.
fn delta_log(t: &Table, name: &str) -> Value {
    let (_keep, dir) = local_copy(t, name);
    readers(&["delta-log", &dir])
}

fn version(t: &Table, name: &str) -> u64 {
    delta_log(t, name)["version"].as_u64().unwrap()
}

/// The Delta commits of table `name` (the JSON files of its log).
fn commits(t: &Table, name: &str) -> Vec<String> {
    t.data_files_and_log(name)
        .into_iter()
        .filter(|f| f.starts_with("_delta_log/") && f.ends_with(".json"))
        .collect()
}

/// The Parquet files under table `name` (relative), whether a version reads them or not.
fn parquet_files(t: &Table, name: &str) -> Vec<String> {
    t.data_files_and_log(name)
        .into_iter()
        .filter(|f| f.ends_with(".parquet"))
        .collect()
}

impl Table {
    fn delta(backend: Backend, tag: &str) -> Table {
        Table::with_execution(backend, tag, DELTA)
    }

    /// Every file under table `name` (relative), data and log.
    fn data_files_and_log(&self, name: &str) -> Vec<String> {
        match self.backend {
            Backend::Local => snapshot(&self.lake.join(&format!("out/{name}")))
                .into_keys()
                .collect(),
            _ => self
                .keys(&format!("lake/{name}/"))
                .into_iter()
                .map(|k| k.trim_start_matches(&format!("lake/{name}/")).to_string())
                .collect(),
        }
    }

    fn vacuum(&self, name: &str) -> Value {
        let out = self.ok(&[
            "vacuum",
            &self.target(name),
            "--retain-hours",
            "0",
            "--json",
        ]);
        out.into_iter().next().unwrap()
    }
}

fn twice_run_keeps_the_version_and_a_changed_day_is_one_commit(backend: Backend) {
    let t = Table::delta(backend, "delta-twice");
    let first = t.run_ok(&t.job);
    assert_eq!(actions(&first).len(), 7, "{backend:?}");
    assert!(
        actions(&first).iter().all(|(_, a)| a == "written"),
        "{first:?}"
    );
    let a_rows = oracle(&t, None);
    assert_eq!(delta_rows(&t, "crashy", None), a_rows, "{backend:?}");
    // One commit for the whole run, naming idem's job, run and the partitions'
    // replaceWhere.
    let log = delta_log(&t, "crashy");
    assert_eq!(log["version"], 0, "{backend:?}");
    let commit = &log["history"][0];
    assert_eq!(commit["operation"], "WRITE", "{commit}");
    assert_eq!(
        commit["operationParameters"]["mode"], "Overwrite",
        "{commit}"
    );
    let predicate = commit["operationParameters"]["predicate"].as_str().unwrap();
    assert!(
        predicate.contains("(dt = '2026-06-01')") && predicate.contains("(dt = '2026-06-07')"),
        "{predicate}"
    );
    assert_eq!(commit["idem"]["job"], "crashy", "{commit}");
    assert_eq!(commit["idem"]["runId"], first[0]["run_id"], "{commit}");
    assert_eq!(commit["idem"]["partitions"].as_array().unwrap().len(), 7);
    // idem reads its own table through the log: every partition whole, the digests a
    // plain Parquet run of the same job computes.
    assert_eq!(t.digests(), t.reference(), "{backend:?}");

    // A re-run of unchanged input writes no file and no commit.
    let before = t.data_files_and_log("crashy");
    let again = t.run_ok(&t.job);
    assert!(
        actions(&again).iter().all(|(_, a)| a == "unchanged"),
        "{again:?}"
    );
    assert_eq!(t.data_files_and_log("crashy"), before, "{backend:?}");
    assert_eq!(version(&t, "crashy"), 0, "{backend:?}");

    // One changed day: one commit that removes that day's file and adds its new one.
    t.switch_to_b(Some("2026-06-03"));
    let changed = t.run_ok(&t.job);
    let written: Vec<_> = actions(&changed)
        .into_iter()
        .filter(|(_, a)| a != "unchanged")
        .collect();
    assert_eq!(written, vec![("dt=2026-06-03".into(), "written".into())]);
    let log = delta_log(&t, "crashy");
    assert_eq!(log["version"], 1, "{backend:?}");
    assert_eq!(
        log["history"][0]["operationParameters"]["predicate"],
        "dt = '2026-06-03'"
    );
    assert_eq!(delta_rows(&t, "crashy", None), oracle(&t, None));
    // Time travel: version 0 still reads the first run's rows.
    assert_eq!(delta_rows(&t, "crashy", Some(0)), a_rows, "{backend:?}");
    assert_eq!(t.digests(), t.reference(), "{backend:?}");
    let restated = t.ok(&["log", &t.target("crashy"), "--json"]);
    assert_eq!(restated.len(), 1, "{restated:?}");
    assert_eq!(restated[0]["partition"], "dt=2026-06-03");

    // The replaced file outlives its removal until vacuum, which deletes only it.
    let files = parquet_files(&t, "crashy");
    assert_eq!(files.len(), 8, "{files:?}");
    let vacuumed = t.vacuum("crashy");
    assert_eq!(vacuumed["files"].as_array().unwrap().len(), 1, "{vacuumed}");
    assert!(
        vacuumed["files"][0]
            .as_str()
            .unwrap()
            .contains("dt=2026-06-03/"),
        "{vacuumed}"
    );
    assert_eq!(parquet_files(&t, "crashy").len(), 7);
    assert_eq!(delta_rows(&t, "crashy", None), oracle(&t, None));
}

#[test]
fn twice_run_keeps_the_version_local() {
    twice_run_keeps_the_version_and_a_changed_day_is_one_commit(Backend::Local);
}

#[test]
fn twice_run_keeps_the_version_s3() {
    twice_run_keeps_the_version_and_a_changed_day_is_one_commit(Backend::S3);
}

fn empty_days_commit_nothing_and_backfills_rerun_without_commits(backend: Backend) {
    let t = Table::delta(backend, "delta-empty");
    // 2026-06-09 has no source rows: nothing to add, nothing to remove, no table yet.
    let out = t.ok(&["run", &t.daily_job, "--date", "2026-06-09", "--json"]);
    assert_eq!(
        actions(&out),
        vec![("dt=2026-06-09".into(), "unchanged".into())]
    );
    assert!(commits(&t, "daily").is_empty(), "{backend:?}");

    let days = [
        "2026-06-04",
        "2026-06-05",
        "2026-06-06",
        "2026-06-07",
        "2026-06-08",
        "2026-06-09",
    ];
    let backfill = |extra: &[&str]| {
        let mut args = vec![
            "backfill",
            t.daily_job.as_str(),
            "--from",
            "2026-06-04",
            "--to",
            "2026-06-09",
            "--json",
        ];
        args.extend_from_slice(extra);
        t.ok(&args)
    };
    backfill(&[]);
    let v = version(&t, "daily");
    assert_eq!(delta_rows(&t, "daily", None), oracle(&t, Some(&days)));
    let before = t.data_files_and_log("daily");
    let rerun = backfill(&[]);
    assert_eq!(rerun.last().unwrap()["written"], 0, "{rerun:?}");
    let fresh = backfill(&["--skip-fresh"]);
    assert_eq!(fresh.last().unwrap()["written"], 0, "{fresh:?}");
    assert_eq!(t.data_files_and_log("daily"), before, "{backend:?}");
    assert_eq!(version(&t, "daily"), v);

    // A day emptied at the source, and said to be gone for good: its commit removes
    // the day's files, adds none.
    let raw = t
        .lake
        .join("testdata/lake/raw/orders/created_date=2026-06-05");
    std::fs::remove_dir_all(&raw).unwrap();
    let emptied = t.ok(&[
        "run",
        &t.daily_job,
        "--date",
        "2026-06-05",
        "--allow-missing-input",
        "--json",
    ]);
    assert_eq!(
        actions(&emptied),
        vec![("dt=2026-06-05".into(), "emptied".into())]
    );
    assert_eq!(version(&t, "daily"), v + 1);
    let left: Vec<&str> = days
        .iter()
        .copied()
        .filter(|d| *d != "2026-06-05")
        .collect();
    assert_eq!(delta_rows(&t, "daily", None), oracle(&t, Some(&left)));
    let again = t.ok(&["run", &t.daily_job, "--date", "2026-06-05", "--json"]);
    assert_eq!(
        actions(&again),
        vec![("dt=2026-06-05".into(), "unchanged".into())]
    );
    assert_eq!(version(&t, "daily"), v + 1);
}

#[test]
fn empty_days_and_backfills_local() {
    empty_days_commit_nothing_and_backfills_rerun_without_commits(Backend::Local);
}

#[test]
fn empty_days_and_backfills_s3() {
    empty_days_commit_nothing_and_backfills_rerun_without_commits(Backend::S3);
}

fn a_failed_check_leaves_the_version_and_rows(backend: Backend) {
    let t = Table::delta(backend, "delta-check");
    t.run_ok(&t.job);
    let a_rows = oracle(&t, None);
    let checked = t.lake.job(
        "checked",
        &(crate::conformance::MONTH_JOB
            .replace("TARGET", &t.target("crashy"))
            .replace("[target]\n", "[checks]\nmax_rows = 10\n[target]\n")
            + DELTA),
    );
    t.switch_to_b(None);
    let before = t.data_files_and_log("crashy");
    let out = t.idem(&["run", &checked, "--date", "2026-06"], &[]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(t.data_files_and_log("crashy"), before, "{backend:?}");
    assert_eq!(version(&t, "crashy"), 0);
    assert_eq!(delta_rows(&t, "crashy", None), a_rows);
}

#[test]
fn a_failed_check_leaves_the_version_local() {
    a_failed_check_leaves_the_version_and_rows(Backend::Local);
}

#[test]
fn a_failed_check_leaves_the_version_s3() {
    a_failed_check_leaves_the_version_and_rows(Backend::S3);
}

/// Every failpoint of the write and publish path, as a crash: afterwards each Delta
/// reader sees the old month or the new one whole, the next run converges, and vacuum
/// leaves exactly the live files.
fn a_crash_anywhere_leaves_the_old_table_or_the_new(backend: Backend) {
    let t = Table::delta(backend, "delta-crash");
    t.run_ok(&t.job);
    let points = [
        "after_first_batch",
        "after_footers",
        "after_stage",
        "before_publish",
        "after_publish_one",
        "before_commit",
    ];
    let mut state_b = false;
    for point in points {
        let old_rows = delta_rows(&t, "crashy", None);
        let old_version = version(&t, "crashy");
        state_b = !state_b;
        if state_b {
            t.switch_to_b(None);
        } else {
            t.switch_to_a();
        }
        let new_rows = oracle(&t, None);
        assert_ne!(old_rows, new_rows);
        let out = t.idem(
            &["run", &t.job, "--date", "2026-06"],
            &[("IDEM_FAILPOINTS", &format!("{point}=abort"))],
        );
        assert!(!out.status.success(), "{point}: the crash did not happen");
        let seen = delta_rows(&t, "crashy", None);
        assert_eq!(
            seen, old_rows,
            "{backend:?} {point}: a crash before the commit showed rows"
        );
        assert_eq!(version(&t, "crashy"), old_version, "{point}");
        let done = t.run_ok(&t.job);
        assert!(
            actions(&done).iter().all(|(_, a)| a == "written"),
            "{point}: {done:?}"
        );
        assert_eq!(version(&t, "crashy"), old_version + 1, "{point}");
        assert_eq!(
            delta_rows(&t, "crashy", None),
            new_rows,
            "{backend:?} {point}"
        );
        // Orphans of the crash and removed files go; the live files stay.
        t.vacuum("crashy");
        let live: BTreeSet<String> = delta_log(&t, "crashy")["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let f = f.as_str().unwrap();
                f[f.find("dt=").unwrap()..].to_string()
            })
            .collect();
        let on_disk: BTreeSet<String> = parquet_files(&t, "crashy").into_iter().collect();
        assert_eq!(on_disk, live, "{backend:?} {point}");
    }
}

#[test]
fn a_crash_anywhere_local() {
    a_crash_anywhere_leaves_the_old_table_or_the_new(Backend::Local);
}

#[test]
fn a_crash_anywhere_s3() {
    a_crash_anywhere_leaves_the_old_table_or_the_new(Backend::S3);
}

/// Two writers at once: of different dates, both land; of one date, the table holds
/// one run's files whole.
fn concurrent_writers(backend: Backend) {
    let t = Table::delta(backend, "delta-concurrent");
    let cmd = |date: &str| {
        let mut c = Command::new(bin());
        c.current_dir(t.lake.path())
            .args(["run", &t.daily_job, "--date", date, "--json"]);
        for (k, v) in backend.env() {
            c.env(k, v);
        }
        c
    };
    all_at_once([cmd("2026-06-01"), cmd("2026-06-02")]);
    assert_eq!(
        delta_rows(&t, "daily", None),
        oracle(&t, Some(&["2026-06-01", "2026-06-02"]))
    );
    assert_eq!(commits(&t, "daily").len(), 2, "{backend:?}");

    t.switch_to_b(Some("2026-06-03"));
    let outs = all_at_once([cmd("2026-06-03"), cmd("2026-06-03")]);
    let reports: Vec<Value> = outs.iter().flat_map(json_lines).collect();
    let written = actions(&reports)
        .into_iter()
        .filter(|(_, a)| a == "written")
        .count();
    assert!((1..=2).contains(&written), "{reports:?}");
    assert_eq!(
        delta_rows(&t, "daily", None),
        oracle(&t, Some(&["2026-06-01", "2026-06-02", "2026-06-03"]))
    );
    let day3: Vec<String> = delta_log(&t, "daily")["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .filter(|f| f.contains("dt=2026-06-03/"))
        .collect();
    assert_eq!(day3.len(), 1, "one run's file, whole: {day3:?}");
}

#[test]
fn concurrent_writers_local() {
    concurrent_writers(Backend::Local);
}

#[test]
fn concurrent_writers_s3() {
    concurrent_writers(Backend::S3);
}

#[test]
fn a_parquet_job_refuses_a_delta_table_and_vacuum_refuses_a_parquet_one() {
    let t = Table::delta(Backend::Local, "delta-refuse");
    t.run_ok(&t.job);
    let plain = t.lake.job(
        "plain",
        &crate::conformance::MONTH_JOB.replace("TARGET", "out/crashy"),
    );
    let out = t.idem(&["run", &plain, "--date", "2026-06"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("is a Delta table") && err.contains("format = \"delta\""),
        "{err}"
    );

    t.run_ok(&t.ref_job);
    let out = t.idem(&["vacuum", "out/ref"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no Delta log"), "{err}");
}

/// A merge into a Delta table commits copy-on-write, in one commit: on disk the files
/// holding changed keys are removed and replaced and the others stay as they are (not
/// re-added); on an object store the affected partitions are rewritten. Version 0
/// still reads the old rows, and a re-run of the same changes commits nothing.
fn a_merge_commits_copy_on_write(backend: Backend) {
    use crate::merge::{base, changes, clustered_job, oracle};
    let lake = Lake::new();
    let target = match backend {
        Backend::Local => "out/dim_customers".to_string(),
        _ => {
            let bucket = crate::s3::bucket("delta-merge");
            idem_testdata::servers::create_bucket(
                backend.endpoint(),
                &format!("{}://{bucket}/", backend.scheme()),
            );
            format!("{}://{bucket}/lake/dim_customers", backend.scheme())
        }
    };
    let job = lake.job(
        "dim",
        &(clustered_job().replace("out/dim_customers", &target) + DELTA),
    );
    let merge_ok = |src: &str| {
        let mut env = backend.env();
        env.push(("SRC", src.to_string()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = idem_in(
            lake.path(),
            &["run", &job, "--date", "2026-06-01", "--json"],
            &env,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out)
    };
    // The table as a local directory (a copy of its objects on S3).
    let local = || -> (Option<tempfile::TempDir>, std::path::PathBuf) {
        match backend {
            Backend::Local => (None, lake.join("out/dim_customers")),
            _ => {
                let dir = tempfile::tempdir().unwrap();
                readers(&[
                    "get",
                    backend.endpoint(),
                    &format!("{target}/"),
                    dir.path().to_str().unwrap(),
                ]);
                let path = dir.path().to_path_buf();
                (Some(dir), path)
            }
        }
    };
    let base = base(&lake);
    merge_ok(&base);
    let files = |v: &Value| v["files"].as_array().unwrap().len();
    let (_keep, table) = local();
    let first = readers(&["delta-log", table.to_str().unwrap()]);
    assert!(files(&first) > 3, "{first}");
    // Keys 1, 2, 3 live in the first file only; 1001 is new.
    let ch = changes(&lake, "a", &[1, 2, 3], &[1001], "DE");
    merge_ok(&ch);
    let (_keep, table) = local();
    let dir = table.to_str().unwrap();
    assert_eq!(readers(&["delta", dir]), oracle(&base, &[&ch]));
    let log = readers(&["delta-log", dir]);
    assert_eq!(log["version"], 1, "{log}");
    let commit =
        std::fs::read_to_string(table.join("_delta_log/00000000000000000001.json")).unwrap();
    let count = |kind: &str| {
        commit
            .lines()
            .filter(|l| l.starts_with(&format!("{{\"{kind}\"")))
            .count()
    };
    let names = |v: &Value| -> BTreeSet<String> {
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let f = f.as_str().unwrap();
                f.rsplit('/').next().unwrap().to_string()
            })
            .collect()
    };
    let (kept, now) = (names(&first), names(&log));
    match backend {
        // On disk, only the file holding the changed keys is rewritten.
        Backend::Local => {
            assert_eq!(count("remove"), 1, "{commit}");
            assert!((1..=2).contains(&count("add")), "{commit}");
            assert_eq!(kept.difference(&now).count(), 1, "one file rewritten");
        }
        // On an object store the footers are not probed: the table is rewritten whole,
        // still in one commit.
        _ => {
            assert_eq!(count("remove"), files(&first), "{commit}");
            assert!(kept.is_disjoint(&now), "{kept:?} {now:?}");
        }
    }
    // Version 0 still reads the base.
    assert_eq!(readers(&["delta", dir, "0"]), oracle(&base, &[]));
    let again = merge_ok(&ch);
    assert_eq!(
        actions(&again),
        vec![("(table)".into(), "unchanged".into())]
    );
    let (_keep, table) = local();
    assert_eq!(
        readers(&["delta-log", table.to_str().unwrap()])["version"],
        1
    );
}

#[test]
fn a_merge_commits_copy_on_write_local() {
    a_merge_commits_copy_on_write(Backend::Local);
}

#[test]
fn a_merge_commits_copy_on_write_s3() {
    a_merge_commits_copy_on_write(Backend::S3);
}

/// A job reading a Delta table idem wrote reads its latest version through the log,
/// not the files a listing finds (which include those its commits removed).
#[test]
fn a_downstream_job_reads_a_delta_table_at_its_latest_version() {
    let t = Table::delta(Backend::Local, "delta-source");
    t.run_ok(&t.job);
    t.switch_to_b(Some("2026-06-03"));
    t.run_ok(&t.job);
    assert_eq!(
        parquet_files(&t, "crashy").len(),
        8,
        "the removed file is still there"
    );
    let down = t.lake.job(
        "down",
        r#"
name = "down"
[sources.f]
path = "out/crashy/"
partitioned_by = [{ name = "dt", type = "date" }]
[transform]
sql = "select order_id, customer_id, amount_usd, status, dt from f"
[target]
path = "out/down"
partition_by = ["dt"]
grain = "month"
"#,
    );
    t.ok(&["run", &down, "--date", "2026-06", "--json"]);
    let out = t.lake.join("out/down");
    assert_eq!(readers(&["table", out.to_str().unwrap()]), oracle(&t, None));
}

/// `backfill --atomic`: the range's partitions appear in one commit; when one date
/// fails, nothing of the range is committed and the table reads as before.
fn an_atomic_backfill_is_one_commit_or_none(backend: Backend) {
    let t = Table::delta(backend, "delta-atomic");
    let days = ["2026-06-01", "2026-06-02", "2026-06-03", "2026-06-04"];
    let backfill = || {
        t.idem(
            &[
                "backfill",
                &t.daily_job,
                "--from",
                days[0],
                "--to",
                days[3],
                "--atomic",
                "--json",
            ],
            &[],
        )
    };
    let out = backfill();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = json_lines(&out);
    let committed: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "committed")
        .collect();
    assert_eq!(committed.len(), 1, "{events:?}");
    assert_eq!(committed[0]["version"], 0);
    // Each date's partitions wait for the range's commit, and say so.
    let modes: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["event"] == "done")
        .flat_map(|e| e["report"]["partitions"].as_array().unwrap())
        .map(|p| p["publish"].as_str().unwrap())
        .collect();
    assert_eq!(modes, BTreeSet::from(["pending"]), "{events:?}");
    assert_eq!(
        commits(&t, "daily").len(),
        1,
        "{backend:?}: one commit for the range"
    );
    let a_rows = oracle(&t, Some(&days));
    assert_eq!(delta_rows(&t, "daily", None), a_rows);
    let commit = &delta_log(&t, "daily")["history"][0];
    assert_eq!(
        commit["idem"]["logicalDates"].as_array().unwrap().len(),
        4,
        "{commit}"
    );

    // Every day changes at the source, but one date cannot be read: nothing lands.
    t.switch_to_b(None);
    let bad = t
        .lake
        .join("testdata/lake/raw/orders/created_date=2026-06-02");
    for f in std::fs::read_dir(&bad).unwrap() {
        std::fs::write(f.unwrap().path(), b"not parquet").unwrap();
    }
    let files = t.data_files_and_log("daily");
    let out = backfill();
    assert!(!out.status.success());
    let events = json_lines(&out);
    let abandoned: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "abandoned")
        .collect();
    assert_eq!(abandoned.len(), 1, "{events:?}");
    assert_eq!(
        (&abandoned[0]["failed"], &abandoned[0]["not_run"]),
        (&1.into(), &0.into())
    );
    // The summary agrees: one date failed, three ran and were discarded, nothing was
    // written.
    let summary = events.iter().find(|e| e["event"] == "summary").unwrap();
    for (field, n) in [
        ("failed", 1),
        ("not_run", 0),
        ("abandoned", 3),
        ("succeeded", 0),
        ("written", 0),
    ] {
        assert_eq!(summary[field], n, "{field}: {summary}");
    }
    assert_eq!(commits(&t, "daily").len(), 1, "{backend:?}");
    assert_eq!(delta_rows(&t, "daily", None), a_rows, "{backend:?}");
    // No file of the discarded dates entered the table.
    assert_eq!(t.data_files_and_log("daily"), files, "{backend:?}");
}

#[test]
fn an_atomic_backfill_local() {
    an_atomic_backfill_is_one_commit_or_none(Backend::Local);
}

#[test]
fn an_atomic_backfill_s3() {
    an_atomic_backfill_is_one_commit_or_none(Backend::S3);
}

#[test]
fn atomic_is_refused_for_a_parquet_table() {
    let t = Table::new(Backend::Local, "parquet-atomic");
    let out = t.idem(
        &[
            "backfill",
            &t.daily_job,
            "--from",
            "2026-06-01",
            "--to",
            "2026-06-02",
            "--atomic",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--atomic needs a Delta table"), "{err}");
}

/// `--rewrite` publishes a partition equal to the live one (a new commit with new
/// files and the same rows); without it the same run is unchanged.
fn rewrite_commits_the_same_rows_again(backend: Backend) {
    let t = Table::delta(backend, "delta-rewrite");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            t.daily_job.as_str(),
            "--date",
            "2026-06-02",
            "--json",
        ];
        args.extend_from_slice(extra);
        t.ok(&args)
    };
    run(&[]);
    let before = delta_log(&t, "daily");
    let rewritten = run(&["--rewrite"]);
    assert_eq!(
        actions(&rewritten),
        vec![("dt=2026-06-02".into(), "written".into())]
    );
    let after = delta_log(&t, "daily");
    assert_eq!(after["version"], 1);
    assert_ne!(after["files"], before["files"]);
    assert_eq!(
        delta_rows(&t, "daily", None),
        oracle(&t, Some(&["2026-06-02"]))
    );
    let plain = run(&[]);
    assert_eq!(
        actions(&plain),
        vec![("dt=2026-06-02".into(), "unchanged".into())]
    );
    assert_eq!(delta_log(&t, "daily")["version"], 1);
}

#[test]
fn rewrite_commits_the_same_rows_again_local() {
    rewrite_commits_the_same_rows_again(Backend::Local);
}

#[test]
fn rewrite_commits_the_same_rows_again_s3() {
    rewrite_commits_the_same_rows_again(Backend::S3);
}

/// Another writer (delta-rs, as Spark would) overwrites a day of an idem Delta table:
/// `idem log` shows the commit, idem's next run of that day finds the partition not
/// its own and replaces it, and the rows stay the oracle's.
#[test]
fn a_foreign_overwrite_is_logged_and_replaced() {
    let t = Table::delta(Backend::Local, "delta-foreign");
    t.run_ok(&t.job);
    let dir = t.target("crashy");
    let version = readers(&["delta-overwrite", &dir, "dt", "2026-06-03"]);
    assert_eq!(version, 1);
    assert_eq!(delta_rows(&t, "crashy", None), oracle(&t, None));
    let log = t.ok(&["log", &dir, "--json"]);
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0]["partition"]
            .as_str()
            .unwrap()
            .starts_with("dt = '2026-06-03'"),
        "{log:?}"
    );
    assert!(log[0]["job"].as_str().unwrap().contains("WRITE"), "{log:?}");
    assert!(
        log[0]["run_id"].as_str().unwrap().ends_with("-delta-v1"),
        "{log:?}"
    );
    let status = t.status_any("crashy");
    let foreign: Vec<&Value> = status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] != "managed")
        .collect();
    assert_eq!(foreign.len(), 1, "{status}");
    let again = t.run_ok(&t.job);
    let written: Vec<_> = actions(&again)
        .into_iter()
        .filter(|(_, a)| a != "unchanged")
        .collect();
    assert_eq!(written, vec![("dt=2026-06-03".into(), "written".into())]);
    assert_eq!(version_of(&t), 2);
    assert_eq!(delta_rows(&t, "crashy", None), oracle(&t, None));
    assert_eq!(t.digests(), t.reference());
}

fn version_of(t: &Table) -> u64 {
    version(t, "crashy")
}

/// Partition values a path must escape (`:`, `/`, `%`, `'`, `=`, a space, NULL) land
/// in the log as the Delta protocol records paths, so every Delta reader finds the
/// files; a rewrite of two of them removes exactly their old files.
fn odd_partition_values(backend: Backend) {
    let lake = Lake::new();
    let target = match backend {
        Backend::Local => "out/odd".to_string(),
        _ => {
            let bucket = crate::s3::bucket("delta-odd");
            idem_testdata::servers::create_bucket(
                backend.endpoint(),
                &format!("{}://{bucket}/", backend.scheme()),
            );
            format!("{}://{bucket}/lake/odd", backend.scheme())
        }
    };
    let csv = lake.join("odd.csv");
    let write = |rows: &str| std::fs::write(&csv, format!("id,k\n{rows}")).unwrap();
    write("1,a:b\n2,x/y\n3,p%q\n4,it's\n5,\n6,sp ace\n7,=eq\n");
    let job = lake.job(
        "odd",
        &format!(
            "name = \"odd\"\n[sources.s]\npath = \"{}\"\nformat = \"csv\"\n\
             [transform]\nsql = \"select id, k from s\"\n\
             [target]\npath = \"{target}\"\nformat = \"delta\"\npartition_by = [\"k\"]\n",
            csv.display()
        ),
    );
    let env = backend.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = || {
        let out = idem_in(
            lake.path(),
            &["run", &job, "--date", "2026-06-01", "--json"],
            &env,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out)
    };
    let rows = |name: &str| match backend {
        Backend::Local => readers(&["delta", lake.join(name).to_str().unwrap()]),
        _ => {
            let dir = tempfile::tempdir().unwrap();
            readers(&[
                "get",
                backend.endpoint(),
                &format!("{target}/"),
                dir.path().to_str().unwrap(),
            ]);
            readers(&["delta", dir.path().to_str().unwrap()])
        }
    };
    let oracle = || {
        readers(&[
            "duckdb",
            &format!(
                "select id, k from read_csv('{}', all_varchar = true)",
                csv.display()
            ),
        ])
    };
    run();
    assert_eq!(rows("out/odd"), oracle(), "{backend:?}");
    let again = run();
    assert!(
        actions(&again).iter().all(|(_, a)| a == "unchanged"),
        "{again:?}"
    );
    write("1,a:b\n2,x/y\n8,x/y\n30,p%q\n4,it's\n5,\n6,sp ace\n7,=eq\n");
    let changed = run();
    let written: Vec<String> = actions(&changed)
        .into_iter()
        .filter(|(_, a)| a != "unchanged")
        .map(|(p, _)| p)
        .collect();
    assert_eq!(written, vec!["k=p%25q", "k=x%2Fy"], "{changed:?}");
    assert_eq!(rows("out/odd"), oracle(), "{backend:?}");
    // Vacuum finds the replaced files by the paths the log records, and only them.
    let out = idem_in(
        lake.path(),
        &["vacuum", &target, "--retain-hours", "0", "--json"],
        &env,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vacuumed = &json_lines(&out)[0];
    assert_eq!(vacuumed["files"].as_array().unwrap().len(), 2, "{vacuumed}");
    assert_eq!(rows("out/odd"), oracle(), "{backend:?}");
}

#[test]
fn odd_partition_values_local() {
    odd_partition_values(Backend::Local);
}

#[test]
fn odd_partition_values_s3() {
    odd_partition_values(Backend::S3);
}

/// Runs idem in `lake` with `backend`'s settings; the report lines, or the failure.
fn idem_on(lake: &Lake, backend: Backend, args: &[&str]) -> std::process::Output {
    let env = backend.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    idem_in(lake.path(), args, &env)
}

/// Has another writer (delta-rs, as Spark would) write the Delta table `dir`; returns
/// its version. `args` as `readers.py delta-write` takes them.
fn foreign_write(dir: &str, args: &[&str]) -> u64 {
    let mut all = vec!["delta-write", dir];
    all.extend(args);
    readers(&all).as_u64().unwrap()
}

/// A Delta table another tool wrote is a source read at its latest version through
/// its log: partition values typed as its schema says (a date compared with a date),
/// a column added later read as null from older files, nothing from the files an
/// overwrite removed. A table that stores columns under other names (column mapping)
/// is refused as a source; one with rules idem's commits would not keep is refused as
/// a target, and nothing is written.
fn a_job_reads_a_foreign_delta_table(backend: Backend) {
    let lake = Lake::new();
    let theirs = lake.join("theirs");
    let dir = theirs.to_str().unwrap();
    foreign_write(
        dir,
        &[
            "append",
            "select range as order_id, range * 1.5 as amount, \
             date '2026-06-01' + (range % 2)::int as dt from range(6)",
            "dt",
        ],
    );
    foreign_write(
        dir,
        &[
            "append",
            "select 100 + range as order_id, 2.5 as amount, 'new' as status, \
             date '2026-06-03' as dt from range(3)",
            "dt",
        ],
    );
    let v = foreign_write(
        dir,
        &[
            "overwrite",
            "select 7 as order_id, 9.0 as amount, 'redo' as status, date '2026-06-01' as dt",
            "dt",
            "dt = '2026-06-01'",
        ],
    );
    assert_eq!(v, 2);
    let source = match backend {
        Backend::Local => dir.to_string(),
        _ => {
            let url = format!("s3://{}/theirs", crate::s3::bucket("delta-theirs"));
            readers(&["put", backend.endpoint(), dir, &url]);
            url
        }
    };
    let job = lake.job(
        "down",
        &format!(
            r#"
name = "down"
[sources.f]
path = "{source}/"
[transform]
sql = "select order_id, amount, status, dt from f where dt < date '2026-06-03'"
[target]
path = "out/down"
partition_by = ["dt"]
grain = "month"
"#
        ),
    );
    let out = idem_on(
        &lake,
        backend,
        &["run", &job, "--date", "2026-06", "--json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the Delta readers see of the source, June 1 and 2.
    let expected: Vec<Value> = readers(&["delta", dir])
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["dt"].as_str().unwrap() < "2026-06-03")
        .cloned()
        .collect();
    assert_eq!(expected.len(), 4, "{expected:?}");
    assert!(expected.iter().any(|r| r["status"].is_null()));
    assert_eq!(
        readers(&["table", lake.join("out/down").to_str().unwrap()]),
        Value::Array(expected)
    );
    let again = idem_on(
        &lake,
        backend,
        &["run", &job, "--date", "2026-06", "--json"],
    );
    assert!(
        actions(&json_lines(&again))
            .iter()
            .all(|(_, a)| a == "unchanged")
    );

    if backend != Backend::Local {
        return;
    }
    let mapped = lake.join("mapped");
    let mapped = mapped.to_str().unwrap();
    foreign_write(
        mapped,
        &[
            "append",
            "select 1 as order_id, 1.5 as amount, 'x' as status, date '2026-06-01' as dt",
            "dt",
            "",
            r#"{"delta.columnMapping.mode": "name"}"#,
        ],
    );
    let read = lake.job(
        "read_mapped",
        &format!(
            r#"
name = "read_mapped"
[sources.f]
path = "{mapped}/"
[transform]
sql = "select order_id, amount, status, dt from f"
[target]
path = "out/from_mapped"
partition_by = ["dt"]
grain = "month"
"#
        ),
    );
    let out = idem_on(&lake, backend, &["run", &read, "--date", "2026-06"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("source `f`") && err.contains("column mapping"),
        "{err}"
    );
    assert!(!lake.join("out/from_mapped").exists());
    // As a target: refused before anything is staged, for each rule idem's commits
    // would not keep.
    for (n, (config, named)) in [
        (r#"{"delta.columnMapping.mode": "name"}"#, "column mapping"),
        (
            r#"{"delta.enableChangeDataFeed": "true"}"#,
            "change data feed",
        ),
        (r#"{"delta.appendOnly": "true"}"#, "appendOnly"),
    ]
    .into_iter()
    .enumerate()
    {
        let theirs = lake.join(&format!("ruled{n}"));
        let theirs = theirs.to_str().unwrap();
        foreign_write(
            theirs,
            &[
                "append",
                "select 1 as order_id, 1.5 as amount, 'x' as status, date '2026-06-01' as dt",
                "dt",
                "",
                config,
            ],
        );
        let before = snapshot(std::path::Path::new(theirs));
        let write = lake.job(
            &format!("write_ruled{n}"),
            &format!(
                r#"
name = "write_ruled"
[sources.f]
path = "{dir}/"
[transform]
sql = "select order_id, amount, status, dt from f"
[target]
path = "{theirs}"
partition_by = ["dt"]
grain = "month"
format = "delta"
"#
            ),
        );
        let out = idem_on(&lake, backend, &["run", &write, "--date", "2026-06"]);
        assert_eq!(out.status.code(), Some(2), "{config}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("Delta table {theirs}")) && err.contains(named),
            "{err}"
        );
        assert_eq!(snapshot(std::path::Path::new(theirs)), before, "{config}");
    }
}

#[test]
fn a_job_reads_a_foreign_delta_table_local() {
    a_job_reads_a_foreign_delta_table(Backend::Local);
}

#[test]
fn a_job_reads_a_foreign_delta_table_s3() {
    a_job_reads_a_foreign_delta_table(Backend::S3);
}

/// idem writes into a Delta table another tool made (one whose partitioning matches),
/// and checkpoints its log at the table's `delta.checkpointInterval`: the readers
/// read the checkpointed table as the oracle says, and an unchanged re-run commits
/// nothing.
#[test]
fn commits_checkpoint_the_log_at_the_tables_interval() {
    let t = Table::delta(Backend::Local, "delta-checkpoint");
    let dir = t.target("crashy");
    foreign_write(
        &dir,
        &[
            "append",
            "select 1::bigint as order_id, 1::bigint as customer_id, 1.5::double as amount_usd, \
             'x' as status, date '2026-06-09' as dt",
            "dt",
            "",
            r#"{"delta.checkpointInterval": "2"}"#,
        ],
    );
    t.run_ok(&t.job);
    t.switch_to_b(Some("2026-06-03"));
    t.run_ok(&t.job);
    let log: Vec<String> = commits(&t, "crashy");
    assert_eq!(log.len(), 3, "{log:?}");
    let files = t.data_files_and_log("crashy");
    assert!(
        files.iter().any(|f| f.ends_with(".checkpoint.parquet"))
            && files.iter().any(|f| f == "_delta_log/_last_checkpoint"),
        "{files:?}"
    );
    assert_eq!(delta_rows(&t, "crashy", None), oracle(&t, None));
    t.run_ok(&t.job);
    assert_eq!(version_of(&t), 2);
}

/// A run killed between the parts of a file's multipart upload into an S3 Delta table
/// commits nothing; the next run aborts the dead run's upload and commits its own.
#[test]
fn a_run_killed_mid_upload_commits_nothing_s3() {
    let t = Table::delta(Backend::S3, "delta-parts");
    crate::s3::one_large_day(&t);
    let uploads = || crate::s3::uploads_in_progress(&t);
    let out = t.idem(
        &["run", &t.daily_job, "--date", "2026-06-01"],
        &[("IDEM_FAILPOINTS", "after_upload_part=abort")],
    );
    assert!(!out.status.success());
    assert_eq!(uploads(), 1, "the killed run left its upload in progress");
    assert!(commits(&t, "daily").is_empty(), "nothing committed");
    let done = t.ok(&["run", &t.daily_job, "--date", "2026-06-01", "--json"]);
    assert_eq!(
        actions(&done),
        vec![("dt=2026-06-01".into(), "written".into())]
    );
    assert_eq!(uploads(), 0);
    assert_eq!(commits(&t, "daily").len(), 1);
    let log = delta_log(&t, "daily");
    let live: BTreeSet<String> = log["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let f = f.as_str().unwrap();
            f[f.find("dt=").unwrap()..].to_string()
        })
        .collect();
    let stored: BTreeSet<String> = parquet_files(&t, "daily").into_iter().collect();
    assert_eq!(stored, live);
    assert_eq!(done[0]["rows"], crate::s3::LARGE_DAY_ROWS, "{done:?}");
    assert!(t.keys("lake/_idem/daily/uploads/").is_empty());
}

/// `idem vacuum --retain-hours 0` while a run, or an `--atomic` range, is about to
/// commit: vacuum must not delete a file the commit adds (it used to, and every
/// reader then failed on the missing file). The writer is paused with files on their
/// way in (a run just before its commit; a range after publishing its first date),
/// vacuum is given time to do its worst, then the writer finishes.
fn vacuum_never_deletes_what_a_commit_is_about_to_add(backend: Backend) {
    let t = Table::delta(backend, "delta-vacuum-race");
    t.ok(&["run", &t.daily_job, "--date", "2026-06-01"]);
    t.switch_to_b(None);
    let days = ["2026-06-01", "2026-06-02", "2026-06-03"];
    let target = t.target("daily");
    let writers: [(&str, Vec<&str>); 2] = [
        (
            "before_commit",
            vec!["run", &t.daily_job, "--date", days[0]],
        ),
        (
            "after_publish_one",
            vec![
                "backfill",
                &t.daily_job,
                "--from",
                days[0],
                "--to",
                days[2],
                "--atomic",
                "--concurrency",
                "1",
                "--oldest-first",
            ],
        ),
    ];
    for (point, args) in writers {
        let context = format!("{backend:?}, paused at {point}");
        let hooks = tempfile::tempdir().unwrap();
        let spawn = |args: &[&str], failpoints: Option<String>| {
            let mut cmd = Command::new(bin());
            cmd.args(args)
                .current_dir(t.lake.path())
                .envs(t.backend.env())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            if let Some(f) = failpoints {
                cmd.env("IDEM_FAILPOINTS", f);
            }
            cmd.spawn().unwrap()
        };
        let mut writer = spawn(
            &args,
            Some(format!("{point}=pause:{}", hooks.path().display())),
        );
        let paused = hooks.path().join(format!("{point}.paused"));
        let started = std::time::Instant::now();
        while !paused.exists() {
            assert!(
                writer.try_wait().unwrap().is_none(),
                "{context}: the writer ended before the point"
            );
            assert!(started.elapsed().as_secs() < 120, "{context}: stuck");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut vacuum = spawn(&["vacuum", &target, "--retain-hours", "0", "--json"], None);
        let given = std::time::Instant::now();
        while given.elapsed().as_secs() < 5 && vacuum.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::fs::write(hooks.path().join(format!("{point}.resume")), b"").unwrap();
        let written = writer.wait_with_output().unwrap();
        assert!(
            written.status.success(),
            "{context}: {}",
            String::from_utf8_lossy(&written.stderr)
        );
        let vacuumed = vacuum.wait_with_output().unwrap();
        assert!(
            vacuumed.status.success(),
            "{context}: {}",
            String::from_utf8_lossy(&vacuumed.stderr)
        );
        // Every file the latest version adds is there: the readers see the new rows.
        let until = if point == "before_commit" { 1 } else { 3 };
        assert_eq!(
            delta_rows(&t, "daily", None),
            oracle(&t, Some(&days[..until])),
            "{context}"
        );
    }
}

#[test]
fn vacuum_during_a_commit_local() {
    vacuum_never_deletes_what_a_commit_is_about_to_add(Backend::Local);
}

#[test]
fn vacuum_during_a_commit_s3() {
    vacuum_never_deletes_what_a_commit_is_about_to_add(Backend::S3);
}

/// Another writer appends rows with a column idem's job does not select (a schema
/// merge). idem's next commit used to write its own schema into the table's metadata,
/// and the column's values vanished for every reader. Now the run is refused with the
/// column named, and with `on_schema_change = "allow"` the commit keeps the column
/// (NULL in idem's rows).
#[test]
fn a_column_another_writer_added_is_kept_or_refused_never_dropped() {
    let t = Table::delta(Backend::Local, "delta-foreign-column");
    t.ok(&[
        "backfill",
        &t.daily_job,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-04",
    ]);
    let dir = t.target("daily");
    foreign_write(
        &dir,
        &[
            "append",
            "select (900 + range)::bigint as order_id, 1::bigint as customer_id, \
             9.99::decimal(12, 2) as amount_usd, 'paid' as status, 'vip' as note, \
             date '2026-06-05' as dt from range(3)",
            "dt",
        ],
    );
    let before = (delta_rows(&t, "daily", None), t.data_files_and_log("daily"));
    let notes = |rows: &Value| -> Vec<Value> {
        rows.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["dt"] == "2026-06-05")
            .map(|r| r["note"].clone())
            .collect()
    };
    assert_eq!(notes(&before.0), vec![Value::from("vip"); 3]);
    // The day's raw data is restated: its run would replace the partition.
    t.switch_to_b(Some("2026-06-04"));
    let out = t.idem(&["run", &t.daily_job, "--date", "2026-06-04"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("lacks column `note` of the Delta table") && err.contains("on_schema_change"),
        "{err}"
    );
    assert_eq!(
        (delta_rows(&t, "daily", None), t.data_files_and_log("daily")),
        before
    );

    let text = std::fs::read_to_string(t.lake.join(&t.daily_job)).unwrap();
    let allow = t
        .lake
        .job("daily_allow", &(text + "on_schema_change = \"allow\"\n"));
    t.ok(&["run", &allow, "--date", "2026-06-04"]);
    let after = delta_rows(&t, "daily", None);
    assert_eq!(notes(&after), vec![Value::from("vip"); 3], "{after}");
    let restated: Vec<&Value> = after
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["dt"] == "2026-06-04")
        .collect();
    assert!(!restated.is_empty());
    assert!(restated.iter().all(|r| r["note"].is_null()), "{after}");
    let expected = oracle(&t, Some(&["2026-06-04"]));
    let without_note: Vec<Value> = restated
        .iter()
        .map(|r| {
            let mut r = (*r).clone();
            r.as_object_mut().unwrap().remove("note");
            r
        })
        .collect();
    assert_eq!(Value::Array(without_note), expected);
}

/// A table whose protocol lists a feature idem's commits do not keep (row tracking,
/// domain metadata, v2 checkpoints, Iceberg compatibility, variants) is refused with
/// the feature named and exit 2 before anything is written; one idem keeps (deletion
/// vectors, which its removes name) is written. As a source, only reader features
/// matter: a table with v2 checkpoints is read, one with variants refused.
#[test]
fn a_protocol_feature_idem_does_not_keep_is_refused_before_writing() {
    for (feature, spelled, kept) in [
        ("RowTracking", "rowTracking", false),
        ("DomainMetadata", "domainMetadata", false),
        ("V2Checkpoint", "v2Checkpoint", false),
        ("IcebergCompatV1", "icebergCompatV1", false),
        ("VariantType", "variantType", false),
        ("DeletionVectors", "deletionVectors", true),
    ] {
        let t = Table::delta(Backend::Local, &format!("delta-feature-{spelled}"));
        t.ok(&["run", &t.daily_job, "--date", "2026-06-01"]);
        let dir = t.target("daily");
        readers(&["delta-feature", &dir, feature]);
        let before = (
            delta_log(&t, "daily")["version"].clone(),
            t.data_files_and_log("daily"),
        );
        let out = t.idem(&["run", &t.daily_job, "--date", "2026-06-02"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        if kept {
            // (The deltalake package does not read deletion vectors: the log shows it.)
            assert!(out.status.success(), "{feature}: {err}");
            let log = delta_log(&t, "daily");
            assert_eq!(log["version"], before.0.as_u64().unwrap() + 1, "{feature}");
            assert_eq!(
                log["history"][0]["idem"]["logicalDates"],
                serde_json::json!(["2026-06-02"]),
                "{feature}: {log}"
            );
            continue;
        }
        assert_eq!(out.status.code(), Some(2), "{feature}: {err}");
        assert!(
            err.contains(&format!("the Delta feature `{spelled}`")) && err.contains(&dir),
            "{feature}: {err}"
        );
        assert_eq!(
            (
                delta_log(&t, "daily")["version"].clone(),
                t.data_files_and_log("daily")
            ),
            before,
            "{feature}"
        );
        // The same table as a source of another job.
        let reader = t.lake.job(
            &format!("reads_{spelled}"),
            &format!(
                "name = \"reads\"\n[sources.t]\npath = \"{dir}/\"\n[transform]\nsql = \
                 \"select count(*) as n from t\"\n[target]\npath = \"out/reads\"\n"
            ),
        );
        let out = t.idem(&["run", &reader, "--date", "2026-06-01"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        if spelled == "variantType" {
            assert_eq!(out.status.code(), Some(2), "{feature} as a source: {err}");
            assert!(
                err.contains("`variantType`"),
                "{feature} as a source: {err}"
            );
        } else {
            assert!(out.status.success(), "{feature} as a source: {err}");
        }
    }
}
