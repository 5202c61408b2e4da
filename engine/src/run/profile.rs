//! `idem run --profile`: where a run's wall time went, stage by stage, and its
//! throughput. The stages follow the run's phases as it reports them to its observer,
//! so they add up to the wall time; the streaming phase is split by what the writer
//! thread measured (waiting for the query's rows, or writing them), and the planning
//! phase by the time spent listing sources. The time encoding, hashing and syncing
//! took on every thread is reported beside them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::physical_plan::ExecutionPlan;
use idem_io::profile::{self, Counter};
use serde::Serialize;

use super::report::{Action, Observer, RunReport};

/// A run's profile, as `--profile` prints it and `--json` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// The run's wall time, which the stages add up to.
    pub wall_ms: f64,
    /// The stages in the order they ran (a stage that did not happen is left out).
    pub stages: Vec<Stage>,
    /// Time the work of several threads took, summed over the threads (it may
    /// exceed the wall time): Parquet encoding, the digest, fsync.
    pub threads_ms: ThreadTimes,
    /// Rows written (of the partitions written or found unchanged).
    pub rows: u64,
    pub rows_per_s: f64,
    /// Rows the query read: what its scans produced from the files statistics did not
    /// rule out. Unknown (null) on a cluster, whose executors read.
    pub input_rows: Option<u64>,
    pub input_rows_per_s: Option<f64>,
    /// Bytes of the input files the run read (their sizes).
    pub input_bytes: u64,
    pub input_bytes_per_s: f64,
    /// Bytes of the partitions it wrote (not of those it found unchanged).
    pub output_bytes: u64,
    pub output_bytes_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stage {
    pub stage: &'static str,
    pub ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThreadTimes {
    pub encoding: f64,
    pub digest: f64,
    pub fsync: f64,
}

/// An observer that notes when each phase begins, and passes everything on.
pub struct Profiler {
    inner: Arc<dyn Observer>,
    started: Instant,
    phases: Mutex<Vec<(String, Instant)>>,
}

impl Profiler {
    /// Starts the clock and the process's counters.
    pub fn start(inner: Arc<dyn Observer>) -> Arc<Profiler> {
        profile::enable();
        Arc::new(Profiler {
            inner,
            started: Instant::now(),
            phases: Mutex::new(Vec::new()),
        })
    }

    /// The profile of the run that ended now with `report`.
    pub fn finish(&self, report: &RunReport) -> Profile {
        let ended = Instant::now();
        let wall = ended - self.started;
        let phases = self.phases.lock().expect("not poisoned").clone();
        let mut stages: Vec<Stage> = Vec::new();
        let mut push = |stage: &'static str, d: Duration| {
            if d.is_zero() {
                return;
            }
            match stages.iter_mut().find(|s| s.stage == stage) {
                Some(s) => s.ms += ms(d),
                None => stages.push(Stage { stage, ms: ms(d) }),
            }
        };
        let nanos = |c| Duration::from_nanos(profile::value(c));
        // Before the first phase: the freshness check and the plan.
        let first = phases.first().map_or(ended, |(_, at)| *at);
        let mut planning = first - self.started;
        let mut bounds: Vec<(&str, Instant, Instant)> = Vec::new();
        for (i, (name, at)) in phases.iter().enumerate() {
            let until = phases.get(i + 1).map_or(ended, |(_, next)| *next);
            bounds.push((name.as_str(), *at, until));
        }
        for (name, from, until) in &bounds {
            if *name == "planning" {
                planning += *until - *from;
            }
        }
        let listing = nanos(Counter::Listing).min(planning);
        push("listing sources", listing);
        push("planning", planning - listing);
        for (name, from, until) in bounds {
            let d = until - from;
            match name {
                "planning" => {}
                "writing" => {
                    // The writer thread either waits for rows or writes them; what it
                    // did not measure (opening the streams, draining) counts as the
                    // query's.
                    let writing = nanos(Counter::Writing).min(d);
                    push("reading and computing", d - writing);
                    push("encoding and digest", writing);
                }
                "finishing" => push("finishing files", d),
                "checking" => push("checks", d),
                "publishing" => push("publishing", d),
                "merging" => push("merging", d),
                "verifying" => push("comparing with the live partitions", d),
                _ => push("writing on the cluster", d),
            }
        }
        let secs = wall.as_secs_f64().max(1e-9);
        let input_bytes = profile::value(Counter::InputBytes);
        let input_rows = report
            .cluster
            .is_none()
            .then(|| profile::value(Counter::InputRows));
        // What was written: an unchanged partition was only compared.
        let output_bytes = report
            .partitions
            .iter()
            .filter(|p| p.action == Action::Written)
            .map(|p| p.bytes)
            .sum::<u64>();
        Profile {
            wall_ms: ms(wall),
            stages,
            threads_ms: ThreadTimes {
                encoding: ms(nanos(Counter::Encoding)),
                digest: ms(nanos(Counter::Digest)),
                fsync: ms(nanos(Counter::Fsync)),
            },
            rows: report.rows,
            rows_per_s: report.rows as f64 / secs,
            input_rows,
            input_rows_per_s: input_rows.map(|n| n as f64 / secs),
            input_bytes,
            input_bytes_per_s: input_bytes as f64 / secs,
            output_bytes,
            output_bytes_per_s: output_bytes as f64 / secs,
        }
    }
}

/// The plan of a profiled run, kept to count its scans' rows once its stream has ended.
/// Not kept otherwise: a finished hash join still holds its build side.
pub struct RowsRead(Option<Arc<dyn ExecutionPlan>>);

impl RowsRead {
    pub fn watch(plan: &Arc<dyn ExecutionPlan>) -> Self {
        Self(profile::enabled().then(|| Arc::clone(plan)))
    }

    /// Records the rows the plan's scans produced: the output rows of its leaves (a
    /// leaf without metrics adds none).
    pub fn record(self) {
        fn leaves(plan: &dyn ExecutionPlan) -> u64 {
            let children = plan.children();
            if children.is_empty() {
                return plan.metrics().and_then(|m| m.output_rows()).unwrap_or(0) as u64;
            }
            children.into_iter().map(|c| leaves(c.as_ref())).sum()
        }
        if let Some(plan) = self.0 {
            profile::set(Counter::InputRows, leaves(plan.as_ref()));
        }
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Observer for Profiler {
    fn phase(&self, phase: &str) {
        self.phases
            .lock()
            .expect("not poisoned")
            .push((phase.to_string(), Instant::now()));
        self.inner.phase(phase);
    }

    fn rows(&self, total: u64) {
        self.inner.rows(total);
    }
}
