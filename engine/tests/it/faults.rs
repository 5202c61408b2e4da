//! Exhaustive single-fault injection. For each scenario (a replace of one partition,
//! of three, that replace on the in-process cluster, a merge that keeps files, a
//! three-date backfill, `gc` after a dead run; on Delta tables also an `--atomic`
//! backfill, and `idem vacuum` after the dead run)
//! and each backend and format, storage call N of the scenario fails — before it takes
//! effect, or as the point where the process dies — or the N-th call that changes
//! storage takes effect with its answer lost (object stores), for N = 1, 2, … until the
//! scenario runs through without reaching N. After each fault: every partition is old
//! or new and whole (as `idem status` and a plain lister see it; on Delta, as its log
//! says, every file it names readable), and the next clean run leaves the table equal
//! to a run that saw no fault, with nothing left in staging after `gc` (and on Delta,
//! after `idem vacuum --retain-hours 0`, no file beside those its log reads).
//!
//! On moto every call is a request to a Python server, and the search takes minutes:
//! `IDEM_FAULTS_S3_STRIDE=K` (CI sets 3) injects at one call in K. A Delta run reads
//! and writes its log on every commit, several hundred calls for a backfill:
//! `IDEM_FAULTS_DELTA_STRIDE=D` (CI sets 20) injects at one call in D on Delta tables
//! (one in K×D on moto). The calls are counted from the offset `IDEM_FAULTS_OFFSET`
//! (default: the day number modulo the stride, so consecutive days of CI cover every
//! call). The in-memory store runs the same commit code over the same store interface
//! at every call of a Parquet table; `testdata/adversary.sh faults` runs every call
//! everywhere.

use std::sync::Mutex;

use idem_io::fault::{self, Mode};

use crate::world::{Backend, Digests, Sources, World};

#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// A daily run whose one partition gets new rows.
    ReplaceOne,
    /// A run owning three days (lookback = 2), all with new rows.
    ReplaceThree,
    /// A merge of one day into a table clustered by key: the other days' files are kept.
    Merge,
    /// [`Scenario::ReplaceThree`] on the in-process cluster (`--cluster standalone`):
    /// the executor's tasks write and stage, the client publishes.
    OnCluster,
    /// A backfill of three dates, two at once.
    Backfill,
    /// The same backfill with `--atomic` (Delta): one commit or none.
    AtomicBackfill,
    /// `idem gc` after a run that died while publishing.
    GcAfterDeadRun,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::ReplaceOne => "replace one partition",
            Scenario::ReplaceThree => "replace three partitions",
            Scenario::Merge => "merge keeping files",
            Scenario::OnCluster => "replace three partitions on a cluster",
            Scenario::Backfill => "backfill of three dates",
            Scenario::AtomicBackfill => "atomic backfill of three dates",
            Scenario::GcAfterDeadRun => "gc after a dead run",
        }
    }

    /// Its name on a Delta table when `delta`.
    fn name_in(self, delta: bool) -> &'static str {
        match (self, delta) {
            (Scenario::GcAfterDeadRun, true) => "gc and vacuum after a dead run",
            _ => self.name(),
        }
    }

    /// Brings a fresh world to the state before the operation (source A loaded; for
    /// gc, a run with source B dead at `dead_at` of its calls).
    fn setup(self, w: &World, sources: &Sources, dead_at: u64) {
        match self {
            Scenario::ReplaceOne | Scenario::GcAfterDeadRun => {
                w.run(&w.daily(0), "2026-06-02").unwrap()
            }
            Scenario::ReplaceThree | Scenario::OnCluster => {
                w.run(&w.daily(2), "2026-06-03").unwrap()
            }
            Scenario::Backfill | Scenario::AtomicBackfill => w
                .backfill(&w.daily(0), &["2026-06-01", "2026-06-02", "2026-06-03"])
                .unwrap(),
            Scenario::Merge => {
                for d in ["2026-06-01", "2026-06-02", "2026-06-03"] {
                    w.run(&w.merge(), d).unwrap();
                }
            }
        }
        w.use_source(&sources.b);
        if let Scenario::GcAfterDeadRun = self {
            let scopes = w.scopes();
            let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
            fault::arm_in(&scopes, Mode::Crash, dead_at);
            let died = w.run(&w.daily(0), "2026-06-02");
            assert!(
                fault::disarm().fired && died.is_err(),
                "the run did not die"
            );
        }
    }

    /// The operation under faults.
    fn operate(self, w: &World) -> Result<(), String> {
        match self {
            Scenario::ReplaceOne => w.run(&w.daily(0), "2026-06-02"),
            Scenario::ReplaceThree => w.run(&w.daily(2), "2026-06-03"),
            Scenario::OnCluster => w.run_on_cluster(&w.daily(2), "2026-06-03"),
            Scenario::Backfill | Scenario::AtomicBackfill => w.backfill_as(
                &w.daily(0),
                &["2026-06-01", "2026-06-02", "2026-06-03"],
                matches!(self, Scenario::AtomicBackfill),
            ),
            Scenario::Merge => w.run(&w.merge(), "2026-06-03"),
            Scenario::GcAfterDeadRun => w.gc().and_then(|()| w.sweep()),
        }
    }

    /// What brings the table to the clean state after a fault: the operation again
    /// (for gc: gc, then the run the dead one was).
    fn recover(self, w: &World) -> Result<(), String> {
        match self {
            Scenario::GcAfterDeadRun => {
                w.gc()?;
                w.sweep()?;
                w.run(&w.daily(0), "2026-06-02")
            }
            _ => self.operate(w),
        }
    }
}

