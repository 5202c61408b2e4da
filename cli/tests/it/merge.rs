//! Merge by key against an independent oracle: DuckDB computes the expected table with
//! the MERGE-equivalent SQL (the table's rows whose key the changes lack, plus every
//! change), and idem's table read back must equal it.

use std::process::Command;

use crate::common::*;

pub fn job(partition_by: &str) -> String {
    format!(
        r#"
name = "dim_customers"
[sources.changes]
path = "${{SRC}}"
format = "csv"
[transform]
sql = "select customer_id, email, country, cast(signup_date as date) as signup_date from changes"
[target]
path = "out/dim_customers"
mode = "merge"
key = ["customer_id"]
partition_by = [{partition_by}]
"#
    )
}

/// Writes a changes file: updates of existing keys (new email; some move country) and
/// new keys.
pub fn changes(lake: &Lake, name: &str, updates: &[u64], new: &[u64], moved_to: &str) -> String {
    let mut text = String::from("customer_id,email,country,signup_date\n");
    for id in updates {
        let country = if id % 2 == 0 { moved_to } else { "US" };
        text.push_str(&format!(
            "{id},{name}{id}@example.org,{country},2020-02-02\n"
        ));
    }
    for id in new {
        text.push_str(&format!(
            "{id},{name}{id}@example.net,{moved_to},2024-04-04\n"
        ));
    }
    let path = lake.join(&format!("{name}.csv"));
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// The unpartitioned dimension sorted by key, 100 rows per file: file N holds ids
/// 100N+1..100N+100.
pub fn clustered_job() -> String {
    job("")
        .replace("from changes\"", "from changes order by customer_id\"")
        .replace(
            "partition_by = []",
            "row_group_rows = 100\nfile_size = \"1 KiB\"",
        )
}

pub fn merge(lake: &Lake, job: &str, src: &str) -> std::process::Output {
    idem_in(
        lake.path(),
        &["run", job, "--date", "2026-06-01", "--json"],
        &[("SRC", src)],
    )
}

pub fn merge_ok(lake: &Lake, job: &str, src: &str) -> Vec<serde_json::Value> {
    let out = merge(lake, job, src);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&out)
}

/// DuckDB's answer for the base file merged with each changes file in turn.
pub fn oracle(base: &str, changes: &[&str]) -> serde_json::Value {
    let mut table = format!(
        "select customer_id, email, country, signup_date::date as signup_date from read_csv('{base}')"
    );
    for c in changes {
        let ch = format!(
            "select customer_id, email, country, signup_date::date as signup_date from read_csv('{c}')"
        );
        table = format!(
            "select * from ({table}) t where customer_id not in (select customer_id from ({ch})) \
             union all {ch}"
        );
    }
    readers(&["duckdb", &table])
}

pub fn base(lake: &Lake) -> String {
    lake.join("testdata/lake/raw/customers/customers.csv")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn unpartitioned_dimension_matches_duckdb_and_rerun_is_unchanged() {
    let lake = Lake::new();
    let job = lake.job("dim", &job(""));
    let base = base(&lake);
    merge_ok(&lake, &job, &base);
    let ch = changes(&lake, "a", &[1, 2, 3, 500, 999], &[1001, 1002], "DE");
    let report = merge_ok(&lake, &job, &ch);
    assert_eq!(actions(&report), vec![("(table)".into(), "written".into())]);
    let table = lake.join("out/dim_customers");
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&ch])
    );
    let before = snapshot(&table);
    let again = merge_ok(&lake, &job, &ch);
    assert_eq!(
        actions(&again),
        vec![("(table)".into(), "unchanged".into())]
    );
    assert_eq!(before, snapshot(&table));
}

