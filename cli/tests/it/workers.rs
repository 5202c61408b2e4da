//! Units of work and workers: `idem dates` in dependency order, `--stale`, a worker's
//! share (`--index`, `JOB_COMPLETION_INDEX`, `--shard`), dependents of a failed
//! upstream date skipped, and a local table refusing a second machine.

use serde_json::Value;

use crate::common::*;

const RANGE: [&str; 4] = ["--from", "2026-06-01", "--to", "2026-06-03"];

/// `idem dates testdata/jobs` over RANGE, `extra` appended: its units.
fn units(lake: &Lake, extra: &[&str]) -> Vec<(usize, String, String, Vec<usize>)> {
    let mut args = vec!["dates", "testdata/jobs"];
    args.extend(RANGE);
    args.push("--json");
    args.extend(extra);
    let out = lake.idem(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let units: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    units
        .iter()
        .map(|u| {
            (
                u["index"].as_u64().unwrap() as usize,
                u["job"].as_str().unwrap().to_string(),
                u["date"].as_str().unwrap().to_string(),
                u["after"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_u64().unwrap() as usize)
                    .collect(),
            )
        })
        .collect()
}

fn unit(i: usize, job: &str, date: &str, after: &[usize]) -> (usize, String, String, Vec<usize>) {
    (i, job.to_string(), date.to_string(), after.to_vec())
}

#[test]
fn dates_lists_units_in_dependency_order_and_stale_keeps_what_must_run() {
    let lake = Lake::new();
    let all = vec![
        unit(0, "fct_orders", "2026-06-03", &[]),
        unit(1, "fct_orders", "2026-06-02", &[]),
        unit(2, "fct_orders", "2026-06-01", &[]),
        unit(3, "daily_sales", "2026-06-03", &[0]),
        unit(4, "daily_sales", "2026-06-02", &[1]),
        unit(5, "daily_sales", "2026-06-01", &[2]),
        unit(6, "orders_by_country", "2026-06-03", &[]),
        unit(7, "orders_by_country", "2026-06-02", &[]),
        unit(8, "orders_by_country", "2026-06-01", &[]),
    ];
    assert_eq!(units(&lake, &[]), all);
    assert_eq!(units(&lake, &["--stale"]), all, "nothing was written yet");
    // One job's units are listed by its job file alone, without `after`.
    let out = lake.idem(&[
        "dates",
        "testdata/jobs/daily_sales.toml",
        "--from",
        "2026-06-02",
        "--to",
        "2026-06-03",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "    0  daily_sales  2026-06-03\n    1  daily_sales  2026-06-02\n"
    );

    // The fact table's dates are done: they are fresh, their dependents still are not.
    let mut args = vec!["backfill", "testdata/jobs/fct_orders.toml"];
    args.extend(RANGE);
    lake.idem_ok(&args);
    assert_eq!(units(&lake, &["--stale"]), all[3..].to_vec());

    // A raw day changes: its fact unit is stale again, and every daily_sales unit is
    // listed (indices are those of the whole range).
    let spec = idem_testdata::OrdersSpec {
        seed: 21,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 1).unwrap();
    let mut want = vec![all[1].clone()];
    want.extend(all[3..].to_vec());
    assert_eq!(units(&lake, &["--stale"]), want);

    // After the whole project ran, nothing is stale.
    let mut args = vec!["backfill", "testdata/jobs"];
    args.extend(RANGE);
    lake.idem_ok(&args);
    assert_eq!(units(&lake, &["--stale"]), vec![]);
}

#[test]
fn a_failed_upstream_date_skips_its_dependents_with_the_upstream_error() {
    let lake = Lake::new();
    let broken = only_file(&lake.join("testdata/lake/raw/orders/created_date=2026-06-02"));
    std::fs::write(&broken, b"not parquet").unwrap();
    let mut args = vec!["backfill", "testdata/jobs"];
    args.extend(RANGE);
    let human = lake.idem(&args);
    assert_eq!(human.status.code(), Some(2));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains(
            "daily_sales  2026-06-02  SKIPPED: upstream `fct_orders` failed for 2026-06-02 \
             (exit 2): job file testdata/jobs/fct_orders.toml: source `orders`: file"
        ),
        "{text}"
    );
    assert!(!text.contains("does not exist"), "{text}");
    assert!(
        text.contains("backfill daily_sales: 3 dates, 2 succeeded, 0 failed, 1 skipped, 0 not run"),
        "{text}"
    );
    assert!(
        !lake
            .join("lake/analytics/daily_sales/dt=2026-06-02")
            .exists()
    );

    args.push("--json");
    let out = lake.idem(&args);
    assert_eq!(out.status.code(), Some(2));
    let events = json_lines(&out);
    let failed: Vec<&Value> = events.iter().filter(|e| e["event"] == "failed").collect();
    // fct_orders and orders_by_country read the broken file; daily_sales never runs.
    assert_eq!(failed.len(), 2, "{events:?}");
    assert!(failed.iter().all(|e| e["exit_code"] == 2), "{failed:?}");
    let skipped: Vec<&Value> = events.iter().filter(|e| e["event"] == "skipped").collect();
    assert_eq!(skipped.len(), 1, "{events:?}");
    assert_eq!(skipped[0]["job"], "daily_sales");
    assert_eq!(skipped[0]["logical_date"], "2026-06-02");
    assert_eq!(skipped[0]["upstream_job"], "fct_orders");
    assert_eq!(skipped[0]["upstream_date"], "2026-06-02");
    assert_eq!(skipped[0]["exit_code"], 2);
    assert!(
        skipped[0]["reason"]
            .as_str()
            .unwrap()
            .contains(broken.file_name().unwrap().to_str().unwrap()),
        "{skipped:?}"
    );

    // A worker given that unit skips it for the same reason, with the same exit code.
    let mut args = vec!["backfill", "testdata/jobs", "--index", "4", "--json"];
    args.extend(RANGE);
    let out = lake.idem(&args);
    assert_eq!(out.status.code(), Some(2));
    let events = json_lines(&out);
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "skipped" && e["job"] == "daily_sales"),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["event"] == "failed" && e["error"].as_str().unwrap().contains("daily")),
        "{events:?}"
    );
}