/// How many faults a search injected.
#[derive(Default)]
struct Count {
    injected: u64,
    /// Calls of the undisturbed operation, and of them, calls that change storage.
    calls: u64,
    writes: u64,
}

/// Which calls a search injects at: call `offset + 1`, then every `stride`-th after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sample {
    stride: u64,
    offset: u64,
}

impl Sample {
    const EVERY: Sample = Sample {
        stride: 1,
        offset: 0,
    };

    /// The sample of the search on `backend` (of a Delta table when `delta`), from the
    /// environment (see the module's doc).
    fn of(backend: Backend, delta: bool) -> Sample {
        let var = |name: &str| {
            std::env::var(name).ok().map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name}={v}: a number"))
            })
        };
        let stride_of = |name: &str, applies: bool| match applies {
            true => var(name).unwrap_or(1).max(1),
            false => 1,
        };
        let stride = stride_of("IDEM_FAULTS_S3_STRIDE", backend == Backend::Moto)
            * stride_of("IDEM_FAULTS_DELTA_STRIDE", delta);
        if stride == 1 {
            return Sample::EVERY;
        }
        let day = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 86_400);
        let offset = var("IDEM_FAULTS_OFFSET").unwrap_or(day) % stride;
        Sample { stride, offset }
    }

    fn text(self) -> String {
        match self {
            Sample::EVERY => String::new(),
            Sample { stride, offset } => format!(
                " (one call in {stride}, from call {}: IDEM_FAULTS_OFFSET={offset})",
                offset + 1
            ),
        }
    }
}

/// Runs the search for `scenario` on `backend` (a Delta table when `delta`) in `mode`,
/// at the calls `sample` picks; returns what it injected.
fn search(backend: Backend, delta: bool, scenario: Scenario, mode: Mode, sample: Sample) -> Count {
    let sources = Sources::new();
    let world = |tag: &str| World::of(backend, delta, tag, &sources);
    // The undisturbed operation: the state before and after it, and its calls.
    let reference = world("ref");
    // A run dying at 80% of its calls leaves staged files (and on object stores,
    // usually, a commit whose apply did not finish) for gc to find.
    let dead_at = {
        let probe = world("probe");
        Scenario::ReplaceOne.setup(&probe, &sources, 0);
        let scopes = probe.scopes();
        let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
        fault::count_in(&scopes);
        Scenario::ReplaceOne.operate(&probe).unwrap();
        fault::disarm().calls * 4 / 5
    };
    // On object stores every world starts from a copy of one set-up world's table:
    // setting up is a third of a case's requests to a server. (After a dead run, the
    // run's local staging is part of the state: those worlds are set up each.)
    let template = (backend.is_object_store() && !matches!(scenario, Scenario::GcAfterDeadRun))
        .then(|| {
            let t = world("tpl");
            scenario.setup(&t, &sources, dead_at);
            t.snapshot()
        });
    let prepare = |w: &World| match &template {
        Some(snapshot) => {
            w.restore(snapshot);
            w.use_source(&sources.b);
        }
        None => scenario.setup(w, &sources, dead_at),
    };
    prepare(&reference);
    let old = reference.status().unwrap();
    let old: Digests = old.into_iter().map(|(p, (_, d))| (p, d)).collect();
    let scopes = reference.scopes();
    let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
    fault::count_in(&scopes);
    scenario.operate(&reference).unwrap();
    let fault::Stats { calls, writes, .. } = fault::disarm();
    // What the operation leaves (gc after a dead run: what the dead run committed).
    let operated = reference.digests();
    if let Scenario::GcAfterDeadRun = scenario {
        scenario.recover(&reference).unwrap();
    }
    let new = reference.digests();
    assert!(!new.is_empty());

    let mut count = Count {
        calls,
        writes,
        ..Default::default()
    };
    for n in (1 + sample.offset..).step_by(sample.stride as usize) {
        let w = world("f");
        prepare(&w);
        let scopes = w.scopes();
        let scopes: Vec<&str> = scopes.iter().map(String::as_str).collect();
        fault::arm_in(&scopes, mode, n);
        let result = scenario.operate(&w);
        let seen = fault::disarm();
        let context = format!(
            "{} / {}: {mode} at call {n}",
            label(backend, delta),
            scenario.name_in(delta)
        );
        if !seen.fired {
            // The operation made fewer calls than n: the search is complete.
            result.unwrap_or_else(|e| panic!("{context}: failed without a fault: {e}"));
            assert_eq!(w.digests(), operated, "{context}");
            break;
        }
        count.injected += 1;
        old_or_new(&w, &old, &new, &context);
        // The next clean run finishes the job; gc leaves nothing staged.
        scenario
            .recover(&w)
            .unwrap_or_else(|e| panic!("{context}: the next clean run failed: {e}"));
        assert_eq!(w.digests(), new, "{context}: not the clean-run state");
        w.gc()
            .unwrap_or_else(|e| panic!("{context}: gc failed: {e}"));
        assert_eq!(w.staged(), Vec::<String>::new(), "{context}: staging left");
        if delta {
            w.sweep()
                .unwrap_or_else(|e| panic!("{context}: vacuum failed: {e}"));
            assert_eq!(w.digests(), new, "{context}: vacuum changed the table");
            assert_eq!(
                w.unread_files(),
                Vec::<String>::new(),
                "{context}: files no version reads left after vacuum"
            );
        }
        assert!(n < 10_000, "{context}: the search does not end");
    }
    count
}