/// Keys spread too thin for the merge's bitmap of changed keys are joined instead;
/// both ways give the oracle's table.
#[test]
fn sparse_keys_merge_like_dense_ones() {
    let lake = Lake::new();
    let job = lake.job("dim", &job(""));
    let base = base(&lake);
    merge_ok(&lake, &job, &base);
    let sparse = changes(&lake, "s", &[2, 7], &[1 << 50, (1 << 50) + 3], "DE");
    let dense = changes(&lake, "d", &[7, 8, 1000], &[1003], "FR");
    let joined = merge_ok(&lake, &job, &sparse);
    assert_eq!(joined.last().unwrap()["merge"]["digest_derived"], false);
    merge_ok(&lake, &job, &dense);
    let table = lake.join("out/dim_customers");
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&sparse, &dense])
    );
}

/// A merge on an integer key into an unpartitioned table derives the new digest from
/// the rewritten files' recorded sums, hashing only the rows it drops and adds: the
/// digest must be the one of the same rows written in full, whether the rewrite fills
/// one file or rolls over several, and merge after merge.
#[test]
fn a_merges_derived_digest_equals_the_digest_of_the_rows_written_in_full() {
    for layout in ["", "row_group_rows = 100\nfile_size = \"2 KiB\""] {
        let lake = Lake::new();
        let dim = lake.job("dim", &job("").replace("partition_by = []", layout));
        let copy = lake.job(
            "copy",
            r#"
name = "copy"
[sources.t]
path = "out/dim_customers/"
[transform]
sql = "select * from t"
[target]
path = "out/copy"
"#,
        );
        let base = base(&lake);
        merge_ok(&lake, &dim, &base);
        let a = changes(&lake, "a", &[1, 2, 3, 500, 999], &[1001, 1002], "DE");
        let b = changes(&lake, "b", &[2, 700, 1001], &[1003], "FR");
        for (i, ch) in [&a, &b].into_iter().enumerate() {
            let report = merge_ok(&lake, &dim, ch);
            let m = &report.last().unwrap()["merge"];
            assert_eq!(m["digest_derived"], true, "{layout:?}: {m}");
            lake.idem_ok(&["run", &copy, "--date", "2026-06-01", "--json"]);
            let merged = status_digests(&lake, lake.join("out/dim_customers").to_str().unwrap());
            let full = status_digests(&lake, lake.join("out/copy").to_str().unwrap());
            assert_eq!(merged, full, "{layout:?}, merge {i}");
        }
        let table = lake.join("out/dim_customers");
        assert_eq!(
            readers(&["table", table.to_str().unwrap()]),
            oracle(&base, &[&a, &b])
        );
        // A re-run of the last merge finds the digest unchanged.
        let again = merge_ok(&lake, &dim, &b);
        assert_eq!(
            actions(&again),
            vec![("(table)".into(), "unchanged".into())]
        );
    }
}

/// A file kept across a schema change still holds rows of the old schema, and its
/// recorded sum hashes them so: a merge that rewrites it hashes every row instead of
/// deriving the digest from that sum.
#[test]
fn a_file_written_with_another_schema_is_hashed_not_derived() {
    let lake = Lake::new();
    let text = clustered_job();
    let dim = lake.job("dim", &text);
    merge_ok(&lake, &dim, &base(&lake));
    // A column added: the files no change touches are kept, with the old schema.
    let wider = lake.job(
        "wider",
        &text
            .replace(
                "as signup_date from",
                "as signup_date, cast(null as varchar) as tier from",
            )
            .replace("[target]", "[target]\non_schema_change = \"allow\""),
    );
    let merge_stats = |ch: &str| {
        let report = merge_ok(&lake, &wider, ch);
        report.last().unwrap()["merge"].clone()
    };
    let first = merge_stats(&changes(&lake, "a", &[150], &[], "DE"));
    assert_eq!(first["files_kept"], 9, "{first}");
    assert_eq!(first["digest_derived"], false, "{first}");
    // The live manifest now has the new schema; file 5 was written with the old one.
    let second = merge_stats(&changes(&lake, "b", &[550], &[], "DE"));
    assert_eq!(second["files_read"], 1, "{second}");
    assert_eq!(second["digest_derived"], false, "{second}");
}

