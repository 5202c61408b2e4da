//! Generated job files: a valid job mutated at random (lines dropped, doubled, swapped
//! or cut short; values replaced by other types; keys added; characters changed) must
//! give a clear error that names the job file — never a panic — and a mutated job
//! that is still valid runs, or fails, without touching the table unless it succeeds.

use std::path::Path;
use std::sync::Arc;

use idem_engine::job::Job;
use idem_engine::run::{Quiet, RunOptions};
use proptest::prelude::*;

use crate::world::{Backend, Sources, World};

/// A job using most of what a job file can say.
const JOB: &str = r#"name = "mutant"
lookback = 1
[sources.orders]
path = "SRC/"
format = "parquet"
partitioned_by = [{ name = "created_date", type = "date" }]
dedupe = { key = ["order_id"], latest_by = "created_at" }
[transform]
sql = """
select order_id, customer_id, amount_usd, status, created_date as dt
from orders
where created_date >= cast($run_start as date) and created_date < cast($run_end as date)
"""
[target]
path = "TARGET"
partition_by = ["dt"]
mode = "replace_partitions"
grain = "day"
compression = "zstd(1)"
row_group_rows = 1000
file_size = "64MiB"
on_schema_change = "fail"
[checks]
unique = ["order_id"]
not_null = ["order_id", "dt"]
min_rows = 0
accepted_values = { status = ["placed", "paid", "shipped", "delivered", "cancelled", "returned"] }
assert = ["select count(*) = count(*) from output"]
"#;

#[derive(Clone, Debug)]
enum Mutation {
    Drop(usize),
    Double(usize),
    Swap(usize, usize),
    Cut(usize),
    Value(usize, String),
    Insert(usize, String),
    Char(usize, char),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let junk = prop_oneof![
        Just("".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("\"".to_string()),
        Just("1e999".to_string()),
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("true".to_string()),
        Just("\"merge\"".to_string()),
        Just("\"hour\"".to_string()),
        Just("[\"_x\"]".to_string()),
        Just("\"/\"".to_string()),
        Just("\"${NOPE}\"".to_string()),
        Just("\"select now()\"".to_string()),
        Just("[\"dt\", \"dt\"]".to_string()),
        Just("\"zstd(99)\"".to_string()),
        Just("\"0 KiB\"".to_string()),
        "\"[ -~]{0,12}\"",
        "[ -~]{0,12}",
    ];
    let line = 0usize..40;
    prop_oneof![
        line.clone().prop_map(Mutation::Drop),
        line.clone().prop_map(Mutation::Double),
        (line.clone(), line.clone()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        (0usize..1500).prop_map(Mutation::Cut),
        (line.clone(), junk.clone()).prop_map(|(l, v)| Mutation::Value(l, v)),
        (line, "[a-z_]{1,10}", junk)
            .prop_map(|(l, k, v)| Mutation::Insert(l, format!("{k} = {v}"))),
        (0usize..1500, any::<char>()).prop_map(|(at, c)| Mutation::Char(at, c)),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for m in mutations {
        let n = lines.len().max(1);
        match m {
            Mutation::Drop(i) if !lines.is_empty() => {
                lines.remove(i % n);
            }
            Mutation::Double(i) if !lines.is_empty() => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Mutation::Swap(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
            Mutation::Value(i, v) if !lines.is_empty() => {
                let l = &mut lines[i % n];
                if let Some((k, _)) = l.split_once('=') {
                    *l = format!("{k}= {v}");
                }
            }
            Mutation::Insert(i, l) => lines.insert(i % (lines.len() + 1), l.clone()),
            Mutation::Cut(at) => {
                let joined = lines.join("\n");
                let at = (*at).min(joined.len());
                let at = (0..=at)
                    .rev()
                    .find(|&i| joined.is_char_boundary(i))
                    .unwrap_or(0);
                lines = joined[..at].lines().map(str::to_string).collect();
            }
            Mutation::Char(at, c) => {
                let mut joined: Vec<char> = lines.join("\n").chars().collect();
                if !joined.is_empty() {
                    let i = at % joined.len();
                    joined[i] = *c;
                }
                lines = joined
                    .into_iter()
                    .collect::<String>()
                    .lines()
                    .map(str::to_string)
                    .collect();
            }
            _ => {}
        }
    }
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Parsing never panics; a refusal names the job file and says why in one go.
    #[test]
    fn a_mutated_job_file_is_parsed_or_refused_by_name(
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let text = mutate(JOB, &mutations)
            .replace("SRC", "/nonexistent/src")
            .replace("TARGET", "/nonexistent/t");
        if let Err(e) = Job::parse(Path::new("jobs/mutant.toml"), &text) {
            let message = e.to_string();
            prop_assert!(message.contains("jobs/mutant.toml"), "{message}");
            prop_assert!(!message.trim().is_empty());
            prop_assert!(e.is_bad_input(), "{message}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A mutated job run against a live table: it succeeds, or it fails and the table
    /// is as it was (its bytes, names and times). Never a panic.
    #[test]
    fn a_mutated_job_never_panics_and_a_failed_one_changes_nothing(
        mutations in prop::collection::vec(mutation(), 1..3),
    ) {
        let sources = shared_sources();
        let w = World::new(Backend::Local, "mut", sources);
        let good = w.daily(0);
        w.run(&good, "2026-06-02").unwrap();
        let before = tree(&w.dir.path().join("t"));
        let text = mutate(JOB, &mutations)
            .replace("SRC", &w.dir.path().join("src").display().to_string())
            .replace("TARGET", &w.target);
        let path = w.dir.path().join("mutant.toml");
        std::fs::write(&path, text).unwrap();
        let Ok(job) = Job::load(&path) else {
            prop_assert_eq!(tree(&w.dir.path().join("t")), before);
            return Ok(());
        };
        // A mutation of the target's path may name a folder outside this test's own
        // (relative to the working directory): not run.
        if !job.target.path.starts_with(w.dir.path()) {
            return Ok(());
        }
        let opts = RunOptions { date: "2026-06-02".into(), ..Default::default() };
        let result = World::runtime().block_on(idem_engine::run::run(&job, &opts, Arc::new(Quiet)));
        if let Err(e) = result {
            prop_assert!(!e.to_string().is_empty());
            // Every final failure, and a source that could not be read, comes before
            // anything is published.
            let before_publish = e.exit_code() != idem_engine::exit::RETRY
                || matches!(e, idem_engine::Error::SourceUnreachable { .. });
            if before_publish {
                prop_assert_eq!(tree(&w.dir.path().join("t")), before, "{}", e);
            }
        }
    }
}

fn shared_sources() -> &'static Sources {
    static SOURCES: std::sync::OnceLock<Sources> = std::sync::OnceLock::new();
    SOURCES.get_or_init(Sources::new)
}

/// Every file under `root`: its bytes, and its modification time.
fn tree(root: &Path) -> Vec<(String, Vec<u8>, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let m = std::fs::metadata(&p).unwrap();
                out.push((
                    p.display().to_string(),
                    std::fs::read(&p).unwrap(),
                    m.modified().unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}
