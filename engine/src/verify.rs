//! `idem verify JOB --date D`: runs the transform twice into scratch tables (publishing
//! nothing to the real target), compares the partitions' content digests and, when they
//! differ, shows differing rows and names the likely cause.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::prelude::ParquetReadOptions;
use idem_io::hive::PartitionPath;
use idem_io::manifest::{InputFile, LiveState, read_partition};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::job::Checks;
use crate::job::{Job, OnSchemaChange};
use crate::run::{Quiet, RunOptions, RunReport};

#[derive(Clone, Debug, Serialize)]
pub struct VerifyPartition {
    pub partition: String,
    pub rows: [u64; 2],
    pub digests: [String; 2],
    pub same: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    pub job: String,
    pub logical_date: String,
    pub deterministic: bool,
    pub partitions: Vec<VerifyPartition>,
    /// The likely cause of a difference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Up to five rows of the first differing partition found only in run 1, then only
    /// in run 2, as text tables.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub only_in: Vec<String>,
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn verify(job: &Job, opts: &RunOptions) -> Result<VerifyReport> {
    let scratch = Scratch(std::env::temp_dir().join(format!(
        "idem-verify-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
    )));
    let mut reports: Vec<RunReport> = Vec::new();
    let mut roots = Vec::new();
    for i in 1..=2 {
        let mut scratch_job = job.clone();
        let root = scratch.0.join(format!("run{i}")).join(&job.name);
        scratch_job.target.path = root.clone();
        // Verify compares outputs; checks and schema guards belong to real runs.
        scratch_job.checks = Checks::default();
        scratch_job.target.on_schema_change = OnSchemaChange::Allow;
        reports.push(crate::run::run(&scratch_job, opts, Arc::new(Quiet)).await?);
        roots.push(root);
    }
    let by_partition = |r: &RunReport| -> BTreeMap<String, (u64, String)> {
        r.partitions
            .iter()
            .map(|p| (p.partition.clone(), (p.rows, p.digest.clone())))
            .collect()
    };
    let (one, two) = (by_partition(&reports[0]), by_partition(&reports[1]));
    let mut names: Vec<&String> = one.keys().chain(two.keys()).collect();
    names.sort();
    names.dedup();
    let missing = (0, "-".to_string());
    let partitions: Vec<VerifyPartition> = names
        .into_iter()
        .map(|n| {
            let a = one.get(n).unwrap_or(&missing);
            let b = two.get(n).unwrap_or(&missing);
            VerifyPartition {
                partition: n.clone(),
                rows: [a.0, b.0],
                digests: [a.1.clone(), b.1.clone()],
                same: a.1 == b.1,
            }
        })
        .collect();
    let deterministic = partitions.iter().all(|p| p.same);
    let mut report = VerifyReport {
        job: job.name.clone(),
        logical_date: reports[0].logical_date.clone(),
        deterministic,
        partitions,
        cause: None,
        only_in: Vec::new(),
    };
    if deterministic {
        return Ok(report);
    }
    let first = report
        .partitions
        .iter()
        .find(|p| !p.same)
        .expect("a difference");
    let partition = if first.partition == "(table)" {
        PartitionPath::root()
    } else {
        PartitionPath::parse(&first.partition).map_err(|source| Error::Table {
            path: roots[0].clone(),
            source,
        })?
    };
    let dirs: Vec<PathBuf> = roots.iter().map(|r| r.join(partition.rel_path())).collect();
    report.only_in = differing_rows(job, &dirs).await.unwrap_or_default();
    report.cause = Some(likely_cause(job, &dirs).await);
    Ok(report)
}

async fn differing_rows(job: &Job, dirs: &[PathBuf]) -> Result<Vec<String>> {
    let ctx = crate::session::guarded(Default::default(), Default::default());
    let exec = |e| Error::execution(&job.path, "comparing the two runs: ", e);
    for (name, dir) in ["one", "two"].iter().zip(dirs) {
        if dir.is_dir() {
            ctx.register_parquet(
                *name,
                format!("{}/", dir.display()),
                ParquetReadOptions::default(),
            )
            .await
            .map_err(exec)?;
        } else {
            ctx.sql(&format!(
                "create view {name} as select * from (select 1) where false"
            ))
            .await
            .map_err(exec)?;
        }
    }
    let mut out = Vec::new();
    for (a, b) in [("one", "two"), ("two", "one")] {
        let batches = ctx
            .sql(&format!(
                "select * from {a} except select * from {b} limit 5"
            ))
            .await
            .map_err(exec)?
            .collect()
            .await
            .map_err(exec)?;
        out.push(crate::sql::pretty(&batches));
    }
    Ok(out)
}

fn inputs_of(dir: &Path) -> Option<Vec<InputFile>> {
    match read_partition(dir) {
        Ok(LiveState::Managed(m)) => Some(m.run.inputs),
        _ => None,
    }
}

async fn likely_cause(job: &Job, dirs: &[PathBuf]) -> String {
    if job.allow_nondeterministic
        && let Ok(planned) = crate::run::plan_unchecked(job).await
        && let Some((function, volatility)) =
            crate::guard::first_nondeterministic(planned.logical_plan())
    {
        return format!(
            "the job sets allow_nondeterministic = true and its SQL calls {function}() \
             (DataFusion marks it {volatility:?}): every run writes different values. \
             Use $run_date / $run_start / $run_end or a stable key from idem_key() instead"
        );
    }
    if let (Some(a), Some(b)) = (inputs_of(&dirs[0]), inputs_of(&dirs[1]))
        && a != b
    {
        let changed: Vec<String> = b
            .iter()
            .filter(|f| !a.contains(f))
            .map(|f| f.path.clone())
            .take(3)
            .collect();
        return format!(
            "a source changed between the two runs ({}); verify again once it is quiet",
            changed.join(", ")
        );
    }
    let sql = job.sql.to_ascii_lowercase();
    for (pattern, what) in [
        ("row_number", "row_number()"),
        ("rank(", "rank()"),
        ("first_value", "first_value()"),
        ("last_value", "last_value()"),
        ("nth_value", "nth_value()"),
        ("array_agg", "array_agg()"),
        ("string_agg", "string_agg()"),
        ("limit", "LIMIT"),
    ] {
        if sql.contains(pattern) {
            return format!(
                "the SQL uses {what}, whose result depends on row order: over an ORDER BY \
                 that is not unique (or none), ties fall differently from run to run. Order \
                 by a unique key, or derive keys with idem_key()"
            );
        }
    }
    "the output depends on something besides the job's inputs (row order, a \
     nondeterministic UDF, or a source that changes while it is read)"
        .into()
}
