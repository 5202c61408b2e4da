//! The exit-code contract retry policies key on (docs/cli.md): one test per code, each
//! with the table left as it was by every failure.

use crate::common::*;

/// A daily job whose select list is `select`; `extra` goes at the end of the file.
fn job(lake: &Lake, name: &str, select: &str, extra: &str) -> String {
    job_reading(lake, name, "testdata/lake/raw/orders/", select, extra)
}

/// [`job`] over the raw orders at `source` (a folder or a URL).
fn job_reading(lake: &Lake, name: &str, source: &str, select: &str, extra: &str) -> String {
    lake.job(
        name,
        &format!(
            r#"
name = "{name}"
[sources.orders]
path = "{source}"
partitioned_by = ["created_date"]
[transform]
sql = "select {select}, cast(created_at as date) as dt from orders where created_date = $run_date"
[target]
path = "out/{name}"
partition_by = ["dt"]
{extra}
"#
        ),
    )
}

/// Runs `args` in the lake with `env`; asserts the exit code and that the stderr holds
/// `text`.
fn ends(lake: &Lake, args: &[&str], env: &[(&str, &str)], code: i32, text: &str) {
    let out = idem_in(lake.path(), args, env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(text), "{args:?}: {err}");
}

const DAY: [&str; 2] = ["--date", "2026-06-02"];

