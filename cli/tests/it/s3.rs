//! Object stores: sources and tables on an S3-compatible server (moto, on 127.0.0.1).

use crate::common::*;

/// A bucket name no other test uses.
fn bucket(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "idem-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn idem_s3(lake: &Lake, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
    let env = s3_env();
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(extra);
    idem_in(lake.path(), args, &all)
}

#[test]
fn a_source_on_s3_gives_the_same_table_as_the_same_files_on_disk() {
    let lake = Lake::new();
    let b = bucket("src");
    let url = format!("s3://{b}/raw/orders/");
    let raw = lake.join("testdata/lake/raw/orders");
    let keys = readers(&["s3-put", s3_endpoint(), raw.to_str().unwrap(), &url]);
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
    let run = |job: &str| {
        let out = idem_s3(&lake, &["run", job, "--date", "2026-06-03", "--json"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out)
    };
    run(&local);
    let first = run(&remote);
    assert_eq!(
        actions(&first),
        vec![("dt=2026-06-03".into(), "written".into())]
    );
    // The same rows: equal digests, and the independent readers agree.
    let l = status_digests(&lake, lake.join("out/local").to_str().unwrap());
    let r = status_digests(&lake, lake.join("out/remote").to_str().unwrap());
    assert_eq!(l, r);
    assert_eq!(
        readers(&["table", lake.join("out/local").to_str().unwrap()]),
        readers(&["table", lake.join("out/remote").to_str().unwrap()])
    );
    // The manifest records the object it read, by URL, size and ETag.
    let manifest = idem_io::manifest::read_from_file(
        &lake.join("out/remote/dt=2026-06-03/part-00000.parquet"),
    )
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

#[test]
fn storage_options_in_the_job_and_bad_urls_are_explained() {
    let lake = Lake::new();
    let b = bucket("opt");
    let url = format!("s3://{b}/raw/orders/");
    let raw = lake.join("testdata/lake/raw/orders");
    readers(&["s3-put", s3_endpoint(), raw.to_str().unwrap(), &url]);
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
    // An unknown storage option is named.
    let bad = lake.job("bad", &format!("{text}\n[storage]\nendpont = \"x\"\n"));
    let out = idem_s3(&lake, &["run", &bad, "--date", "2026-06-02"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("endpont"), "{err}");
    // A prefix with no objects says so, naming the URL.
    let empty = lake.job(
        "empty",
        &text.replace(&url, &format!("s3://{b}/nothing/here/")),
    );
    let out = idem_s3(&lake, &["run", &empty, "--date", "2026-06-02"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("s3://{b}/nothing/here/")), "{err}");
    // An unsupported scheme is refused by name.
    let gopher = lake.job("gopher", &text.replace(&url, "gopher://b/raw/"));
    let out = idem_s3(&lake, &["run", &gopher, "--date", "2026-06-02"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("gopher://"), "{err}");
}

// ---------------------------------------------------------------- tables on S3

const MONTH_JOB: &str = r#"
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

/// A lake whose month job writes to a fresh bucket; the second source state (B) is the
/// same days regenerated with another seed.
struct S3Lake {
    lake: Lake,
    bucket: String,
    job: String,
    local_job: String,
    b: tempfile::TempDir,
}

impl S3Lake {
    fn new(tag: &str) -> S3Lake {
        let lake = Lake::new();
        let bucket = bucket(tag);
        let empty = tempfile::tempdir().unwrap();
        readers(&[
            "s3-put",
            s3_endpoint(),
            empty.path().to_str().unwrap(),
            &format!("s3://{bucket}/"),
        ]);
        let job = lake.job(
            "crashy",
            &MONTH_JOB.replace("TARGET", &format!("s3://{bucket}/lake/crashy")),
        );
        let local_job = lake.job("crashy_local", &MONTH_JOB.replace("TARGET", "out/crashy"));
        let b = tempfile::tempdir().unwrap();
        let spec = idem_testdata::OrdersSpec {
            seed: 9,
            ..Default::default()
        };
        idem_testdata::write_orders(b.path(), &spec).unwrap();
        S3Lake {
            lake,
            bucket,
            job,
            local_job,
            b,
        }
    }

    fn url(&self, rel: &str) -> String {
        format!("s3://{}/{rel}", self.bucket)
    }

    fn idem(&self, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
        idem_s3(&self.lake, args, extra)
    }

    fn run_ok(&self, job: &str) -> Vec<serde_json::Value> {
        let out = self.idem(&["run", job, "--date", "2026-06", "--json"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out)
    }

    /// Replaces one day of the source with state B (or all days when `day` is None).
    fn switch_to_b(&self, day: Option<&str>) {
        let raw = self.lake.join("testdata/lake/raw/orders");
        match day {
            None => copy_dir(self.b.path(), &raw),
            Some(d) => copy_dir(
                &self.b.path().join(format!("created_date={d}")),
                &raw.join(format!("created_date={d}")),
            ),
        }
    }

    /// partition -> digest through the markers, asserting every partition is managed.
    fn digests(&self) -> std::collections::BTreeMap<String, String> {
        let out = self.idem(&["status", &self.url("lake/crashy"), "--json"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                assert_eq!(p["state"], "managed", "{p}");
                (
                    p["partition"].as_str().unwrap().to_string(),
                    p["digest"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn keys(&self, rel: &str) -> Vec<String> {
        readers(&["s3-list", s3_endpoint(), &self.url(rel)])
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect()
    }

    /// What a plain reader sees: the table downloaded, read by DuckDB, Polars, pyarrow.
    fn plain_rows(&self) -> serde_json::Value {
        let dir = tempfile::tempdir().unwrap();
        readers(&[
            "s3-get",
            s3_endpoint(),
            &self.url("lake/crashy/"),
            dir.path().to_str().unwrap(),
        ]);
        readers(&["table", dir.path().to_str().unwrap()])
    }

    /// The clean state: every partition holds exactly its marker's files, nothing is
    /// staged, and the digests are `expected`.
    fn assert_clean(&self, expected: &std::collections::BTreeMap<String, String>, context: &str) {
        assert_eq!(&self.digests(), expected, "{context}");
        let data = self.keys("lake/crashy/");
        assert_eq!(data.len(), expected.len(), "{context}: {data:?}");
        assert!(
            self.keys("lake/_idem/crashy/staging/").is_empty(),
            "{context}: staging left behind"
        );
    }
}

#[test]
fn a_table_on_s3_equals_the_table_on_disk_and_a_rerun_writes_nothing() {
    let s = S3Lake::new("tbl");
    let first = s.run_ok(&s.job);
    assert_eq!(actions(&first).len(), 7);
    assert!(actions(&first).iter().all(|(_, a)| a == "written"));
    s.run_ok(&s.local_job);
    let local = status_digests(&s.lake, "out/crashy");
    assert_eq!(s.digests(), local);
    // A plain reader of the bucket sees exactly the rows of the local table.
    assert_eq!(
        s.plain_rows(),
        readers(&["table", s.lake.join("out/crashy").to_str().unwrap()])
    );
    let data = s.keys("lake/crashy/");
    assert!(
        data.iter()
            .all(|k| k.ends_with("/part-000001-00000.parquet")),
        "{data:?}"
    );
    assert_eq!(s.keys("lake/_idem/crashy/markers/").len(), 7);

    // The same run again: unchanged, not one object written.
    let again = s.run_ok(&s.job);
    assert!(actions(&again).iter().all(|(_, a)| a == "unchanged"));
    assert_eq!(s.keys("lake/crashy/"), data);

    // One changed source day rewrites that partition only, under the next sequence
    // number; its old file is gone, the restatement is logged.
    s.switch_to_b(Some("2026-06-03"));
    let changed = s.run_ok(&s.job);
    let written: Vec<_> = actions(&changed)
        .into_iter()
        .filter(|(_, a)| a == "written")
        .collect();
    assert_eq!(written, vec![("dt=2026-06-03".into(), "written".into())]);
    let now = s.keys("lake/crashy/");
    assert!(
        now.contains(&"lake/crashy/dt=2026-06-03/part-000002-00000.parquet".to_string()),
        "{now:?}"
    );
    assert_eq!(now.len(), 7, "{now:?}");
    assert_eq!(s.keys("lake/_idem/crashy/log/").len(), 1);
    s.run_ok(&s.local_job);
    assert_eq!(s.digests(), status_digests(&s.lake, "out/crashy"));
    assert!(s.keys("lake/_idem/crashy/staging/").is_empty());
}

#[test]
fn a_failed_check_on_s3_leaves_the_live_partitions_untouched() {
    let s = S3Lake::new("chk");
    s.run_ok(&s.job);
    let before = s.keys("lake/");
    s.switch_to_b(None);
    let strict = s.lake.job(
        "strict",
        &format!(
            "{}\n[checks]\nmin_rows = 100000\n",
            std::fs::read_to_string(s.lake.join(&s.job)).unwrap()
        ),
    );
    let out = s.idem(&["run", &strict, "--date", "2026-06"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(s.keys("lake/"), before);
}

#[test]
fn abort_at_every_failpoint_on_s3_then_rerun() {
    let s = S3Lake::new("fp");
    s.run_ok(&s.job);
    let old = s.digests();
    s.switch_to_b(None);
    // The reference state B, from a local run of the same job.
    s.run_ok(&s.local_job);
    let new = status_digests(&s.lake, "out/crashy");
    for point in [
        "after_first_batch",
        "after_row_group",
        "after_footers",
        "after_stage",
        "before_publish",
        "before_swap",
        "after_swap",
        "after_apply_copy",
        "after_publish_one",
    ] {
        let spec = format!("{point}=abort");
        let out = s.idem(
            &["run", &s.job, "--date", "2026-06"],
            &[("IDEM_FAILPOINTS", &spec)],
        );
        assert!(!out.status.success(), "{point}: the run should have died");
        // Every partition is old or new, through its marker.
        for (p, d) in s.digests() {
            assert!(d == old[&p] || d == new[&p], "{point}: {p} is neither");
        }
        s.run_ok(&s.job);
        s.assert_clean(&new, point);
        // Back to state A for the next point.
        copy_dir(
            &crate::common::repo_root().join("testdata/lake/raw/orders"),
            &s.lake.join("testdata/lake/raw/orders"),
        );
        s.run_ok(&s.job);
        assert_eq!(s.digests(), old, "{point}: back to A");
        s.switch_to_b(None);
    }
}

#[test]
fn sigkill_at_random_moments_on_s3() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let s = S3Lake::new("kill");
    s.run_ok(&s.local_job);
    let a = status_digests(&s.lake, "out/crashy");
    s.switch_to_b(None);
    s.run_ok(&s.local_job);
    let b = status_digests(&s.lake, "out/crashy");
    copy_dir(
        &repo_root().join("testdata/lake/raw/orders"),
        &s.lake.join("testdata/lake/raw/orders"),
    );
    s.run_ok(&s.job);
    // How long an undisturbed run takes, to spread the kills over all of it.
    s.switch_to_b(None);
    let t = Instant::now();
    s.run_ok(&s.job);
    let full = t.elapsed().as_micros() as u64;
    let kills: usize = std::env::var("IDEM_S3_KILL_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let mut rng = crate::crash::Lcg(20261201);
    let mut to_b = false;
    let mut killed_mid_run = 0;
    for i in 0..kills {
        if to_b {
            s.switch_to_b(None);
        } else {
            copy_dir(
                &repo_root().join("testdata/lake/raw/orders"),
                &s.lake.join("testdata/lake/raw/orders"),
            );
        }
        let (old, new) = if to_b { (&a, &b) } else { (&b, &a) };
        let delay = Duration::from_micros(rng.next() % (full * 12 / 10 + 1));
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["run", &s.job, "--date", "2026-06"])
            .current_dir(s.lake.path())
            .envs(s3_env())
            .env_remove("IDEM_FAILPOINTS")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            killed_mid_run += 1;
        }
        child.kill().ok();
        child.wait().unwrap();
        let context = format!("kill {i} after {delay:?}");
        // Through the markers, every partition is whole and old or new.
        let now = s.digests();
        for (p, d) in &now {
            assert!(d == &old[p] || d == &new[p], "{context}: {p} is neither");
        }
        // The next run rolls forward or cleans up: exactly the clean state.
        s.run_ok(&s.job);
        s.assert_clean(new, &context);
        to_b = !to_b;
    }
    eprintln!("{killed_mid_run} of {kills} kills on S3 hit a running process ({full} µs a run)");
    assert!(
        killed_mid_run * 2 > kills,
        "only {killed_mid_run} of {kills} kills hit a running process"
    );
}

#[test]
fn four_concurrent_writers_of_one_partition_on_s3() {
    use std::process::{Command, Stdio};
    let s = S3Lake::new("four");
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
                "s3-watch",
                s3_endpoint(),
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
                        Command::new(env!("CARGO_BIN_EXE_idem"))
                            .args(["run", &j, "--date", "2026-06"])
                            .current_dir(&dir)
                            .envs(s3_env())
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
    assert_eq!(seen["violations"], serde_json::json!([]), "{seen}");
    assert!(seen["reads"].as_u64().unwrap() > 0, "{seen}");
    // Every partition is one writer's whole output, read through its marker, and a
    // plain listing holds exactly the markers' files.
    let now = s.digests();
    assert_eq!(now.len(), 7);
    for (p, d) in &now {
        assert!(refs.iter().any(|r| &r[p] == d), "{p}: no writer's output");
    }
    assert_eq!(s.keys("lake/crashy/").len(), 7);
    eprintln!("watcher: {seen}");
}
