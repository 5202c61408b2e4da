//! Schedule exploration on a Delta table shared with another writer: idem's runs of a
//! date, a merge, an `--atomic` backfill, `idem vacuum --retain-hours 0` and `gc`,
//! interleaved with the deltalake package writing the same table (an append, an
//! append that adds a column, a `replaceWhere`, a whole-table overwrite, a delete, an
//! optimize, a vacuum, a restore). idem's writers stop at every failpoint where their
//! work meets the table (`merge_read`, `after_stage`, `before_publish`,
//! `after_publish_one`, `before_commit`, `gc_step`); the other writer's operations and
//! idem's vacuum and gc start when the scheduler picks them, and the scheduler lets one
//! stopped writer go (or starts one operation) at a time, in a seeded order.
//!
//! The Delta log orders every commit, so the check is exact: the table must end as the
//! model of its commits, applied in the log's order, says (each idem commit replaces
//! its partitions with its source's rows, or upserts its change set; each operation of
//! the other writer does what Delta says it does; a restore goes back to its version's
//! state), every file the latest version names must be there (the readers read it
//! whole), no column may vanish, and every partition an idem run reported written must
//! be in a commit. A writer may fail only as Delta lets a concurrent writer fail: a
//! commit conflict, idem's refusal of a column it does not select, a restore of files
//! vacuumed.
//!
//! Another writer's vacuum below the retention window deletes any file no commit names
//! yet, so, as Delta documents for every writer, it is not run while an idem commit is
//! on its way (stopped at `before_commit`, its files in the table).
//!
//! CI explores `IDEM_DELTA_SCHEDULES` schedules (default 32) from seed
//! `IDEM_SCHEDULE_SEED` (default 1); `testdata/adversary.sh delta-schedules N [SEED]`
//! runs more, and a failure names the seed that reproduces it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;
use crate::crash::Lcg;
use crate::schedules::{asleep, waiting};

const POINTS: [&str; 6] = [
    "merge_read",
    "after_stage",
    "before_publish",
    "after_publish_one",
    "before_commit",
    "gc_step",
];

const DAYS: [&str; 3] = ["2026-06-01", "2026-06-02", "2026-06-03"];

/// A row as the readers render it: column -> value as text (NULL: `None`).
type Row = BTreeMap<String, Option<String>>;

/// What one writer does.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    /// idem replaces one day with source state A or B.
    Replace { day: usize, b: bool },
    /// idem upserts its change set.
    Merge,
    /// idem replaces every day with source state B in one commit.
    Atomic,
    /// `idem vacuum --retain-hours 0`.
    Vacuum,
    /// `idem gc`.
    Gc,
    /// The deltalake package: `readers.py delta-op` with this operation, on a day.
    Foreign(&'static str, usize),
}

impl Op {
    fn name(&self) -> String {
        match self {
            Op::Replace { day, b } => {
                format!(
                    "idem run {} from {}",
                    DAYS[*day],
                    if *b { "B" } else { "A" }
                )
            }
            Op::Merge => "idem merge".into(),
            Op::Atomic => "idem backfill --atomic from B".into(),
            Op::Vacuum => "idem vacuum".into(),
            Op::Gc => "idem gc".into(),
            Op::Foreign(op, day) => format!("deltalake {op} {}", DAYS[*day]),
        }
    }

    /// Whether it runs from the start, stopping at idem's failpoints (else it starts
    /// when the scheduler picks it).
    fn stepped(&self) -> bool {
        matches!(self, Op::Replace { .. } | Op::Merge | Op::Atomic)
    }

