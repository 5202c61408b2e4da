//! Two workers on the same task: concurrent runs of one job succeed or fail cleanly and
//! leave the table in the state of one complete run, never a mix.

use std::collections::BTreeMap;
use std::process::Command;

use crate::common::*;

const FCT: &str = "testdata/jobs/fct_orders.toml";

fn digests(lake: &Lake) -> BTreeMap<String, String> {
    status_digests(lake, "lake/analytics/fct_orders")
}

fn spawn_all(lake: &Lake, dates: &[&str]) -> Vec<std::process::Output> {
    all_at_once(dates.iter().map(|d| {
        let mut run = Command::new(bin());
        run.args(["run", FCT, "--date", d, "--json"])
            .current_dir(lake.path());
        run
    }))
}

#[test]
fn four_runs_of_the_same_date_end_as_one_run() {
    // The clean-run state of the new source day, from a separate lake.
    let reference = Lake::new();
    let spec = idem_testdata::OrdersSpec {
        seed: 3,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&reference.join("testdata/lake/raw/orders"), &spec, 3).unwrap();
    reference.idem_ok(&["run", FCT, "--date", "2026-06-04"]);
    let expected = digests(&reference);

    for round in 0..3 {
        let lake = Lake::new();
        lake.idem_ok(&["run", FCT, "--date", "2026-06-04"]);
        idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 3).unwrap();
        let outs = spawn_all(&lake, &["2026-06-04"; 4]);
        for o in &outs {
            assert!(
                o.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        assert_eq!(digests(&lake), expected, "round {round}");
        let staging = lake.join("lake/analytics/_idem/fct_orders/staging");
        assert_eq!(std::fs::read_dir(staging).unwrap().count(), 0);
        // Exactly one complete run's files: one Parquet file, one manifest.
        let files: Vec<_> = std::fs::read_dir(lake.join("lake/analytics/fct_orders/dt=2026-06-04"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
    }
}

#[test]
fn runs_of_different_dates_do_not_disturb_each_other() {
    let reference = Lake::new();
    reference.idem_ok(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-04",
    ]);
    let expected = digests(&reference);

    let lake = Lake::new();
    let outs = spawn_all(
        &lake,
        &["2026-06-01", "2026-06-02", "2026-06-03", "2026-06-04"],
    );
    for o in &outs {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["partitions"].as_array().unwrap().len(), 1);
    }
    assert_eq!(digests(&lake), expected);
}
