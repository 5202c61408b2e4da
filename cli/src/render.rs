//! Human output: a spinner while a run works (only on a terminal), then a summary
//! table on stdout. Scripts use `--json` instead.

use std::sync::Arc;
use std::time::Duration;

use idem_engine::backfill::{Event, Outcome};
use idem_engine::run::{Action, Observer, RunReport};
use idem_engine::status::TableStatus;
use idem_engine::verify::VerifyReport;
use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new(enabled: bool) -> Arc<Self> {
        let bar = enabled.then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Arc::new(Self { bar })
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Observer for Progress {
    fn phase(&self, phase: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(phase.to_string());
        }
    }

    fn rows(&self, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!("writing: {} rows", thousands(total)));
        }
    }
}

/// Width of the partition column: its longest name, at least the header's.
fn column_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names
        .map(str::len)
        .max()
        .unwrap_or(0)
        .max("partition".len())
}

/// `1 date`, `3 dates`.
fn dates(n: usize) -> String {
    if n == 1 {
        "1 date".into()
    } else {
        format!("{n} dates")
    }
}

pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub fn report(r: &RunReport) {
    println!(
        "{} {}  run {}  ({} input file{}){}",
        r.job,
        r.logical_date,
        r.run_id,
        r.inputs,
        if r.inputs == 1 { "" } else { "s" },
        r.cluster
            .as_ref()
            .map(|c| format!("  on cluster {c}"))
            .unwrap_or_default()
    );
    let width = column_width(r.partitions.iter().map(|p| p.partition.as_str()));
    println!(
        "  {:<width$}  {:<9}  {:>12}  {:>10}  {:>8}",
        "partition", "action", "rows", "bytes", "publish"
    );
    for p in &r.partitions {
        println!(
            "  {:<width$}  {:<9}  {:>12}  {:>10}  {:>6} ms",
            p.partition,
            p.action.to_string(),
            thousands(p.rows),
            bytes(p.bytes),
            p.ms
        );
    }
    let count = |a: idem_engine::run::Action| r.partitions.iter().filter(|p| p.action == a).count();
    println!(
        "{} partitions: {} written, {} unchanged, {} emptied; {} rows in {:.2} s",
        r.partitions.len(),
        count(idem_engine::run::Action::Written),
        count(idem_engine::run::Action::Unchanged),
        count(idem_engine::run::Action::Emptied),
        thousands(r.rows),
        r.elapsed_ms as f64 / 1000.0
    );
    if let Some(m) = &r.merge {
        println!(
            "merge: {} changes; read {} of the table's {} files, kept {} unchanged",
            thousands(m.changes),
            m.files_read,
            m.table_files,
            m.files_kept
        );
    }
    if let Some(p) = &r.profile {
        profile(p);
    }
}

/// `run --profile`: the stages (adding up to the wall time), the threads' time, and
/// the throughput.
fn profile(p: &idem_engine::run::profile::Profile) {
    let per_s = |n: f64| bytes(n as u64);
    let rows_read = match (p.input_rows, p.input_rows_per_s) {
        (Some(n), Some(r)) => format!("{} rows ({} rows/s), ", thousands(n), thousands(r as u64)),
        _ => String::new(),
    };
    println!(
        "profile: read {rows_read}{} ({}/s); wrote {} rows ({} rows/s), {} ({}/s)",
        bytes(p.input_bytes),
        per_s(p.input_bytes_per_s),
        thousands(p.rows),
        thousands(p.rows_per_s as u64),
        bytes(p.output_bytes),
        per_s(p.output_bytes_per_s)
    );
    let width = column_width(p.stages.iter().map(|s| s.stage)).max("stage".len());
    println!("  {:<width$}  {:>10}  {:>6}", "stage", "ms", "%");
    for s in &p.stages {
        println!(
            "  {:<width$}  {:>10.1}  {:>5.1}%",
            s.stage,
            s.ms,
            100.0 * s.ms / p.wall_ms.max(1e-9)
        );
    }
    println!("  {:<width$}  {:>10.1}", "wall time", p.wall_ms);
    println!(
        "  threads: encoding {:.1} ms, digest {:.1} ms, fsync {:.1} ms (summed over threads)",
        p.threads_ms.encoding, p.threads_ms.digest, p.threads_ms.fsync
    );
}

pub fn status(s: &TableStatus) {
    println!(
        "{}: {} partitions, {} rows, {}",
        s.table,
        s.partitions.len(),
        thousands(s.rows),
        bytes(s.bytes)
    );
    let width = column_width(s.partitions.iter().map(|p| p.partition.as_str()));
    println!(
        "  {:<width$}  {:<8}  {:>12}  {:>10}  {:<32}  {:<10}  {:<8}  run",
        "partition", "state", "rows", "bytes", "digest", "date", "inputs"
    );
    for p in &s.partitions {
        println!(
            "  {:<width$}  {:<8}  {:>12}  {:>10}  {:<32}  {:<10}  {:<8}  {}",
            p.partition,
            p.state,
            p.rows.map(thousands).unwrap_or_else(|| "?".into()),
            bytes(p.bytes),
            p.digest.as_deref().unwrap_or("-"),
            p.logical_date.as_deref().unwrap_or("-"),
            p.input_state.unwrap_or("-"),
            p.run_id.as_deref().unwrap_or("-"),
        );
    }
    if !s.staging.is_empty() {
        println!(
            "staging directories of runs in progress or dead: {}",
            s.staging.join(", ")
        );
    }
}