#[test]
fn partitioned_dimension_with_keys_that_move_partition() {
    let lake = Lake::new();
    let job = lake.job("dim", &job("\"country\""));
    let base = base(&lake);
    merge_ok(&lake, &job, &base);
    let table = lake.join("out/dim_customers");
    let before = snapshot(&table);
    // Even ids move to NZ; odd ones to US; two new keys land in NZ.
    let ch = changes(&lake, "a", &[10, 11, 12, 13, 14], &[2001, 2002], "NZ");
    let report = merge_ok(&lake, &job, &ch);
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&ch])
    );
    // Only partitions that gained or lost a key were rewritten.
    let touched: Vec<String> = actions(&report)
        .into_iter()
        .filter(|(_, a)| a == "written")
        .map(|(p, _)| p)
        .collect();
    assert!(touched.contains(&"country=NZ".to_string()), "{touched:?}");
    let after = snapshot(&table);
    let untouched = ["country=JP", "country=KR", "country=EG"]
        .into_iter()
        .filter(|c| !touched.contains(&c.to_string()))
        .collect::<Vec<_>>();
    assert!(!untouched.is_empty());
    for c in untouched {
        for (k, v) in &before {
            if k.starts_with(c) {
                assert_eq!(Some(v), after.get(k), "{k} was touched");
            }
        }
    }
    let again = merge_ok(&lake, &job, &ch);
    assert!(actions(&again).iter().all(|(_, a)| a == "unchanged"));
}

#[test]
fn duplicate_or_null_keys_are_errors_and_change_nothing() {
    let lake = Lake::new();
    let job = lake.job("dim", &job("\"country\""));
    merge_ok(&lake, &job, &base(&lake));
    let table = lake.join("out/dim_customers");
    let before = snapshot(&table);

    let dup = lake.join("dup.csv");
    std::fs::write(
        &dup,
        "customer_id,email,country,signup_date\n7,a@x,US,2020-01-01\n7,b@x,US,2020-01-02\n8,c@x,US,2020-01-01\n8,d@x,DE,2020-01-01\n8,e@x,DE,2020-01-01\n",
    )
    .unwrap();
    let out = merge(&lake, &job, dup.to_str().unwrap());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("2 duplicate merge keys (customer_id)"),
        "{err}"
    );
    assert!(err.contains("| 8           | 3      |"), "{err}");
    assert_eq!(before, snapshot(&table));

    let null = lake.join("null.csv");
    std::fs::write(
        &null,
        "customer_id,email,country,signup_date\n9,b@x,US,2020-01-01\n,a@x,US,2020-01-01\n",
    )
    .unwrap();
    let out = merge(&lake, &job, null.to_str().unwrap());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("NULL in the merge key"), "{err}");
    assert_eq!(before, snapshot(&table));
}

#[test]
fn concurrent_merges_both_land_and_crashes_recover() {
    let lake = Lake::new();
    let job = lake.job("dim", &job("\"country\""));
    let base = base(&lake);
    merge_ok(&lake, &job, &base);
    let a = changes(&lake, "a", &[20, 21, 22], &[3001], "NZ");
    let b = changes(&lake, "b", &[30, 31, 32], &[3002], "ZA");
    all_at_once([&a, &b].map(|src| {
        let mut run = Command::new(bin());
        run.args(["run", &job, "--date", "2026-06-01"])
            .current_dir(lake.path())
            .env("SRC", src);
        run
    }));
    // The two change sets touch disjoint keys, so either order gives this table.
    let table = lake.join("out/dim_customers");
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&a, &b])
    );

    // A merge killed after its first partition swap, then re-run: the clean result.
    let c = changes(&lake, "c", &[40, 41, 42, 43], &[3003], "KR");
    let out = idem_in(
        lake.path(),
        &["run", &job, "--date", "2026-06-01"],
        &[("SRC", &c), ("IDEM_FAILPOINTS", "after_swap=abort")],
    );
    assert!(!out.status.success());
    merge_ok(&lake, &job, &c);
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&a, &b, &c])
    );
}