/// Every partition whole (status reads it; on disk its files are its manifest's) and
/// either old or new.
fn old_or_new(w: &World, old: &Digests, new: &Digests, context: &str) {
    let status = w
        .status()
        .unwrap_or_else(|e| panic!("{context}: idem status failed: {e}"));
    for (p, (state, digest)) in &status {
        let whole = state == "managed" || (w.backend.is_object_store() && state == "pending");
        assert!(whole, "{context}: {p} is {state}");
        assert!(
            old.get(p) == Some(digest) || new.get(p) == Some(digest),
            "{context}: {p} is neither old nor new"
        );
    }
    for p in old.keys() {
        assert!(status.contains_key(p), "{context}: {p} vanished");
    }
}

/// The backend and format, as reports name them.
fn label(backend: Backend, delta: bool) -> String {
    match delta {
        true => format!("{}, Delta", backend.name()),
        false => backend.name().to_string(),
    }
}

fn report(what: &str, scenario: &str, counts: &[(Mode, Count)], sample: Sample) {
    let line = counts
        .iter()
        .map(|(m, c)| format!("{m}: {}", c.injected))
        .collect::<Vec<_>>()
        .join(", ");
    let (calls, writes) = counts.first().map_or((0, 0), |(_, c)| (c.calls, c.writes));
    let text = format!(
        "faults | {what} | {scenario} | {calls} calls, {writes} writes | {line}{}\n",
        sample.text()
    );
    eprint!("{text}");
    // Collected for CI's summary.
    let path = idem_testdata::servers::repo_root().join("target/adversary-report.txt");
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(text.as_bytes());
    }
}

/// The longest searches first, so that the last child to start is a short one. (The
/// cluster's search runs on disk and in memory: on moto its calls are those of the
/// in-memory store over HTTP, and a case costs seconds.)
const SCENARIOS: [Scenario; 6] = [
    Scenario::Backfill,
    Scenario::ReplaceThree,
    Scenario::OnCluster,
    Scenario::Merge,
    Scenario::ReplaceOne,
    Scenario::GcAfterDeadRun,
];

/// On Delta tables, the `--atomic` backfill too.
const DELTA_SCENARIOS: [Scenario; 6] = [
    Scenario::AtomicBackfill,
    Scenario::Backfill,
    Scenario::ReplaceThree,
    Scenario::Merge,
    Scenario::ReplaceOne,
    Scenario::GcAfterDeadRun,
];

/// In a child process: the scenario and mode it searches (`<index>:<mode>`).
const CASE_VAR: &str = "IDEM_FAULTS_CASE";

