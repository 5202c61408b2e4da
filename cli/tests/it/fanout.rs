//! Fan-out: many worker processes that share nothing but an S3-compatible store (moto
//! on 127.0.0.1) backfill one project, each with its own working directory, staging
//! directory and host name, as pods of a Kubernetes Indexed Job would; some are killed
//! at random and retried. The tables must end equal to a single-process backfill, and
//! nothing may be left staged after `idem gc`.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::s3::bucket;

/// A daily fact table from raw orders on the store, a daily summary reading it, and a
/// rolling three-day count reading it (`reads_before = 2`).
fn project(dir: &std::path::Path, bucket: &str, prefix: &str) {
    let jobs = dir.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::write(
        jobs.join("fct.toml"),
        format!(
            r#"
name = "fct"
[sources.orders]
path = "s3://{bucket}/raw/orders/"
partitioned_by = [{{ name = "created_date", type = "date" }}]
[transform]
sql = "select order_id, customer_id, amount_usd, status, created_date as dt from orders where created_date = $run_date"
[target]
path = "s3://{bucket}/{prefix}/fct"
partition_by = ["dt"]
"#
        ),
    )
    .unwrap();
    std::fs::write(
        jobs.join("sums.toml"),
        format!(
            r#"
name = "sums"
[sources.fct]
path = "s3://{bucket}/{prefix}/fct/"
partitioned_by = [{{ name = "dt", type = "date" }}]
[transform]
sql = "select dt, status, count(*) as orders, sum(amount_usd) as amount from fct where dt = $run_date group by dt, status"
[target]
path = "s3://{bucket}/{prefix}/sums"
partition_by = ["dt"]
"#
        ),
    )
    .unwrap();
    std::fs::write(
        jobs.join("rolling.toml"),
        format!(
            r#"
name = "rolling"
[sources.fct]
path = "s3://{bucket}/{prefix}/fct/"
partitioned_by = [{{ name = "dt", type = "date" }}]
reads_before = 2
[transform]
sql = "select cast($run_date as date) as day, count(*) as orders, sum(amount_usd) as amount from fct where dt > cast($run_date as date) - interval '3 days' and dt <= cast($run_date as date)"
[target]
path = "s3://{bucket}/{prefix}/rolling"
partition_by = ["day"]
"#
        ),
    )
    .unwrap();
}

/// A small deterministic generator (xorshift), seeded from `IDEM_FANOUT_SEED` or the
/// clock; the seed is printed so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const FROM: &str = "2026-06-01";
const TO: &str = "2026-06-07";