    fn command(&self, world: &World, i: usize) -> Command {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let args = match self {
            Op::Replace { day, b } => {
                let job = if *b {
                    "jobs/rep_b.toml"
                } else {
                    "jobs/rep_a.toml"
                };
                s(&["run", job, "--date", DAYS[*day], "--json"])
            }
            Op::Merge => s(&["run", "jobs/merge.toml", "--date", DAYS[0], "--json"]),
            Op::Atomic => s(&[
                "backfill",
                "jobs/rep_b.toml",
                "--from",
                DAYS[0],
                "--to",
                DAYS[2],
                "--atomic",
                "--json",
            ]),
            Op::Vacuum => s(&["vacuum", "out/t", "--retain-hours", "0"]),
            Op::Gc => s(&["gc", "out/t"]),
            Op::Foreign(op, day) => {
                let mut cmd = Command::new(python());
                cmd.arg(repo_root().join("testdata/py/readers.py")).args([
                    "delta-op",
                    world.table().to_str().unwrap(),
                    op,
                    DAYS[*day],
                    &Self::base(i).to_string(),
                ]);
                return cmd;
            }
        };
        let mut cmd = Command::new(bin());
        cmd.args(args)
            .current_dir(world.lake.path())
            .env_remove("IDEM_FAILPOINTS");
        cmd
    }

    /// The first order id another writer's rows take (distinct per writer).
    fn base(i: usize) -> i64 {
        1000 * (i as i64 + 1)
    }

    /// Whether a failure is one Delta allows a writer racing others.
    fn may_fail_with(&self, err: &str) -> bool {
        let conflict = err.contains("another writer committed first")
            || err.contains("CommitFailed")
            || err.to_lowercase().contains("conflict");
        match self {
            // The other writer's column arrived before the run checked the table.
            Op::Replace { .. } | Op::Merge | Op::Atomic => {
                conflict || err.contains("lacks column `note` of the Delta table")
            }
            Op::Foreign("restore", _) => {
                conflict || err.contains("not found") || err.contains("No such file")
            }
            Op::Foreign(..) => conflict,
            Op::Vacuum | Op::Gc => false,
        }
    }
}

/// The rows another writer's operation writes (`foreign_rows` of readers.py).
fn foreign_rows(op: &str, day: &str, base: i64) -> Vec<Row> {
    let n = match op {
        "append" => 3,
        "merge-column" | "replace-where" | "overwrite" => 2,
        _ => 0,
    };
    (0..n)
        .map(|k| {
            let mut r = Row::new();
            r.insert("order_id".into(), Some((base + k).to_string()));
            r.insert("customer_id".into(), Some((k + 1).to_string()));
            r.insert("amount_usd".into(), Some("9.99".into()));
            r.insert("status".into(), Some("foreign".into()));
            r.insert("dt".into(), Some(day.to_string()));
            if op == "merge-column" {
                r.insert("note".into(), Some(format!("n{k}")));
            }
            r
        })
        .collect()
}

/// The table's rows, as the model of its commits says.
#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    rows: BTreeSet<Row>,
}

impl Model {
    fn of_day(r: &Row) -> &str {
        r["dt"].as_deref().unwrap_or_default()
    }

    fn replace(&mut self, day: &str, rows: &[Row]) {
        self.rows.retain(|r| Self::of_day(r) != day);
        self.rows.extend(rows.iter().cloned());
    }

    /// Each change replaces every row of its key, wherever it is.
    fn merge(&mut self, changes: &[Row]) {
        for c in changes {
            self.rows.retain(|r| r["order_id"] != c["order_id"]);
            self.rows.insert(c.clone());
        }
    }

    /// The table as the commits of `state` (`readers.py delta-state`'s answer) make
    /// it, applied in the log's order.
    fn of_log(state: &Value, world: &World) -> Result<Model, String> {
        let mut states: Vec<Model> = Vec::new();
        let mut model = Model::default();
        for c in state["history"].as_array().unwrap() {
            if c["version"].as_u64() != Some(states.len() as u64) {
                return Err(format!("a gap in the log before {c}"));
            }
            model.apply(c, &states, world)?;
            states.push(model.clone());
        }
        Ok(model)
    }

