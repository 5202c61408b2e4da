//! The rows idem writes are the SQL's answer, on every run.
//!
//! Two kinds of test. The regression tests hold each class of wrong answer found so far
//! to the right rows, run after run; each also shows that its class is still wrong in
//! DataFusion with its path turned back on (`IDEM_UNSAFE_REENABLE`), so the day an
//! upgrade fixes one, the test says so. The search (`testdata/py/answers.py`) generates
//! tables and queries, runs them through idem as job files and through DuckDB, and
//! compares the rows; it also checks that a re-run is `unchanged` and the metamorphic
//! relations TLP and NoREC. Its budget: `IDEM_ANSWERS_SEED`, `IDEM_ANSWERS_WORLDS`,
//! `IDEM_ANSWERS_QUERIES` (CONTRIBUTING.md says how to run a larger one).

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Decimal128Array, Int64Array, StringArray};
use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;
use serde_json::Value;

use crate::common::*;

/// Writes `columns` as one Parquet file of row groups of `group` rows.
fn write(path: &Path, columns: Vec<(&str, ArrayRef)>, group: usize) {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(group))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn decimals(values: &[i128], p: u8, s: i8) -> ArrayRef {
    Arc::new(
        Decimal128Array::from(values.to_vec())
            .with_precision_and_scale(p, s)
            .unwrap(),
    )
}

fn ints(values: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(values.to_vec()))
}

/// A job of one source `t` at `src` writing `sql`'s rows to the unpartitioned table
/// `out/NAME`.
fn job(lake: &Lake, name: &str, sources: &[&str], sql: &str) -> String {
    let mut text = format!("name = \"{name}\"\n");
    for s in sources {
        text += &format!("[sources.{s}]\npath = \"src/{name}/{s}/\"\n");
    }
    text += &format!(
        "[transform]\nsql = \"\"\"\n{sql}\n\"\"\"\n[target]\npath = \"out/{name}\"\npartition_by = []\n"
    );
    lake.job(name, &text)
}

/// The rows of the table `out/NAME`, as readers see them.
fn rows(lake: &Lake, name: &str) -> Value {
    readers(&["table", lake.join(&format!("out/{name}")).to_str().unwrap()])
}