/// (job, date) of every `done` event's report, sorted.
fn done(events: &[Value]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["event"] == "done")
        .map(|e| {
            (
                e["report"]["job"].as_str().unwrap().to_string(),
                e["logical_date"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// partition -> bytes of every `done` event's report.
fn bytes(events: &[Value]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = events
        .iter()
        .filter(|e| e["event"] == "done")
        .flat_map(|e| e["report"]["partitions"].as_array().unwrap().clone())
        .map(|p| {
            (
                p["partition"].as_str().unwrap().to_string(),
                p["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_worker_runs_its_unit_or_shard_after_the_upstream_units_it_reads() {
    let lake = Lake::new();
    // Unit 3 (daily_sales of 2026-06-03), its index from the environment as a
    // Kubernetes Indexed Job sets it: the fact date it reads is run first.
    let mut args = vec!["backfill", "testdata/jobs", "--json", "--index"];
    args.extend(RANGE);
    let out = idem_in(lake.path(), &args, &[("JOB_COMPLETION_INDEX", "3")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pair = |j: &str, d: &str| (j.to_string(), d.to_string());
    let first = json_lines(&out);
    assert_eq!(
        done(&first),
        vec![
            pair("daily_sales", "2026-06-03"),
            pair("fct_orders", "2026-06-03")
        ]
    );
    assert_eq!(
        status_digests(&lake, "lake/analytics/daily_sales")
            .keys()
            .collect::<Vec<_>>(),
        vec!["dt=2026-06-03"]
    );
    // Again with --skip-fresh: both units are fresh, nothing is computed.
    let mut again = args.clone();
    again.push("--skip-fresh");
    let out = idem_in(lake.path(), &again, &[("JOB_COMPLETION_INDEX", "3")]);
    let reports = json_lines(&out);
    assert_eq!(
        actions(&reports)
            .into_iter()
            .map(|(_, a)| a)
            .collect::<Vec<_>>(),
        vec!["fresh", "fresh"]
    );
    // A fresh partition reports the bytes its files take, as when it was written.
    assert_eq!(bytes(&reports), bytes(&first));

    // Two shards, one after the other, give the whole range's tables.
    let reference = Lake::new();
    let mut all = vec!["backfill", "testdata/jobs"];
    all.extend(RANGE);
    reference.idem_ok(&all);
    let sharded = Lake::new();
    for shard in ["1/2", "0/2"] {
        let mut args = all.clone();
        args.extend(["--shard", shard]);
        sharded.idem_ok(&args);
    }
    for table in [
        "lake/analytics/fct_orders",
        "lake/analytics/daily_sales",
        "lake/analytics/orders_by_country",
    ] {
        assert_eq!(
            status_digests(&sharded, table),
            status_digests(&reference, table),
            "{table}"
        );
    }

    // Without --index, the variable changes nothing: the whole range runs.
    let everything = Lake::new();
    let out = idem_in(everything.path(), &all, &[("JOB_COMPLETION_INDEX", "3")]);
    assert!(out.status.success());
    assert_eq!(
        status_digests(&everything, "lake/analytics/daily_sales").len(),
        3
    );

    // Indices and shards outside the range are bad input.
    for (extra, message) in [
        (
            vec!["--index", "9"],
            "error: --index 9 is past the last unit: the range has 9 units (0 to 8)",
        ),
        (
            vec!["--shard", "2/2"],
            "error: --shard 2/2: needs 0 <= K < N",
        ),
        (
            vec!["--index"],
            "error: --index without a value reads JOB_COMPLETION_INDEX, which is not set",
        ),
        (
            vec!["--index", "x"],
            "error: --index `x` is not a unit's index (0, 1, 2, ...)",
        ),
    ] {
        let mut args = all.clone();
        args.extend(extra);
        let out = lake.idem(&args);
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), message);
    }
}

#[test]
fn a_local_table_refuses_a_run_from_a_second_machine() {
    let lake = Lake::new();
    let job = "testdata/jobs/fct_orders.toml";
    let run =
        |date: &str, env: &[(&str, &str)]| idem_in(lake.path(), &["run", job, "--date", date], env);
    assert!(run("2026-06-02", &[]).status.success());
    // Processes of this machine naming their host differently share its kernel and
    // its locks: a run killed while staged under one name is cleaned by the next.
    let died = run(
        "2026-06-03",
        &[
            ("IDEM_HOST", "alpha"),
            ("IDEM_FAILPOINTS", "after_stage=abort"),
        ],
    );
    assert!(!died.status.success());
    assert!(run("2026-06-03", &[]).status.success());

    // A run on another machine (another host, another kernel) left its lock.
    let locks = lake.join("lake/analytics/_idem/fct_orders/locks");
    let foreign = locks.join("20261202T000000.000Z-4242-0123456789ab.lock");
    std::fs::write(
        &foreign,
        "host etl-7\nboot 00000000-0000-0000-0000-000000000000\n",
    )
    .unwrap();
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);
    for args in [
        vec!["run", job, "--date", "2026-06-04"],
        vec!["gc", "lake/analytics/fct_orders"],
    ] {
        let out = idem_in(lake.path(), &args, &[("IDEM_HOST", "etl-8")]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("a run from another machine (`etl-7`; this is `etl-8`) left its lock")
                && err.contains("A local-disk table is single-host")
                && err.contains(&format!("delete {}", foreign.display())),
            "{err}"
        );
        assert_eq!(snapshot(&table), before, "{args:?} changed the table");
    }
    // The same host name is this machine after a reboot: not refused.
    let out = idem_in(
        lake.path(),
        &["run", job, "--date", "2026-06-04"],
        &[("IDEM_HOST", "etl-7")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Once its lock is deleted, as the error says, any host runs.
    std::fs::write(
        &foreign,
        "host etl-7\nboot 00000000-0000-0000-0000-000000000000\n",
    )
    .unwrap();
    assert_eq!(run("2026-06-05", &[]).status.code(), Some(2));
    std::fs::remove_file(&foreign).unwrap();
    assert!(run("2026-06-05", &[]).status.success());
}

#[test]
fn a_source_reading_before_its_window_depends_on_every_upstream_date_it_reads() {
    let lake = Lake::new();
    let rolling = |reads_before: &str| {
        format!(
            r#"
name = "rolling"
[sources.fct]
path = "lake/analytics/fct_orders/"
partitioned_by = [{{ name = "dt", type = "date" }}]
reads_before = {reads_before}
[transform]
sql = "select cast($run_date as date) as day, count(*) as orders from fct where dt > cast($run_date as date) - interval '3 days' and dt <= cast($run_date as date)"
[target]
path = "lake/analytics/rolling"
partition_by = ["day"]
"#
        )
    };
    std::fs::write(lake.join("testdata/jobs/rolling.toml"), rolling("2")).unwrap();
    let all = units(&lake, &[]);
    let of = |job: &str, date: &str| {
        all.iter()
            .find(|u| u.1 == job && u.2 == date)
            .unwrap()
            .clone()
    };
    // fct_orders units are 0 (06-03), 1 (06-02), 2 (06-01).
    assert_eq!(of("rolling", "2026-06-03").3, vec![0, 1, 2]);
    assert_eq!(of("rolling", "2026-06-02").3, vec![1, 2]);
    assert_eq!(of("rolling", "2026-06-01").3, vec![2]);
    std::fs::write(lake.join("testdata/jobs/rolling.toml"), rolling("\"all\"")).unwrap();
    assert_eq!(
        units(&lake, &[])
            .into_iter()
            .find(|u| u.1 == "rolling" && u.2 == "2026-06-01")
            .unwrap()
            .3,
        vec![0, 1, 2]
    );
    std::fs::write(lake.join("testdata/jobs/rolling.toml"), rolling("\"some\"")).unwrap();
    let out = lake.idem(&[
        "dates",
        "testdata/jobs",
        RANGE[0],
        RANGE[1],
        RANGE[2],
        RANGE[3],
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "source `fct`: reads_before = \"some\": expected a number of this job's grain units \
             (0 to 3660) or \"all\""
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // One worker on the newest rolling unit brings the three fact dates up first, so
    // its rows are those of a whole backfill.
    std::fs::write(lake.join("testdata/jobs/rolling.toml"), rolling("2")).unwrap();
    let index = of("rolling", "2026-06-03").0.to_string();
    let mut args = vec!["backfill", "testdata/jobs", "--index", &index];
    args.extend(RANGE);
    lake.idem_ok(&args);
    let reference = Lake::new();
    std::fs::write(reference.join("testdata/jobs/rolling.toml"), rolling("2")).unwrap();
    let mut all_args = vec!["backfill", "testdata/jobs"];
    all_args.extend(RANGE);
    reference.idem_ok(&all_args);
    assert_eq!(
        status_digests(&lake, "lake/analytics/rolling")["day=2026-06-03"],
        status_digests(&reference, "lake/analytics/rolling")["day=2026-06-03"]
    );
}
