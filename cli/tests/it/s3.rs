//! Object stores: sources and tables on an S3-compatible server (moto, on 127.0.0.1)
//! and on Azure Blob Storage (Azurite, on 127.0.0.1).

use crate::common::*;
use crate::conformance::{Backend, Table};

/// A bucket name no other test uses.
pub fn bucket(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "idem-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn idem_s3(lake: &Lake, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
    let env = s3_env();
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(extra);
    idem_in(lake.path(), args, &all)
}

#[test]
fn a_source_on_an_object_store_gives_the_same_table_as_the_same_files_on_disk() {
    for backend in [Backend::S3, Backend::Azure] {
        source_on(backend);
    }
}

/// `idem run JOB --date DATE --json` in the lake with the backend's settings, which
/// must succeed; its report lines.
fn run_on(backend: Backend, lake: &Lake, job: &str, date: &str) -> Vec<serde_json::Value> {
    let env = backend.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = idem_in(lake.path(), &["run", job, "--date", date, "--json"], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&out)
}

fn source_on(backend: Backend) {
    let lake = Lake::new();
    let b = bucket("src");
    let url = format!("{}://{b}/raw/orders/", backend.scheme());
    let raw = lake.join("testdata/lake/raw/orders");
    let keys = readers(&["put", backend.endpoint(), raw.to_str().unwrap(), &url]);
    assert_eq!(keys.as_array().unwrap().len(), 7, "{keys}");

    let local = lake.job(
        "local",
        &std::fs::read_to_string(lake.join("testdata/jobs/fct_orders.toml"))
            .unwrap()
            .replace("lake/analytics/fct_orders/", "out/local/"),
    );
    let remote = lake.job(
        "remote",
        &std::fs::read_to_string(lake.join("testdata/jobs/fct_orders.toml"))
            .unwrap()
            .replace("testdata/lake/raw/orders/", &url)
            .replace("lake/analytics/fct_orders/", "out/remote/"),
    );
    let run = |job: &str| run_on(backend, &lake, job, "2026-06-03");
    run(&local);
    let first = run(&remote);
    assert_eq!(
        actions(&first),
        vec![("dt=2026-06-03".into(), "written".into())]
    );
    // The same rows: equal digests, and the independent readers agree.
    let l = status_digests(&lake, lake.join("out/local").to_str().unwrap());
    let r = status_digests(&lake, lake.join("out/remote").to_str().unwrap());
    assert_eq!(l, r, "{backend:?}");
    assert_eq!(
        readers(&["table", lake.join("out/local").to_str().unwrap()]),
        readers(&["table", lake.join("out/remote").to_str().unwrap()])
    );
    // The manifest records the object it read, by URL, size and ETag.
    let manifest =
        idem_io::manifest::read_from_file(&only_file(&lake.join("out/remote/dt=2026-06-03")))
            .unwrap()
            .unwrap();
    let inputs: Vec<&str> = manifest
        .run
        .inputs
        .iter()
        .map(|i| i.path.as_str())
        .collect();
    assert_eq!(
        inputs,
        [format!("{url}created_date=2026-06-03/part-0.parquet").as_str()],
        "{:?}",
        manifest.run.inputs
    );
    assert!(manifest.run.inputs[0].etag.is_some());
    // A re-run reads the same objects: unchanged.
    let again = run(&remote);
    assert_eq!(
        actions(&again),
        vec![("dt=2026-06-03".into(), "unchanged".into())]
    );
}