pub fn verify(r: &VerifyReport) {
    println!(
        "verify {} {}: {}",
        r.job,
        r.logical_date,
        if r.deterministic {
            "deterministic (two runs, equal digests)"
        } else {
            "NOT deterministic: two runs of the same date differ"
        }
    );
    for p in &r.partitions {
        println!(
            "  {}  {} / {} rows  {} {} {}",
            p.partition,
            thousands(p.rows[0]),
            thousands(p.rows[1]),
            p.digests[0],
            if p.same { "=" } else { "≠" },
            p.digests[1]
        );
    }
    if let Some(cause) = &r.cause {
        println!("likely cause: {cause}");
    }
    for (i, rows) in r.only_in.iter().enumerate() {
        println!("rows only in run {} (up to 5):\n{rows}", i + 1);
    }
}

/// A backfill's display: an overall bar on a terminal, one line per finished date.
pub struct BackfillProgress {
    bar: Option<ProgressBar>,
}

impl BackfillProgress {
    pub fn new(dates: usize, terminal: bool) -> Arc<Self> {
        let bar = terminal.then(|| {
            let bar = ProgressBar::new(dates as u64);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} dates {elapsed} {msg}")
                    .expect("valid template"),
            );
            bar
        });
        Arc::new(Self { bar })
    }

    pub fn event(&self, e: &Event) {
        let line = match e {
            Event::Start {
                logical_date,
                running,
                ..
            } => {
                if let Some(bar) = &self.bar {
                    bar.set_message(format!("running {logical_date} ({running} at once)"));
                }
                return;
            }
            Event::Done {
                logical_date,
                report,
                ..
            } => {
                let count = |a: Action| report.partitions.iter().filter(|p| p.action == a).count();
                let mut parts = Vec::new();
                for (a, n) in [
                    (Action::Written, count(Action::Written)),
                    (Action::Unchanged, count(Action::Unchanged)),
                    (Action::Emptied, count(Action::Emptied)),
                    (Action::Fresh, count(Action::Fresh)),
                ] {
                    if n > 0 {
                        parts.push(format!("{n} {a}"));
                    }
                }
                format!(
                    "{logical_date}  {:<28}  {:>12} rows  {:>7} ms",
                    parts.join(", "),
                    thousands(report.rows),
                    report.elapsed_ms
                )
            }
            Event::Failed {
                logical_date,
                error,
                ..
            } => format!("{logical_date}  FAILED: {error}"),
            Event::Committed { version, .. } => {
                let line = match version {
                    Some(v) => format!("committed the range as one commit: version {v}"),
                    None => "nothing to commit".to_string(),
                };
                match &self.bar {
                    Some(bar) => bar.println(line),
                    None => println!("{line}"),
                }
                return;
            }
            Event::Abandoned {
                failed, not_run, ..
            } => {
                let line = format!(
                    "{} failed and {} not run: nothing of the range was committed; the table \
                     is as it was",
                    dates(*failed),
                    not_run
                );
                match &self.bar {
                    Some(bar) => bar.println(line),
                    None => println!("{line}"),
                }
                return;
            }
        };
        match &self.bar {
            Some(bar) => {
                bar.inc(1);
                bar.println(line);
            }
            None => println!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[derive(serde::Serialize)]
pub struct BackfillSummary {
    pub event: &'static str,
    pub job: String,
    pub dates: usize,
    pub succeeded: usize,
    pub failed: usize,
    /// Dates never started (after a failure with --fail-fast or a bad job).
    pub not_run: usize,
    /// Dates not run because a date of an upstream job they read did not succeed.
    pub skipped: usize,
    pub written: usize,
    pub unchanged: usize,
    pub emptied: usize,
    pub fresh: usize,
    pub rows: u64,
    pub elapsed_ms: u64,
    /// Ctrl-C stopped the backfill before every date started.
    pub interrupted: bool,
    /// `--atomic` and the range was not committed: the dates that ran without error,
    /// whose partitions were discarded (they count as neither succeeded nor written).
    pub abandoned: usize,
}

impl BackfillSummary {
    pub fn of(outcomes: &[Outcome], dates: usize, elapsed: Duration) -> Self {
        let reports: Vec<&RunReport> = outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().ok())
            .collect();
        let count = |a: Action| {
            reports
                .iter()
                .flat_map(|r| &r.partitions)
                .filter(|p| p.action == a)
                .count()
        };
        let failed = outcomes.len() - reports.len();
        Self {
            event: "summary",
            job: String::new(),
            dates,
            succeeded: reports.len(),
            failed,
            not_run: dates - outcomes.len(),
            skipped: 0,
            written: count(Action::Written),
            unchanged: count(Action::Unchanged),
            emptied: count(Action::Emptied),
            fresh: count(Action::Fresh),
            rows: reports.iter().map(|r| r.rows).sum(),
            elapsed_ms: elapsed.as_millis() as u64,
            interrupted: false,
            abandoned: 0,
        }
    }

    /// The range was not committed: nothing the dates computed was published.
    pub fn abandon(&mut self) {
        self.abandoned = self.succeeded;
        self.succeeded = 0;
        self.written = 0;
        self.unchanged = 0;
        self.emptied = 0;
        self.fresh = 0;
        self.rows = 0;
    }

    pub fn print(&self, job: &str) {
        if self.interrupted {
            println!(
                "backfill {job}: interrupted; {} dates were not started",
                self.not_run
            );
        }
        let abandoned = match self.abandoned {
            0 => String::new(),
            n => format!(", {n} abandoned (computed, not committed)"),
        };
        println!(
            "backfill {job}: {} dates, {} succeeded, {} failed, {} skipped, {} not run{abandoned}; \
             partitions: {} written, {} unchanged, {} emptied, {} fresh; {} rows in {:.2} s",
            self.dates,
            self.succeeded,
            self.failed,
            self.skipped,
            self.not_run,
            self.written,
            self.unchanged,
            self.emptied,
            self.fresh,
            thousands(self.rows),
            self.elapsed_ms as f64 / 1000.0
        );
    }
}