#[test]
fn dedupe_keeps_the_newest_row_per_key_and_refuses_ties() {
    let lake = Lake::new();
    let text = job("\"country\"").replace(
        "format = \"csv\"",
        "format = \"csv\"\ndedupe = { key = [\"customer_id\"], latest_by = \"updated_at\" }",
    );
    let job = lake.job("dim", &text);
    let feed = lake.join("feed.csv");
    std::fs::write(
        &feed,
        "customer_id,email,country,signup_date,updated_at\n\
         1,old1@x,US,2020-01-01,2026-01-01T00:00:00\n\
         1,new1@x,DE,2020-01-01,2026-01-02T00:00:00\n\
         2,only2@x,FR,2020-01-01,2026-01-01T00:00:00\n\
         3,mid3@x,US,2020-01-01,2026-01-02T00:00:00\n\
         3,new3@x,US,2020-01-01,2026-01-03T00:00:00\n\
         3,old3@x,US,2020-01-01,2026-01-01T00:00:00\n",
    )
    .unwrap();
    merge_ok(&lake, &job, feed.to_str().unwrap());
    let table = lake.join("out/dim_customers");
    let rows = readers(&["table", table.to_str().unwrap()]);
    let expected = readers(&[
        "duckdb",
        &format!(
            "select customer_id, email, country, signup_date::date as signup_date from read_csv('{}') \
             qualify row_number() over (partition by customer_id order by updated_at desc) = 1",
            feed.display()
        ),
    ]);
    assert_eq!(rows, expected);
    assert_eq!(rows.as_array().unwrap().len(), 3);

    // Two newest rows for one key: an error naming the key, and nothing changes.
    let before = snapshot(&table);
    std::fs::write(
        &feed,
        "customer_id,email,country,signup_date,updated_at\n\
         4,a4@x,US,2020-01-01,2026-01-05T00:00:00\n\
         4,b4@x,DE,2020-01-01,2026-01-05T00:00:00\n\
         5,c5@x,US,2020-01-01,2026-01-01T00:00:00\n",
    )
    .unwrap();
    let out = merge(&lake, &job, feed.to_str().unwrap());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("dedupe tie") && err.contains("customer_id=4"),
        "{err}"
    );
    assert!(err.contains("updated_at"), "{err}");
    assert_eq!(before, snapshot(&table));
}

#[test]
fn delete_missing_syncs_only_the_runs_window() {
    let lake = Lake::new();
    let job = lake.job(
        "sync",
        r#"
name = "orders_state"
[sources.feed]
path = "${SRC}"
format = "csv"
[transform]
sql = "select cast(order_id as bigint) as order_id, cast(state as varchar) as state, cast(dt as date) as dt from feed where cast(dt as date) = $run_date"
[target]
path = "out/orders_state"
mode = "merge"
key = ["order_id"]
delete_missing = true
partition_by = ["dt"]
"#,
    );
    let feed = lake.join("feed.csv");
    let run = |text: &str, date: &str| {
        std::fs::write(&feed, text).unwrap();
        let out = idem_in(
            lake.path(),
            &["run", &job, "--date", date, "--json"],
            &[("SRC", feed.to_str().unwrap())],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out)
    };
    let header = "order_id,state,dt\n";
    run(
        &format!("{header}1,new,2026-06-01\n2,new,2026-06-01\n3,new,2026-06-01\n"),
        "2026-06-01",
    );
    run(
        &format!("{header}4,new,2026-06-02\n5,new,2026-06-02\n"),
        "2026-06-02",
    );
    let before_day2 = snapshot(&lake.join("out/orders_state/dt=2026-06-02"));
    // Day 1 again: order 3 is gone upstream, order 2 changed.
    let report = run(
        &format!("{header}1,new,2026-06-01\n2,paid,2026-06-01\n"),
        "2026-06-01",
    );
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-01".into(), "written".into())]
    );
    let rows = readers(&["table", lake.join("out/orders_state").to_str().unwrap()]);
    let got: Vec<(String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["order_id"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("1".into(), "new".into()),
            ("2".into(), "paid".into()),
            ("4".into(), "new".into()),
            ("5".into(), "new".into()),
        ]
    );
    assert_eq!(
        before_day2,
        snapshot(&lake.join("out/orders_state/dt=2026-06-02"))
    );
    // A day whose feed is empty is emptied, not left stale.
    let report = run(header, "2026-06-02");
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-02".into(), "emptied".into())]
    );
}