/// A merge whose source is Parquet on an object store: the inputs it records (each
/// looked up as a possible idem partition, a request to the store) are read off the
/// async workers, and the table equals the one the same files on disk give.
#[test]
fn a_merge_of_parquet_on_an_object_store_equals_the_same_files_on_disk() {
    let backend = Backend::S3;
    let lake = Lake::new();
    let url = format!("s3://{}/raw/orders/", bucket("merge-src"));
    let raw = lake.join("testdata/lake/raw/orders");
    readers(&["put", backend.endpoint(), raw.to_str().unwrap(), &url]);
    let job = |source: &str, out: &str| {
        format!(
            r#"
name = "orders_by_id"
[sources.orders]
path = "{source}"
format = "parquet"
partitioned_by = ["created_date"]
[transform]
sql = "select order_id, status, amount_usd, cast(created_at as date) as dt from orders where created_date = $run_date"
[target]
path = "{out}"
mode = "merge"
key = ["order_id"]
partition_by = ["dt"]
"#
        )
    };
    let local = lake.job("local", &job(raw.to_str().unwrap(), "out/local"));
    let remote = lake.job("remote", &job(&url, "out/remote"));
    let run = |job: &str| run_on(backend, &lake, job, "2026-06-03");
    run(&local);
    let first = run(&remote);
    assert_eq!(
        actions(&first),
        vec![("dt=2026-06-03".into(), "written".into())]
    );
    assert_eq!(
        status_digests(&lake, lake.join("out/local").to_str().unwrap()),
        status_digests(&lake, lake.join("out/remote").to_str().unwrap())
    );
    let manifest =
        idem_io::manifest::read_from_file(&only_file(&lake.join("out/remote/dt=2026-06-03")))
            .unwrap()
            .unwrap();
    assert_eq!(
        manifest
            .run
            .inputs
            .iter()
            .map(|i| i.path.as_str())
            .collect::<Vec<_>>(),
        [format!("{url}created_date=2026-06-03/part-0.parquet").as_str()]
    );
    let again = run(&remote);
    assert_eq!(
        actions(&again),
        vec![("dt=2026-06-03".into(), "unchanged".into())]
    );
}

