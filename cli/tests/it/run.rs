//! Re-runs, changed sources, empty days: the table ends as one clean run leaves it.

use crate::common::*;

const FCT: &str = "testdata/jobs/fct_orders.toml";

fn backfill(lake: &Lake) -> Vec<serde_json::Value> {
    lake.idem_ok(&[
        "backfill",
        FCT,
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-07",
        "--json",
    ])
}

#[test]
fn example_job_twice_is_unchanged_and_byte_identical() {
    let lake = Lake::new();
    let first = backfill(&lake);
    assert_eq!(first.iter().filter(|e| e["event"] == "done").count(), 7);
    assert!(
        actions(&first).iter().all(|(_, a)| a == "written"),
        "{:?}",
        actions(&first)
    );
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);
    assert_eq!(before.keys().filter(|k| k.ends_with(".parquet")).count(), 7);

    let second = backfill(&lake);
    let acts = actions(&second);
    assert_eq!(acts.len(), 7);
    assert!(acts.iter().all(|(_, a)| a == "unchanged"), "{acts:?}");
    assert_eq!(
        before,
        snapshot(&table),
        "a re-run changed the table's files"
    );

    // Nothing but partition directories and Parquet files under the table root.
    for k in before.keys() {
        let leaf = k.rsplit('/').next().unwrap();
        assert!(
            leaf.starts_with("dt=2026-06-0") || leaf.ends_with(".parquet"),
            "unexpected entry {k}"
        );
    }
    // Staging is cleaned up.
    let staging = lake.join("lake/analytics/_idem/fct_orders/staging");
    assert_eq!(std::fs::read_dir(staging).unwrap().count(), 0);
}

#[test]
fn changing_one_source_day_rewrites_only_that_partition() {
    let lake = Lake::new();
    backfill(&lake);
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);

    // Regenerate 2026-06-03 with another seed: same shape, different rows.
    let spec = idem_testdata::OrdersSpec {
        seed: 7,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 2).unwrap();

    let acts = actions(&backfill(&lake));
    let written: Vec<_> = acts.iter().filter(|(_, a)| a == "written").collect();
    assert_eq!(written.len(), 1, "{acts:?}");
    assert_eq!(written[0].0, "dt=2026-06-03");
    let after = snapshot(&table);
    for (k, v) in &before {
        if !k.starts_with("dt=2026-06-03") {
            assert_eq!(Some(v), after.get(k), "{k} was touched");
        }
    }
    // A new version of the partition: other file names, other bytes.
    let day3 = |files: &std::collections::BTreeMap<String, _>| -> Vec<String> {
        files
            .keys()
            .filter(|k| k.starts_with("dt=2026-06-03/"))
            .cloned()
            .collect()
    };
    assert_eq!(day3(&after).len(), 1, "{after:?}");
    assert!(
        day3(&after).iter().all(|k| !before.contains_key(k)),
        "{after:?}"
    );

    // The rewrite is in the table's restatement log, once; the first load and the
    // unchanged re-runs are not.
    let out = lake.idem(&["log", "lake/analytics/fct_orders", "--json"]);
    assert!(out.status.success());
    let events = json_lines(&out);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["partition"], "dt=2026-06-03");
    assert_eq!(e["job"], "fct_orders");
    assert_eq!(e["logical_date"], "2026-06-03");
    assert_ne!(e["old_digest"], e["new_digest"]);
    let human = lake.idem(&["log", "lake/analytics/fct_orders"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("dt=2026-06-03"));
}

