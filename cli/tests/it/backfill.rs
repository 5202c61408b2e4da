//! Backfills: newest first, capped concurrency, idempotent re-runs, and --skip-fresh.

use std::time::Instant;

use crate::common::*;

const FCT: &str = "testdata/jobs/fct_orders.toml";

fn thirty_days(lake: &Lake) {
    let spec = idem_testdata::OrdersSpec {
        days: 30,
        ..Default::default()
    };
    idem_testdata::write_orders(&lake.join("testdata/lake/raw/orders"), &spec).unwrap();
}

fn backfill(lake: &Lake, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-30",
        "--json",
    ];
    args.extend_from_slice(extra);
    lake.idem_ok(&args)
}

#[test]
fn newest_first_with_a_concurrency_cap() {
    let lake = Lake::new();
    thirty_days(&lake);
    let events = backfill(&lake, &["--concurrency", "3"]);
    let starts: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "start")
        .map(|e| e["logical_date"].as_str().unwrap())
        .collect();
    let mut newest_first = starts.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(starts, newest_first);
    assert_eq!(starts.len(), 30);
    let max_running = events
        .iter()
        .filter_map(|e| e["running"].as_u64())
        .max()
        .unwrap();
    assert!((1..=3).contains(&max_running), "{max_running}");
    let summary = events.last().unwrap();
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["succeeded"], 30);
    assert_eq!(summary["written"], 30);

    let oldest = lake.idem_ok(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-03",
        "--json",
        "--oldest-first",
        "--concurrency",
        "1",
    ]);
    let starts: Vec<&str> = oldest
        .iter()
        .filter(|e| e["event"] == "start")
        .map(|e| e["logical_date"].as_str().unwrap())
        .collect();
    assert_eq!(starts, vec!["2026-06-01", "2026-06-02", "2026-06-03"]);
}

#[test]
fn a_rerun_is_unchanged_and_skip_fresh_skips_every_date() {
    let lake = Lake::new();
    thirty_days(&lake);
    let t = Instant::now();
    backfill(&lake, &[]);
    let first = t.elapsed();
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);

    let t = Instant::now();
    let again = backfill(&lake, &[]);
    let second = t.elapsed();
    let acts = actions(&again);
    assert_eq!(acts.len(), 30);
    assert!(acts.iter().all(|(_, a)| a == "unchanged"), "{acts:?}");

    let t = Instant::now();
    let fresh = backfill(&lake, &["--skip-fresh"]);
    let third = t.elapsed();
    let acts = actions(&fresh);
    assert_eq!(acts.len(), 30);
    assert!(acts.iter().all(|(_, a)| a == "fresh"), "{acts:?}");
    assert_eq!(before, snapshot(&table));
    eprintln!("30-day backfill: first {first:?}, re-run {second:?}, --skip-fresh {third:?}");

    // One source day changes: exactly that date runs, the others stay fresh.
    let spec = idem_testdata::OrdersSpec {
        seed: 77,
        days: 30,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 9).unwrap();
    let after = backfill(&lake, &["--skip-fresh"]);
    let acts = actions(&after);
    let ran: Vec<_> = acts.iter().filter(|(_, a)| a != "fresh").collect();
    assert_eq!(
        ran,
        vec![&("dt=2026-06-10".to_string(), "written".to_string())]
    );
}

