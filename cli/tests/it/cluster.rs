//! A Ballista cluster of real processes on 127.0.0.1 (one `idem scheduler`, two `idem
//! executor`s) against moto: a backfill on the cluster equals the same backfill on one
//! machine, and an executor killed in the middle of a run leaves every partition old
//! or new, after which a retry converges.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;
use crate::s3::bucket;

const DAILY_JOB: &str = r#"
name = "daily"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = """
select order_id, customer_id, amount_usd, status,
       idem_key(order_id, customer_id) as order_key,
       cast(created_at as date) as created_day, created_date as dt
from orders where created_date = $run_date
"""
[target]
path = "TARGET"
partition_by = ["dt"]
[checks]
unique = ["order_id"]
"#;

/// The month job: seven daily partitions per run.
const MONTH_JOB: &str = r#"
name = "month"
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
[execution]
partitions = 4
"#;

/// `n` distinct free ports on 127.0.0.1.
fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The processes of a cluster, killed when dropped.
struct Cluster {
    port: u16,
    scheduler: Child,
    executors: Vec<Child>,
    work: tempfile::TempDir,
}

impl Cluster {
    /// A scheduler that takes a silent executor for dead after 4 s.
    fn start() -> Cluster {
        let [port] = free_ports();
        let work = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(work.path().join("scheduler.log")).unwrap();
        let scheduler = Command::new(bin())
            .args([
                "scheduler",
                "--port",
                &port.to_string(),
                "--executor-timeout",
                "4",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !listening(port) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the scheduler did not listen: {}",
                std::fs::read_to_string(work.path().join("scheduler.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Cluster {
            port,
            scheduler,
            executors: Vec::new(),
            work,
        }
    }

    /// Starts an executor with `env` (besides the S3 server's) and waits until it
    /// listens; returns its index.
    fn add_executor(&mut self, env: &[(&str, String)]) -> usize {
        let [flight, grpc] = free_ports();
        let n = self.executors.len();
        let dir = self.work.path().join(format!("executor-{n}-{flight}"));
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(bin())
            .args([
                "executor",
                "--scheduler",
                &format!("127.0.0.1:{}", self.port),
                "--port",
                &flight.to_string(),
                "--grpc-port",
                &grpc.to_string(),
                "--concurrent-tasks",
                "2",
                "--heartbeat",
                "1",
                "--work-dir",
                dir.to_str().unwrap(),
            ])
            .envs(s3_env())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("IDEM_STAGING", dir.join("staging"))
            .env("IDEM_HOST", format!("executor-{n}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.executors.push(child);
        let started = Instant::now();
        while !listening(flight) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "executor {n} did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Registered with the scheduler at its first heartbeat.
        std::thread::sleep(Duration::from_millis(1500));
        n
    }

    fn kill(&mut self, n: usize) {
        let _ = self.executors[n].kill();
        let _ = self.executors[n].wait();
    }

    fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    /// The logs of every process, for a failure's message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for e in walk(self.work.path()) {
            if e.ends_with("log") || e.ends_with("scheduler.log") {
                let text = std::fs::read_to_string(&e).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                out.push_str(&format!("--- {}\n", e.display()));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self
            .executors
            .iter_mut()
            .chain(std::iter::once(&mut self.scheduler))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn idem(lake: &Lake, args: &[&str]) -> std::process::Output {
    let env = s3_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    idem_in(lake.path(), args, &env)
}

fn ok(lake: &Lake, cluster: &Cluster, args: &[&str]) -> Vec<Value> {
    let out = idem(lake, args);
    assert!(
        out.status.success(),
        "idem {args:?}: {}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout),
        cluster.logs()
    );
    json_lines(&out)
}

fn digests(lake: &Lake, table: &str) -> BTreeMap<String, String> {
    let env = s3_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    status_digests_with(lake, table, &env)
}

/// The rows a plain reader (DuckDB, Polars, pyarrow) sees in the table at `url`.
fn plain_rows(url: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    readers(&["get", s3_endpoint(), url, dir.path().to_str().unwrap()]);
    readers(&["table", dir.path().to_str().unwrap()])
}

fn keys(url: &str) -> Vec<String> {
    readers(&["list", s3_endpoint(), url])
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_backfill_on_a_cluster_of_processes_equals_one_on_one_machine() {
    let mut cluster = Cluster::start();
    cluster.add_executor(&[]);
    cluster.add_executor(&[]);
    let lake = Lake::new();
    let bucket = bucket("cluster");
    idem_testdata::servers::create_bucket(s3_endpoint(), &format!("s3://{bucket}/"));
    let on_cluster = format!("s3://{bucket}/lake/daily");
    let here = format!("s3://{bucket}/lake/daily_here");
    let cluster_job = lake.job("daily", &DAILY_JOB.replace("TARGET", &on_cluster));
    let local_job = lake.job("daily_here", &DAILY_JOB.replace("TARGET", &here));
    let url = cluster.url();
    let range = ["--from", "2026-06-01", "--to", "2026-06-07", "--json"];

    let mut args = vec!["backfill", cluster_job.as_str(), "--cluster", &url];
    args.extend_from_slice(&range);
    let first = ok(&lake, &cluster, &args);
    assert_eq!(actions(&first).len(), 7, "{first:?}");
    assert!(
        actions(&first).iter().all(|(_, a)| a == "written"),
        "{first:?}"
    );
    let ran_on: Vec<_> = first
        .iter()
        .filter(|e| e["event"] == "done")
        .map(|e| e["report"]["cluster"].as_str().unwrap_or("here"))
        .collect();
    assert_eq!(ran_on, vec![url.as_str(); 7]);
    let mut local = vec!["backfill", local_job.as_str()];
    local.extend_from_slice(&range);
    ok(&lake, &cluster, &local);

    let expected = digests(&lake, &here);
    assert_eq!(expected.len(), 7);
    assert_eq!(digests(&lake, &on_cluster), expected);
    assert_eq!(
        plain_rows(&format!("{on_cluster}/")),
        plain_rows(&format!("{here}/"))
    );

    // The cluster's backfill over the table written on one machine finds every date
    // unchanged and leaves it byte for byte as it was (every file name carries a
    // token of the write that made it: the same keys are the same files).
    let local_keys = keys(&format!("{here}/"));
    let mut over = vec!["backfill", local_job.as_str(), "--cluster", &url];
    over.extend_from_slice(&range);
    let over = ok(&lake, &cluster, &over);
    assert!(
        actions(&over).iter().all(|(_, a)| a == "unchanged"),
        "{over:?}"
    );
    assert_eq!(keys(&format!("{here}/")), local_keys);

    // Again on the cluster: nothing changes, and no run left anything staged.
    let before = keys(&format!("s3://{bucket}/lake/daily/"));
    let again = ok(&lake, &cluster, &args);
    assert!(
        actions(&again).iter().all(|(_, a)| a == "unchanged"),
        "{again:?}"
    );
    assert_eq!(keys(&format!("s3://{bucket}/lake/daily/")), before);
    assert_eq!(
        keys(&format!("s3://{bucket}/lake/_idem/daily/staging/")),
        Vec::<String>::new()
    );
    assert_eq!(
        keys(&format!("s3://{bucket}/lake/_idem/daily/uploads/")),
        Vec::<String>::new()
    );
}

#[test]
fn an_executor_killed_mid_query_leaves_old_or_new_and_a_retry_converges() {
    let mut cluster = Cluster::start();
    let lake = Lake::new();
    let bucket = bucket("killed");
    idem_testdata::servers::create_bucket(s3_endpoint(), &format!("s3://{bucket}/"));
    let table = format!("s3://{bucket}/lake/month");
    let job = lake.job("month", &MONTH_JOB.replace("TARGET", &table));
    let reference = lake.job("reference", &MONTH_JOB.replace("TARGET", "out/reference"));
    ok(
        &lake,
        &cluster,
        &["run", &reference, "--date", "2026-06", "--json"],
    );
    let expected = status_digests(&lake, "out/reference");

    // Old state: the month as written from other rows (the first three days only).
    let partial = lake.job(
        "partial",
        &MONTH_JOB.replace("TARGET", &table).replace(
            "where created_date >=",
            "where created_date < '2026-06-04' and created_date >=",
        ),
    );
    ok(
        &lake,
        &cluster,
        &["run", &partial, "--date", "2026-06", "--json"],
    );
    let old = digests(&lake, &table);

    // The only executor pauses in its first task, holding rows of the run; a second
    // one joins, and the first is killed there.
    let hooks = tempfile::tempdir().unwrap();
    let doomed = cluster.add_executor(&[(
        "IDEM_FAILPOINTS",
        format!("after_first_batch=pause:{}", hooks.path().display()),
    )]);
    let env = s3_env();
    let run = Command::new(bin())
        .args([
            "run",
            &job,
            "--date",
            "2026-06",
            "--json",
            "--cluster",
            &cluster.url(),
        ])
        .current_dir(lake.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let paused = hooks.path().join("after_first_batch.paused");
    let started = Instant::now();
    while !paused.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no task paused: {}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.add_executor(&[]);
    cluster.kill(doomed);
    let out = run.wait_with_output().unwrap();
    let code = out.status.code();
    eprintln!(
        "the run whose executor was killed ended with {code:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    assert!(
        code == Some(0) || code == Some(1),
        "a lost executor is worth a retry (exit 1), or the cluster ran its tasks again: \
         {code:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A lost executor is said as such, not as Ballista's debug print of its transport.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("GrpcConnectionError(") && !err.contains("tonic::transport::Error("),
        "{err}"
    );

    // Every partition old or new; all new when the run succeeded.
    let now = digests(&lake, &table);
    if code == Some(0) {
        assert_eq!(now, expected);
    }
    for (p, d) in &now {
        assert!(
            old.get(p) == Some(d) || expected.get(p) == Some(d),
            "partition {p} is neither old nor new: {d}"
        );
    }
    // The retry converges, and gc leaves nothing staged.
    ok(
        &lake,
        &cluster,
        &[
            "run",
            &job,
            "--date",
            "2026-06",
            "--json",
            "--cluster",
            &cluster.url(),
        ],
    );
    assert_eq!(digests(&lake, &table), expected);
    ok(&lake, &cluster, &["gc", &table, "--json"]);
    assert_eq!(
        keys(&format!("s3://{bucket}/lake/_idem/month/staging/")),
        Vec::<String>::new()
    );
    assert_eq!(
        keys(&format!("s3://{bucket}/lake/_idem/month/uploads/")),
        Vec::<String>::new()
    );
    assert_eq!(
        plain_rows(&format!("{table}/")),
        readers(&["table", lake.join("out/reference").to_str().unwrap()])
    );
}

/// Values that are different to a hash but name one directory (NULL, '' and the Hive
/// default name; NaNs of different signs) are written by one task, as one partition,
/// exactly as a local run writes them.
#[test]
fn values_that_share_a_directory_are_one_partition_on_a_cluster() {
    let lake = Lake::new();
    let job = |name: &str, execution: &str| {
        lake.job(
            name,
            &format!(
                r#"
name = "{name}"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{{ name = "created_date", type = "date" }}]
[transform]
sql = """
select order_id, amount_usd,
       case order_id % 3 when 0 then null when 1 then '' else '__HIVE_DEFAULT_PARTITION__' end as region,
       case when order_id % 2 = 0 then cast('NaN' as double) else -cast('NaN' as double) end as score,
       created_date as dt
from orders where created_date = $run_date
"""
[target]
path = "out/{name}"
partition_by = ["dt", "region", "score"]
{execution}
"#
            ),
        )
    };
    let here = job("here", "");
    let there = job(
        "there",
        "[execution]\ncluster = \"standalone\"\npartitions = 5",
    );
    lake.idem_ok(&["run", &here, "--date", "2026-06-02", "--json"]);
    let out = lake.idem_ok(&["run", &there, "--date", "2026-06-02", "--json"]);
    assert_eq!(out[0]["cluster"], "standalone");
    let expected = status_digests(&lake, "out/here");
    assert_eq!(expected.len(), 1, "{expected:?}");
    assert_eq!(status_digests(&lake, "out/there"), expected);
}

/// A failure on a cluster exits as it would on one machine: the data's fault 5, bad
/// input 2; a merge is refused there before anything runs.
#[test]
fn failures_on_a_cluster_keep_their_exit_codes() {
    let lake = Lake::new();
    let cast = lake.job(
        "cast",
        r#"
name = "cast"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = "select order_id, cast(status as int) as status_code, created_date as dt from orders where created_date = $run_date"
[target]
path = "out/cast"
partition_by = ["dt"]
"#,
    );
    let out = lake.idem(&[
        "run",
        &cast,
        "--date",
        "2026-06-02",
        "--cluster",
        "standalone",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("cluster standalone") && err.contains("Cannot cast"),
        "{err}"
    );
    assert!(
        !lake.join("out/cast").exists(),
        "a failed run created the table"
    );

    let bad = lake.idem(&[
        "run",
        &cast,
        "--date",
        "2026-06-02",
        "--cluster",
        "sched:50050",
    ]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--cluster") && err.contains("df://HOST:PORT"),
        "{err}"
    );

    let merge = lake.job(
        "merge",
        r#"
name = "merge"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = "select order_id, status, created_date as dt from orders where created_date = $run_date"
[target]
path = "out/merge"
partition_by = ["dt"]
mode = "merge"
key = ["order_id"]
"#,
    );
    let out = lake.idem(&[
        "run",
        &merge,
        "--date",
        "2026-06-02",
        "--cluster",
        "standalone",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("merge") && err.contains("cannot run on a cluster"),
        "{err}"
    );

    // No scheduler there: worth a retry.
    let [port] = free_ports();
    let url = format!("df://127.0.0.1:{port}");
    let out = lake.idem(&["run", &cast, "--date", "2026-06-02", "--cluster", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("cluster {url}")), "{err}");
    // Said as what failed where, not as the transport's debug print.
    assert!(
        err.contains(&format!(
            "cannot reach the scheduler at 127.0.0.1:{port} (connection refused)"
        )) && !err.contains("tonic::transport"),
        "{err}"
    );
}