    /// What commit `c` (an entry of `readers.py delta-state`'s history) does, given
    /// the states of the versions before it.
    fn apply(&mut self, c: &Value, states: &[Model], world: &World) -> Result<(), String> {
        if let Some(idem) = c["idem"].as_object() {
            let job = idem["job"].as_str().unwrap_or_default();
            let parts = idem["partitions"].as_array().cloned().unwrap_or_default();
            match job {
                "rep_a" | "rep_b" => {
                    for p in parts {
                        let day = p["partition"].as_str().unwrap_or_default();
                        let day = day.trim_start_matches("dt=");
                        self.replace(day, &world.source(job == "rep_b", day));
                    }
                }
                "merge" => self.merge(&world.changes),
                other => return Err(format!("a commit of an unknown job {other}: {c}")),
            }
            return Ok(());
        }
        if let Some(op) = c["testOp"].as_str() {
            let mut words = op.split(' ');
            let (op, day) = (words.next().unwrap(), words.next().unwrap());
            let base: i64 = words.next().unwrap().parse().unwrap();
            match op {
                "append" | "merge-column" => self.rows.extend(foreign_rows(op, day, base)),
                "replace-where" => self.replace(day, &foreign_rows(op, day, base)),
                "overwrite" => self.rows = foreign_rows(op, day, base).into_iter().collect(),
                "delete" => self.rows.retain(|r| {
                    let id: i64 = r["order_id"].as_deref().unwrap().parse().unwrap();
                    Self::of_day(r) != day || id % 2 != 0
                }),
                "optimize" | "vacuum" => {}
                "restore" => {
                    let to = c["restore"].as_u64().ok_or("a restore without a version")?;
                    *self = states[to as usize].clone();
                }
                other => return Err(format!("unknown operation {other}")),
            }
            return Ok(());
        }
        match c["operation"].as_str() {
            // idem vacuum's.
            Some("VACUUM START" | "VACUUM END") => Ok(()),
            _ => Err(format!("a commit no writer of the schedule made: {c}")),
        }
    }
}

/// The lake: two sources (A and B) of three days, the jobs writing the Delta table
/// `out/t` from each and a merge job, and the rows each source and change set holds.
struct World {
    lake: Lake,
    /// Source A's and B's rows by day.
    sources: [BTreeMap<String, Vec<Row>>; 2],
    changes: Vec<Row>,
}

impl World {
    fn new() -> World {
        let lake = Lake::new();
        let mut sources: [BTreeMap<String, Vec<Row>>; 2] = Default::default();
        for (i, (name, seed)) in [("a", 1), ("b", 2)].into_iter().enumerate() {
            let dir = lake.join(&format!("src_{name}"));
            let spec = idem_testdata::OrdersSpec {
                days: 3,
                rows_per_day: 16,
                customers: 10,
                seed,
                ..Default::default()
            };
            idem_testdata::write_orders(&dir, &spec).unwrap();
            let rows = readers(&[
                "duckdb",
                &format!(
                    "select order_id, customer_id, amount_usd, status, created_date as dt \
                     from read_parquet('{}/*/*.parquet', hive_partitioning = true)",
                    dir.display()
                ),
            ]);
            for r in rows.as_array().unwrap() {
                let row = row_of(r);
                sources[i]
                    .entry(Model::of_day(&row).to_string())
                    .or_default()
                    .push(row);
            }
            lake.job(
                &format!("rep_{name}"),
                &format!(
                    r#"
name = "rep_{name}"
[sources.orders]
path = "src_{name}/"
partitioned_by = [{{ name = "created_date", type = "date" }}]
[transform]
sql = "select order_id, customer_id, amount_usd, status, created_date as dt from orders where created_date = $run_date"
[target]
path = "out/t"
format = "delta"
partition_by = ["dt"]
"#
                ),
            );
        }
        // Updates in place, a move to another day, and a new key.
        let changes = [
            ("2026-06-02", 17, 1, "1.01", "paid"),
            ("2026-06-03", 18, 2, "1.02", "moved"),
            ("2026-06-01", 900, 3, "1.03", "new"),
        ];
        let mut csv = String::from("order_id,customer_id,amount_usd,status,dt\n");
        for (dt, id, customer, amount, status) in changes {
            csv.push_str(&format!("{id},{customer},{amount},{status},{dt}\n"));
        }
        std::fs::write(lake.join("changes.csv"), csv).unwrap();
        lake.job(
            "merge",
            r#"
name = "merge"
[sources.changes]
path = "changes.csv"
format = "csv"
[transform]
sql = """
select order_id, customer_id, cast(amount_usd as decimal(12, 2)) as amount_usd, status,
       cast(dt as date) as dt
from changes
"""
[target]
path = "out/t"
format = "delta"
partition_by = ["dt"]
mode = "merge"
key = ["order_id"]
"#,
        );
        let changes = changes
            .iter()
            .map(|(dt, id, customer, amount, status)| {
                [
                    ("order_id", id.to_string()),
                    ("customer_id", customer.to_string()),
                    ("amount_usd", amount.to_string()),
                    ("status", status.to_string()),
                    ("dt", dt.to_string()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), Some(v)))
                .collect()
            })
            .collect();
        World {
            lake,
            sources,
            changes,
        }
    }

    /// The table before a schedule: every day from source A, one commit each.
    fn base(&self) -> Result<(), String> {
        let days = ["--from", DAYS[0], "--to", DAYS[2]];
        let args = [&["backfill", "jobs/rep_a.toml"][..], &days].concat();
        let out = idem_in(self.lake.path(), &args, &[]);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }

    fn source(&self, b: bool, day: &str) -> Vec<Row> {
        self.sources[b as usize]
            .get(day)
            .cloned()
            .unwrap_or_default()
    }

    fn table(&self) -> PathBuf {
        self.lake.join("out/t")
    }
}