#[test]
fn storage_options_in_the_job_and_bad_urls_are_explained() {
    let lake = Lake::new();
    let b = bucket("opt");
    let url = format!("s3://{b}/raw/orders/");
    let raw = lake.join("testdata/lake/raw/orders");
    readers(&["put", s3_endpoint(), raw.to_str().unwrap(), &url]);
    let text = std::fs::read_to_string(lake.join("testdata/jobs/fct_orders.toml"))
        .unwrap()
        .replace("testdata/lake/raw/orders/", &url)
        .replace("lake/analytics/fct_orders/", "out/opt/");
    // The endpoint and http permission from the job, not the environment.
    let with_opts = lake.job(
        "opts",
        &format!(
            "{text}\n[storage]\nendpoint = \"{}\"\nallow_http = true\npath_style = true\nregion = \"us-east-1\"\n",
            s3_endpoint()
        ),
    );
    let out = idem_in(
        lake.path(),
        &["run", &with_opts, "--date", "2026-06-02"],
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same options on the source alone; `--skip-fresh` reaches the recorded inputs
    // with them too (the environment names no endpoint), so the re-run is `fresh`.
    let per_source = lake.job(
        "per_source",
        &text.replace("out/opt/", "out/per_source/").replace(
            &format!("path = \"{url}\""),
            &format!(
                "path = \"{url}\"\nstorage = {{ endpoint = \"{}\", allow_http = true, path_style = true, region = \"us-east-1\" }}",
                s3_endpoint()
            ),
        ),
    );
    let written = std::fs::read_to_string(lake.join(&per_source)).unwrap();
    assert!(written.contains("storage = {"), "{written}");
    let keys_only = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    let backfill = |extra: &[&str]| {
        let mut args = vec!["backfill", &per_source, "--from", "2026-06-02"];
        args.extend_from_slice(&["--to", "2026-06-02", "--json"]);
        args.extend_from_slice(extra);
        let out = idem_in(lake.path(), &args, &keys_only);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        actions(&json_lines(&out))
    };
    assert_eq!(
        backfill(&[]),
        vec![("dt=2026-06-02".into(), "written".into())]
    );
    assert_eq!(
        backfill(&["--skip-fresh"]),
        vec![("dt=2026-06-02".into(), "fresh".into())]
    );
    // A job refused as bad input (exit 2) before anything runs: its error text.
    let refused = |job: &str| {
        let out = idem_s3(&lake, &["run", job, "--date", "2026-06-02"], &[]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{err}");
        err
    };
    // Options on a local source, and two sources of one bucket that disagree, are
    // refused by name before anything runs.
    let local_opts = lake.job(
        "local_opts",
        &std::fs::read_to_string(lake.join("testdata/jobs/fct_orders.toml"))
            .unwrap()
            .replace(
                "path = \"testdata/lake/raw/orders/\"",
                "path = \"testdata/lake/raw/orders/\"\nstorage = { region = \"eu-west-1\" }",
            ),
    );
    let err = refused(&local_opts);
    assert!(
        err.contains("orders") && err.contains("object-store paths"),
        "{err}"
    );
    let two = lake.job(
        "two",
        &format!(
            "name = \"two\"\n\
             [sources.a]\npath = \"s3://{b}/raw/orders/\"\n\
             [sources.b]\npath = \"s3://{b}/raw/orders/\"\nstorage = {{ region = \"eu-west-1\" }}\n\
             [transform]\nsql = \"select * from a\"\n\
             [target]\npath = \"out/two\"\n"
        ),
    );
    let err = refused(&two);
    assert!(
        err.contains("`a` and `b`") && err.contains(&format!("s3://{b}")),
        "{err}"
    );
    // Nor may a source in the target's bucket bring options of its own.
    let shared = lake.job(
        "shared",
        &format!(
            "name = \"shared\"\n\
             [sources.a]\npath = \"s3://{b}/raw/orders/\"\nstorage = {{ region = \"eu-west-1\" }}\n\
             [transform]\nsql = \"select * from a\"\n\
             [target]\npath = \"s3://{b}/out/shared\"\n"
        ),
    );
    let err = refused(&shared);
    assert!(
        err.contains("`a`") && err.contains("target's bucket"),
        "{err}"
    );
    // An unknown storage option is named.
    let bad = lake.job("bad", &format!("{text}\n[storage]\nendpont = \"x\"\n"));
    let err = refused(&bad);
    assert!(err.contains("endpont"), "{err}");
    // A prefix with no objects says so, naming the URL.
    let empty = lake.job(
        "empty",
        &text.replace(&url, &format!("s3://{b}/nothing/here/")),
    );
    let err = refused(&empty);
    assert!(err.contains(&format!("s3://{b}/nothing/here/")), "{err}");
    // An unsupported scheme is refused by name.
    let gopher = lake.job("gopher", &text.replace(&url, "gopher://b/raw/"));
    let out = idem_s3(&lake, &["run", &gopher, "--date", "2026-06-02"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("gopher://"), "{err}");
}

// ---------------------------------------------------------------- tables on S3
// The scenarios every backend must pass are in conformance.rs; here, what only an
// object store has: readers going through the markers while writers race.

#[test]
fn four_concurrent_writers_of_one_partition_on_object_stores() {
    for backend in [Backend::S3, Backend::Azure] {
        four_writers_on(backend);
    }
}

fn four_writers_on(backend: Backend) {
    use std::process::{Command, Stdio};
    let s = Table::new(backend, "four");
    // Four writers whose outputs differ (a constant column): the partition must end as
    // exactly one writer's complete output.
    let jobs: Vec<String> = (0..4)
        .map(|w| {
            let text = std::fs::read_to_string(s.lake.join(&s.job))
                .unwrap()
                .replace(
                    "select order_id,",
                    &format!("select order_id, {w} as writer,"),
                )
                .replace("name = \"crashy\"", &format!("name = \"crashy{w}\""));
            s.lake.job(&format!("writer{w}"), &text)
        })
        .collect();
    // Each writer's clean output, from a local run.
    let refs: Vec<_> = jobs
        .iter()
        .map(|j| {
            let text = std::fs::read_to_string(s.lake.join(j))
                .unwrap()
                .replace(&s.url("lake/crashy"), "out/ref");
            let local = s.lake.job("ref", &text);
            s.run_ok(&local);
            status_digests(&s.lake, "out/ref")
        })
        .collect();
    s.run_ok(&jobs[0]);
    let stop = s.lake.join("stop-watch");
    let marker = s.url("lake/_idem/crashy/markers/dt=2026-06-03.json");
    let part = s.url("lake/crashy/dt=2026-06-03");
    let watcher = {
        let (marker, part, stop) = (marker.clone(), part.clone(), stop.clone());
        std::thread::spawn(move || {
            readers(&[
                "watch",
                backend.endpoint(),
                &marker,
                &part,
                stop.to_str().unwrap(),
            ])
        })
    };
    let children: Vec<_> = jobs
        .iter()
        .map(|j| {
            let j = j.clone();
            let dir = s.lake.path().to_path_buf();
            std::thread::spawn(move || {
                let mut outs = Vec::new();
                for _ in 0..3 {
                    outs.push(
                        Command::new(bin())
                            .args(["run", &j, "--date", "2026-06"])
                            .current_dir(&dir)
                            .envs(backend.env())
                            .env_remove("IDEM_FAILPOINTS")
                            .stdin(Stdio::null())
                            .output()
                            .unwrap(),
                    );
                }
                outs
            })
        })
        .collect();
    for c in children {
        for out in c.join().unwrap() {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    std::fs::write(&stop, "").unwrap();
    let seen = watcher.join().unwrap();
    assert_eq!(
        seen["violations"],
        serde_json::json!([]),
        "{backend:?}: {seen}"
    );
    assert!(seen["reads"].as_u64().unwrap() > 0, "{backend:?}: {seen}");
    // Every partition is one writer's whole output, read through its marker, and a
    // plain listing holds exactly the markers' files.
    let now = s.digests();
    assert_eq!(now.len(), 7);
    for (p, d) in &now {
        assert!(
            refs.iter().any(|r| &r[p] == d),
            "{backend:?} {p}: no writer's output"
        );
    }
    assert_eq!(s.keys("lake/crashy/").len(), 7, "{backend:?}");
    eprintln!("{backend:?} watcher: {seen}");
}

#[test]
fn a_downstream_job_reads_an_s3_idem_table_through_its_markers() {
    let t = Table::new(Backend::S3, "down");
    let downstream = |target: &str, source: &str| {
        format!(
            r#"
name = "per_status"
[sources.orders]
path = "{source}"
partitioned_by = [{{ name = "dt", type = "date" }}]
[transform]
sql = "select dt, status, count(*) as orders, sum(amount_usd) as amount from orders where dt = $run_date group by dt, status"
[target]
path = "{target}"
partition_by = ["dt"]
"#
        )
    };
    let remote = t.lake.job(
        "down_remote",
        &downstream("out/remote", &format!("{}/", t.target("daily"))),
    );
    let local_daily = t.lake.job(
        "daily_local",
        &std::fs::read_to_string(t.lake.join(&t.daily_job))
            .unwrap()
            .replace(&t.target("daily"), "out/daily_local"),
    );
    let local = t
        .lake
        .job("down_local", &downstream("out/local", "out/daily_local/"));
    let day = |job: &str| {
        let out = t.idem(&["run", job, "--date", "2026-06-03", "--json"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for job in [&t.daily_job, &local_daily, &remote, &local] {
        day(job);
    }
    assert_eq!(
        readers(&["table", t.lake.join("out/remote").to_str().unwrap()]),
        readers(&["table", t.lake.join("out/local").to_str().unwrap()])
    );
    // Nothing upstream changed: the downstream date is fresh, from its manifest.
    // `--skip-fresh` of the downstream date, decided from the manifests.
    let skip_fresh = || {
        t.idem(
            &[
                "backfill",
                &remote,
                "--from",
                "2026-06-03",
                "--to",
                "2026-06-03",
                "--skip-fresh",
                "--json",
            ],
            &[],
        )
    };
    let fresh = skip_fresh();
    assert_eq!(
        actions(&json_lines(&fresh)),
        vec![("dt=2026-06-03".into(), "fresh".into())],
        "{}",
        String::from_utf8_lossy(&fresh.stderr)
    );
    // Upstream day 3 changes and is committed but not applied (the run dies right
    // after its marker is put): a plain listing still holds the old file only, but
    // the downstream job reads the committed rows through the marker.
    t.switch_to_b(Some("2026-06-03"));
    let out = t.idem(
        &["run", &t.daily_job, "--date", "2026-06-03"],
        &[("IDEM_FAILPOINTS", "after_swap=abort")],
    );
    assert!(!out.status.success());
    let listed = t.keys("lake/daily/dt=2026-06-03/");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(
        listed[0].ends_with("part-000001-00000.parquet"),
        "{listed:?}"
    );
    day(&local_daily);
    // The upstream partition's digest moved: no longer fresh.
    let stale = skip_fresh();
    assert_eq!(
        actions(&json_lines(&stale)),
        vec![("dt=2026-06-03".into(), "written".into())]
    );
    day(&local);
    assert_eq!(
        readers(&["table", t.lake.join("out/remote").to_str().unwrap()]),
        readers(&["table", t.lake.join("out/local").to_str().unwrap()])
    );
}

#[test]
fn merges_into_object_store_tables_match_duckdb_and_concurrent_merges_both_land() {
    use crate::merge::{base, changes, job, oracle};
    let cases = [Backend::S3, Backend::Azure]
        .into_iter()
        .flat_map(|b| ["", "\"country\""].map(|p| (b, p)));
    for (backend, partition_by) in cases {
        let t = Table::new(backend, "merge");
        let url = t.url("lake/dim_customers");
        let dim = t
            .lake
            .job("dim", &job(partition_by).replace("out/dim_customers", &url));
        let base = base(&t.lake);
        let merge = |src: &str| {
            let out = t.idem(
                &["run", &dim, "--date", "2026-06-01", "--json"],
                &[("SRC", src)],
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            json_lines(&out)
        };
        let rows = || {
            let dir = tempfile::tempdir().unwrap();
            readers(&[
                "get",
                backend.endpoint(),
                &format!("{url}/"),
                dir.path().to_str().unwrap(),
            ]);
            readers(&["table", dir.path().to_str().unwrap()])
        };
        // Merges of the given changes files, all started at once; each must succeed.
        let race = |sources: &[&String]| {
            all_at_once(sources.iter().map(|src| {
                let mut run = std::process::Command::new(bin());
                run.args(["run", &dim, "--date", "2026-06-01"])
                    .current_dir(t.lake.path())
                    .envs(backend.env())
                    .env("SRC", src)
                    .env_remove("IDEM_FAILPOINTS");
                run
            }));
        };
        merge(&base);
        // Updates (even ids move to NZ) and new keys.
        let a = changes(&t.lake, "a", &[10, 11, 12, 13, 14], &[2001, 2002], "NZ");
        merge(&a);
        assert_eq!(rows(), oracle(&base, &[&a]), "{backend:?} [{partition_by}]");
        let keys = t.keys("lake/dim_customers/");
        let again = merge(&a);
        assert!(
            actions(&again).iter().all(|(_, x)| x == "unchanged"),
            "[{partition_by}] {again:?}"
        );
        assert_eq!(t.keys("lake/dim_customers/"), keys);

        // Two merges at once: both land (the loser merges again on top of the winner).
        let b = changes(&t.lake, "b", &[20, 21, 22], &[3001], "ZA");
        let c = changes(&t.lake, "c", &[30, 31, 32], &[3002], "ZA");
        race(&[&b, &c]);
        assert_eq!(
            rows(),
            oracle(&base, &[&a, &b, &c]),
            "{backend:?} [{partition_by}]"
        );
        assert!(t.keys("lake/_idem/dim_customers/staging/").is_empty());

        // Two merges insert one new key into different partitions at once: the key
        // ends in exactly one row (the lock serializes them; the second moves it).
        let x = changes(&t.lake, "x", &[], &[5001], "NZ");
        let y = changes(&t.lake, "y", &[], &[5001], "ZA");
        race(&[&x, &y]);
        let all = rows();
        let copies: Vec<_> = all
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["customer_id"] == "5001")
            .collect();
        assert_eq!(copies.len(), 1, "{backend:?} [{partition_by}] {copies:?}");
        assert!(t.keys("lake/_idem/dim_customers/writes.lock").is_empty());
    }
}

/// Rows of [`one_large_day`].
pub const LARGE_DAY_ROWS: u64 = 2_000_000;

/// Replaces the lake's raw orders with one day large enough for a multipart upload
/// (its output file is over 8 MiB: about 10 MiB, with ids and keys written as deltas).
pub fn one_large_day(t: &Table) {
    let raw = t.lake.join("testdata/lake/raw/orders");
    std::fs::remove_dir_all(&raw).unwrap();
    let spec = idem_testdata::OrdersSpec {
        days: 1,
        rows_per_day: LARGE_DAY_ROWS,
        customers: 1_000_000,
        ..Default::default()
    };
    idem_testdata::write_orders(&raw, &spec).unwrap();
}

/// The multipart uploads in progress under the table's bucket prefix `lake/`.
pub fn uploads_in_progress(t: &Table) -> usize {
    readers(&["s3-uploads", s3_endpoint(), &t.url("lake/")])
        .as_array()
        .unwrap()
        .len()
}

#[test]
fn a_run_killed_mid_upload_leaves_no_parts_behind() {
    let t = Table::new(Backend::S3, "parts");
    one_large_day(&t);
    let uploads = || uploads_in_progress(&t);
    let out = t.idem(
        &["run", &t.daily_job, "--date", "2026-06-01"],
        &[("IDEM_FAILPOINTS", "after_upload_part=abort")],
    );
    assert!(!out.status.success());
    assert_eq!(uploads(), 1, "the killed run left its upload in progress");
    assert!(
        t.keys("lake/daily/").is_empty(),
        "nothing under the table root"
    );
    // The next run aborts the dead run's upload, then publishes its own.
    let done = t.ok(&["run", &t.daily_job, "--date", "2026-06-01", "--json"]);
    assert_eq!(
        actions(&done),
        vec![("dt=2026-06-01".into(), "written".into())]
    );
    assert_eq!(uploads(), 0);
    assert!(t.keys("lake/_idem/daily/uploads/").is_empty());
    assert!(t.keys("lake/_idem/daily/staging/").is_empty());
}