#[test]
fn a_failed_date_does_not_stop_the_others() {
    let lake = Lake::new();
    // 2026-06-02's source file is corrupt: that date fails, the others land.
    std::fs::write(
        lake.join("testdata/lake/raw/orders/created_date=2026-06-02/part-0.parquet"),
        b"not parquet",
    )
    .unwrap();
    let out = lake.idem(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-04",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let events = json_lines(&out);
    let failed: Vec<_> = events.iter().filter(|e| e["event"] == "failed").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["logical_date"], "2026-06-02");
    let summary = events.last().unwrap();
    assert_eq!(summary["failed"], 1);
    assert_eq!(summary["succeeded"], 3);
    for d in ["2026-06-01", "2026-06-03", "2026-06-04"] {
        assert!(
            lake.join(&format!("lake/analytics/fct_orders/dt={d}"))
                .is_dir()
        );
    }
    // With --fail-fast, no date starts after the failure.
    let out = lake.idem(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-04",
        "--json",
        "--fail-fast",
        "--oldest-first",
        "--concurrency",
        "1",
    ]);
    let events = json_lines(&out);
    let summary = events.last().unwrap();
    assert_eq!(summary["not_run"], 2, "{summary}");
}

#[test]
fn ctrl_c_finishes_running_dates_and_reports_what_ran() {
    use std::io::{BufRead, BufReader};
    let lake = Lake::new();
    thirty_days(&lake);
    let mut child = std::process::Command::new(bin())
        .args([
            "backfill",
            FCT,
            "--from",
            "2026-06-01",
            "--to",
            "2026-06-30",
            "--json",
            "--concurrency",
            "1",
        ])
        .current_dir(lake.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Interrupt once the second date is done.
    let mut done = 0;
    let mut events = Vec::new();
    for line in lines.by_ref() {
        let e: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if e["event"] == "done" {
            done += 1;
        }
        events.push(e);
        if done == 2 {
            rustix::process::kill_process(
                rustix::process::Pid::from_child(&child),
                rustix::process::Signal::INT,
            )
            .unwrap();
            break;
        }
    }
    for line in lines {
        events.push(serde_json::from_str(&line.unwrap()).unwrap());
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let summary = events.last().unwrap();
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["interrupted"], true);
    let not_run = summary["not_run"].as_u64().unwrap();
    assert!(not_run > 0 && not_run <= 28, "{summary}");
    assert_eq!(summary["succeeded"].as_u64().unwrap() + not_run, 30);
    // Every partition that exists is whole; the same backfill finishes the job.
    status_digests(&lake, "lake/analytics/fct_orders");
    let rest = backfill(&lake, &[]);
    assert_eq!(rest.last().unwrap()["succeeded"], 30);
}

#[test]
fn lookback_owns_late_days_and_backfills_run_each_partition_once() {
    let lake = Lake::new();
    let job = lake.job(
        "late",
        r#"
name = "late"
lookback = 2
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = """
select order_id, amount_usd, created_date as dt
from orders
where created_date >= cast($run_start as date) and created_date < cast($run_end as date)
"""
[target]
path = "out/late"
partition_by = ["dt"]
"#,
    );
    let first = lake.idem_ok(&["run", &job, "--date", "2026-06-05", "--json"]);
    assert_eq!(
        actions(&first),
        vec![
            ("dt=2026-06-03".to_string(), "written".to_string()),
            ("dt=2026-06-04".to_string(), "written".to_string()),
            ("dt=2026-06-05".to_string(), "written".to_string()),
        ]
    );
    assert_eq!(first[0]["logical_date"], "2026-06-05");
    // Late rows for 06-04: the next run of 06-05 picks them up.
    let spec = idem_testdata::OrdersSpec {
        seed: 8,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 3).unwrap();
    let again = lake.idem_ok(&["run", &job, "--date", "2026-06-05", "--json"]);
    let written: Vec<_> = actions(&again)
        .into_iter()
        .filter(|(_, a)| a == "written")
        .collect();
    assert_eq!(
        written,
        vec![("dt=2026-06-04".to_string(), "written".to_string())]
    );

    let events = lake.idem_ok(&[
        "backfill",
        &job,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-07",
        "--json",
        "--concurrency",
        "1",
    ]);
    let starts: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "start")
        .map(|e| e["logical_date"].as_str().unwrap())
        .collect();
    assert_eq!(starts, vec!["2026-06-07", "2026-06-04", "2026-06-03"]);
    let digests = status_digests(&lake, "out/late");
    assert_eq!(digests.len(), 7);
}

