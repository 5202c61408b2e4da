//! Projects: the DAG from paths, cycles, and staleness of downstream partitions.

use crate::common::*;

#[test]
fn plan_orders_jobs_and_stale_finds_exactly_the_changed_partitions() {
    let lake = Lake::new();
    let out = lake.idem(&["plan", "testdata/jobs", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let order: Vec<&str> = plan
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["job"].as_str().unwrap())
        .collect();
    let pos = |n: &str| order.iter().position(|j| *j == n).unwrap();
    assert!(pos("fct_orders") < pos("daily_sales"), "{order:?}");
    assert_eq!(
        plan[pos("daily_sales")]["upstream"],
        serde_json::json!(["fct_orders"])
    );

    for job in ["fct_orders", "daily_sales"] {
        lake.idem_ok(&[
            "backfill",
            &format!("testdata/jobs/{job}.toml"),
            "--from",
            "2026-06-01",
            "--to",
            "2026-06-03",
        ]);
    }
    let stale = lake.idem(&["stale", "testdata/jobs", "--json"]);
    assert!(json_lines(&stale).is_empty());
    // The mart's manifest records what it read from fct_orders by partition digest.
    let manifest = idem_io::manifest::read_from_file(&only_file(
        &lake.join("lake/analytics/daily_sales/dt=2026-06-01"),
    ))
    .unwrap()
    .unwrap();
    let upstream = status_digests(&lake, "lake/analytics/fct_orders");
    assert_eq!(manifest.run.inputs.len(), 1);
    assert_eq!(
        manifest.run.inputs[0].idem_digest.as_deref(),
        Some(upstream["dt=2026-06-01"].as_str())
    );
    // The raw source of one day changes and fct_orders is re-run: that one mart
    // partition is now stale, the others are not.
    let spec = idem_testdata::OrdersSpec {
        seed: 21,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 1).unwrap();
    lake.idem_ok(&[
        "backfill",
        "testdata/jobs/fct_orders.toml",
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-03",
    ]);
    let stale = json_lines(&lake.idem(&["stale", "testdata/jobs", "--json"]));
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(stale[0]["job"], "daily_sales");
    assert_eq!(stale[0]["partition"], "dt=2026-06-02");
    assert_eq!(stale[0]["upstream"], "fct_orders");
    // `idem status` shows the same freshness per partition.
    let status = lake.idem(&["status", "lake/analytics/daily_sales", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    for p in status["partitions"].as_array().unwrap() {
        let want = if p["partition"] == "dt=2026-06-02" {
            "changed"
        } else {
            "current"
        };
        assert_eq!(p["input_state"], want, "{p}");
    }
    // Re-running the mart for that date clears it.
    lake.idem_ok(&[
        "run",
        "testdata/jobs/daily_sales.toml",
        "--date",
        "2026-06-02",
    ]);
    assert!(json_lines(&lake.idem(&["stale", "testdata/jobs", "--json"])).is_empty());
}

#[test]
fn a_cycle_is_an_error_that_names_it() {
    let lake = Lake::new();
    let dir = lake.join("cyclic");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, reads, writes) in [("a", "out/b/", "out/a"), ("b", "out/a/", "out/b")] {
        std::fs::create_dir_all(lake.join(reads)).unwrap();
        std::fs::write(lake.join(&format!("{reads}x.parquet")), b"").unwrap();
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "name = \"{name}\"\n[sources.s]\npath = \"{reads}\"\n[transform]\nsql = \"select 1 as x\"\n\
                 [target]\npath = \"{writes}\"\n"
            ),
        )
        .unwrap();
    }
    let out = lake.idem(&["plan", "cyclic"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cycle: a -> b -> a"), "{err}");
}

#[test]
fn cascade_reruns_exactly_what_an_upstream_change_made_stale() {
    let lake = Lake::new();
    // A two-level project: raw -> fct_orders -> daily_sales.
    let project = lake.join("project");
    std::fs::create_dir_all(&project).unwrap();
    for f in ["fct_orders.toml", "daily_sales.toml", "daily_sales.sql"] {
        std::fs::copy(lake.join(&format!("testdata/jobs/{f}")), project.join(f)).unwrap();
    }
    let first = lake.idem_ok(&[
        "backfill",
        "project",
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-07",
        "--json",
    ]);
    let summaries: Vec<_> = first.iter().filter(|e| e["event"] == "summary").collect();
    assert_eq!(summaries.len(), 2);
    assert_eq!(summaries[0]["job"], "fct_orders");
    assert_eq!(summaries[1]["job"], "daily_sales");
    let mart = lake.join("lake/analytics/daily_sales");
    let before = snapshot(&mart);

    // Three raw days change.
    let spec = idem_testdata::OrdersSpec {
        seed: 31,
        ..Default::default()
    };
    for day in [1, 3, 5] {
        idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, day)
            .unwrap();
    }
    let events = lake.idem_ok(&[
        "backfill",
        "project",
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-07",
        "--json",
        "--cascade",
    ]);
    let written: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["event"] == "done")
        .flat_map(|e| {
            let job = e["report"]["job"].as_str().unwrap().to_string();
            e["report"]["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["action"] == "written")
                .map(move |p| (job.clone(), p["partition"].as_str().unwrap().to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut written = written;
    written.sort();
    assert_eq!(
        written,
        vec![
            ("daily_sales".to_string(), "dt=2026-06-02".to_string()),
            ("daily_sales".to_string(), "dt=2026-06-04".to_string()),
            ("daily_sales".to_string(), "dt=2026-06-06".to_string()),
            ("fct_orders".to_string(), "dt=2026-06-02".to_string()),
            ("fct_orders".to_string(), "dt=2026-06-04".to_string()),
            ("fct_orders".to_string(), "dt=2026-06-06".to_string()),
        ]
    );
    // The mart ran only the three stale dates; its other partitions were not touched.
    let mart_starts = events.iter().filter(|e| e["event"] == "start").count();
    assert_eq!(mart_starts, 7 + 3);
    let after = snapshot(&mart);
    for (k, v) in &before {
        if !["dt=2026-06-02", "dt=2026-06-04", "dt=2026-06-06"]
            .iter()
            .any(|d| k.starts_with(d))
        {
            assert_eq!(Some(v), after.get(k), "{k} was touched");
        }
    }
    assert!(json_lines(&lake.idem(&["stale", "project", "--json"])).is_empty());
    // The mart equals what DuckDB computes from scratch over the raw orders.
    let expected = readers(&[
        "duckdb",
        &format!(
            "select created_at::date as dt, store_id, sum(amount_usd) as amount_usd_sum, \
             count(*) as order_count, count(distinct customer_id) as customers \
             from read_parquet('{}/testdata/lake/raw/orders/*/*.parquet', hive_partitioning=true) \
             where status <> 'cancelled' group by 1, 2",
            lake.path().display()
        ),
    ]);
    assert_eq!(readers(&["table", mart.to_str().unwrap()]), expected);
}