/// Runs `job` `times` times, each into a fresh table, with `reenable` naming the
/// paths turned back on; the distinct row sets the runs wrote.
fn answers(lake: &Lake, job: &str, name: &str, times: usize, reenable: &str) -> Vec<Value> {
    let mut seen: Vec<Value> = Vec::new();
    for _ in 0..times {
        let _ = std::fs::remove_dir_all(lake.join(&format!("out/{name}")));
        let out = idem_in(
            lake.path(),
            &["run", job, "--date", "2026-06-04"],
            &[("IDEM_UNSAFE_REENABLE", reenable)],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = rows(lake, name);
        if !seen.contains(&r) {
            seen.push(r);
        }
    }
    seen
}

/// Class 1 (apache/datafusion#24816): `min(price), max(seq + 1)` over two files, the
/// second of small row groups. The aggregation's dynamic filter, built from
/// `min(price)` alone, skipped the row groups `max(seq + 1)` needs: 3 on one run, 12
/// on the next, for 101.
#[test]
fn a_global_min_and_max_of_an_expression_is_the_right_answer_on_every_run() {
    let lake = Lake::new();
    let src = lake.join("src/minmax/t");
    write(
        &src.join("a.parquet"),
        vec![
            ("price", decimals(&[100, 900], 9, 2)),
            ("seq", ints(&[1, 2])),
        ],
        2,
    );
    write(
        &src.join("b.parquet"),
        vec![
            ("price", decimals(&[500, 600, 500, 700, 600, 800], 9, 2)),
            ("seq", ints(&[10, 11, 50, 51, 99, 100])),
        ],
        2,
    );
    let job = job(
        &lake,
        "minmax",
        &["t"],
        "select min(price) as min_price, max(seq + 1) as max_seq, \
         cast($run_date as date) as dt from t",
    );
    let right = serde_json::json!([{"dt": "2026-06-04", "max_seq": "101", "min_price": "1.00"}]);
    // `idem verify` runs the date twice and compares: deterministic, 20 times over.
    for _ in 0..20 {
        let out = lake.idem(&["verify", &job, "--date", "2026-06-04"]);
        assert!(
            out.status.success(),
            "verify: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(answers(&lake, &job, "minmax", 5, ""), vec![right.clone()]);
    // With the path on, DataFusion 55.2 gets it wrong on some runs.
    let on = answers(&lake, &job, "minmax", 20, "aggregate_dynamic_filter");
    assert!(
        on.iter().any(|r| *r != right),
        "with the aggregate dynamic filter on, every run was right: has DataFusion fixed \
         #24816? If so, drop the path from engine/src/known_wrong.rs. Rows: {on:?}"
    );
}

/// Class 2: a join's filter mapped by name onto a cast grouping expression. The derived
/// table groups by `cast(cast(p as int) as decimal(12,2))`, named `p`; the join with a
/// one-row constant pushed its bounds (5.00) onto the raw `p` (5.10 to 5.90) and
/// skipped the row groups of group 5.00.
#[test]
fn a_join_to_a_grouping_by_a_cast_of_a_column_finds_its_groups() {
    let lake = Lake::new();
    let src = lake.join("src/castjoin/t");
    write(
        &src.join("a.parquet"),
        vec![
            ("p", decimals(&[390, 410, 510, 590, 610, 690], 9, 2)),
            ("q", ints(&[1, 2, 3, 4, 5, 6])),
        ],
        2,
    );
    let job = job(
        &lake,
        "castjoin",
        &["t"],
        "select s.x, d.p, d.n \
         from (select cast(5 as decimal(12,2)) as x) s \
         join (select cast(cast(p as int) as decimal(12,2)) as p, count(*) as n \
               from t group by cast(cast(p as int) as decimal(12,2))) d \
         on s.x = d.p",
    );
    let right = serde_json::json!([{"n": "2", "p": "5.00", "x": "5.00"}]);
    // Paths on or off, DataFusion 55.2 gives this layout the right rows here (its
    // partial aggregation names the key `t.p`, which no scan column matches); the
    // test holds the answer wherever the plan's names fall.
    for reenable in ["", "join_dynamic_filter"] {
        assert_eq!(
            answers(&lake, &job, "castjoin", 2, reenable),
            vec![right.clone()]
        );
    }
}

/// Class 2 through a top-k: `order by p limit 1` over the same grouping; the top-k's
/// threshold is pushed onto the raw `p` by name.
#[test]
fn a_top_k_over_a_grouping_by_a_cast_of_a_column_finds_its_groups() {
    let lake = Lake::new();
    let src = lake.join("src/casttopk/t");
    write(
        &src.join("a.parquet"),
        vec![("p", decimals(&[590, 510, 690, 610, 790, 710], 9, 2))],
        2,
    );
    write(
        &src.join("b.parquet"),
        vec![("p", decimals(&[550, 560], 9, 2))],
        2,
    );
    let job = job(
        &lake,
        "casttopk",
        &["t"],
        "select cast(cast(p as int) as decimal(12,2)) as p, count(*) as n \
         from t group by cast(cast(p as int) as decimal(12,2)) \
         order by p desc limit 2",
    );
    let right = serde_json::json!([{"n": "2", "p": "7.00"}, {"n": "2", "p": "6.00"}]);
    let right = sorted(right);
    assert_eq!(answers(&lake, &job, "casttopk", 3, ""), vec![right]);
}

/// Class 3 (apache/datafusion#25264): two grouping columns of one name, `a.v` and
/// `b.v` from the two sides of a join, joined on the second: the join's filter landed
/// on the first.
#[test]
fn a_join_on_the_second_of_two_grouping_columns_of_one_name_finds_its_rows() {
    let lake = Lake::new();
    let src = lake.join("src/dupnames");
    write(
        &src.join("ta/a.parquet"),
        vec![
            ("id", Arc::new(StringArray::from(vec!["a1"])) as ArrayRef),
            ("ty", Arc::new(StringArray::from(vec!["x1"])) as ArrayRef),
        ],
        1,
    );
    write(
        &src.join("tb/b.parquet"),
        vec![("id", Arc::new(StringArray::from(vec!["x1"])) as ArrayRef)],
        1,
    );
    let job = job(
        &lake,
        "dupnames",
        &["ta", "tb"],
        "select s.id as sid, d.aid, d.bid from tb s \
         join (select a.id as aid, b.id as bid from ta a left join tb b on a.ty = b.id \
               group by a.id, b.id) d \
         on s.id = d.bid",
    );
    let right = serde_json::json!([{"aid": "a1", "bid": "x1", "sid": "x1"}]);
    assert_eq!(answers(&lake, &job, "dupnames", 3, ""), vec![right]);
}

/// Found by the search (seed 1, world 0): `tb b right join ta a … where b.id is null`
/// returned no rows. DataFusion's first physical filter pushdown mapped `b.id IS NULL`
/// through the projection above the join by name, onto `a.id`, and pruned every row
/// group of `a` by its null count.
#[test]
fn a_filter_above_a_join_of_two_columns_of_one_name_stays_on_its_column() {
    let lake = Lake::new();
    let src = lake.join("src/antijoin");
    write(
        &src.join("ta/a.parquet"),
        vec![("id", ints(&[1, 2, 3])), ("k", ints(&[1, 2, 3]))],
        2,
    );
    write(
        &src.join("tb/b.parquet"),
        vec![("id", ints(&[10, 20])), ("k", ints(&[1, 2]))],
        2,
    );
    let job = job(
        &lake,
        "antijoin",
        &["ta", "tb"],
        "select b.id as bid, a.id as aid from tb b right join ta a on a.k = b.k \
         where b.id is null",
    );
    let right = serde_json::json!([{"aid": "3", "bid": null}]);
    assert_eq!(answers(&lake, &job, "antijoin", 2, ""), vec![right.clone()]);
    let on = answers(&lake, &job, "antijoin", 1, "filter_pushdown_by_name");
    assert_ne!(
        on,
        vec![right],
        "with DataFusion's filter pushdown unfenced the rows were right: fixed upstream?"
    );
}

/// Found by the search (seed 18, world 1): DataFusion 55 computes `INTERSECT ALL` as a
/// semi join (`{1, 1, 2} INTERSECT ALL {1}` gives `{1, 1}`, not `{1}`) and `EXCEPT
/// ALL` as an anti join. No option turns that off: the guard refuses both, exit 2.
#[test]
fn intersect_all_and_except_all_are_refused_with_the_reason() {
    let lake = Lake::new();
    let src = lake.join("src/multiset");
    write(&src.join("ta/a.parquet"), vec![("x", ints(&[1, 1, 2]))], 2);
    write(&src.join("tb/b.parquet"), vec![("x", ints(&[1]))], 2);
    for (op, word) in [
        ("intersect all", "INTERSECT ALL"),
        ("except all", "EXCEPT ALL"),
    ] {
        let name = op.replace(' ', "_");
        let job = job(
            &lake,
            &name,
            &["ta", "tb"],
            &format!("select x from ta {op} select x from tb"),
        );
        std::fs::create_dir_all(lake.join(&format!("src/{name}"))).unwrap();
        copy_dir(&src.join("ta"), &lake.join(&format!("src/{name}/ta")));
        copy_dir(&src.join("tb"), &lake.join(&format!("src/{name}/tb")));
        let out = lake.idem(&["run", &job, "--date", "2026-06-04"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("{word} is not supported")), "{err}");
        assert!(!lake.join(&format!("out/{name}")).exists());
    }
    // The distinct forms are right, and run.
    let job = job(
        &lake,
        "multiset",
        &["ta", "tb"],
        "select x from ta intersect select x from tb",
    );
    assert_eq!(
        answers(&lake, &job, "multiset", 1, ""),
        vec![serde_json::json!([{"x": "1"}])]
    );
}

/// A millisecond timestamp compared with a literal of microseconds: DataFusion's
/// simplifier casts the literal down to milliseconds, truncating it, so `ts =
/// '… 00:00:00.515835'` held for a `ts` of `00:00:00.515`; also where the comparison
/// is made by the optimizer, pushing a filter into a union (found by a review).
#[test]
fn a_timestamp_compared_with_a_finer_literal_is_compared_exactly() {
    let lake = Lake::new();
    let src = lake.join("src/finer/t");
    let base = 1_780_531_200_000i64; // 2026-06-04 00:00:00 in milliseconds
    let ts: ArrayRef = Arc::new(
        arrow::array::TimestampMillisecondArray::from(vec![base - 1, base, base + 515, base + 516])
            .with_timezone("UTC"),
    );
    write(
        &src.join("a.parquet"),
        vec![("ts", ts), ("n", ints(&[0, 1, 2, 3]))],
        2,
    );
    let lit = "cast('2026-06-04 00:00:00.515835' as timestamp)";
    let job = job(
        &lake,
        "finer",
        &["t"],
        &format!(
            "select \
               sum(case when ts = {lit} then 1 else 0 end) as eq, \
               sum(case when ts < {lit} then 1 else 0 end) as lt, \
               sum(case when ts >= {lit} then 1 else 0 end) as ge, \
               sum(case when ts in ({lit}, cast('2026-06-04' as timestamp)) then 1 else 0 end) as inl, \
               (select count(*) from t where ts > {lit}) as filtered, \
               (select count(*) from (select ts from t union all \
                  select arrow_cast(ts, 'Timestamp(Nanosecond, Some(\"UTC\"))') as ts from t) u \
                where ts >= {lit}) as unioned \
             from t"
        ),
    );
    // `unioned`: the filter is pushed into both sides of the union, where the
    // millisecond side gains a cast the optimizer made.
    let right = serde_json::json!([
        {"eq": "0", "filtered": "1", "ge": "1", "inl": "1", "lt": "3", "unioned": "2"}
    ]);
    assert_eq!(answers(&lake, &job, "finer", 1, ""), vec![right.clone()]);
    let on = answers(&lake, &job, "finer", 1, "timestamp_literal_truncation");
    assert_ne!(on, vec![right], "truncation fixed upstream?");
}

/// Found by the search (seed 1): a merge whose source declares a column NOT NULL
/// (`coalesce(k, 0)`) into a table whose rows hold NULLs there failed (exit 5,
/// "Column 'k' is declared as non-nullable but contains null values"): the table's
/// files were read with the source's nullability.
#[test]
fn a_merge_of_a_not_null_column_into_rows_holding_nulls_keeps_them() {
    let lake = Lake::new();
    let src = lake.join("src/base/t");
    let k: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, None]));
    write(
        &src.join("a.parquet"),
        vec![("id", ints(&[1, 2, 3])), ("k", k)],
        2,
    );
    copy_dir(&src, &lake.join("src/change/t"));
    let base = job(&lake, "base", &["t"], "select id, k from t");
    let change = lake.job(
        "change",
        "name = \"change\"\n[sources.t]\npath = \"src/change/t/\"\n[transform]\n\
         sql = \"select id, coalesce(k, 0) + 10 as k from t where id = 2\"\n[target]\n\
         path = \"out/base\"\npartition_by = []\nmode = \"merge\"\nkey = [\"id\"]\n",
    );
    lake.idem_ok(&["run", &base, "--date", "2026-06-04"]);
    lake.idem_ok(&["run", &change, "--date", "2026-06-04"]);
    assert_eq!(
        rows(&lake, "base"),
        serde_json::json!([
            {"id": "1", "k": "1"},
            {"id": "2", "k": "10"},
            {"id": "3", "k": null},
        ])
    );
    let again = lake.idem_ok(&["run", &change, "--date", "2026-06-04", "--json"]);
    assert_eq!(
        actions(&again),
        vec![("(table)".to_string(), "unchanged".to_string())]
    );
}