#[test]
fn a_merge_killed_at_any_failpoint_then_rerun_gives_the_clean_result() {
    for point in FAILPOINTS {
        let lake = Lake::new();
        let job = lake.job("dim", &job("\"country\""));
        let base = base(&lake);
        merge_ok(&lake, &job, &base);
        let ch = changes(&lake, "a", &[50, 51, 52, 53], &[4001], "NZ");
        let out = idem_in(
            lake.path(),
            &["run", &job, "--date", "2026-06-01"],
            &[("SRC", &ch), ("IDEM_FAILPOINTS", &format!("{point}=abort"))],
        );
        assert!(!out.status.success(), "{point}: did not fire");
        // Every partition whole (old or new), then the re-run lands the merge.
        let status = lake.idem(&["status", "out/dim_customers", "--json"]);
        let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        for p in s["partitions"].as_array().unwrap() {
            assert_eq!(p["state"], "managed", "{point}: {p}");
        }
        merge_ok(&lake, &job, &ch);
        let table = lake.join("out/dim_customers");
        assert_eq!(
            readers(&["table", table.to_str().unwrap()]),
            oracle(&base, &[&ch]),
            "{point}"
        );
    }
}

/// The table's data files, by relative path.
fn parquet_files(table: &std::path::Path) -> Vec<String> {
    snapshot(table)
        .into_keys()
        .filter(|k| k.ends_with(".parquet"))
        .collect()
}

#[test]
fn files_whose_key_range_holds_no_change_are_kept_not_rewritten() {
    let lake = Lake::new();
    let text = clustered_job();
    let dim = lake.job("dim", &text);
    let base = base(&lake);
    merge_ok(&lake, &dim, &base);
    let table = lake.join("out/dim_customers");
    let files = parquet_files(&table);
    assert_eq!(files.len(), 10, "{files:?}");
    let before = snapshot(&table);

    // Two updates in the second file, two new keys above every file's range.
    let ch = changes(&lake, "a", &[150, 160], &[1001, 1002], "DE");
    let report = merge_ok(&lake, &dim, &ch);
    assert_eq!(actions(&report), vec![("(table)".into(), "written".into())]);
    let m = &report.last().unwrap()["merge"];
    assert_eq!(
        (
            m["table_files"].as_u64(),
            m["files_read"].as_u64(),
            m["files_kept"].as_u64()
        ),
        (Some(10), Some(1), Some(9)),
        "{m}"
    );
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&ch])
    );
    // The nine kept files are the same files: inode, bytes and mtime unchanged (names
    // end in their number: `part-<token>-00001.parquet`).
    let after = snapshot(&table);
    let numbered = |n: usize| format!("-{n:05}.parquet");
    let named = |files: &std::collections::BTreeMap<String, _>, n: usize| {
        files.keys().find(|k| k.ends_with(&numbered(n))).cloned()
    };
    for (name, v) in &before {
        if name.ends_with(&numbered(1)) {
            assert!(
                !after.contains_key(name),
                "{name} should have been rewritten"
            );
        } else {
            assert_eq!(Some(v), after.get(name), "{name} was rewritten");
        }
    }
    assert!(named(&after, 10).is_some(), "{after:?}");
    // idem reads the partition through its newest manifest: managed, digest current.
    let digests = status_digests(&lake, table.to_str().unwrap());
    assert_eq!(digests.len(), 1, "{digests:?}");

    // A re-run finds the same digest from the kept files' recorded sums: unchanged.
    let again = merge_ok(&lake, &dim, &ch);
    assert_eq!(
        actions(&again),
        vec![("(table)".into(), "unchanged".into())]
    );
    assert_eq!(after, snapshot(&table));

    // A second merge on top keeps the files the first one kept, and the result still
    // equals the oracle applied twice.
    let ch2 = changes(&lake, "b", &[150, 950], &[], "DE");
    merge_ok(&lake, &dim, &ch2);
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&ch, &ch2])
    );
    let third = snapshot(&table);
    let first = named(&before, 0).unwrap();
    assert_eq!(third.get(&first), before.get(&first));
    assert!(named(&third, 9).is_none(), "{third:?}");
}

