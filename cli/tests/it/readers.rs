//! What independent engines read from idem's tables: the same rows DuckDB computes from
//! the same SQL over the same source, and never a staged file, even mid-run.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

fn table_rows(lake: &Lake, table: &str) -> serde_json::Value {
    readers(&["table", lake.join(table).to_str().unwrap()])
}

fn duck(lake: &Lake, sql: &str) -> serde_json::Value {
    let raw = lake.join("testdata/lake/raw");
    readers(&["duckdb", &sql.replace("RAW", raw.to_str().unwrap())])
}

#[test]
fn projection_and_filter_match_duckdb() {
    let lake = Lake::new();
    for d in ["2026-06-01", "2026-06-02"] {
        lake.idem_ok(&["run", "testdata/jobs/fct_orders.toml", "--date", d]);
    }
    let expected = duck(
        &lake,
        "select order_id, customer_id, store_id, amount_usd, status, created_at::date as dt \
         from read_parquet('RAW/orders/*/*.parquet', hive_partitioning=true) \
         where created_date in ('2026-06-01', '2026-06-02') and status <> 'cancelled'",
    );
    assert!(expected.as_array().unwrap().len() > 1000);
    assert_eq!(table_rows(&lake, "lake/analytics/fct_orders"), expected);
}

#[test]
fn group_by_aggregate_matches_duckdb() {
    let lake = Lake::new();
    let job = lake.job(
        "store_daily",
        r#"
name = "store_daily"
[sources.orders]
path = "testdata/lake/raw/orders/"
[transform]
sql = """
select cast(created_at as date) as dt, store_id,
       sum(amount_usd) as amount_usd_sum, count(*) as order_count,
       round(avg(cast(amount_usd as double)), 6) as amount_usd_avg, max(created_at) as last_order_at
from orders
where created_at >= $run_start and created_at < $run_end and status <> 'cancelled'
group by 1, 2
"""
[target]
path = "out/store_daily"
partition_by = ["dt"]
"#,
    );
    for d in ["2026-06-03", "2026-06-04"] {
        lake.idem_ok(&["run", &job, "--date", d]);
    }
    let expected = duck(
        &lake,
        "select created_at::date as dt, store_id, sum(amount_usd) as amount_usd_sum, \
         count(*) as order_count, round(avg(cast(amount_usd as double)), 6) as amount_usd_avg, max(created_at) as last_order_at \
         from read_parquet('RAW/orders/*/*.parquet') \
         where created_at >= timestamptz '2026-06-03 00:00:00+00' \
           and created_at < timestamptz '2026-06-05 00:00:00+00' and status <> 'cancelled' \
         group by 1, 2",
    );
    assert!(expected.as_array().unwrap().len() > 400);
    assert_eq!(table_rows(&lake, "out/store_daily"), expected);
}

#[test]
fn join_of_two_sources_matches_duckdb() {
    let lake = Lake::new();
    for d in ["2026-06-05", "2026-06-06"] {
        lake.idem_ok(&["run", "testdata/jobs/orders_by_country.toml", "--date", d]);
    }
    let idem = table_rows(&lake, "lake/analytics/orders_by_country");
    // DuckDB has no idem_key(); compare the other columns, then check the key apart.
    let mut without_key = idem.clone();
    for r in without_key.as_array_mut().unwrap() {
        let key = r.as_object_mut().unwrap().remove("row_key").unwrap();
        assert_eq!(key.as_str().unwrap().len(), 32);
    }
    let expected = duck(
        &lake,
        "select o.created_at::date as dt, c.country, count(*) as orders, sum(o.amount_usd) as revenue \
         from read_parquet('RAW/orders/*/*.parquet', hive_partitioning=true) o \
         join read_csv('RAW/customers/customers.csv') c on c.customer_id = o.customer_id \
         where o.created_date in ('2026-06-05', '2026-06-06') group by 1, 2",
    );
    assert!(expected.as_array().unwrap().len() >= 20);
    assert_eq!(without_key, expected);
}

fn wait_for(path: &Path, child: &mut std::process::Child) {
    let t = Instant::now();
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("idem exited ({status}) before pausing");
        }
        assert!(t.elapsed() < Duration::from_secs(120), "idem never paused");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn readers_never_see_staged_files_mid_run() {
    let lake = Lake::new();
    let fct = "testdata/jobs/fct_orders.toml";
    lake.idem_ok(&["run", fct, "--date", "2026-06-03"]);
    let table = lake.join("lake/analytics/fct_orders");
    let old_rows = table_rows(&lake, "lake/analytics/fct_orders");

    // New source rows for the day, then a run paused between staging and publish.
    let spec = idem_testdata::OrdersSpec {
        seed: 99,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 2).unwrap();
    let hooks = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(bin())
        .args(["run", fct, "--date", "2026-06-03"])
        .current_dir(lake.path())
        .env(
            "IDEM_FAILPOINTS",
            format!("before_publish=pause:{}", hooks.path().display()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&hooks.path().join("before_publish.paused"), &mut child);

    // Mid-run: the staged partition is complete on disk, but no reader sees it.
    let staging = lake.join("lake/analytics/_idem/fct_orders/staging");
    assert!(
        std::fs::read_dir(&staging).unwrap().count() > 0,
        "nothing staged"
    );
    assert_eq!(table_rows(&lake, "lake/analytics/fct_orders"), old_rows);
    let files = readers(&["files", table.to_str().unwrap()]);
    for (engine, list) in files.as_object().unwrap() {
        let list = list.as_array().unwrap();
        assert_eq!(list.len(), 1, "{engine} read {list:?}");
        let f = list[0].as_str().unwrap();
        assert!(
            f.contains("fct_orders/dt=2026-06-03/part-") && f.ends_with("-00000.parquet"),
            "{engine}: {f}"
        );
    }

    std::fs::write(hooks.path().join("before_publish.resume"), "").unwrap();
    assert!(child.wait().unwrap().success());
    let new_rows = table_rows(&lake, "lake/analytics/fct_orders");
    assert_ne!(new_rows, old_rows);
    let expected = duck(
        &lake,
        "select order_id, customer_id, store_id, amount_usd, status, created_at::date as dt \
         from read_parquet('RAW/orders/created_date=2026-06-03/*.parquet') where status <> 'cancelled'",
    );
    assert_eq!(new_rows, expected);
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
}