/// Searches every scenario in each of `modes` on `backend` (Delta tables when `delta`):
/// one child process per scenario and mode (fault plans are per process), four at a
/// time, each against a moto server of its own on S3 (one server answers on one core);
/// then reports each scenario. `test` is the calling test's name, which each child runs
/// again.
fn every_scenario(test: &str, backend: Backend, delta: bool, modes: &[Mode]) {
    let scenarios: Vec<Scenario> = match (delta, backend) {
        (true, _) => DELTA_SCENARIOS.to_vec(),
        (false, Backend::Moto) => SCENARIOS
            .into_iter()
            .filter(|s| !matches!(s, Scenario::OnCluster))
            .collect(),
        (false, _) => SCENARIOS.to_vec(),
    };
    if let Some(case) = std::env::var_os(CASE_VAR) {
        let case = case.into_string().expect("a case");
        let (i, mode) = case.split_once(':').expect("<index>:<mode>");
        let scenario = scenarios[i.parse::<usize>().expect("a scenario")];
        let mode = *modes
            .iter()
            .find(|m| m.to_string() == mode)
            .expect("a mode of this backend");
        let count = search(backend, delta, scenario, mode, Sample::of(backend, delta));
        println!(
            "fault-count {} {} {}",
            count.calls, count.writes, count.injected
        );
        return;
    }
    let sample = Sample::of(backend, delta);
    let queue: Mutex<std::collections::VecDeque<(usize, Mode)>> = Mutex::new(
        (0..scenarios.len())
            .flat_map(|i| modes.iter().map(move |&m| (i, m)))
            .collect(),
    );
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let next = queue.lock().unwrap().pop_front();
                    let Some((i, mode)) = next else { break };
                    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
                    child
                        .args(["--exact", test, "--nocapture", "--test-threads=1"])
                        .env(CASE_VAR, format!("{i}:{mode}"))
                        .env("IDEM_FAULTS_OFFSET", sample.offset.to_string())
                        .env_remove("IDEM_FAULTS");
                    if let Backend::Moto = backend {
                        let endpoint = idem_testdata::servers::private_s3_endpoint();
                        child
                            .envs(idem_testdata::servers::s3_env_of(&endpoint))
                            .env("IDEM_S3_ENDPOINT", &endpoint);
                    }
                    let out = child.output().unwrap();
                    done.lock().unwrap().push(((i, mode), out));
                }
            });
        }
    });
    let done = done.into_inner().unwrap();
    let what = label(backend, delta);
    for (i, &scenario) in scenarios.iter().enumerate() {
        let counts: Vec<(Mode, Count)> = modes
            .iter()
            .map(|&mode| {
                let (_, out) = done.iter().find(|(c, _)| *c == (i, mode)).unwrap();
                let context = format!("{what} / {}: {mode}", scenario.name_in(delta));
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "{context}: {stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                // The line may follow the test harness's "test … " on one line.
                let line = stdout
                    .split_once("fault-count ")
                    .and_then(|(_, rest)| rest.lines().next())
                    .unwrap_or_else(|| panic!("{context}: the search did not run: {stdout}"));
                let n: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
                let count = Count {
                    calls: n[0],
                    writes: n[1],
                    injected: n[2],
                };
                (mode, count)
            })
            .collect();
        report(&what, scenario.name_in(delta), &counts, sample);
    }
}

#[test]
fn every_single_fault_on_a_local_disk() {
    every_scenario(
        "faults::every_single_fault_on_a_local_disk",
        Backend::Local,
        false,
        &[Mode::Fail, Mode::Crash],
    );
}

#[test]
fn every_single_fault_on_an_in_memory_object_store() {
    every_scenario(
        "faults::every_single_fault_on_an_in_memory_object_store",
        Backend::Memory,
        false,
        &[Mode::Fail, Mode::Lose, Mode::Crash],
    );
}

/// On a real S3-compatible server (moto): the conditional marker commits, copies and
/// deletes over HTTP, each scenario and mode in full. The in-process engine reaches
/// the server through the AWS_* environment each child is started with.
#[test]
fn every_single_fault_on_an_s3_server() {
    every_scenario(
        "faults::every_single_fault_on_an_s3_server",
        Backend::Moto,
        false,
        &[Mode::Fail, Mode::Lose, Mode::Crash],
    );
}

/// Delta tables: every call of a run, merge, backfill (`--atomic` too), gc and vacuum
/// on them, the Delta log's reads and commits included.
#[test]
fn every_single_fault_on_delta_tables_on_local_disk() {
    every_scenario(
        "faults::every_single_fault_on_delta_tables_on_local_disk",
        Backend::Local,
        true,
        &[Mode::Fail, Mode::Crash],
    );
}

#[test]
fn every_single_fault_on_delta_tables_on_an_in_memory_object_store() {
    every_scenario(
        "faults::every_single_fault_on_delta_tables_on_an_in_memory_object_store",
        Backend::Memory,
        true,
        &[Mode::Fail, Mode::Lose, Mode::Crash],
    );
}

#[test]
fn every_single_fault_on_delta_tables_on_an_s3_server() {
    every_scenario(
        "faults::every_single_fault_on_delta_tables_on_an_s3_server",
        Backend::Moto,
        true,
        &[Mode::Fail, Mode::Lose, Mode::Crash],
    );
}
