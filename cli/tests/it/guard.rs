//! Jobs that would make two runs differ, and malformed input, are rejected before
//! anything is written.

use crate::common::*;

fn job_with(expr: &str) -> String {
    format!(
        r#"
name = "clocky"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = ["created_date"]
[transform]
sql = "select order_id, {expr} as x, cast(created_at as date) as dt from orders where created_date = $run_date"
[target]
path = "out/clocky"
partition_by = ["dt"]
"#
    )
}

#[test]
fn nondeterministic_functions_are_rejected_before_writing() {
    for (expr, function) in [
        ("now()", "now()"),
        ("current_date", "current_date()"),
        ("random()", "random()"),
        ("uuid()", "uuid()"),
        ("(select max(order_id) + random() from orders)", "random()"),
    ] {
        let lake = Lake::new();
        let job = lake.job("clocky", &job_with(expr));
        let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
        assert_eq!(out.status.code(), Some(2), "{expr}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(function), "{expr}: {err}");
        assert!(err.contains("jobs/clocky.toml"), "{err}");
        assert!(err.contains("$run_date"), "{err}");
        assert!(!lake.join("out").exists(), "{expr}: something was written");
    }
}

#[test]
fn allow_nondeterministic_runs_and_never_settles() {
    let lake = Lake::new();
    let text = job_with("random()").replace(
        "name = \"clocky\"",
        "name = \"clocky\"\nallow_nondeterministic = true",
    );
    let job = lake.job("clocky", &text);
    let first = lake.idem_ok(&["run", &job, "--date", "2026-06-01", "--json"]);
    let second = lake.idem_ok(&["run", &job, "--date", "2026-06-01", "--json"]);
    // The same date, the same input: a deterministic job would report `unchanged`.
    assert_eq!(
        actions(&first),
        vec![("dt=2026-06-01".into(), "written".into())]
    );
    assert_eq!(
        actions(&second),
        vec![("dt=2026-06-01".into(), "written".into())]
    );
    assert_ne!(
        first[0]["partitions"][0]["digest"],
        second[0]["partitions"][0]["digest"]
    );
}

#[test]
fn bad_input_is_named_and_changes_nothing() {
    let lake = Lake::new();
    let fct = "testdata/jobs/fct_orders.toml";
    lake.idem_ok(&["run", fct, "--date", "2026-06-01"]);
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);

    let good = std::fs::read_to_string(lake.join(fct)).unwrap();
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "unknown key",
            good.replace("grain = \"day\"", "grain = \"day\"\npartiton_by = [\"dt\"]"),
            vec!["partiton_by", "jobs/bad.toml"],
        ),
        (
            "malformed TOML",
            good.replace("name = \"fct_orders\"", "name = \"fct_orders"),
            vec!["jobs/bad.toml", "TOML"],
        ),
        (
            "missing source path",
            good.replace("testdata/lake/raw/orders/", "testdata/lake/raw/nope/"),
            vec!["source `orders`", "does not exist"],
        ),
        (
            "SQL syntax error",
            good.replace("select order_id", "selec order_id"),
            vec!["jobs/bad.toml", "SQL error", "selec", "Line: 1, Column: 1"],
        ),
        (
            "unknown column",
            good.replace("customer_id, store_id", "customerid, store_id"),
            vec!["customerid", "customer_id"],
        ),
        (
            "unbound parameter",
            good.replace("$run_date", "$run_day"),
            vec!["$run_day", "--var"],
        ),
        (
            "missing partition column",
            good.replace(
                "cast(created_at as date) as dt",
                "cast(created_at as date) as day",
            ),
            vec!["no column `dt`", "partition_by"],
        ),
        (
            "a deeper layout than the table",
            good.replace(
                "partition_by = [\"dt\"]",
                "partition_by = [\"dt\", \"status\"]",
            ),
            vec!["partitioned by `dt`", "`dt`, `status`"],
        ),
        (
            "other partition column than the table",
            good.replace("as dt", "as event_date")
                .replace("partition_by = [\"dt\"]", "partition_by = [\"event_date\"]"),
            vec!["partitioned by `dt`", "event_date"],
        ),
    ];
    for (what, text, needles) in cases {
        let job = lake.job("bad", &text);
        let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        for n in needles {
            assert!(err.contains(n), "{what}: `{n}` not in: {err}");
        }
        assert_eq!(before, snapshot(&table), "{what}: the table changed");
    }

    // A source file that does not parse: the error names it, nothing changes.
    let bad_file = lake.join("testdata/lake/raw/orders/created_date=2026-06-01/part-0.parquet");
    let good_bytes = std::fs::read(&bad_file).unwrap();
    std::fs::write(&bad_file, b"not parquet").unwrap();
    let out = lake.idem(&["run", fct, "--date", "2026-06-01"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("created_date=2026-06-01/part-0.parquet"),
        "{err}"
    );
    assert!(err.contains("source `orders`"), "{err}");
    assert_eq!(before, snapshot(&table));
    std::fs::write(&bad_file, good_bytes).unwrap();

    let out = lake.idem(&["run", "jobs/missing.toml", "--date", "2026-06-01"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read job file jobs/missing.toml")
    );

    let out = lake.idem(&["run", fct, "--date", "2026-06-31"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("2026-06-31"));
    let out = lake.idem(&["run", fct, "--date", "2026-06-01", "--var", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(before, snapshot(&table));
}

#[test]
fn schema_changes_are_refused_unless_allowed() {
    let lake = Lake::new();
    let fct = "testdata/jobs/fct_orders.toml";
    lake.idem_ok(&["run", fct, "--date", "2026-06-01"]);
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);
    let good = std::fs::read_to_string(lake.join(fct)).unwrap();
    for (what, text, note) in [
        (
            "retyped",
            good.replace(
                "store_id, amount_usd",
                "store_id, cast(amount_usd as double) as amount_usd",
            ),
            "amount_usd",
        ),
        (
            "added",
            good.replace("store_id, amount_usd", "store_id, amount_usd, 1 as coupon"),
            "coupon",
        ),
        (
            "dropped",
            good.replace("store_id, amount_usd", "amount_usd"),
            "store_id",
        ),
    ] {
        let job = lake.job("changed", &text);
        let out = lake.idem(&["run", &job, "--date", "2026-06-02"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(&format!("<- {what}")), "{what}: {err}");
        assert!(
            err.contains(note) && err.contains("on_schema_change"),
            "{what}: {err}"
        );
        assert!(err.contains("Decimal128(12, 2)"), "{what}: {err}");
        assert_eq!(before, snapshot(&table), "{what}: the table changed");
    }
    // Allowed, the new schema is written for the partitions the run replaces.
    let allowed = good
        .replace("store_id, amount_usd", "store_id, amount_usd, 1 as coupon")
        .replace(
            "grain = \"day\"",
            "grain = \"day\"\non_schema_change = \"allow\"",
        );
    let job = lake.job("changed", &allowed);
    let report = lake.idem_ok(&["run", &job, "--date", "2026-06-01", "--json"]);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-01".into(), "written".into())]
    );
}

#[test]
fn verify_passes_on_the_examples_and_names_the_cause_of_a_difference() {
    let lake = Lake::new();
    lake.idem_ok(&[
        "run",
        "testdata/jobs/fct_orders.toml",
        "--date",
        "2026-06-05",
    ]);
    let before = snapshot(&lake.join("lake/analytics"));
    for job in ["fct_orders", "daily_sales", "orders_by_country"] {
        let out = lake.idem(&[
            "verify",
            &format!("testdata/jobs/{job}.toml"),
            "--date",
            "2026-06-05",
            "--json",
        ]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{job}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["deterministic"], true, "{job}");
        assert!(!r["partitions"].as_array().unwrap().is_empty());
    }
    // Verify publishes nothing.
    assert_eq!(before, snapshot(&lake.join("lake/analytics")));

    let text = job_with("random()").replace(
        "name = \"clocky\"",
        "name = \"clocky\"\nallow_nondeterministic = true",
    );
    let job = lake.job("clocky", &text);
    let out = lake.idem(&["verify", &job, "--date", "2026-06-01"]);
    assert_eq!(out.status.code(), Some(4));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("NOT deterministic"), "{text}");
    assert!(
        text.contains("allow_nondeterministic") && text.contains("random()"),
        "{text}"
    );
    assert!(text.contains("rows only in run 1"), "{text}");
    assert!(!lake.join("out/clocky").exists());
}

fn chmod_tree(p: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            let e = e.unwrap();
            let m = if e.file_type().unwrap().is_dir() {
                0o755
            } else {
                0o644
            };
            chmod_tree(&e.path(), m);
        }
    }
}

