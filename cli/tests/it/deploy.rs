//! The orchestrator examples in deploy/, run as their README says: the Indexed Job
//! runner launching this build's idem as Kubernetes would, the Airflow DAG against a
//! stand-in Airflow, and the Dagster asset materialized in-process.

use std::process::Command;

use crate::common::*;

/// Runs `cmd` from the repository root with this build's idem as `IDEM_BIN`; it must
/// succeed and end with "N passed, 0 failed".
fn passes(mut cmd: Command) {
    let out = cmd
        .current_dir(repo_root())
        .env("IDEM_BIN", bin())
        .env_remove("IDEM_FAILPOINTS")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        out.status.success() && last.contains(" passed, 0 failed") && !last.contains("skipped"),
        "{cmd:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_indexed_job_runner_starts_retries_and_fails_indices_by_exit_code() {
    let mut cmd = Command::new("bash");
    cmd.arg("deploy/kubernetes/test_run_indexed_job.sh");
    passes(cmd);
}

#[test]
fn the_airflow_dag_maps_one_task_per_unit_and_retries_by_exit_code() {
    let mut cmd = Command::new(python());
    cmd.arg("deploy/airflow/test_idem_backfill_dag.py");
    passes(cmd);
}

#[test]
fn the_dagster_asset_materializes_partitions_and_reports_unchanged() {
    let mut cmd = Command::new(python());
    cmd.arg("deploy/dagster/test_idem_dagster.py");
    passes(cmd);
}