#[test]
fn workers_sharing_only_the_store_killed_and_retried_at_random_equal_one_backfill() {
    let lake = Lake::new();
    let bucket = bucket("fanout");
    readers(&[
        "put",
        s3_endpoint(),
        lake.join("testdata/lake/raw/orders").to_str().unwrap(),
        &format!("s3://{bucket}/raw/orders/"),
    ]);
    let s3: Vec<(&str, String)> = s3_env();
    let env: Vec<(&str, &str)> = s3.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // The reference: one process backfills the whole range.
    let reference = tempfile::tempdir().unwrap();
    project(reference.path(), &bucket, "ref");
    let out = idem_in(
        reference.path(),
        &["backfill", "jobs", "--from", FROM, "--to", TO],
        &env,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The units, as an orchestrator lists them.
    let scratch = tempfile::tempdir().unwrap();
    project(scratch.path(), &bucket, "fan");
    let out = idem_in(
        scratch.path(),
        &["dates", "jobs", "--from", FROM, "--to", TO, "--json"],
        &env,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let units: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(units.len(), 21, "{units:?}");

    // The workers: one per unit as an Indexed Job starts them (the index from
    // JOB_COMPLETION_INDEX), three shards over the same units, and a single-job
    // worker over a few of the same dates, all at once.
    let range = ["--from", FROM, "--to", TO, "--skip-fresh", "--json"];
    let mut work: Vec<(Vec<String>, Option<usize>)> = Vec::new();
    for i in 0..units.len() {
        let mut args = vec!["backfill".to_string(), "jobs".to_string()];
        // Half of them recompute even a fresh unit.
        args.extend(
            range
                .iter()
                .filter(|a| i % 2 == 0 || **a != "--skip-fresh")
                .map(|s| s.to_string()),
        );
        work.push((args, Some(i)));
    }
    for k in 0..3 {
        let mut args = vec!["backfill".to_string(), "jobs".to_string()];
        args.extend(range.iter().map(|s| s.to_string()));
        args.extend(["--shard".to_string(), format!("{k}/3")]);
        work.push((args, None));
    }
    work.push((
        [
            "backfill",
            "jobs/fct.toml",
            "--from",
            "2026-06-03",
            "--to",
            "2026-06-05",
        ]
        .map(String::from)
        .to_vec(),
        None,
    ));

    let seed = std::env::var("IDEM_FANOUT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("fan-out: IDEM_FANOUT_SEED={seed}");
    let mut rng = Rng(seed);
    let mut work: Vec<_> = work.into_iter().enumerate().collect();
    for i in (1..work.len()).rev() {
        work.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let rng = Arc::new(Mutex::new(rng));
    let queue = Arc::new(Mutex::new(work));
    let kills = Arc::new(Mutex::new((0usize, None::<Instant>)));
    let attempts = Arc::new(Mutex::new(0usize));
    let workers: Vec<_> = (0..6)
        .map(|_| {
            let (queue, rng, kills, attempts) = (
                Arc::clone(&queue),
                Arc::clone(&rng),
                Arc::clone(&kills),
                Arc::clone(&attempts),
            );
            let s3 = s3.clone();
            let (bucket, staging_root) = (bucket.clone(), scratch.path().to_path_buf());
            std::thread::spawn(move || {
                while let Some((w, (args, index))) = queue.lock().unwrap().pop() {
                    // Each attempt is a new pod: its own host name, staging directory
                    // and copy of the job files; no disk is shared.
                    for attempt in 0.. {
                        assert!(attempt < 10, "worker {w} never succeeded");
                        *attempts.lock().unwrap() += 1;
                        let pod = staging_root.join(format!("w{w}-a{attempt}"));
                        project(&pod, &bucket, "fan");
                        let mut cmd = Command::new(bin());
                        cmd.args(&args)
                            .current_dir(&pod)
                            .envs(s3.iter().map(|(k, v)| (*k, v.as_str())))
                            .env("IDEM_HOST", format!("worker-{w}-{attempt}"))
                            .env("IDEM_STAGING", pod.join("staging"))
                            .env("IDEM_LEASE_TIMEOUT", "60")
                            .env_remove("IDEM_FAILPOINTS")
                            .env_remove("IDEM_FAULTS")
                            .env_remove("JOB_COMPLETION_INDEX")
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::piped());
                        if let Some(i) = index {
                            cmd.arg("--index")
                                .env("JOB_COMPLETION_INDEX", i.to_string());
                        }
                        // Some attempts die: killed at a random moment, or at a random
                        // storage call (`crash@N` aborts the process there).
                        let kill_at = {
                            let mut r = rng.lock().unwrap();
                            match (attempt < 4).then(|| r.below(4)) {
                                Some(0) => Some(Duration::from_millis(10 + r.below(300))),
                                Some(1) => {
                                    cmd.env("IDEM_FAULTS", format!("crash@{}", 1 + r.below(40)));
                                    None
                                }
                                _ => None,
                            }
                        };
                        let mut child = cmd.spawn().unwrap();
                        let started = Instant::now();
                        let mut killed = false;
                        let status = loop {
                            if let Some(status) = child.try_wait().unwrap() {
                                break status;
                            }
                            if kill_at.is_some_and(|at| started.elapsed() >= at) && !killed {
                                child.kill().unwrap();
                                killed = true;
                            }
                            std::thread::sleep(Duration::from_millis(10));
                        };
                        let stderr = {
                            use std::io::Read;
                            let mut s = String::new();
                            child.stderr.take().unwrap().read_to_string(&mut s).unwrap();
                            s
                        };
                        eprintln!(
                            "worker {w} attempt {attempt}: {:?} after {} ms",
                            status.code(),
                            started.elapsed().as_millis()
                        );
                        if status.code().is_none() {
                            let mut k = kills.lock().unwrap();
                            k.0 += 1;
                            k.1 = Some(Instant::now());
                        }
                        match status.code() {
                            Some(0) => break,
                            // Killed, or a failure a retry may fix: retried, as the
                            // Job's pod failure policy does.
                            None | Some(1) => continue,
                            Some(code) => panic!(
                                "worker {w} ({args:?}, index {index:?}) ended with final \
                                 code {code}: {stderr}"
                            ),
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (killed, last_kill) = *kills.lock().unwrap();
    eprintln!(
        "fan-out: {} worker attempts, {killed} killed",
        attempts.lock().unwrap()
    );
    assert!(killed > 0, "no worker was killed (seed {seed})");

    // Read through the commits, the tables equal the single-process backfill.
    let digests = |table: &str, all_managed: bool| -> BTreeMap<String, String> {
        let out = idem_in(scratch.path(), &["status", table, "--json"], &env);
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
                if all_managed {
                    assert_eq!(p["state"], "managed", "{table}: {p}");
                }
                (
                    p["partition"].as_str().unwrap().to_string(),
                    p["digest"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    for name in ["fct", "sums", "rolling"] {
        let want = digests(&format!("s3://{bucket}/ref/{name}"), true);
        assert_eq!(want.len(), 7, "{name}");
        assert_eq!(
            digests(&format!("s3://{bucket}/fan/{name}"), false),
            want,
            "{name} (seed {seed})"
        );
    }

    // Once the killed workers' leases are stale, `gc` (from yet another host) leaves
    // nothing staged, no upload open, and every partition exactly its manifest's files.
    if let Some(at) = last_kill {
        std::thread::sleep(Duration::from_secs(62).saturating_sub(at.elapsed()));
    }
    for name in ["fct", "sums", "rolling"] {
        let table = format!("s3://{bucket}/fan/{name}");
        let mut gc_env = env.clone();
        gc_env.extend([("IDEM_HOST", "gc-host"), ("IDEM_LEASE_TIMEOUT", "60")]);
        let out = idem_in(scratch.path(), &["gc", &table], &gc_env);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta = format!("s3://{bucket}/fan/_idem/{name}");
        for dir in ["staging", "uploads", "leases"] {
            let left = readers(&["list", s3_endpoint(), &format!("{meta}/{dir}/")]);
            assert_eq!(left, serde_json::json!([]), "{name} {dir} (seed {seed})");
        }
        let uploads = readers(&["s3-uploads", s3_endpoint(), &format!("s3://{bucket}/fan/")]);
        assert_eq!(uploads, serde_json::json!([]), "{name} (seed {seed})");
        let want = digests(&format!("s3://{bucket}/ref/{name}"), true);
        assert_eq!(digests(&table, true), want, "{name} after gc (seed {seed})");
    }
}