#[test]
fn owned_day_without_rows_becomes_empty_partition() {
    let lake = Lake::new();
    lake.idem_ok(&["run", FCT, "--date", "2026-06-02", "--json"]);
    // The source loses that day (a late delete, a fixed bug upstream), and the user
    // says it is gone for good: the partition must not keep stale rows. (Without the
    // flag the run is refused: vanished.rs.)
    std::fs::remove_dir_all(lake.join("testdata/lake/raw/orders/created_date=2026-06-02")).unwrap();
    let report = lake.idem_ok(&[
        "run",
        FCT,
        "--date",
        "2026-06-02",
        "--allow-missing-input",
        "--json",
    ]);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-02".to_string(), "emptied".to_string())]
    );
    let rows = readers(&[
        "table",
        lake.join("lake/analytics/fct_orders").to_str().unwrap(),
    ]);
    assert_eq!(rows.as_array().unwrap().len(), 0);
    let files: Vec<_> = std::fs::read_dir(lake.join("lake/analytics/fct_orders/dt=2026-06-02"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with("part-") && files[0].ends_with("-00000.parquet"));

    // A day the source never had is created empty too.
    let report = lake.idem_ok(&["run", FCT, "--date", "2026-07-15", "--json"]);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-07-15".to_string(), "emptied".to_string())]
    );
    // Running it again changes nothing.
    let report = lake.idem_ok(&["run", FCT, "--date", "2026-07-15", "--json"]);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-07-15".to_string(), "unchanged".to_string())]
    );
}