#[test]
fn storage_failures_are_named_and_change_nothing() {
    let lake = Lake::new();
    let fct = "testdata/jobs/fct_orders.toml";
    lake.idem_ok(&["run", fct, "--date", "2026-06-01"]);
    let table = lake.join("lake/analytics/fct_orders");
    let before = snapshot(&table);
    let good = std::fs::read_to_string(lake.join(fct)).unwrap();

    // The target path is a file.
    std::fs::write(lake.join("a_file"), "x").unwrap();
    let job = lake.job(
        "to_file",
        &good.replace("lake/analytics/fct_orders/", "a_file"),
    );
    let out = lake.idem(&["run", &job, "--date", "2026-06-01"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a_file exists and is not a directory"),
        "{err}"
    );
    assert_eq!(std::fs::read(lake.join("a_file")).unwrap(), b"x");

    // The disk fills up while staging.
    let spec = idem_testdata::OrdersSpec {
        seed: 11,
        ..Default::default()
    };
    idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 0).unwrap();
    let out = idem_in(
        lake.path(),
        &["run", fct, "--date", "2026-06-01"],
        &[("IDEM_FAILPOINTS", "after_row_group=enospc")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("dt=2026-06-01"), "{err}");
    assert_eq!(before, snapshot(&table));
    let staging = lake.join("lake/analytics/_idem/fct_orders/staging");
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);

    // No permission to write: run as an unprivileged user (root ignores permissions).
    chmod_tree(lake.path(), 0o755);
    let bin = lake.join("idem-bin");
    std::fs::copy(crate::common::bin(), &bin).unwrap();
    chmod_tree(&bin, 0o755);
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["run", fct, "--date", "2026-06-01"])
        .current_dir(lake.path())
        .env_remove("IDEM_FAILPOINTS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(err.contains("lake/analytics/_idem/fct_orders"), "{err}");
    assert_eq!(before, snapshot(&table));
}
