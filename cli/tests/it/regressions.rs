//! One test per class of bug an adversarial user found (the trust issue): each fails
//! on the build where it was found and passes since. The systematic searches that
//! would have found them (fault injection, schedule exploration, generated inputs)
//! live in `adversary.rs`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::conformance::Backend;
use crate::s3::bucket;

/// An unpartitioned job writing into `target`.
fn flat_job(target: &str) -> String {
    format!(
        r#"
name = "flat"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{{ name = "created_date", type = "date" }}]
[transform]
sql = "select order_id, amount_usd from orders where created_date = $run_date"
[target]
path = "{target}"
partition_by = []
"#
    )
}

fn refused(out: &std::process::Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

/// Class 1: a target that is not a table is refused, named, and left as it was — a
/// project folder, the working directory, a home directory, a source's folder, and a
/// partitioned table with something else in it; on disk and on an object store.
#[test]
fn a_target_that_is_not_a_table_is_refused_and_nothing_under_it_changes() {
    let lake = Lake::new();
    // A project folder: files and a subdirectory beside some Parquet.
    let project = lake.join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(project.join("notes.txt"), "mine").unwrap();
    std::fs::write(project.join("src/main.rs"), "fn main() {}").unwrap();
    std::fs::write(project.join("old.parquet"), "not really").unwrap();
    let before = snapshot(&project);
    let job = lake.job("flat", &flat_job("project"));
    let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
    refused(
        &out,
        &["project", "notes.txt (a file)", "src/ (a directory)"],
    );
    assert_eq!(snapshot(&project), before, "the folder changed");

    // The working directory, and a directory that holds it.
    for target in [".", ".."] {
        let job = lake.job("cwd", &flat_job(target));
        let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
        refused(&out, &["working directory"]);
    }
    // A home directory (as $HOME says), even an empty one.
    let home = lake.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let job = lake.job("home", &flat_job(home.to_str().unwrap()));
    let out = idem_in(
        lake.path(),
        &["run", &job, "--date", "2026-06-01"],
        &[("HOME", home.to_str().unwrap())],
    );
    refused(&out, &["home directory"]);
    // A source's folder, and a folder holding it.
    for target in ["testdata/lake/raw/orders", "testdata/lake"] {
        let before = snapshot(&lake.join("testdata"));
        let job = lake.job("src", &flat_job(target));
        let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
        refused(&out, &["source `orders`"]);
        assert_eq!(snapshot(&lake.join("testdata")), before);
    }
    // A partitioned table with a stray directory inside a partition, or a file at its
    // root: refused before the partition would be swapped.
    let fct = "testdata/jobs/fct_orders.toml";
    lake.idem_ok(&["run", fct, "--date", "2026-06-01"]);
    let table = lake.join("lake/analytics/fct_orders");
    std::fs::create_dir_all(table.join("dt=2026-06-01/backup")).unwrap();
    std::fs::write(table.join("dt=2026-06-01/backup/keep.txt"), "keep").unwrap();
    std::fs::write(table.join("README.md"), "readme").unwrap();
    let before = snapshot(&table);
    let out = lake.idem(&["run", fct, "--date", "2026-06-01"]);
    refused(
        &out,
        &["README.md (a file)", "dt=2026-06-01/backup/ (a directory)"],
    );
    assert_eq!(snapshot(&table), before);

    // An object-store prefix holding other objects.
    for backend in [Backend::S3, Backend::Azure] {
        let b = bucket("notatable");
        let url = format!("{}://{b}/project", backend.scheme());
        readers(&["put", backend.endpoint(), project.to_str().unwrap(), &url]);
        let keys = || {
            readers(&[
                "list",
                backend.endpoint(),
                &format!("{}://{b}/", backend.scheme()),
            ])
        };
        let before = keys();
        let job = lake.job("remote", &flat_job(&url));
        let env = backend.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = idem_in(lake.path(), &["run", &job, "--date", "2026-06-01"], &env);
        refused(&out, &["notes.txt (a file)", "src/ (a directory)"]);
        assert_eq!(keys(), before, "{backend:?}: the prefix changed");
    }
}

/// A table of dimension rows at `target`, partitioned by country: merged by
/// `merge.rs`'s job, and replaced country by country by a job reading `people.csv`.
fn people_jobs(lake: &Lake, target: &str) -> (String, String) {
    let merge = lake.job(
        "dim",
        &crate::merge::job("\"country\"").replace("out/dim_customers", target),
    );
    let replace = lake.job(
        "people",
        &format!(
            r#"
name = "people"
[sources.people]
path = "people.csv"
format = "csv"
[transform]
sql = "select customer_id, email, country, cast(signup_date as date) as signup_date from people"
[target]
path = "{target}"
partition_by = ["country"]
"#
        ),
    );
    std::fs::write(
        lake.join("people.csv"),
        "customer_id,email,country,signup_date\n\
         5001,replaced5001@example.com,US,2021-01-01\n\
         5002,replaced5002@example.com,US,2021-01-02\n",
    )
    .unwrap();
    (merge, replace)
}

/// A people table of `backend`: its target, and the environment its runs need.
fn people_target(backend: Backend) -> (String, Vec<(&'static str, String)>) {
    if backend == Backend::Local {
        return ("out/dim_customers".into(), Vec::new());
    }
    let b = bucket("people");
    let root = format!("{}://{b}/", backend.scheme());
    idem_testdata::servers::create_bucket(backend.endpoint(), &root);
    (format!("{root}dim_customers"), backend.env())
}

/// The rows of the table at `target` as the independent readers see them (an object
/// store's table downloaded first).
fn rows_at(lake: &Lake, backend: Backend, target: &str) -> serde_json::Value {
    if backend == Backend::Local {
        return readers(&["table", lake.join(target).to_str().unwrap()]);
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().to_str().unwrap();
    readers(&["get", backend.endpoint(), &format!("{target}/"), table]);
    readers(&["table", table])
}

/// Class 2: a merge that read the table, then waited while a replace run of the same
/// table published, must not publish "the table it read + its changes" over the
/// replace: the end state is one of the two serial orders (here: the merge computed
/// again on top of the replace). The merge waits either after listing the table's
/// files (the replace's apply then removes files it is about to read: on an object
/// store, a 404 that must not fail it) or with its result staged.
#[test]
fn a_merge_and_a_replace_run_of_one_table_end_in_a_serial_order() {
    for backend in [Backend::Local, Backend::S3] {
        for point in ["merge_read", "before_publish"] {
            merge_against_replace(backend, point);
        }
    }
}

/// Runs `job` of `lake` for 2026-06-01 with `$SRC` set to `src` and `env`; it must
/// succeed (`case` says which case failed).
fn run_people(lake: &Lake, env: &[(&'static str, String)], job: &str, src: &str, case: &str) {
    let mut vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("SRC", src));
    let out = idem_in(lake.path(), &["run", job, "--date", "2026-06-01"], &vars);
    assert!(
        out.status.success(),
        "{case}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The people table of `backend` after its two serial orders (merge of the changes
/// `ch` of `lake`, replace): (merge first, replace first).
fn people_serial_orders(lake: &Lake, backend: Backend) -> (serde_json::Value, serde_json::Value) {
    let serial = |first_merge: bool| {
        let other = Lake::new();
        let (target, env) = people_target(backend);
        let (m, r) = people_jobs(&other, &target);
        let base = crate::merge::base(&other);
        let ch = other.join("ch.csv");
        std::fs::copy(lake.join("ch.csv"), &ch).unwrap();
        let run = |job: &str, src: &str| run_people(&other, &env, job, src, "serial order");
        run(&m, &base);
        if first_merge {
            run(&m, ch.to_str().unwrap());
            run(&r, "");
        } else {
            run(&r, "");
            run(&m, ch.to_str().unwrap());
        }
        rows_at(&other, backend, &target)
    };
    let orders = (serial(true), serial(false));
    assert_ne!(orders.0, orders.1);
    orders
}

/// The changes the people merge applies: updates of US rows (kept in US), a new key.
fn people_changes(lake: &Lake) -> String {
    crate::merge::changes(lake, "ch", &[1, 3, 5, 7, 9, 11], &[9001], "US")
}

fn merge_against_replace(backend: Backend, point: &str) {
    let case = format!("{backend:?}, the merge paused at {point}");
    let lake = Lake::new();
    let (target, env) = people_target(backend);
    let (merge, replace) = people_jobs(&lake, &target);
    run_people(&lake, &env, &merge, &crate::merge::base(&lake), &case);
    let ch = people_changes(&lake);
    let (merge_first, replace_first) = people_serial_orders(&lake, backend);

    // The merge reads the table, then waits at `point`.
    let hooks = tempfile::tempdir().unwrap();
    let merging = Command::new(bin())
        .args(["run", &merge, "--date", "2026-06-01"])
        .current_dir(lake.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("SRC", &ch)
        .env(
            "IDEM_FAILPOINTS",
            format!("{point}=pause:{}", hooks.path().display()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&hooks.path().join(format!("{point}.paused")));
    // The replace run publishes meanwhile.
    run_people(&lake, &env, &replace, "", &case);
    std::fs::write(hooks.path().join(format!("{point}.resume")), "").unwrap();
    let out = merging.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{case}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end = rows_at(&lake, backend, &target);
    assert!(
        end == merge_first || end == replace_first,
        "{case}: the table matches no serial order of the merge and the replace"
    );
    assert_eq!(
        end, replace_first,
        "{case}: the merge was computed again on the replace"
    );
}

/// Found by the schedule search on S3: a merge read a file of the table (its footer),
/// a replace run's apply then removed it, and the merge's next read of it failed with
/// the store's "not found" instead of the merge being computed again. Here the merge
/// stops at each call on the live file of the partition the replace rewrites in turn
/// (`IDEM_FAULTS=pause@N:<key>`: its listing, footer and data reads, the checks after,
/// its apply), the replace publishes there, and the merge must land on top of it; or,
/// where the merge holds the table's publish lock, the replace must wait for it
/// (found here: a lease refreshed with equal content kept its ETag, and a waiter took
/// the lock of a live holder after three heartbeats).
#[test]
fn a_merge_whose_read_of_a_file_races_its_removal_is_computed_again() {
    let backend = Backend::S3;
    let lake = Lake::new();
    let ch = people_changes(&lake);
    let (merge_first, replace_first) = people_serial_orders(&lake, backend);
    let mut recomputed = 0;
    let mut waited_out = false;
    for n in 1.. {
        let case = format!("the merge paused at its call {n} on the live US file");
        let (target, env) = people_target(backend);
        let (merge, replace) = people_jobs(&lake, &target);
        run_people(&lake, &env, &merge, &crate::merge::base(&lake), &case);
        let hooks = tempfile::tempdir().unwrap();
        let mut merging = Command::new(bin())
            .args(["run", &merge, "--date", "2026-06-01"])
            .current_dir(lake.path())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("SRC", &ch)
            .env(
                "IDEM_FAULTS",
                format!("pause@{n}:dim_customers/country=US/part-"),
            )
            .env("IDEM_FAULTS_DIR", hooks.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let flag = hooks.path().join("fault.paused");
        let reached = loop {
            if flag.exists() {
                break true;
            }
            if merging.try_wait().unwrap().is_some() {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if reached {
            let root = format!("{}/", target.rsplit_once('/').unwrap().0);
            let keys = readers(&["list", backend.endpoint(), &root]).to_string();
            if keys.contains("/publish.lock\"") {
                // The merge is publishing: the replace waits for it, however long it
                // takes, as long as the merge's lease is refreshed (once, for more than
                // three heartbeats).
                let mut vars = env.clone();
                vars.push(("SRC", String::new()));
                let mut replacing = Command::new(bin())
                    .args(["run", &replace, "--date", "2026-06-01"])
                    .current_dir(lake.path())
                    .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                if !waited_out {
                    std::thread::sleep(Duration::from_secs(35));
                    assert!(
                        replacing.try_wait().unwrap().is_none(),
                        "{case}: the replace took the publish lock of a live merge"
                    );
                    waited_out = true;
                }
                std::fs::write(hooks.path().join("fault.resume"), "").unwrap();
                let out = replacing.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "{case}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            } else {
                run_people(&lake, &env, &replace, "", &case);
                std::fs::write(hooks.path().join("fault.resume"), "").unwrap();
            }
        }
        let out = merging.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{case} ({}): {}",
            std::fs::read_to_string(&flag).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
        if !reached {
            break;
        }
        // Paused before its commit, the merge is computed again on the replace; paused
        // after it (its apply, its checks), it landed first.
        let end = rows_at(&lake, backend, &target);
        let at = std::fs::read_to_string(&flag).unwrap_or_default();
        assert!(
            end == merge_first || end == replace_first,
            "{case} ({at}): the table matches no serial order of the merge and the replace"
        );
        eprintln!(
            "{n} {at}: {}",
            if end == replace_first {
                "replace first"
            } else {
                "merge first"
            }
        );
        recomputed += usize::from(end == replace_first);
    }
    assert!(
        recomputed >= 3,
        "only {recomputed} pauses before the merge's commit: the search missed the reads"
    );
    assert!(waited_out, "no pause while the merge held the publish lock");
}

/// Found by the schedule search on S3: a job reading an idem table on an object store
/// read a partition's marker while its apply was under way, so it read a file from
/// the writer's staging; the writer finished and removed its staging, and the reading
/// job failed ("No files found … Cannot infer schema") instead of reading the marker
/// again. Here the reader stops at its first call on the writer's staging
/// (`IDEM_FAULTS=pause@1:<staging>`) while the writer is paused right after its
/// commit; the writer finishes; the reader must then read the new version.
#[test]
fn a_job_reading_an_object_store_table_reads_it_again_when_an_apply_finishes_under_it() {
    let lake = Lake::new();
    let (target, env) = people_target(Backend::S3);
    let upstream = lake.job(
        "upstream",
        &format!(
            r#"
name = "upstream"
[sources.orders]
path = "orders.csv"
format = "csv"
[transform]
sql = "select order_id, amount_usd, cast(dt as date) as dt from orders"
[target]
path = "{target}"
partition_by = ["dt"]
"#
        ),
    );
    let copy = lake.job(
        "copy",
        &format!(
            r#"
name = "copy"
[sources.t]
path = "{target}/"
[transform]
sql = "select order_id, amount_usd from t"
[target]
path = "out/copy"
"#
        ),
    );
    // Version `v` of the orders of 2026-06-01.
    let orders = |v: u32| {
        let mut csv = String::from("order_id,amount_usd,dt\n");
        for id in 1..=50 {
            csv.push_str(&format!("{id},{}.25,2026-06-01\n", id * 10 + v));
        }
        std::fs::write(lake.join("orders.csv"), csv).unwrap();
    };
    let vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    orders(0);
    let out = idem_in(
        lake.path(),
        &["run", &upstream, "--date", "2026-06-01"],
        &vars,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    orders(1);

    // The writer of a new version stops right after its commit, before its apply.
    let writer_hooks = tempfile::tempdir().unwrap();
    let writer = Command::new(bin())
        .args(["run", &upstream, "--date", "2026-06-01"])
        .current_dir(lake.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env(
            "IDEM_FAILPOINTS",
            format!("after_swap=pause:{}", writer_hooks.path().display()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&writer_hooks.path().join("after_swap.paused"));
    // The reader stops at its first call on the writer's staging.
    let reader_hooks = tempfile::tempdir().unwrap();
    let reader = Command::new(bin())
        .args(["run", &copy, "--date", "2026-06-01"])
        .current_dir(lake.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("IDEM_FAULTS", "pause@1:/staging/")
        .env("IDEM_FAULTS_DIR", reader_hooks.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&reader_hooks.path().join("fault.paused"));
    // The writer finishes (its apply, then its staging removed); then the reader goes on.
    std::fs::write(writer_hooks.path().join("after_swap.resume"), "").unwrap();
    let out = writer.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(reader_hooks.path().join("fault.resume"), "").unwrap();
    let out = reader.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the reading job failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It read the new version.
    let pairs = |rows: serde_json::Value| -> std::collections::BTreeSet<(String, String)> {
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| (r["order_id"].to_string(), r["amount_usd"].to_string()))
            .collect()
    };
    let copied = pairs(readers(&["table", lake.join("out/copy").to_str().unwrap()]));
    assert_eq!(copied, pairs(rows_at(&lake, Backend::S3, &target)));
}

fn wait_for(flag: &Path) {
    let t = Instant::now();
    while !flag.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{} never appeared",
            flag.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A merge job over the daily orders: each date upserts that day's orders by key.
const MERGE_ORDERS: &str = r#"
name = "orders_merged"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = "select order_id, customer_id, amount_usd, status, created_date as dt from orders where created_date = $run_date"
[target]
path = "out/orders_merged"
mode = "merge"
key = ["order_id"]
partition_by = ["dt"]
"#;

/// Class 3: a backfill of a merge job with default flags ran four merges on a runtime
/// of two worker threads, each waiting for the table's write lock on a worker: hung
/// for ever. It must finish on 1, 2 and 4 worker threads.
#[test]
fn a_default_backfill_of_a_merge_job_finishes_on_any_number_of_worker_threads() {
    for threads in ["1", "2", "4"] {
        let lake = Lake::new();
        let job = lake.job("merged", MERGE_ORDERS);
        let mut child = Command::new(bin())
            .args([
                "backfill",
                &job,
                "--from",
                "2026-06-01",
                "--to",
                "2026-06-04",
                "--json",
            ])
            .current_dir(lake.path())
            .env("TOKIO_WORKER_THREADS", threads)
            .env_remove("IDEM_FAILPOINTS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(300) {
                child.kill().ok();
                panic!("{threads} worker threads: the backfill hung");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let written = actions(&json_lines(&out));
        assert_eq!(written.len(), 4, "{threads}: {written:?}");
        assert!(written.iter().all(|(_, a)| a == "written"), "{written:?}");
    }
}

/// Class 4: `--skip-fresh` must see a source that moved: `path = "${SRC}/"` pointed at
/// other data is another input, not a fresh date.
#[test]
fn skip_fresh_follows_a_source_path_that_an_environment_variable_moved() {
    let lake = Lake::new();
    let job = lake.job(
        "env",
        &std::fs::read_to_string(lake.join("testdata/jobs/fct_orders.toml"))
            .unwrap()
            .replace("testdata/lake/raw/orders/", "${SRC}/"),
    );
    let a = lake.join("testdata/lake/raw/orders");
    let b = lake.join("other/orders");
    let spec = idem_testdata::OrdersSpec {
        seed: 77,
        ..Default::default()
    };
    idem_testdata::write_orders(&b, &spec).unwrap();
    let run = |src: &Path, extra: &[&str]| {
        let mut args = vec![
            "backfill",
            &job,
            "--from",
            "2026-06-02",
            "--to",
            "2026-06-02",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = idem_in(lake.path(), &args, &[("SRC", src.to_str().unwrap())]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        actions(&json_lines(&out))
    };
    run(&a, &[]);
    assert_eq!(
        run(&a, &["--skip-fresh"]),
        vec![("dt=2026-06-02".into(), "fresh".into())]
    );
    assert_eq!(
        run(&b, &["--skip-fresh"]),
        vec![("dt=2026-06-02".into(), "written".into())]
    );
    // The table now holds B's rows: the same as a clean run over B.
    let reference = Lake::new();
    let rjob = reference.job("env", &std::fs::read_to_string(lake.join(&job)).unwrap());
    let out = idem_in(
        reference.path(),
        &["run", &rjob, "--date", "2026-06-02"],
        &[("SRC", b.to_str().unwrap())],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        status_digests(&lake, "lake/analytics/fct_orders"),
        status_digests(&reference, "lake/analytics/fct_orders")
    );
}

/// Class 5: an hourly table on an object store (partition values holding `:`) is
/// keyed exactly as Hive escapes it, once: idem finds its own partitions again, and a
/// plain lister reads the hour back.
#[test]
fn an_hourly_table_on_an_object_store_is_escaped_once_and_found_again() {
    for backend in [Backend::S3, Backend::Azure] {
        let lake = Lake::new();
        let b = bucket("hourly");
        idem_testdata::servers::create_bucket(
            backend.endpoint(),
            &format!("{}://{b}/", backend.scheme()),
        );
        let target = format!("{}://{b}/lake/hourly", backend.scheme());
        let job = lake.job("hourly", &crate::run::hourly_job(&target));
        let env = backend.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let run = || {
            let out = idem_in(
                lake.path(),
                &["run", &job, "--date", "2026-06-02T05", "--json"],
                &env,
            );
            assert!(
                out.status.success(),
                "{backend:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            actions(&json_lines(&out))
        };
        let first = run();
        assert_eq!(first.len(), 1, "{backend:?}: {first:?}");
        let keys = readers(&["list", backend.endpoint(), &format!("{target}/")]);
        let keys: Vec<&str> = keys
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert_eq!(keys.len(), 1, "{backend:?}: {keys:?}");
        assert!(
            keys[0].starts_with("lake/hourly/hour=2026-06-02 05%3A00%3A00/"),
            "{backend:?}: {keys:?}"
        );
        // idem finds it: status lists it, a re-run is unchanged, gc finds nothing.
        let out = idem_in(lake.path(), &["status", &target, "--json"], &env);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let parts = status["partitions"].as_array().unwrap();
        assert_eq!(parts.len(), 1, "{backend:?}: {status}");
        assert_eq!(parts[0]["partition"], "hour=2026-06-02 05%3A00%3A00");
        assert_eq!(parts[0]["state"], "managed");
        assert_eq!(run(), vec![(first[0].0.clone(), "unchanged".into())]);
        // A downstream job reads it as an idem source (through the marker).
        let down = lake.job(
            "down",
            &format!(
                r#"
name = "down"
[sources.hourly]
path = "{target}/"
partitioned_by = [{{ name = "hour", type = "string" }}]
[transform]
sql = "select count(*) as n, hour from hourly group by hour"
[target]
path = "out/down"
partition_by = []
"#
            ),
        );
        let out = idem_in(lake.path(), &["run", &down, "--date", "2026-06-02"], &env);
        assert!(
            out.status.success(),
            "{backend:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = readers(&["table", lake.join("out/down").to_str().unwrap()]);
        assert_eq!(
            rows[0]["hour"], "2026-06-02 05:00:00",
            "{backend:?}: {rows}"
        );
    }
}

/// Class 6: a file copied into a live partition on an object store is not served for
/// ever: the next run that owns the partition publishes it again without it.
#[test]
fn a_foreign_file_in_an_object_store_partition_is_replaced_by_the_next_run() {
    for backend in [Backend::S3, Backend::Azure] {
        let t = crate::conformance::Table::new(backend, "foreign");
        let first = t.ok(&["run", &t.daily_job, "--date", "2026-06-02", "--json"]);
        assert_eq!(
            actions(&first),
            vec![("dt=2026-06-02".into(), "written".into())]
        );
        let clean = t.plain_daily_rows();
        // Another tool drops a Parquet file of the same columns into the live
        // partition (here: a day of the local reference table).
        t.reference();
        let extra = tempfile::tempdir().unwrap();
        std::fs::copy(
            only_file(&t.lake.join("out/ref/dt=2026-06-01")),
            extra.path().join("extra.parquet"),
        )
        .unwrap();
        readers(&[
            "put",
            backend.endpoint(),
            extra.path().to_str().unwrap(),
            &t.url("lake/daily/dt=2026-06-02"),
        ]);
        assert_ne!(t.plain_daily_rows(), clean);
        let status = t.status_any("daily");
        assert_eq!(
            status["partitions"][0]["state"], "pending",
            "{backend:?}: {status}"
        );
        let again = t.ok(&["run", &t.daily_job, "--date", "2026-06-02", "--json"]);
        assert_eq!(
            actions(&again),
            vec![("dt=2026-06-02".into(), "written".into())],
            "{backend:?}"
        );
        assert_eq!(t.plain_daily_rows(), clean, "{backend:?}");
        assert_eq!(t.data_files("daily").len(), 1, "{backend:?}");
        let third = t.ok(&["run", &t.daily_job, "--date", "2026-06-02", "--json"]);
        assert_eq!(
            actions(&third),
            vec![("dt=2026-06-02".into(), "unchanged".into())]
        );
    }
}

/// Partition columns named `_x` or `.x` hide their partitions from readers that skip
/// such directories (idem's listings among them: a merge then dropped rows): refused.
#[test]
fn a_partition_column_readers_would_skip_is_refused() {
    let lake = Lake::new();
    for col in ["_dt", ".dt"] {
        let job = lake.job(
            "hidden",
            &std::fs::read_to_string(lake.join("testdata/jobs/fct_orders.toml"))
                .unwrap()
                .replace("as dt", &format!("as \"{col}\""))
                .replace(
                    "partition_by = [\"dt\"]",
                    &format!("partition_by = [\"{col}\"]"),
                ),
        );
        let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
        refused(&out, &[&format!("partition_by column `{col}`"), "skip"]);
        assert!(!lake.join("lake/analytics/fct_orders").exists());
    }
}

/// No two versions of a partition share a file name: a reader that listed the old
/// version and opens its files one by one cannot get a newer version's file.
#[test]
fn every_version_of_a_partition_has_its_own_file_names() {
    let lake = Lake::new();
    let fct = "testdata/jobs/fct_orders.toml";
    let names = |lake: &Lake| -> Vec<String> {
        std::fs::read_dir(lake.join("lake/analytics/fct_orders/dt=2026-06-03"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    lake.idem_ok(&["run", fct, "--date", "2026-06-03"]);
    let first = names(&lake);
    let spec = idem_testdata::OrdersSpec {
        seed: 5,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 2).unwrap();
    let report = lake.idem_ok(&["run", fct, "--date", "2026-06-03", "--json"]);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-03".into(), "written".into())]
    );
    let second = names(&lake);
    assert_eq!(second.len(), 1);
    assert!(
        first.iter().all(|n| !second.contains(n)),
        "{first:?} {second:?}"
    );
}

/// A source that is one file is unchanged by other files in its folder: the date is
/// fresh, and `idem status` says its input is current (it named the job file, which
/// sat beside the source, as a changed input).
#[test]
fn a_single_file_source_is_not_changed_by_its_neighbours() {
    let lake = Lake::new();
    let dir = lake.join("jobs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        lake.join("testdata/lake/raw/customers/customers.csv"),
        dir.join("customers.csv"),
    )
    .unwrap();
    let job = lake.job(
        "single",
        r#"
name = "single"
[sources.customers]
path = "jobs/customers.csv"
format = "csv"
[transform]
sql = """
select customer_id, email, country, cast(signup_date as date) as dt
from customers where cast(signup_date as date) = $run_date
"""
[target]
path = "out/single"
partition_by = ["dt"]
"#,
    );
    let backfill = |extra: &[&str]| {
        let mut args = vec![
            "backfill",
            &job,
            "--from",
            "2015-01-10",
            "--to",
            "2015-01-10",
            "--json",
        ];
        args.extend_from_slice(extra);
        actions(&lake.idem_ok(&args))
    };
    assert_eq!(
        backfill(&[]),
        vec![("dt=2015-01-10".into(), "written".into())]
    );
    // Other files beside it (the job file sits there too).
    std::fs::write(dir.join("notes.csv"), "a,b\n1,2\n").unwrap();
    assert_eq!(
        backfill(&["--skip-fresh"]),
        vec![("dt=2015-01-10".into(), "fresh".into())]
    );
    let out = lake.idem(&["status", "out/single", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for p in status["partitions"].as_array().unwrap() {
        assert_eq!(p["input_state"], "current", "{p}");
    }
    // A change to the file itself is still seen.
    let text = std::fs::read_to_string(dir.join("customers.csv")).unwrap();
    std::fs::write(dir.join("customers.csv"), text.replace("user1@", "other1@")).unwrap();
    assert_eq!(
        backfill(&["--skip-fresh"]),
        vec![("dt=2015-01-10".into(), "written".into())]
    );
}

/// A partition value too long for a directory name is refused by name, before
/// anything is staged (generated values found it: it failed deep in staging).
#[test]
fn a_partition_value_too_long_for_a_directory_is_refused() {
    let lake = Lake::new();
    let job = lake.job(
        "long",
        r#"
name = "long"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = "select order_id, repeat('x', 300) as tag from orders where created_date = $run_date"
[target]
path = "out/long"
partition_by = ["tag"]
"#,
    );
    let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
    refused(&out, &["tag=xxxx", "304 bytes long", "255"]);
    assert!(!lake.join("out/long").exists());
}

/// Runs that each publish several partitions of one object-store table publish one
/// after the other, never interleaved (each partition's commit is atomic on its own,
/// so without a table-wide publish lease a month run could land half before and half
/// after another). The first is stopped after its first partition; the second, with
/// other source data, must wait for it; the month ends all one run's.
#[test]
fn runs_publishing_several_partitions_of_an_object_store_table_do_not_interleave() {
    for backend in [Backend::S3, Backend::Azure] {
        let t = crate::conformance::Table::new(backend, "interleave");
        let a = t.reference();
        t.run_ok(&t.job);
        // A second lake whose sources hold state B, running the same job.
        let other = crate::conformance::Table::new(backend, "interleave-b");
        other.switch_to_b(None);
        let b = other.reference();
        let job_b = other.lake.job(
            "crashy",
            &std::fs::read_to_string(t.lake.join(&t.job)).unwrap(),
        );
        let hooks = tempfile::tempdir().unwrap();
        let spawn = |lake: &Lake, job: &str, env: Vec<(String, String)>| {
            Command::new(bin())
                .args(["run", job, "--date", "2026-06"])
                .current_dir(lake.path())
                .envs(backend.env())
                .envs(env)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        // A: state A again (a month rewrite after state B went in first).
        t.switch_to_b(None);
        t.run_ok(&t.job);
        t.switch_to_a();
        let first = spawn(
            &t.lake,
            &t.job,
            vec![(
                "IDEM_FAILPOINTS".into(),
                format!("after_publish_one=pause:{}", hooks.path().display()),
            )],
        );
        wait_for(&hooks.path().join("after_publish_one.paused"));
        let mut second = spawn(&other.lake, &job_b, Vec::new());
        // The second cannot publish while the first holds the table's publish lease.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(8) {
            assert!(
                second.try_wait().unwrap().is_none(),
                "{backend:?}: the second run published while the first was publishing"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::write(hooks.path().join("after_publish_one.resume"), "").unwrap();
        for child in [first, second] {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The second ran last: all of the month is B.
        assert_eq!(t.digests(), b, "{backend:?}");
        assert_ne!(a, b);
    }
}

/// A run owns every partition its window holds when it publishes, not only those it
/// saw when it started: in a table of several partition columns, a partition another
/// run created meanwhile is emptied too (as a serial order would), not left beside it.
#[test]
fn a_run_owns_the_partitions_of_its_window_that_appeared_while_it_ran() {
    let lake = Lake::new();
    let job = |country: &str| {
        lake.job(
            &format!("by_{country}"),
            &format!(
                r#"
name = "by_{country}"
[sources.customers]
path = "testdata/lake/raw/customers/customers.csv"
format = "csv"
[transform]
sql = "select customer_id, email, $run_date as dt, country from customers where country = '{country}'"
[target]
path = "out/by_country"
partition_by = ["dt", "country"]
"#
            ),
        )
    };
    let (us, fr) = (job("US"), job("FR"));
    let hooks = tempfile::tempdir().unwrap();
    let paused = Command::new(bin())
        .args(["run", &us, "--date", "2026-06-01"])
        .current_dir(lake.path())
        .env(
            "IDEM_FAILPOINTS",
            format!("before_publish=pause:{}", hooks.path().display()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&hooks.path().join("before_publish.paused"));
    lake.idem_ok(&["run", &fr, "--date", "2026-06-01"]);
    std::fs::write(hooks.path().join("before_publish.resume"), "").unwrap();
    let out = paused.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The FR run, then the US run: the US run owns dt=2026-06-01 and empties FR.
    let out = lake.idem(&["status", "out/by_country", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<(String, u64)> = status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["partition"].as_str().unwrap().to_string(),
                p["rows"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].0, "dt=2026-06-01/country=FR");
    assert_eq!(rows[0].1, 0, "{rows:?}");
    assert!(rows[1].1 > 0, "{rows:?}");
}

/// A table inside a directory source's folder would read itself back (and its
/// staging, which sits beside it): refused.
#[test]
fn a_target_inside_a_directory_source_is_refused() {
    let lake = Lake::new();
    let job = lake.job(
        "inside",
        &std::fs::read_to_string(lake.join("testdata/jobs/fct_orders.toml"))
            .unwrap()
            .replace("lake/analytics/fct_orders/", "testdata/lake/raw/orders/out"),
    );
    let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
    refused(&out, &["inside the folder of source `orders`"]);
    assert!(!lake.join("testdata/lake/raw/orders/out").exists());
}