#[test]
fn every_exit_code_of_the_contract() {
    let lake = Lake::new();
    let run = |job: &str, env: &[(&str, &str)], code: i32, text: &str| {
        ends(&lake, &["run", job, DAY[0], DAY[1]], env, code, text)
    };
    // 0: done.
    run(&job(&lake, "plain", "order_id, status", ""), &[], 0, "");
    let table = lake.join("out/plain");
    let before = snapshot(&table);

    // 1: storage failed (an injected I/O error listing a new table, past the two calls
    // of the freshness probe, whose failure only means a full run): nothing was
    // published, and a retry succeeds.
    let retry = job(&lake, "retry", "order_id, status", "");
    run(
        &retry,
        &[("IDEM_FAULTS", "fail@4")],
        1,
        "injected fault (list)",
    );
    assert!(!lake.join("out/retry/dt=2026-06-02").exists());
    run(&retry, &[], 0, "");

    // 2: bad input, with the job file named.
    let bad = job(&lake, "plain", "order_id, no_such_column", "");
    run(&bad, &[], 2, "job file jobs/plain.toml");
    assert_eq!(snapshot(&table), before);

    // 3: a check on the staged output failed, nothing published.
    let checked = job(
        &lake,
        "plain",
        "order_id, status",
        "[checks]\nmax_rows = 10\n",
    );
    run(&checked, &[], 3, "check `max_rows");
    assert_eq!(snapshot(&table), before);

    // 4: `idem verify` found that two runs of the date differ.
    let clocky = job(&lake, "clocky", "order_id, random() as x", "");
    let text = std::fs::read_to_string(lake.join(&clocky)).unwrap();
    std::fs::write(
        lake.join(&clocky),
        text.replace(
            "name = \"clocky\"",
            "name = \"clocky\"\nallow_nondeterministic = true",
        ),
    )
    .unwrap();
    let out = idem_in(lake.path(), &["verify", &clocky, DAY[0], DAY[1]], &[]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT deterministic"));

    // 5: the transform failed on the date's data (a cast that does not fit): the same
    // input fails again, and nothing is published.
    let cast = job(
        &lake,
        "casty",
        "order_id, cast(status as int) as status",
        "",
    );
    run(&cast, &[], 5, "Cast error");
    assert!(!lake.join("out/casty/dt=2026-06-02").exists());
    assert_eq!(snapshot(&table), before);

    // A backfill ends with its final code when no date may succeed on a retry, and each
    // failed date carries its own; with --fail-fast too.
    let range = ["--from", "2026-06-01", "--to", "2026-06-02", "--json"];
    let out = idem_in(
        lake.path(),
        &[
            "backfill", &cast, range[0], range[1], range[2], range[3], range[4],
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(5));
    let failed: Vec<serde_json::Value> = json_lines(&out)
        .into_iter()
        .filter(|e| e["event"] == "failed")
        .collect();
    assert_eq!(failed.len(), 2);
    assert!(failed.iter().all(|e| e["exit_code"] == 5), "{failed:?}");
    let out = idem_in(
        lake.path(),
        &[
            "backfill",
            &cast,
            range[0],
            range[1],
            range[2],
            range[3],
            "--fail-fast",
            "--concurrency",
            "1",
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "a date left unstarted by --fail-fast"
    );
}

#[test]
fn a_second_ctrl_c_abandons_the_running_dates_with_130_and_leaves_them_old_or_new() {
    use std::io::{BufRead, BufReader};
    let lake = Lake::new();
    // Dates long enough (a fraction of a second each) to be running at the signals.
    let spec = idem_testdata::OrdersSpec {
        days: 10,
        rows_per_day: 300_000,
        ..Default::default()
    };
    idem_testdata::write_orders(&lake.join("testdata/lake/raw/orders"), &spec).unwrap();
    let mut child = std::process::Command::new(bin())
        .args([
            "backfill",
            "testdata/jobs/fct_orders.toml",
            "--from",
            "2026-06-01",
            "--to",
            "2026-06-10",
            "--json",
            "--concurrency",
            "1",
        ])
        .current_dir(lake.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let pid = rustix::process::Pid::from_child(&child);
    let interrupt = || rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    // Twice, once the second date has started; the output is read to its end (a
    // closed pipe would fail the process's next line).
    let (mut starts, mut sent) = (0, false);
    for line in BufReader::new(stdout).lines() {
        starts += usize::from(line.unwrap().contains("\"event\":\"start\""));
        if !sent && starts == 2 {
            interrupt();
            std::thread::sleep(std::time::Duration::from_millis(50));
            interrupt();
            sent = true;
        }
    }
    assert!(sent);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    // Every partition that exists is whole, and a retry finishes the range.
    status_digests(&lake, "lake/analytics/fct_orders");
    lake.idem_ok(&[
        "backfill",
        "testdata/jobs/fct_orders.toml",
        "--from",
        "2026-06-01",
        "--to",
        "2026-06-10",
    ]);
    assert_eq!(status_digests(&lake, "lake/analytics/fct_orders").len(), 10);
}

#[test]
fn a_source_the_store_fails_to_list_is_retryable_and_a_corrupt_one_is_final() {
    let lake = Lake::new();
    let bucket = crate::s3::bucket("codes");
    readers(&[
        "put",
        s3_endpoint(),
        lake.join("testdata/lake/raw/orders").to_str().unwrap(),
        &format!("s3://{bucket}/raw/orders/"),
    ]);
    let job = lake.job(
        "remote",
        &format!(
            r#"
name = "remote"
[sources.orders]
path = "s3://{bucket}/raw/orders/"
partitioned_by = [{{ name = "created_date", type = "date" }}]
[transform]
sql = "select order_id, created_date as dt from orders where created_date = $run_date"
[target]
path = "out/remote"
partition_by = ["dt"]
"#
        ),
    );
    let s3 = s3_env();
    let mut env: Vec<(&str, &str)> = s3.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = |env: &[(&str, &str)], code: i32, text: &str| {
        ends(&lake, &["run", &job, DAY[0], DAY[1]], env, code, text)
    };
    // The store fails the source's listing: 1, and the retry succeeds.
    let mut faulty = env.clone();
    faulty.push(("IDEM_FAULTS", "fail@1:raw/orders"));
    run(
        &faulty,
        1,
        "job file jobs/remote.toml: source `orders`: cannot read the files under",
    );
    assert!(!lake.join("out/remote").exists());
    run(&env, 0, "");
    // A file of the source that is not Parquet fails the same way every time: final,
    // and named (2), on a store as on disk.
    let bad = lake.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("part-9.parquet"), b"not parquet").unwrap();
    readers(&[
        "put",
        s3_endpoint(),
        bad.to_str().unwrap(),
        &format!("s3://{bucket}/raw/orders/created_date=2026-06-02/"),
    ]);
    env.push(("IDEM_LOG", "off"));
    run(
        &env,
        2,
        &format!(
            "file s3://{bucket}/raw/orders/created_date=2026-06-02/part-9.parquet cannot be read"
        ),
    );
}

/// A page that cannot be decoded under a valid footer (256 bytes overwritten at a
/// fifth of the file, as a failing disk or a torn copy leaves it) fails the same way
/// every time: idem decodes the inputs to find the file and names it (2), on disk and
/// on a store (fetching the objects). Nothing is written either way.
#[test]
fn a_page_that_cannot_be_decoded_is_final_and_named_on_disk() {
    let lake = Lake::new();
    let raw = lake.join("testdata/lake/raw/orders");
    let file = raw.join("created_date=2026-06-02/part-0.parquet");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 5;
    bytes[at..at + 256].fill(0xA5);
    std::fs::write(&file, &bytes).unwrap();
    let every_column = "order_id, customer_id, store_id, amount_usd, status, created_at";
    let local = job(&lake, "torn", every_column, "");
    let named = format!("file {} cannot be read: ", file.display());
    ends(&lake, &["run", &local, DAY[0], DAY[1]], &[], 2, &named);
    ends(&lake, &["run", &local, DAY[0], DAY[1]], &[], 2, "snappy");
    assert!(!lake.join("out/torn").exists());

    let bucket = crate::s3::bucket("torn");
    readers(&[
        "put",
        s3_endpoint(),
        raw.to_str().unwrap(),
        &format!("s3://{bucket}/raw/orders/"),
    ]);
    let source = format!("s3://{bucket}/raw/orders/");
    let remote = job_reading(&lake, "torn_remote", &source, every_column, "");
    let s3 = s3_env();
    let env: Vec<(&str, &str)> = s3.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let named = format!("file {source}created_date=2026-06-02/part-0.parquet cannot be read: ");
    ends(&lake, &["run", &remote, DAY[0], DAY[1]], &env, 2, &named);
    assert!(!lake.join("out/torn_remote").exists());
}

/// With `--json`, a failure ends stdout with one object: the error as stderr says it,
/// the exit code, and the partition it names (null when none); a backfill's `failed`
/// event names the partition too.
#[test]
fn a_failure_with_json_prints_the_error_object() {
    let lake = Lake::new();
    let checked = job(
        &lake,
        "checked",
        "order_id, status",
        "[checks]\naccepted_values = { status = [\"paid\"] }",
    );
    let out = idem_in(
        lake.path(),
        &["run", &checked, DAY[0], DAY[1], "--json"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    let last = json_lines(&out).pop().expect("an error object");
    assert_eq!(last["exit_code"], 3, "{last}");
    assert_eq!(last["partition"], "dt=2026-06-02", "{last}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = last["error"].as_str().unwrap();
    assert!(error.starts_with("job file jobs/checked.toml: check `accepted_values: status` failed on partition dt=2026-06-02"), "{error}");
    assert!(stderr.contains(error), "{stderr}");

    let out = idem_in(
        lake.path(),
        &["run", &checked, "--date", "2026-13-02", "--json"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let last = json_lines(&out).pop().expect("an error object");
    assert_eq!(last["exit_code"], 2);
    assert!(last["partition"].is_null(), "{last}");
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("invalid --date `2026-13-02`")
    );

    let out = idem_in(
        lake.path(),
        &[
            "backfill",
            &checked,
            "--from",
            "2026-06-01",
            "--to",
            "2026-06-02",
            "--json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    let failed: Vec<serde_json::Value> = json_lines(&out)
        .into_iter()
        .filter(|e| e["event"] == "failed")
        .collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    for f in &failed {
        let date = f["logical_date"].as_str().unwrap();
        assert_eq!(f["partition"], format!("dt={date}"), "{f}");
        assert_eq!(f["exit_code"], 3);
    }
}

/// Errors DataFusion raises after the SQL parsed, while optimizing or planning it
/// (duplicate names, a type coercion) are the query's fault: 2, never 1 (a retry fails
/// the same way for ever). A value that does not fit its cast is the data's: 5.
#[test]
fn errors_found_after_parsing_are_classified_by_their_type() {
    let lake = Lake::new();
    let run = |name: &str, sql: &str, code: i32, text: &str| {
        let job = lake.job(
            name,
            &format!(
                r#"
name = "{name}"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = ["created_date"]
[transform]
sql = """{sql}"""
[target]
path = "out/{name}"
partition_by = ["dt"]
"#
            ),
        );
        ends(&lake, &["run", &job, DAY[0], DAY[1]], &[], code, text);
        assert!(!lake.join(&format!("out/{name}")).exists(), "{name}");
    };
    let day = "cast($run_date as date) as dt from orders where created_date = $run_date";
    run(
        "dup_names",
        &format!(
            "select cast(order_id as bigint) as a, order_id as b, count(*) as n, {day} \
             group by cast(order_id as bigint), order_id"
        ),
        2,
        "Projections require unique expression names",
    );
    run(
        "coercion",
        &format!(
            "select order_id, {day} and (cast(store_id as tinyint unsigned) and status = 'paid')"
        ),
        2,
        "Cannot infer common argument type for logical boolean operation UInt8 AND Boolean",
    );
    // A constant of the SQL that does not fit its type fails in the optimizer, before
    // any data is read: the same on every input.
    run(
        "constant",
        &format!(
            "select order_id, {day} and created_at > cast('0001-01-01 00:00:00' as timestamp)"
        ),
        2,
        "Overflow converting 0001-01-01 00:00:00 to Nanosecond",
    );
    run(
        "overflow",
        &format!(
            "select arrow_cast(created_at + interval '300000 days', \
             'Timestamp(Nanosecond, Some(\"UTC\"))') as t, {day}"
        ),
        5,
        "exceeds the representable i64 range",
    );
}

#[test]
fn numbers_too_large_for_their_setting_are_refused_not_wrapped() {
    let lake = Lake::new();
    let delta = job(
        &lake,
        "numbers",
        "order_id, amount_usd",
        "format = \"delta\"",
    );
    let run = ["run", delta.as_str(), "--date", "2026-06-01"];
    let table = lake.join("out/numbers");
    // A lease timeout past what a duration holds: refused before anything starts, never
    // a panic, and no table is created.
    for value in ["99999999999999999999", "31536001", "ten minutes"] {
        ends(
            &lake,
            &run,
            &[("IDEM_LEASE_TIMEOUT", value)],
            2,
            "IDEM_LEASE_TIMEOUT=",
        );
        assert!(!table.exists(), "{value}: a refused run created the table");
    }
    ends(&lake, &run, &[("IDEM_LEASE_TIMEOUT", "120")], 0, "");
    assert!(table.join("_delta_log").is_dir());
    // A second version of the day removes the first one's file.
    std::fs::write(
        lake.join(&delta),
        std::fs::read_to_string(lake.join(&delta)).unwrap().replace(
            "order_id, amount_usd",
            "order_id + 1 as order_id, amount_usd",
        ),
    )
    .unwrap();
    lake.idem_ok(&["run", &delta, "--date", "2026-06-01"]);
    let removed = |hours: &str| -> Vec<String> {
        let out = lake.idem_ok(&[
            "vacuum",
            "out/numbers",
            "--retain-hours",
            hours,
            "--dry-run",
            "--json",
        ]);
        serde_json::from_value(out[0]["files"].clone()).unwrap()
    };
    assert_eq!(removed("0").len(), 1);
    // A century keeps it (it used to wrap around to about an hour in a release build);
    // past that, the flag is refused.
    assert_eq!(removed("876000"), Vec::<String>::new());
    ends(
        &lake,
        &[
            "vacuum",
            "out/numbers",
            "--retain-hours",
            "5124095576030432",
        ],
        &[],
        2,
        "--retain-hours",
    );
}