fn row_of(v: &Value) -> Row {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().map(str::to_string)))
        .collect()
}

/// A writer of the schedule: not started yet, or its process.
enum Proc {
    Pending,
    Running(Child),
    Done(std::process::Output),
}

/// What one schedule did: steps taken, operations of the other writer started while
/// an idem commit was on its way or a merge had read the table, and writers that
/// failed as Delta allows (a conflict, a refusal).
#[derive(Default)]
struct Stats {
    steps: usize,
    raced: usize,
    refused: usize,
}

/// One explored schedule, or what broke.
fn schedule(seed: u64) -> Result<Stats, String> {
    let mut rng = Lcg(seed);
    let world = World::new();
    world.base()?;

    // One of idem's writers that commits, the next in turn with each eight seeds; one
    // operation of the other writer, the next in turn with each seed (so any eight
    // seeds in a row try every operation); and at random, one more of each.
    let committing = [
        Op::Replace { day: 1, b: true },
        Op::Merge,
        Op::Replace { day: 2, b: true },
        Op::Atomic,
    ];
    let more = [
        Op::Replace { day: 1, b: false },
        Op::Replace { day: 2, b: true },
        Op::Merge,
        Op::Vacuum,
        Op::Gc,
    ];
    let foreign = [
        "append",
        "merge-column",
        "replace-where",
        "delete",
        "optimize",
        "overwrite",
        "restore",
        "vacuum",
    ];
    let turn = seed.wrapping_sub(1) as usize;
    let mut ops = vec![committing[turn / foreign.len() % committing.len()].clone()];
    let other = more[(rng.next() % more.len() as u64) as usize].clone();
    if rng.next().is_multiple_of(2) && !ops.contains(&other) {
        ops.push(other);
    }
    ops.push(Op::Foreign(
        foreign[turn % foreign.len()],
        1 + (rng.next() % 2) as usize,
    ));
    if rng.next().is_multiple_of(3) {
        let op = foreign[(rng.next() % foreign.len() as u64) as usize];
        ops.push(Op::Foreign(op, 1 + (rng.next() % 2) as usize));
    }
    let names = || ops.iter().map(Op::name).collect::<Vec<_>>().join(", ");

    let steps_dir = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = (0..ops.len())
        .map(|i| {
            let dir = steps_dir.path().join(format!("w{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            dir
        })
        .collect();
    let start = |i: usize| -> Child {
        let mut cmd = ops[i].command(&world, i);
        if ops[i].stepped() {
            let spec: Vec<String> = POINTS
                .iter()
                .map(|p| format!("{p}=step:{}", dirs[i].display()))
                .collect();
            cmd.env("IDEM_FAILPOINTS", spec.join(";"));
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut procs: Vec<Proc> = (0..ops.len())
        .map(|i| {
            if ops[i].stepped() {
                Proc::Running(start(i))
            } else {
                Proc::Pending
            }
        })
        .collect();

    let started = Instant::now();
    let mut stats = Stats::default();
    loop {
        // Until no writer runs (each stopped at a step, blocked on a lock, or done) for
        // a few polls in a row: then the seed alone picks the next step.
        let mut calm = 0;
        while calm < 4 {
            let all = procs.iter().all(|p| match p {
                Proc::Running(c) => asleep(c.id()),
                _ => true,
            });
            calm = if all { calm + 1 } else { 0 };
            std::thread::sleep(Duration::from_millis(2));
        }
        for p in procs.iter_mut() {
            if let Proc::Running(c) = p
                && c.try_wait().unwrap().is_some()
            {
                let Proc::Running(c) = std::mem::replace(p, Proc::Pending) else {
                    unreachable!()
                };
                *p = Proc::Done(c.wait_with_output().unwrap());
            }
        }
        let stopped = waiting(&dirs);
        // A commit on its way: its files are in the table, named by no commit yet.
        let at = |point: &str| stopped.iter().any(|s| s.to_string_lossy().ends_with(point));
        let committing = at(".before_commit");
        let midway = committing || at(".merge_read") || at(".after_publish_one");
        let mut choices: Vec<Result<PathBuf, usize>> = stopped.into_iter().map(Ok).collect();
        for (i, p) in procs.iter().enumerate() {
            let vacuum = matches!(ops[i], Op::Foreign("vacuum", _));
            if matches!(p, Proc::Pending) && !(committing && vacuum) {
                choices.push(Err(i));
            }
        }
        if choices.is_empty() {
            if procs.iter().all(|p| matches!(p, Proc::Done(_))) {
                break;
            }
        } else {
            match &choices[(rng.next() % choices.len() as u64) as usize] {
                Ok(step) => std::fs::write(format!("{}.go", step.display()), "").unwrap(),
                Err(i) => {
                    if midway && matches!(ops[*i], Op::Foreign(..)) {
                        stats.raced += 1;
                    }
                    procs[*i] = Proc::Running(start(*i));
                }
            }
            stats.steps += 1;
        }
        if started.elapsed() > Duration::from_secs(300) {
            for p in procs.iter_mut() {
                if let Proc::Running(c) = p {
                    c.kill().ok();
                }
            }
            return Err(format!(
                "the schedule of {} did not finish in 300 s",
                names()
            ));
        }
    }

    let outs: Vec<std::process::Output> = procs
        .into_iter()
        .map(|p| match p {
            Proc::Done(out) => out,
            _ => unreachable!(),
        })
        .collect();
    for (op, out) in ops.iter().zip(&outs) {
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if !op.may_fail_with(&err) {
                return Err(format!("{} failed (of {}): {err}", op.name(), names()));
            }
            stats.refused += 1;
        }
    }

    // The table as it ends, and the model of its log.
    let out = Command::new(python())
        .arg(repo_root().join("testdata/py/readers.py"))
        .args(["delta-state", world.table().to_str().unwrap()])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(format!(
            "the table cannot be read after {}: {}",
            names(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let model = Model::of_log(&state, &world).map_err(|e| format!("{e} (of {})", names()))?;
    let columns: BTreeSet<String> = state["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let mut expected = BTreeSet::new();
    for r in &model.rows {
        if let Some((c, _)) = r.iter().find(|(c, v)| v.is_some() && !columns.contains(*c)) {
            return Err(format!("column {c} vanished (of {})", names()));
        }
        let r: Row = columns
            .iter()
            .map(|c| (c.clone(), r.get(c).cloned().flatten()))
            .collect();
        expected.insert(r);
    }
    let found: BTreeSet<Row> = state["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(row_of)
        .collect();
    if found != expected {
        let diff: Vec<String> = found
            .symmetric_difference(&expected)
            .map(|r| format!("{}{r:?}", if found.contains(r) { "+" } else { "-" }))
            .collect();
        let log: Vec<String> = state["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let what = c["idem"]["job"]
                    .as_str()
                    .map(|j| {
                        format!(
                            "idem {j} {}",
                            c["idem"]["partitions"].as_array().map_or(0, Vec::len)
                        )
                    })
                    .or_else(|| c["testOp"].as_str().map(str::to_string))
                    .unwrap_or_else(|| c["operation"].to_string());
                format!("v{} {what}", c["version"])
            })
            .collect();
        return Err(format!(
            "the table is not its log's model after {}; log {log:?}; differs by {diff:?}",
            names()
        ));
    }

    // Every partition an idem run reported written is in a commit of those rows.
    let committed: Vec<(String, String)> = state["history"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| {
            c["idem"]["partitions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|p| {
            (
                p["partition"].as_str().unwrap_or_default().to_string(),
                p["digest"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for (op, out) in ops.iter().zip(&outs) {
        if !op.stepped() || !out.status.success() {
            continue;
        }
        for report in json_lines(out) {
            for p in report["partitions"].as_array().cloned().unwrap_or_default() {
                if p["action"] != "written" {
                    continue;
                }
                let key = (
                    p["partition"].as_str().unwrap_or_default().to_string(),
                    p["digest"].as_str().unwrap_or_default().to_string(),
                );
                if !committed.contains(&key) {
                    return Err(format!(
                        "{} reported {} written, and no commit holds it (of {})",
                        op.name(),
                        key.0,
                        names()
                    ));
                }
            }
        }
    }
    Ok(stats)
}

/// Explores `IDEM_DELTA_SCHEDULES` (else `default`) schedules from `IDEM_SCHEDULE_SEED`
/// (else 1).
fn explore(default: u64) {
    let var = "IDEM_DELTA_SCHEDULES";
    let n: u64 = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    let first: u64 = std::env::var("IDEM_SCHEDULE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut all = Stats::default();
    for seed in first..first + n {
        match schedule(seed) {
            Ok(s) => {
                all.steps += s.steps;
                all.raced += s.raced;
                all.refused += s.refused;
            }
            Err(e) => panic!(
                "Delta schedule seed {seed} broke (rerun with {var}=1 \
                 IDEM_SCHEDULE_SEED={seed}): {e}"
            ),
        }
    }
    adversary_report(&format!(
        "schedules | Delta with another writer (local) | {n} schedules from seed {first} | \
         {} steps, {} of the other writer's operations amid an idem commit or merge, {} \
         writers refused or lost a conflict\n",
        all.steps, all.raced, all.refused
    ));
}

#[test]
fn random_schedules_with_another_delta_writer_end_as_the_log_says() {
    explore(32);
}

/// The rows of the table now, and its state as the model of its log says.
fn rows_and_model(world: &World) -> (BTreeSet<Row>, BTreeSet<Row>) {
    let state = readers(&["delta-state", world.table().to_str().unwrap()]);
    let model = Model::of_log(&state, world).unwrap();
    let rows = state["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(row_of)
        .collect();
    (rows, model.rows)
}

/// A merge read the table, another writer appended rows to a day the merge rewrites,
/// then the merge committed: its commit removed the appended file with the files it
/// rewrote, and those rows were gone for every reader (found by the search above, seed
/// 201). Now the commit finds the day changed since the merge read it, the merge is
/// computed again over the appended rows, and its commit keeps them.
#[test]
fn a_merge_never_removes_rows_another_writer_added_after_its_read() {
    let world = World::new();
    let lake = world.lake.path();
    world.base().unwrap();
    let hooks = tempfile::tempdir().unwrap();
    let merge = Command::new(bin())
        .args(["run", "jobs/merge.toml", "--date", DAYS[0]])
        .current_dir(lake)
        .env(
            "IDEM_FAILPOINTS",
            format!("before_commit=pause:{}", hooks.path().display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !hooks.path().join("before_commit.paused").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the merge never paused"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Day 3 gains key 18 from the merge.
    readers(&[
        "delta-op",
        world.table().to_str().unwrap(),
        "append",
        DAYS[2],
        "5000",
    ]);
    std::fs::write(hooks.path().join("before_commit.resume"), "").unwrap();
    let out = merge.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let (rows, model) = rows_and_model(&world);
    assert_eq!(rows, model);
    assert!(
        foreign_rows("append", DAYS[2], 5000)
            .iter()
            .all(|r| rows.contains(r))
    );
    assert!(world.changes.iter().all(|r| rows.contains(r)));
}
