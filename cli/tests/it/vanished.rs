//! Raw data that disappears (a retention policy, a half-finished upstream, a typo in a
//! range): a run whose sources have no file for its window refuses to empty partitions
//! that hold rows, names the sources, the window and the rows, and changes nothing,
//! unless the user says so. A day whose input is there and matches no row still clears
//! its partition.

use crate::common::*;

const FCT: &str = "testdata/jobs/fct_orders.toml";

/// Moves a raw day of the sample orders out of the lake (as a retention policy would).
fn vanish(lake: &Lake, day: &str) {
    let raw = lake.join(&format!("testdata/lake/raw/orders/created_date={day}"));
    let away = lake.join(&format!("gone/created_date={day}"));
    std::fs::create_dir_all(away.parent().unwrap()).unwrap();
    std::fs::rename(raw, away).unwrap();
}

/// The rows each partition of `table` holds, per `idem status`.
fn rows_by_partition(lake: &Lake, table: &str) -> Vec<(String, u64)> {
    let out = lake.idem(&["status", table, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["partition"].as_str().unwrap().to_string(),
                p["rows"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn refused_naming(out: &std::process::Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
    assert!(err.contains("Nothing was published"), "{err}");
}

/// The tree of `table` byte for byte, and its rows per partition.
type State = (
    std::collections::BTreeMap<String, (u64, u64, i64, i64, u64)>,
    Vec<(String, u64)>,
);

fn state(lake: &Lake, table: &str) -> State {
    (snapshot(&lake.join(table)), rows_by_partition(lake, table))
}

#[test]
fn a_vanished_raw_day_leaves_its_partition_and_says_why() {
    let lake = Lake::new();
    let table = "lake/analytics/fct_orders";
    lake.idem_ok(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-03",
    ]);
    let before = state(&lake, table);
    let rows = before
        .1
        .iter()
        .find(|(p, _)| p == "dt=2026-06-02")
        .unwrap()
        .1;
    assert!(rows > 0);
    vanish(&lake, "2026-06-02");

    let out = lake.idem(&["run", FCT, "--date", "2026-06-02", "--json"]);
    refused_naming(
        &out,
        &[
            "no input for 2026-06-02",
            "source `orders`",
            "testdata/lake/raw/orders/",
            &format!("partition dt=2026-06-02, which holds {rows} rows"),
            "--allow-missing-input",
        ],
    );
    let report = json_lines(&out);
    assert_eq!(report[0]["exit_code"], 2);
    assert_eq!(report[0]["partition"], "dt=2026-06-02");
    assert_eq!(
        state(&lake, table),
        before,
        "the refused run changed the table"
    );

    // Said so: the partition is emptied, and the others are left alone.
    let done = lake.idem_ok(&[
        "run",
        FCT,
        "--date",
        "2026-06-02",
        "--allow-missing-input",
        "--json",
    ]);
    assert_eq!(
        actions(&done),
        vec![("dt=2026-06-02".to_string(), "emptied".to_string())]
    );
    let after = rows_by_partition(&lake, table);
    let expected: Vec<(String, u64)> = before
        .1
        .iter()
        .map(|(p, r)| (p.clone(), if p == "dt=2026-06-02" { 0 } else { *r }))
        .collect();
    assert_eq!(after, expected);
}

#[test]
fn a_backfill_over_aged_out_days_changes_none_of_them() {
    let lake = Lake::new();
    let table = "lake/analytics/fct_orders";
    lake.idem_ok(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-04",
    ]);
    let before = state(&lake, table);
    vanish(&lake, "2026-06-01");
    vanish(&lake, "2026-06-02");

    let out = lake.idem(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-04",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = json_lines(&out);
    let mut failed: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "failed")
        .map(|e| e["logical_date"].as_str().unwrap())
        .collect();
    failed.sort();
    assert_eq!(failed, ["2026-06-01", "2026-06-02"], "{events:?}");
    for e in events.iter().filter(|e| e["event"] == "failed") {
        assert_eq!(e["exit_code"], 2, "{e}");
        assert!(
            e["error"].as_str().unwrap().contains("source `orders`"),
            "{e}"
        );
    }
    assert_eq!(
        state(&lake, table),
        before,
        "the backfill changed the table"
    );
}

#[test]
fn the_job_setting_allows_it_and_a_day_without_matching_rows_still_clears() {
    let lake = Lake::new();
    let table = "lake/analytics/fct_orders";
    lake.idem_ok(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-02",
    ]);
    let text = std::fs::read_to_string(lake.join(FCT)).unwrap();

    // Input there, no row matches (invariant 3): the partition is emptied, no flag
    // needed. The source is a glob over files named by day, so its files are told
    // apart by the pattern.
    let flat = lake.join("flat");
    std::fs::create_dir_all(&flat).unwrap();
    for day in ["2026-06-01", "2026-06-02"] {
        let dir = lake.join(&format!("testdata/lake/raw/orders/created_date={day}"));
        std::fs::copy(only_file(&dir), flat.join(format!("orders-{day}.parquet"))).unwrap();
    }
    let globbed = |name: &str, filter: &str| {
        lake.job(
            name,
            &format!(
                r#"
name = "{name}"
[sources.orders]
path = "flat/orders-*.parquet"
[transform]
sql = "select order_id, amount_usd, cast(created_at as date) as dt from orders where cast(created_at as date) = $run_date {filter}"
[target]
path = "lake/analytics/globbed/"
partition_by = ["dt"]
"#
            ),
        )
    };
    let all = globbed("all", "");
    let none = globbed("none", "and amount_usd < 0");
    let done = lake.idem_ok(&["run", &all, "--date", "2026-06-01", "--json"]);
    assert_eq!(
        actions(&done),
        vec![("dt=2026-06-01".to_string(), "written".to_string())]
    );
    let done = lake.idem_ok(&["run", &none, "--date", "2026-06-01", "--json"]);
    assert_eq!(
        actions(&done),
        vec![("dt=2026-06-01".to_string(), "emptied".to_string())]
    );

    // Input gone, and the job file says that is expected.
    vanish(&lake, "2026-06-02");
    let allowed = lake.job(
        "allowed",
        &text.replace(
            "name = \"fct_orders\"",
            "name = \"fct_orders\"\nallow_missing_input = true",
        ),
    );
    let done = lake.idem_ok(&["run", &allowed, "--date", "2026-06-02", "--json"]);
    assert_eq!(
        actions(&done),
        vec![("dt=2026-06-02".to_string(), "emptied".to_string())]
    );
    let rows = rows_by_partition(&lake, table);
    assert_eq!(rows.len(), 2);
    assert!(rows[0].1 > 0, "{rows:?}");
    assert_eq!(rows[1], ("dt=2026-06-02".to_string(), 0));
}

#[test]
fn a_join_names_the_source_that_vanished_not_the_one_still_there() {
    let lake = Lake::new();
    let job = "testdata/jobs/orders_by_country.toml";
    let table = "lake/analytics/orders_by_country";
    lake.idem_ok(&["run", job, "--date", "2026-06-03"]);
    let before = state(&lake, table);
    vanish(&lake, "2026-06-03");
    let out = lake.idem(&["run", job, "--date", "2026-06-03"]);
    refused_naming(&out, &["source `orders`", "dt=2026-06-03"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("source `customers`"), "{err}");
    assert_eq!(state(&lake, table), before);
}

#[test]
fn a_delta_table_and_a_cluster_run_refuse_the_same_way() {
    let lake = Lake::new();
    let text = std::fs::read_to_string(lake.join(FCT)).unwrap();
    let delta = lake.job(
        "delta",
        &text.replace(
            "path = \"lake/analytics/fct_orders/\"",
            "path = \"lake/analytics/fct_delta/\"\nformat = \"delta\"",
        ),
    );
    lake.idem_ok(&["run", &delta, "--date", "2026-06-02"]);
    lake.idem_ok(&["run", FCT, "--date", "2026-06-02"]);
    let log = lake.join("lake/analytics/fct_delta/_delta_log");
    let commits = || std::fs::read_dir(&log).unwrap().count();
    let (delta_before, commits_before) =
        (snapshot(&lake.join("lake/analytics/fct_delta")), commits());
    let parquet_before = state(&lake, "lake/analytics/fct_orders");
    vanish(&lake, "2026-06-02");

    let out = lake.idem(&["run", &delta, "--date", "2026-06-02"]);
    refused_naming(
        &out,
        &["source `orders`", "partition dt=2026-06-02, which holds"],
    );
    assert_eq!(commits(), commits_before, "the refused run committed");
    assert_eq!(
        snapshot(&lake.join("lake/analytics/fct_delta")),
        delta_before
    );

    let out = lake.idem(&[
        "run",
        FCT,
        "--date",
        "2026-06-02",
        "--cluster",
        "standalone",
    ]);
    refused_naming(
        &out,
        &["source `orders`", "partition dt=2026-06-02, which holds"],
    );
    assert_eq!(state(&lake, "lake/analytics/fct_orders"), parquet_before);
}

#[test]
fn plan_shows_the_jobs_that_may_empty_partitions_without_input() {
    let lake = Lake::new();
    let project = lake.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let text = std::fs::read_to_string(lake.join(FCT)).unwrap();
    std::fs::write(project.join("fct_orders.toml"), &text).unwrap();
    std::fs::write(
        project.join("lenient.toml"),
        text.replace(
            "name = \"fct_orders\"",
            "name = \"lenient\"\nallow_missing_input = true",
        )
        .replace("lake/analytics/fct_orders/", "lake/analytics/lenient/"),
    )
    .unwrap();
    let out = lake.idem(&["plan", "project"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |job: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{job} ")))
            .unwrap_or_else(|| panic!("{job} missing from: {text}"))
            .to_string()
    };
    assert!(line("lenient").ends_with("(empties partitions when its input is missing)"));
    assert!(!line("fct_orders").contains("input is missing"));
    let out = lake.idem(&["plan", "project", "--json"]);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let flag = |job: &str| {
        plan.as_array()
            .unwrap()
            .iter()
            .find(|e| e["job"] == job)
            .unwrap()["allow_missing_input"]
            .clone()
    };
    assert_eq!(flag("lenient"), true);
    assert_eq!(flag("fct_orders"), false);
}