#[test]
fn status_reads_the_manifests() {
    let lake = Lake::new();
    let reports = lake.idem_ok(&["run", FCT, "--date", "2026-06-04", "--json"]);
    let rows = reports[0]["rows"].as_u64().unwrap();
    let out = lake.idem(&["status", "lake/analytics/fct_orders", "--json"]);
    assert!(out.status.success());
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &s["partitions"][0];
    assert_eq!(p["partition"], "dt=2026-06-04");
    assert_eq!(p["state"], "managed");
    assert_eq!(p["rows"].as_u64().unwrap(), rows);
    assert_eq!(p["job"], "fct_orders");
    assert_eq!(p["logical_date"], "2026-06-04");
    assert_eq!(p["digest"], reports[0]["partitions"][0]["digest"]);
    // Partition pruning: the run read exactly the one source file of its day.
    assert_eq!(p["inputs"], 1);
    assert_eq!(reports[0]["inputs"], 1);

    let human = lake.idem(&["status", "lake/analytics/fct_orders"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("dt=2026-06-04") && text.contains("managed"),
        "{text}"
    );
}

#[test]
fn multi_column_partitions_and_null_values() {
    let lake = Lake::new();
    let job = lake.job(
        "by_status",
        r#"
name = "by_status"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = ["created_date"]
[transform]
sql = """
select order_id, amount_usd, cast(created_at as date) as dt,
       case when status = 'placed' then null when status = 'paid' then '' else status end as status
from orders where created_date = $run_date
"""
[target]
path = "out/by_status"
partition_by = ["dt", "status"]
"#,
    );
    let out = lake.idem(&["run", &job, "--date", "2026-06-05", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("__HIVE_DEFAULT_PARTITION__"), "{stderr}");
    let acts = actions(&json_lines(&out));
    // NULL and '' share the Hive default partition (one writer, one file).
    assert_eq!(acts.len(), 5, "{acts:?}");
    assert!(
        acts.iter()
            .any(|(p, _)| p == "dt=2026-06-05/status=__HIVE_DEFAULT_PARTITION__")
    );
    let idem_rows = readers(&["table", lake.join("out/by_status").to_str().unwrap()]);
    let expected = readers(&[
        "duckdb",
        &format!(
            "select order_id, amount_usd, created_date::date as dt, \
             case when status in ('placed', 'paid') then null else status end as status \
             from read_parquet('{}/testdata/lake/raw/orders/*/*.parquet', hive_partitioning=true) \
             where created_date = '2026-06-05'",
            lake.path().display()
        ),
    ]);
    assert_eq!(idem_rows, expected);
    // Re-run: every partition unchanged.
    let again = lake.idem_ok(&["run", &job, "--date", "2026-06-05", "--json"]);
    assert!(actions(&again).iter().all(|(_, a)| a == "unchanged"));
}

/// An hourly job over the sample orders, partitioned by the hour (a TIMESTAMP),
/// writing to `target`.
pub fn hourly_job(target: &str) -> String {
    format!(
        r#"
name = "hourly"
[sources.orders]
path = "testdata/lake/raw/orders/"
[transform]
sql = """
select order_id, amount_usd, date_trunc('hour', created_at) as hour
from orders
where created_at >= $run_start and created_at < $run_end
"""
[target]
path = "{target}"
partition_by = ["hour"]
grain = "hour"
"#
    )
}

#[test]
fn hourly_job_owns_its_hour() {
    let lake = Lake::new();
    let job = lake.job("hourly", &hourly_job("out/hourly"));
    let report = lake.idem_ok(&["run", &job, "--date", "2026-06-02T05", "--json"]);
    assert_eq!(
        actions(&report),
        vec![(
            "hour=2026-06-02 05%3A00%3A00".to_string(),
            "written".to_string()
        )]
    );
    let rows = report[0]["rows"].as_u64().unwrap();
    let expected = readers(&[
        "duckdb",
        &format!(
            "select count(*) as n from read_parquet('{}/testdata/lake/raw/orders/*/*.parquet') \
             where created_at >= timestamptz '2026-06-02 05:00:00+00' \
               and created_at < timestamptz '2026-06-02 06:00:00+00'",
            lake.path().display()
        ),
    ]);
    assert_eq!(expected[0]["n"].as_str().unwrap(), rows.to_string());
    // An hour without source rows becomes an empty partition of its own.
    let report = lake.idem_ok(&["run", &job, "--date", "2026-07-01T00", "--json"]);
    assert_eq!(
        actions(&report),
        vec![(
            "hour=2026-07-01 00%3A00%3A00".to_string(),
            "emptied".to_string()
        )]
    );
    // The wrong date shape for the grain is refused.
    let out = lake.idem(&["run", &job, "--date", "2026-06-02"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("YYYY-MM-DDTHH"));
}

#[test]
fn monthly_job_replaces_the_days_it_owns_and_vars_are_typed() {
    let lake = Lake::new();
    let job = lake.job(
        "monthly",
        r#"
name = "monthly"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = """
select store_id, count(*) as orders, created_date as dt
from orders
where created_date >= $run_date and created_date < cast($run_end as date)
  and store_id <= $max_store
group by store_id, created_date
"""
[target]
path = "out/monthly"
partition_by = ["dt"]
grain = "month"
"#,
    );
    let first = lake.idem_ok(&[
        "run",
        &job,
        "--date",
        "2026-06",
        "--var",
        "max_store:int=50",
        "--json",
    ]);
    assert_eq!(actions(&first).len(), 7);
    // Days deleted from the source are emptied by the next monthly run; the others are
    // unchanged.
    for d in ["2026-06-06", "2026-06-07"] {
        std::fs::remove_dir_all(lake.join(&format!("testdata/lake/raw/orders/created_date={d}")))
            .unwrap();
    }
    let second = lake.idem_ok(&[
        "run",
        &job,
        "--date",
        "2026-06",
        "--var",
        "max_store:int=50",
        "--json",
    ]);
    let acts = actions(&second);
    assert_eq!(
        acts.iter().filter(|(_, a)| a == "unchanged").count(),
        5,
        "{acts:?}"
    );
    assert_eq!(
        acts.iter()
            .filter(|(_, a)| a == "emptied")
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>(),
        vec!["dt=2026-06-06", "dt=2026-06-07"]
    );
    // A different --var changes the rows: every day with data is rewritten.
    let third = lake.idem_ok(&[
        "run",
        &job,
        "--date",
        "2026-06",
        "--var",
        "max_store:int=10",
        "--json",
    ]);
    assert_eq!(
        actions(&third)
            .iter()
            .filter(|(_, a)| a == "written")
            .count(),
        5
    );
    // Missing the var is an error naming it.
    let out = lake.idem(&["run", &job, "--date", "2026-06"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("$max_store"));
}

#[test]
fn json_and_csv_glob_sources_into_an_unpartitioned_table() {
    let lake = Lake::new();
    let events = lake.join("raw/events");
    std::fs::create_dir_all(&events).unwrap();
    let mut lines = String::new();
    for i in 0..50 {
        let day = if i % 2 == 0 {
            "2026-06-01"
        } else {
            "2026-06-02"
        };
        lines.push_str(&format!(
            "{{\"id\": {i}, \"kind\": \"{}\", \"day\": \"{day}\"}}\n",
            ["view", "click"][i % 2]
        ));
    }
    std::fs::write(events.join("events.jsonl"), lines).unwrap();
    let job = lake.job(
        "kinds",
        r#"
name = "kinds"
[sources.events]
path = "raw/events/events.jsonl"
format = "json"
[sources.customers]
path = "testdata/lake/raw/*/customers.csv"
format = "csv"
[transform]
sql = """
select kind, count(*) as n, (select count(*) from customers) as customers
from events where cast(day as date) = $run_date group by kind
"""
[target]
path = "out/kinds"
"#,
    );
    let first = lake.idem_ok(&["run", &job, "--date", "2026-06-01", "--json"]);
    assert_eq!(
        actions(&first),
        vec![("(table)".to_string(), "written".to_string())]
    );
    let rows = readers(&["table", lake.join("out/kinds").to_str().unwrap()]);
    assert_eq!(
        rows,
        serde_json::json!([{"customers": "1000", "kind": "view", "n": "25"}])
    );
    // The whole table is what one run owns: the next date replaces it, and a date with
    // no rows leaves it empty.
    lake.idem_ok(&["run", &job, "--date", "2026-06-02"]);
    let rows = readers(&["table", lake.join("out/kinds").to_str().unwrap()]);
    assert_eq!(rows[0]["kind"], "click");
    let empty = lake.idem_ok(&["run", &job, "--date", "2026-06-03", "--json"]);
    assert_eq!(
        actions(&empty),
        vec![("(table)".to_string(), "emptied".to_string())]
    );
    let rows = readers(&["table", lake.join("out/kinds").to_str().unwrap()]);
    assert_eq!(rows, serde_json::json!([]));
    let again = lake.idem_ok(&["run", &job, "--date", "2026-06-03", "--json"]);
    assert_eq!(
        actions(&again),
        vec![("(table)".to_string(), "unchanged".to_string())]
    );
}

#[test]
fn a_text_partition_column_is_not_taken_for_a_date() {
    let lake = Lake::new();
    let job = lake.job(
        "by_country",
        &std::fs::read_to_string(lake.join("testdata/jobs/orders_by_country.toml"))
            .unwrap()
            .replace("partition_by = [\"dt\"]", "partition_by = [\"country\"]")
            .replace("lake/analytics/orders_by_country/", "out/by_country"),
    );
    let report = lake.idem_ok(&["run", &job, "--date", "2026-06-02", "--json"]);
    let acts = actions(&report);
    assert_eq!(acts.len(), 20, "{acts:?}");
    assert!(
        acts.iter()
            .all(|(p, a)| p.starts_with("country=") && p.len() == 10 && a == "written"),
        "{acts:?}"
    );
}

#[test]
fn a_stray_file_in_a_partition_is_replaced_by_the_next_run() {
    let lake = Lake::new();
    lake.idem_ok(&["run", FCT, "--date", "2026-06-01"]);
    let marker = lake.join("lake/analytics/fct_orders/dt=2026-06-01/_SUCCESS");
    std::fs::write(&marker, "").unwrap();
    let report = lake.idem_ok(&["run", FCT, "--date", "2026-06-01", "--json"]);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-01".into(), "written".into())]
    );
    assert!(!marker.exists());
    // Polars reads the table again (it fails on a stray `_SUCCESS`).
    readers(&[
        "table",
        lake.join("lake/analytics/fct_orders").to_str().unwrap(),
    ]);
}

/// A re-run whose job and inputs are as recorded is confirmed from the query and the
/// digest alone: nothing is staged (a failpoint armed in the writer never fires) and
/// the partition is untouched. Once its source day changes, the date is staged as
/// usual (the failpoint fires, the live partition survives), then written.
#[test]
fn a_rerun_of_unchanged_inputs_stages_nothing() {
    let lake = Lake::new();
    backfill(&lake);
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);
    let args = ["run", FCT, "--date", "2026-06-03", "--json"];
    let armed = [("IDEM_FAILPOINTS", "after_first_batch=error")];

    let out = idem_in(lake.path(), &args, &armed);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = json_lines(&out);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-03".to_string(), "unchanged".to_string())]
    );
    assert!(report[0]["rows"].as_u64().unwrap() > 0, "{report:?}");
    assert_eq!(before, snapshot(&table), "the re-run touched the table");

    let spec = idem_testdata::OrdersSpec {
        seed: 7,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 2).unwrap();
    let out = idem_in(lake.path(), &args, &armed);
    assert!(!out.status.success(), "the changed day was not staged");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("after_first_batch"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(before, snapshot(&table), "a failed run touched the table");
    assert_eq!(
        actions(&lake.idem_ok(&args)),
        vec![("dt=2026-06-03".to_string(), "written".to_string())]
    );
}

/// Checks run on staged files, so a job with checks stages its re-runs too.
#[test]
fn a_job_with_checks_stages_and_checks_every_run() {
    let lake = Lake::new();
    let text = std::fs::read_to_string(lake.join(FCT)).unwrap()
        + "\n[checks]\nnot_null = [\"order_id\"]\n";
    let job = lake.job("fct_checked", &text);
    let args = ["run", job.as_str(), "--date", "2026-06-03", "--json"];
    lake.idem_ok(&args);
    let out = idem_in(
        lake.path(),
        &args,
        &[("IDEM_FAILPOINTS", "after_first_batch=error")],
    );
    assert!(!out.status.success(), "the re-run was not staged");
    assert_eq!(
        actions(&lake.idem_ok(&args)),
        vec![("dt=2026-06-03".to_string(), "unchanged".to_string())]
    );
}

/// `run --profile`: the stages add up to the run's wall time, which is the report's
/// elapsed time; the throughput is the rows and bytes over it, the input bytes are
/// the sizes of the files the day read; and the human output shows the same table.
#[test]
fn a_profile_adds_up_to_the_runs_wall_time() {
    let lake = Lake::new();
    let day = "2026-06-02";
    let files: Vec<std::path::PathBuf> =
        std::fs::read_dir(lake.join(&format!("testdata/lake/raw/orders/created_date={day}")))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
    let input: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    // The rows read are every row of the day's files (the filter on `status` comes
    // after the scan), counted from their footers.
    let input_rows: i64 = files
        .iter()
        .map(|f| {
            let file = std::fs::File::open(f).unwrap();
            parquet::file::reader::FileReader::metadata(
                &parquet::file::reader::SerializedFileReader::new(file).unwrap(),
            )
            .file_metadata()
            .num_rows()
        })
        .sum();
    let check = |report: &serde_json::Value, expect: &[&str]| {
        let p = &report["profile"];
        let wall = p["wall_ms"].as_f64().unwrap();
        let stages = p["stages"].as_array().unwrap();
        let names: Vec<&str> = stages
            .iter()
            .map(|s| s["stage"].as_str().unwrap())
            .collect();
        for e in expect {
            assert!(names.contains(e), "no stage {e}: {names:?}");
        }
        let sum: f64 = stages.iter().map(|s| s["ms"].as_f64().unwrap()).sum();
        assert!(
            (sum - wall).abs() <= 0.5 + wall * 0.01,
            "stages {sum} ms, wall {wall} ms: {p}"
        );
        let elapsed = report["elapsed_ms"].as_f64().unwrap();
        assert!(
            (elapsed - wall).abs() <= 5.0,
            "elapsed {elapsed} ms, wall {wall} ms"
        );
        let rows = report["rows"].as_f64().unwrap();
        let per_s = p["rows_per_s"].as_f64().unwrap();
        assert!(
            (per_s - rows / (wall / 1e3)).abs() <= per_s * 0.01 + 1.0,
            "{p}"
        );
        assert_eq!(p["input_bytes"], input, "{p}");
        assert_eq!(p["input_rows"], input_rows, "{p}");
        let input_per_s = p["input_rows_per_s"].as_f64().unwrap();
        assert!(
            (input_per_s - input_rows as f64 / (wall / 1e3)).abs() <= input_per_s * 0.01 + 1.0,
            "{p}"
        );
        let written: u64 = report["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["action"] == "written")
            .map(|p| p["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(p["output_bytes"], written, "{p}");
    };
    let first = lake.idem_ok(&["run", FCT, "--date", day, "--profile", "--json"]);
    check(
        &first[0],
        &[
            "listing sources",
            "planning",
            "reading and computing",
            "encoding and digest",
            "finishing files",
            "publishing",
        ],
    );
    let threads = &first[0]["profile"]["threads_ms"];
    assert!(threads["encoding"].as_f64().unwrap() > 0.0, "{threads}");
    assert!(threads["digest"].as_f64().unwrap() > 0.0, "{threads}");
    assert!(threads["fsync"].as_f64().unwrap() > 0.0, "{threads}");
    // An unchanged re-run compares instead of publishing.
    let again = lake.idem_ok(&["run", FCT, "--date", day, "--profile", "--json"]);
    assert_eq!(again[0]["partitions"][0]["action"], "unchanged");
    check(&again[0], &["planning"]);

    let thousands = |n: i64| {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    let report_rows = first[0]["rows"].as_i64().unwrap();
    let out = lake.idem(&["run", FCT, "--date", day, "--profile"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("profile: read {} rows (", thousands(input_rows)))
            && text.contains(&format!("; wrote {} rows (", thousands(report_rows))),
        "{text}"
    );
    assert!(
        text.contains("wall time") && text.contains("planning"),
        "{text}"
    );
    let out = lake.idem(&["verify", FCT, "--date", day, "--profile"]);
    assert_eq!(out.status.code(), Some(2));
}

/// One day's orders into 3,000 partitions (`partition_by = ["dt", "bucket"]`): every
/// query batch is routed as thousands of parts of a few rows each. Every partition
/// holds exactly its rows (DuckDB over the raw day is the reference) in one file of
/// one row group, not one row group per part, and a re-run finds every partition
/// unchanged and leaves the table byte for byte as it was.
#[test]
fn thousands_of_partitions_a_day_are_whole_and_one_row_group_each() {
    const BUCKETS: usize = 3000;
    let lake = Lake::new();
    let spec = idem_testdata::OrdersSpec {
        days: 1,
        rows_per_day: 40_000,
        customers: 100_000,
        ..Default::default()
    };
    idem_testdata::write_orders(&lake.join("raw/orders"), &spec).unwrap();
    let job = lake.job(
        "buckets",
        &format!(
            r#"
name = "buckets"
[sources.orders]
path = "raw/orders/"
partitioned_by = ["created_date"]
[transform]
sql = """
select order_id, customer_id, amount_usd, status, cast(created_at as date) as dt,
       customer_id % {BUCKETS} as bucket
from orders where created_date = $run_date
"""
[target]
path = "out/buckets/"
partition_by = ["dt", "bucket"]
"#
        ),
    );
    let first = lake.idem_ok(&["run", &job, "--date", "2026-06-01", "--json"]);
    let acts = actions(&first);
    assert_eq!(acts.len(), BUCKETS, "one partition per bucket");
    assert!(acts.iter().all(|(_, a)| a == "written"), "{acts:?}");

    let per_bucket = |glob: String, bucket: &str| {
        readers(&[
            "duckdb",
            &format!(
                "select {bucket} as bucket, count(*) as n, sum(amount_usd) as amount, \
                 min(order_id) as lo, max(order_id) as hi, count(distinct status) as statuses \
                 from read_parquet('{glob}', hive_partitioning=true) group by all"
            ),
        ])
    };
    let table = lake.join("out/buckets");
    let written = per_bucket(format!("{}/*/*/*.parquet", table.display()), "bucket");
    let expected = per_bucket(
        format!("{}/raw/orders/*/*.parquet", lake.path().display()),
        &format!("customer_id % {BUCKETS}"),
    );
    assert_eq!(written.as_array().unwrap().len(), BUCKETS);
    assert_eq!(written, expected);

    let layout = readers(&[
        "duckdb",
        &format!(
            "select count(distinct file_name) as files, max(row_group_id) as last_row_group \
             from parquet_metadata('{}/*/*/*.parquet')",
            table.display()
        ),
    ]);
    assert_eq!(
        layout,
        serde_json::json!([{"files": BUCKETS.to_string(), "last_row_group": "0"}]),
        "one file of one row group a partition"
    );

    let before = snapshot(&table);
    let again = lake.idem_ok(&["run", &job, "--date", "2026-06-01", "--json"]);
    let acts = actions(&again);
    assert_eq!(acts.len(), BUCKETS);
    assert!(acts.iter().all(|(_, a)| a == "unchanged"), "{acts:?}");
    assert_eq!(
        before,
        snapshot(&table),
        "a re-run changed the table's files"
    );
}
