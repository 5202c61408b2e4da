//! What a run is asked (its options) and what it answers: a report per partition,
//! and the observer that follows its phases.

use std::collections::BTreeMap;

use idem_io::commit::PublishMode;
use serde::Serialize;

use crate::job::Job;
use crate::params::Var;
use crate::window::Window;

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub date: String,
    pub vars: Vec<Var>,
    /// Skip the run when every partition its window owns is fresh (see `freshness`).
    pub skip_fresh: bool,
    /// Run the plan on this cluster, over the job's `[execution] cluster`.
    pub cluster: Option<crate::cluster::Cluster>,
    /// Publish every partition the run computes, even one equal to the live one (to
    /// apply new writer settings: compression, file and row-group sizes).
    pub rewrite: bool,
    /// Leave the run's partitions in this pending commit of the table instead of
    /// committing them (a Delta table's backfill made one snapshot; see
    /// [`crate::backfill::BackfillOptions::atomic`]).
    pub commit_with: Option<String>,
    /// Measure where the run's time goes ([`crate::run::profile`]); one run per
    /// process at a time.
    pub profile: bool,
}

impl RunOptions {
    /// The `--var` values as text, as manifests record them.
    pub fn var_text(&self) -> BTreeMap<String, String> {
        self.vars
            .iter()
            .map(|v| (v.name.clone(), v.value.to_string()))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// New rows were published.
    Written,
    /// The new rows equal the live ones (same digest and schema): nothing was touched.
    Unchanged,
    /// The run owns the partition but produced no rows for it: it now holds none.
    Emptied,
    /// `--skip-fresh`: the partition was written by this job and idem version from
    /// inputs that have not changed since, so the run was skipped.
    Fresh,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Written => "written",
            Action::Unchanged => "unchanged",
            Action::Emptied => "emptied",
            Action::Fresh => "fresh",
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PartitionReport {
    pub partition: String,
    pub action: Action,
    pub rows: u64,
    pub bytes: u64,
    pub files: usize,
    pub digest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish: Option<PublishMode>,
    pub ms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub job: String,
    pub job_file: String,
    pub table: String,
    pub logical_date: String,
    pub run_id: String,
    pub partitions: Vec<PartitionReport>,
    pub rows: u64,
    pub bytes: u64,
    pub inputs: usize,
    pub elapsed_ms: u64,
    pub warnings: Vec<String>,
    /// For a merge: how many files it read and how many it kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<crate::merge::MergeStats>,
    /// The cluster the plan ran on (`df://HOST:PORT`, `standalone`); absent when it
    /// ran in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `--profile`: the time of each stage, and the throughput.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<super::profile::Profile>,
}

impl RunReport {
    /// The report of a run of `job` over `window` that left `partitions` as listed, with
    /// their totals; no elapsed time, warnings or merge figures yet.
    pub(super) fn of(
        job: &Job,
        window: &Window,
        run_id: String,
        inputs: usize,
        partitions: Vec<PartitionReport>,
    ) -> RunReport {
        RunReport {
            job: job.name.clone(),
            job_file: job.path.display().to_string(),
            table: job.target.path.display().to_string(),
            logical_date: window.label(),
            run_id,
            rows: partitions.iter().map(|p| p.rows).sum(),
            bytes: partitions.iter().map(|p| p.bytes).sum(),
            inputs,
            partitions,
            elapsed_ms: 0,
            warnings: Vec::new(),
            merge: None,
            cluster: None,
            profile: None,
        }
    }
}

/// Receives progress while a run executes (the CLI draws it).
pub trait Observer: Send + Sync {
    fn phase(&self, _phase: &str) {}
    fn rows(&self, _total: u64) {}
}

/// An observer that ignores everything.
pub struct Quiet;

impl Observer for Quiet {}