/// A daily job by event day that also owns the day before (`lookback = 1`).
fn by_event_day(lake: &Lake) -> String {
    lake.job(
        "by_event_day",
        r#"
name = "by_event_day"
lookback = 1
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = """
select order_id, amount_usd, cast(created_at as date) as dt
from orders
where created_date >= cast($run_start as date) and created_date < cast($run_end as date)
"""
[target]
path = "out/by_event_day"
partition_by = ["dt"]
"#,
    )
}

#[test]
fn a_late_row_lands_in_the_previous_days_partition_with_lookback_1() {
    let lake = Lake::new();
    let job = by_event_day(&lake);
    lake.idem_ok(&[
        "backfill",
        &job,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-04",
    ]);
    // 2026-06-05's load brings a row for 2026-06-04 (it arrived late).
    let dir = lake.join("testdata/lake/raw/orders/created_date=2026-06-05");
    let batch = {
        use arrow::array::*;
        use std::sync::Arc;
        let schema = idem_testdata::orders_schema();
        arrow::record_batch::RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![999_999])),
                Arc::new(Int64Array::from(vec![1])),
                Arc::new(Int32Array::from(vec![1])),
                Arc::new(
                    Decimal128Array::from(vec![1234])
                        .with_precision_and_scale(12, 2)
                        .unwrap(),
                ),
                Arc::new(StringArray::from(vec!["paid"])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![1_780_574_400_000_000]) // 2026-06-04T12:00Z
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap()
    };
    let file = std::fs::File::create(dir.join("late.parquet")).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let report = lake.idem_ok(&["run", &job, "--date", "2026-06-05", "--json"]);
    let acts = actions(&report);
    assert!(
        acts.contains(&("dt=2026-06-04".to_string(), "written".to_string())),
        "{acts:?}"
    );
    assert!(
        acts.contains(&("dt=2026-06-05".to_string(), "written".to_string())),
        "{acts:?}"
    );
    let rows = readers(&["table", lake.join("out/by_event_day").to_str().unwrap()]);
    let late: Vec<_> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["order_id"] == "999999")
        .collect();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0]["dt"], "2026-06-04");
    let expected = readers(&[
        "duckdb",
        &format!(
            "select order_id, amount_usd, created_at::date as dt \
             from read_parquet('{}/testdata/lake/raw/orders/*/*.parquet', hive_partitioning=true) \
             where created_date <= '2026-06-05'",
            lake.path().display()
        ),
    ]);
    assert_eq!(rows, expected);
}

/// A run whose lookback reaches a partition already written from unchanged inputs
/// still creates its own day, empty when the source has no rows for it: every
/// partition the window owns is replaced, however the run finds the others unchanged.
#[test]
fn a_new_day_with_a_fresh_lookback_day_is_created_empty() {
    let lake = Lake::new();
    let job = by_event_day(&lake);
    lake.idem_ok(&["run", &job, "--date", "2026-06-07", "--json"]);
    // The source has no 2026-06-08 yet; 2026-06-07 is as it was read.
    let report = lake.idem_ok(&["run", &job, "--date", "2026-06-08", "--json"]);
    assert_eq!(
        actions(&report),
        vec![
            ("dt=2026-06-07".to_string(), "unchanged".to_string()),
            ("dt=2026-06-08".to_string(), "emptied".to_string()),
        ]
    );
    assert!(lake.join("out/by_event_day/dt=2026-06-08").is_dir());
    // Now every owned partition is live and fresh: the re-run stages nothing.
    let out = idem_in(
        lake.path(),
        &["run", &job, "--date", "2026-06-08", "--json"],
        &[("IDEM_FAILPOINTS", "after_first_batch=error")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        actions(&json_lines(&out)),
        vec![
            ("dt=2026-06-07".to_string(), "unchanged".to_string()),
            ("dt=2026-06-08".to_string(), "unchanged".to_string()),
        ]
    );
}