#[test]
fn a_key_that_moves_partition_rewrites_only_the_file_that_held_it() {
    let lake = Lake::new();
    let text = job("\"country\"")
        .replace("from changes\"", "from changes order by customer_id\"")
        .replace(
            "partition_by = [\"country\"]",
            "partition_by = [\"country\"]\nrow_group_rows = 20\nfile_size = \"1 KiB\"",
        );
    let dim = lake.job("dim", &text);
    let base = base(&lake);
    merge_ok(&lake, &dim, &base);
    let table = lake.join("out/dim_customers");
    let before = snapshot(&table);
    // Key 10 moves to NZ (a new partition); key 11 stays in US.
    let ch = changes(&lake, "a", &[10, 11], &[], "NZ");
    let report = merge_ok(&lake, &dim, &ch);
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&ch])
    );
    let m = &report.last().unwrap()["merge"];
    let read = m["files_read"].as_u64().unwrap();
    let kept = m["files_kept"].as_u64().unwrap();
    // Files whose id range starts above 11 are not even read.
    assert!(read < m["table_files"].as_u64().unwrap() && kept > 0, "{m}");
    // Every file not in a written partition, and every kept file, is the same file.
    let after = snapshot(&table);
    let same = before
        .iter()
        .filter(|(k, v)| k.ends_with(".parquet") && after.get(*k) == Some(v))
        .count() as u64;
    let total = before.keys().filter(|k| k.ends_with(".parquet")).count() as u64;
    assert!(
        same >= total - read,
        "{same} of {total} files unchanged, {read} read"
    );
    let again = merge_ok(&lake, &dim, &ch);
    assert!(actions(&again).iter().all(|(_, a)| a == "unchanged"));
}

#[test]
fn a_key_that_includes_the_partition_column_reads_only_the_changes_partitions() {
    let lake = Lake::new();
    let text = job("\"country\"").replace(
        "key = [\"customer_id\"]",
        "key = [\"country\", \"customer_id\"]",
    );
    let dim = lake.job("dim", &text);
    let base = base(&lake);
    merge_ok(&lake, &dim, &base);
    let table = lake.join("out/dim_customers");
    let before = snapshot(&table);
    // Customer 498 (in US) is updated and 1003 is new in US. Every partition's id
    // range spans 498, so only the partition value can rule the others out.
    let ch = changes(&lake, "a", &[], &[], "US");
    std::fs::write(
        &ch,
        "customer_id,email,country,signup_date\n498,new498@example.org,US,2020-02-02\n1003,n@x,US,2024-04-04\n",
    )
    .unwrap();
    let report = merge_ok(&lake, &dim, &ch);
    assert_eq!(
        actions(&report),
        vec![("country=US".into(), "written".into())]
    );
    let m = &report.last().unwrap()["merge"];
    let us_files = before
        .keys()
        .filter(|k| k.starts_with("country=US/") && k.ends_with(".parquet"))
        .count() as u64;
    assert_eq!(m["files_read"].as_u64(), Some(us_files), "{m}");
    assert_eq!(
        readers(&["table", table.to_str().unwrap()]),
        oracle(&base, &[&ch])
    );
}