fn sorted(v: Value) -> Value {
    let mut rows = v.as_array().unwrap().clone();
    rows.sort_by_key(|r| r.to_string());
    Value::Array(rows)
}

/// Reads a number from the environment, else `default`.
fn budget(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the search and fails with every failure it found, each with the command that
/// replays it; appends what it did to the adversary report.
fn search(label: &str, worlds: u64, queries: u64, merges: u64, extra: &[&str]) {
    let seed = budget("IDEM_ANSWERS_SEED", 20261207);
    let bin = bin();
    let script = repo_root().join("testdata/py/answers.py");
    let (w, q, m) = (worlds.to_string(), queries.to_string(), merges.to_string());
    let mut args = vec![
        script.to_str().unwrap(),
        "search",
        "--idem",
        bin.to_str().unwrap(),
        "--worlds",
        &w,
        "--queries",
        &q,
        "--merges",
        &m,
    ];
    let s = seed.to_string();
    args.extend(["--seed", &s]);
    args.extend(extra);
    let out = std::process::Command::new(python())
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "answers.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "answers.py printed no summary ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let n = |k: &str| summary[k].as_u64().unwrap_or(0);
    let shapes: Vec<String> = summary
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(k, v)| Some(format!("{} {}", k.strip_prefix("shape:")?, v)))
        .collect();
    let text = format!(
        "answers | {label} | seed {seed}: {} worlds, {} queries ({}), {} rows compared with \
         DuckDB, {} equal; {} merges, {} equal; {} re-runs unchanged; {} TLP and {} NoREC \
         checks; {} on a cluster the same; {} refused by idem alone\n",
        n("worlds"),
        n("queries"),
        shapes.join(", "),
        n("rows_compared"),
        n("queries_equal"),
        n("merges"),
        n("merges_equal"),
        n("reruns_unchanged") + n("merge_reruns_unchanged"),
        n("tlp"),
        n("norec"),
        n("cluster_same"),
        summary["refusals"].as_array().map_or(0, Vec::len),
    );
    adversary_report(&text);
    for r in summary["refusals"].as_array().into_iter().flatten() {
        eprintln!("refused by idem alone: {r}");
    }
    let failures = summary["failures"].as_array().cloned().unwrap_or_default();
    assert!(
        failures.is_empty(),
        "{} of the generated queries broke a promise; replay one with \
         `python testdata/py/answers.py replay --idem target/debug/idem <replay>`:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|f| serde_json::to_string_pretty(f).unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn generated_queries_give_duckdbs_rows_and_the_same_table_on_a_rerun() {
    search(
        "local",
        budget("IDEM_ANSWERS_WORLDS", 40),
        budget("IDEM_ANSWERS_QUERIES", 24),
        budget("IDEM_ANSWERS_MERGES", 2),
        &[],
    );
}

/// The same search with every date's plan on an in-process Ballista cluster
/// (`--cluster standalone`): the digests must equal the local run's. Fewer worlds:
/// each runs its jobs a third time.
#[test]
fn generated_queries_on_a_cluster_write_what_a_local_run_writes() {
    search(
        "cluster",
        budget("IDEM_ANSWERS_CLUSTER_WORLDS", 3),
        budget("IDEM_ANSWERS_QUERIES", 24),
        0,
        &["--cluster"],
    );
}
