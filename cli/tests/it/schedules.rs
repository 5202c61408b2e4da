//! Schedule exploration: two to four writers of one table — replace runs of a date,
//! merges, a backfill, `gc` — started together as real `idem` processes, their steps
//! interleaved in a seeded random order. Every failpoint where a writer's work meets
//! the table's (`merge_read`, `after_stage`, `before_publish`, `before_swap`,
//! `after_swap`, `after_publish_one`, `gc_step`) is a scheduling point: the writer
//! stops there until the scheduler lets it go, and the scheduler lets one of the
//! stopped writers go at a time. Meanwhile a reader reads the table over and over: a
//! plain lister of a local table, and on S3 (where a plain lister may see two versions
//! during an apply, as documented) idem itself, through the partitions' markers, by a
//! job that copies the table. The checks: every writer succeeds; the table ends equal
//! to some serial order of the writers (computed by a model of what each does); every
//! partition the reader saw is one version's (its files are its manifest's) and a
//! version some serial order passes through (never rows of two versions).
//!
//! CI explores `IDEM_SCHEDULES` schedules (default 200) from seed `IDEM_SCHEDULE_SEED`
//! (default 1); `testdata/adversary.sh schedules N [SEED]` runs more, and a failure
//! names the seed that reproduces it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow::array::AsArray;
use arrow::datatypes::{Decimal128Type, Int64Type};

use crate::common::*;
use crate::crash::Lcg;

const POINTS: [&str; 8] = [
    "merge_read",
    "after_apply_copy",
    "after_stage",
    "before_publish",
    "before_swap",
    "after_swap",
    "after_publish_one",
    "gc_step",
];

const DAYS: [&str; 3] = ["2026-06-01", "2026-06-02", "2026-06-03"];

/// A row of the table: (dt, order_id, customer_id, amount in cents, status).
type Row = (String, i64, i64, i128, String);

/// What a reader saw of the table: its rows and its partitions.
type Seen = (BTreeSet<Row>, BTreeSet<String>);

/// The distinct contents a reader saw of each day (a day without rows: empty).
type Versions = BTreeMap<String, BTreeSet<Vec<Row>>>;

/// Adds what one read saw to `versions`.
fn record(versions: &mut Versions, rows: &BTreeSet<Row>) {
    for day in DAYS {
        let of_day: Vec<Row> = rows.iter().filter(|r| r.0 == day).cloned().collect();
        versions.entry(day.to_string()).or_default().insert(of_day);
    }
}

/// What a writer does.
#[derive(Clone, Debug)]
enum Writer {
    /// Replaces one day with source state A or B.
    Replace {
        day: usize,
        b: bool,
    },
    /// Upserts change set 0 or 1.
    Merge(usize),
    /// Replaces every day with source state B, two at once.
    Backfill,
    Gc,
}

impl Writer {
    fn name(&self) -> String {
        match self {
            Writer::Replace { day, b } => {
                format!("run {} from {}", DAYS[*day], if *b { "B" } else { "A" })
            }
            Writer::Merge(i) => format!("merge of change set {i}"),
            Writer::Backfill => "backfill from B".into(),
            Writer::Gc => "gc".into(),
        }
    }

    fn args(&self) -> Vec<String> {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        match self {
            Writer::Replace { day, b } => {
                let job = if *b {
                    "jobs/rep_b.toml"
                } else {
                    "jobs/rep_a.toml"
                };
                s(&["run", job, "--date", DAYS[*day]])
            }
            Writer::Merge(i) => s(&["run", &format!("jobs/merge{i}.toml"), "--date", DAYS[0]]),
            Writer::Backfill => s(&[
                "backfill",
                "jobs/rep_b.toml",
                "--from",
                DAYS[0],
                "--to",
                DAYS[2],
                "--concurrency",
                "2",
            ]),
            Writer::Gc => s(&["gc", "TARGET"]),
        }
    }

    /// The model: what the writer does to the table's rows and partitions.
    fn apply(&self, m: &mut Model, world: &World) {
        match self {
            Writer::Replace { day, b } => m.replace(DAYS[*day], &world.source(*b)[*day]),
            Writer::Backfill => {
                for (day, rows) in DAYS.iter().zip(world.source(true)) {
                    m.replace(day, rows);
                }
            }
            Writer::Merge(i) => m.merge(&world.changes[*i]),
            Writer::Gc => {}
        }
    }

    /// The runs a writer is made of, each atomic on its own: a backfill is one run
    /// per date, in any order relative to the other writers.
    fn runs(&self) -> Vec<Writer> {
        match self {
            Writer::Backfill => (0..DAYS.len())
                .map(|day| Writer::Replace { day, b: true })
                .collect(),
            Writer::Gc => Vec::new(),
            other => vec![other.clone()],
        }
    }
}

/// The table's rows (a key may sit in two partitions: a replace run does not look at
/// other partitions) and its partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Model {
    rows: BTreeSet<Row>,
    partitions: BTreeSet<String>,
}

impl Model {
    fn replace(&mut self, day: &str, rows: &[Row]) {
        self.rows.retain(|r| r.0 != day);
        self.rows.extend(rows.iter().cloned());
        self.partitions.insert(day.to_string());
    }

    /// Each change replaces every row of its key, wherever it is (the partitions it
    /// leaves are rewritten, maybe empty).
    fn merge(&mut self, changes: &[Row]) {
        for c in changes {
            let (gone, kept): (BTreeSet<Row>, BTreeSet<Row>) = std::mem::take(&mut self.rows)
                .into_iter()
                .partition(|r| r.1 == c.1);
            self.rows = kept;
            self.partitions.extend(gone.into_iter().map(|r| r.0));
            self.rows.insert(c.clone());
            self.partitions.insert(c.0.clone());
        }
    }

    fn of(rows: &BTreeSet<Row>, partitions: &BTreeSet<String>) -> Model {
        Model {
            rows: rows.clone(),
            partitions: partitions.clone(),
        }
    }
}

/// The lake, its jobs and the rows each source holds; the table is local (`out/t`) or
/// on moto's S3 server.
struct World {
    lake: Lake,
    target: String,
    s3: bool,
    a: Vec<Vec<Row>>,
    b: Vec<Vec<Row>>,
    changes: [Vec<Row>; 2],
}

impl World {
    fn new(s3: bool) -> World {
        let lake = Lake::new();
        let target = if s3 {
            let b = crate::s3::bucket("sched");
            idem_testdata::servers::create_bucket(s3_endpoint(), &format!("s3://{b}/"));
            format!("s3://{b}/t")
        } else {
            "out/t".to_string()
        };
        let mut sources = Vec::new();
        for (name, seed) in [("a", 1), ("b", 2)] {
            let dir = lake.join(&format!("src_{name}"));
            let spec = idem_testdata::OrdersSpec {
                days: 3,
                rows_per_day: 16,
                customers: 10,
                seed,
                ..Default::default()
            };
            idem_testdata::write_orders(&dir, &spec).unwrap();
            sources.push(read_source(&dir));
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
path = "{target}"
partition_by = ["dt"]
"#
                ),
            );
        }
        // Two change sets over the same keys: updates in place, moves to another
        // day, and a new key.
        let changes = [
            vec![
                ("2026-06-02".into(), 17, 1, 101, "paid".into()),
                ("2026-06-03".into(), 18, 2, 102, "moved".into()),
                ("2026-06-01".into(), 900, 3, 103, "new".into()),
            ],
            vec![
                ("2026-06-02".into(), 18, 4, 204, "paid".into()),
                ("2026-06-01".into(), 17, 5, 205, "moved".into()),
                ("2026-06-03".into(), 33, 6, 206, "paid".into()),
            ],
        ];
        for (i, rows) in changes.iter().enumerate() {
            let mut csv = String::from("order_id,customer_id,amount_usd,status,dt\n");
            for (dt, id, customer, cents, status) in rows {
                csv.push_str(&format!(
                    "{id},{customer},{}.{:02},{status},{dt}\n",
                    cents / 100,
                    cents % 100
                ));
            }
            std::fs::write(lake.join(&format!("changes{i}.csv")), csv).unwrap();
            lake.job(
                &format!("merge{i}"),
                &format!(
                    r#"
name = "merge{i}"
[sources.changes]
path = "changes{i}.csv"
format = "csv"
[transform]
sql = """
select order_id, customer_id, cast(amount_usd as decimal(12, 2)) as amount_usd, status,
       cast(dt as date) as dt
from changes
"""
[target]
path = "{target}"
partition_by = ["dt"]
mode = "merge"
key = ["order_id"]
"#
                ),
            );
        }
        // The reader of an object-store table: idem, copying it whole to local disk.
        lake.job(
            "copy",
            &format!(
                r#"
name = "copy"
[sources.t]
path = "{target}/"
[transform]
sql = "select order_id, customer_id, amount_usd, status, cast(dt as varchar) as dt from t"
[target]
path = "out/copy"
"#
            ),
        );
        let mut sources = sources.into_iter();
        let (a, b) = (sources.next().unwrap(), sources.next().unwrap());
        World {
            lake,
            target,
            s3,
            a,
            b,
            changes,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        if self.s3 { s3_env() } else { Vec::new() }
    }

    /// The table as a plain reader sees it once the writers are done (an object
    /// store's is downloaded first).
    fn read_settled(&self) -> Result<Seen, String> {
        let dir = tempfile::tempdir().unwrap();
        let table = if self.s3 {
            readers(&[
                "get",
                s3_endpoint(),
                &format!("{}/", self.target),
                dir.path().to_str().unwrap(),
            ]);
            dir.path().to_path_buf()
        } else {
            self.table()
        };
        loop {
            if let Some(found) = read_table(&table, self.s3)? {
                return Ok(found);
            }
        }
    }

    fn source(&self, b: bool) -> &Vec<Vec<Row>> {
        if b { &self.b } else { &self.a }
    }

    fn table(&self) -> PathBuf {
        self.lake.join("out/t")
    }
}

/// The rows of each day of a raw orders source.
fn read_source(dir: &Path) -> Vec<Vec<Row>> {
    DAYS.iter()
        .map(|day| {
            let file = dir.join(format!("created_date={day}/part-0.parquet"));
            read_rows(&file, day).unwrap()
        })
        .collect()
}

/// The rows of one Parquet file of the table (or a raw source file), on day `dt`.
fn read_rows(file: &Path, dt: &str) -> std::io::Result<Vec<Row>> {
    let (_, batches) = read_file(std::fs::File::open(file)?).map_err(std::io::Error::other)?;
    Ok(rows_of(&batches, Some(dt)))
}

/// An open Parquet file's manifest (if it has one) and rows.
fn read_file(
    file: std::fs::File,
) -> Result<
    (
        Option<idem_io::manifest::Manifest>,
        Vec<arrow::record_batch::RecordBatch>,
    ),
    String,
> {
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| e.to_string())?;
    let manifest = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| {
            kv.iter()
                .find(|kv| kv.key == idem_io::manifest::MANIFEST_KEY)
        })
        .and_then(|kv| kv.value.as_deref())
        .map(|json| serde_json::from_str(json).map_err(|e| e.to_string()))
        .transpose()?;
    let batches = builder
        .build()
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok((manifest, batches))
}

/// The rows of the copy an idem run made of an object-store table, or `None` when
/// that run failed because a newer commit deleted a file under its read (it never
/// returns rows of two versions; read again).
fn read_through_idem(lake: &Path, env: &[(&str, String)]) -> Result<Option<BTreeSet<Row>>, String> {
    let out = Command::new(bin())
        .args(["run", "jobs/copy.toml", "--date", DAYS[0]])
        .current_dir(lake)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("not found")
            || err.contains("NotFound")
            || err.contains("No such")
            || err.contains("another writer committed first")
        {
            return Ok(None);
        }
        return Err(format!("the reading run failed: {err}"));
    }
    let mut rows = BTreeSet::new();
    for f in std::fs::read_dir(lake.join("out/copy")).unwrap().flatten() {
        let (_, batches) = read_file(std::fs::File::open(f.path()).unwrap())?;
        rows.extend(rows_of(&batches, None));
    }
    Ok(Some(rows))
}

/// The rows of `batches`, on day `dt` (else the day of their `dt` column).
fn rows_of(batches: &[arrow::record_batch::RecordBatch], dt: Option<&str>) -> Vec<Row> {
    let mut out = Vec::new();
    for batch in batches {
        let col = |name: &str| batch.column(batch.schema().index_of(name).unwrap()).clone();
        let (ids, customers) = (col("order_id"), col("customer_id"));
        let (amounts, statuses) = (col("amount_usd"), col("status"));
        let statuses = arrow::compute::cast(&statuses, &arrow::datatypes::DataType::Utf8).unwrap();
        let days = dt.is_none().then(|| col("dt"));
        for i in 0..batch.num_rows() {
            out.push((
                match (dt, &days) {
                    (Some(dt), _) => dt.to_string(),
                    (None, Some(days)) => days.as_string::<i32>().value(i).to_string(),
                    (None, None) => unreachable!(),
                },
                ids.as_primitive::<Int64Type>().value(i),
                customers.as_primitive::<Int64Type>().value(i),
                amounts.as_primitive::<Decimal128Type>().value(i),
                statuses.as_string::<i32>().value(i).to_string(),
            ));
        }
    }
    out
}

/// The table as a plain reader sees it: every partition's rows, checked to be one
/// version's (the files listed are exactly the manifest's, and their rows' digest is
/// the manifest's). `Err` names a partition that is not; `Ok(None)` when a partition
/// changed under the read (a file gone): read again. A table downloaded from an object
/// store (`renamed`) holds its files under the names its commit gave them
/// (`part-<seq>-<i>`, one sequence number), while the footers name them as staged.
fn read_table(table: &Path, renamed: bool) -> Result<Option<Seen>, String> {
    let mut rows = BTreeSet::new();
    let mut partitions = BTreeSet::new();
    let Ok(dirs) = std::fs::read_dir(table) else {
        return Ok(Some((rows, partitions)));
    };
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        let Some(day) = name.strip_prefix("dt=") else {
            return Err(format!("{name} in the table"));
        };
        let Ok(listing) = std::fs::read_dir(d.path()) else {
            return Ok(None);
        };
        let mut files: Vec<String> = listing
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut newest: Option<idem_io::manifest::Manifest> = None;
        let mut digest = idem_io::digest::DigestState::default();
        for f in &files {
            // Opened by name once: a name never names another version's file, so a
            // file gone since the listing means the partition changed under the read.
            let Ok(file) = std::fs::File::open(d.path().join(f)) else {
                return Ok(None);
            };
            let (manifest, batches) = read_file(file).map_err(|e| format!("{name}/{f}: {e}"))?;
            let manifest = manifest.ok_or_else(|| format!("{name}/{f} has no manifest"))?;
            if newest
                .as_ref()
                .is_none_or(|n| manifest.generation > n.generation)
            {
                newest = Some(manifest);
            }
            for b in &batches {
                digest.update(b);
            }
            rows.extend(rows_of(&batches, Some(day)));
        }
        let manifest = newest.ok_or_else(|| format!("{name} holds no data file"))?;
        let mut listed: Vec<String> = manifest.files.iter().map(|f| f.name.clone()).collect();
        listed.sort();
        if renamed {
            let seq = files[0].split('-').nth(1).unwrap_or_default();
            listed = (0..listed.len())
                .map(|i| format!("part-{seq}-{i:05}.parquet"))
                .collect();
        }
        if listed != files {
            return Err(format!("{name}: files {files:?}, manifest {listed:?}"));
        }
        if digest.finish() != manifest.digest {
            return Err(format!("{name}: its files' rows are not its manifest's"));
        }
        partitions.insert(day.to_string());
    }
    Ok(Some((rows, partitions)))
}

/// One explored schedule; `Err` describes what broke.
fn schedule(seed: u64, s3: bool) -> Result<(usize, usize), String> {
    let mut rng = Lcg(seed);
    let world = World::new(s3);
    let env = world.env();
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // The table before: every day from A.
    let base = idem_in(
        world.lake.path(),
        &[
            "backfill",
            "jobs/rep_a.toml",
            "--from",
            DAYS[0],
            "--to",
            DAYS[2],
        ],
        &env_refs,
    );
    if !base.status.success() {
        return Err(String::from_utf8_lossy(&base.stderr).into_owned());
    }
    let mut before = Model::default();
    for (day, rows) in DAYS.iter().zip(&world.a) {
        before.replace(day, rows);
    }

    // Two to four writers, drawn from the menu (at most one backfill and one gc).
    let menu = [
        Writer::Replace { day: 1, b: true },
        Writer::Replace { day: 1, b: false },
        Writer::Replace { day: 2, b: true },
        Writer::Merge(0),
        Writer::Merge(1),
        Writer::Backfill,
        Writer::Gc,
    ];
    let count = 2 + (rng.next() % 3) as usize;
    let mut writers: Vec<Writer> = Vec::new();
    while writers.len() < count {
        let w = &menu[(rng.next() % menu.len() as u64) as usize];
        let dup = writers.iter().any(|x| {
            matches!(
                (x, w),
                (Writer::Backfill, Writer::Backfill) | (Writer::Gc, Writer::Gc)
            )
        });
        if !dup {
            writers.push(w.clone());
        }
    }

    // A reader over the whole schedule: a plain lister of a local table, idem itself
    // of an object store's.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, reads, table) = (Arc::clone(&stop), Arc::clone(&reads), world.table());
        let (lake, env) = (world.lake.path().to_path_buf(), world.env());
        std::thread::spawn(move || -> Result<Versions, String> {
            let mut versions = Versions::new();
            while !stop.load(Ordering::SeqCst) {
                let rows = if s3 {
                    read_through_idem(&lake, &env)?
                } else if let Some((rows, partitions)) = read_table(&table, false)? {
                    // Every day is live all along: never a gap.
                    if partitions.len() != DAYS.len() {
                        return Err(format!("a gap: only {partitions:?}"));
                    }
                    Some(rows)
                } else {
                    None
                };
                if let Some(rows) = rows {
                    record(&mut versions, &rows);
                    reads.fetch_add(1, Ordering::SeqCst);
                }
                // Leave the writers a core: they make the steps worth reading between.
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(versions)
        })
    };

    let steps_dir = tempfile::tempdir().unwrap();
    let mut children: Vec<(Child, PathBuf)> = writers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let dir = steps_dir.path().join(format!("w{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let spec: Vec<String> = POINTS
                .iter()
                .map(|p| format!("{p}=step:{}", dir.display()))
                .collect();
            let args: Vec<String> = w
                .args()
                .into_iter()
                .map(|a| a.replace("TARGET", &world.target))
                .collect();
            let child = Command::new(bin())
                .args(args)
                .current_dir(world.lake.path())
                .envs(world.env())
                .env("IDEM_FAILPOINTS", spec.join(";"))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (child, dir)
        })
        .collect();

    // Let one stopped writer go at a time, in a seeded order.
    let started = Instant::now();
    let mut steps = 0;
    let mut exited = vec![None; children.len()];
    loop {
        // Until every writer is stopped at a step, blocked on a lock, idle or done
        // (no thread of any is running), the same for a few polls in a row: then the
        // set of stopped writers is what the schedule so far makes it, and the seed
        // alone picks the next.
        let mut calm = 0;
        while calm < 4 {
            calm = if children.iter().all(|(c, _)| asleep(c.id())) {
                calm + 1
            } else {
                0
            };
            std::thread::sleep(Duration::from_millis(2));
        }
        for (i, (child, _)) in children.iter_mut().enumerate() {
            if exited[i].is_none() {
                exited[i] = child.try_wait().unwrap();
            }
        }
        let dirs: Vec<PathBuf> = children.iter().map(|(_, d)| d.clone()).collect();
        let stopped = waiting(&dirs);
        if stopped.is_empty() {
            if exited.iter().all(Option::is_some) {
                break;
            }
        } else {
            let pick = &stopped[(rng.next() % stopped.len() as u64) as usize];
            std::fs::write(format!("{}.go", pick.display()), "").unwrap();
            steps += 1;
        }
        if started.elapsed() > Duration::from_secs(300) {
            for (c, _) in children.iter_mut() {
                c.kill().ok();
            }
            return Err("the schedule did not finish in 300 s".into());
        }
    }
    stop.store(true, Ordering::SeqCst);
    let read = reader.join().unwrap();
    let mut errors = Vec::new();
    for ((child, _), w) in children.into_iter().zip(&writers) {
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            errors.push(format!(
                "{} failed: {}",
                w.name(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let seen = read.map_err(|e| format!("a reader saw a mixed partition: {e}"))?;
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }

    // Some serial order of the writers gives the table's rows and partitions.
    let (rows, partitions) = world.read_settled()?;
    let end = Model::of(&rows, &partitions);
    let runs: Vec<Writer> = writers.iter().flat_map(Writer::runs).collect();
    let mut orders = Vec::new();
    permutations(&mut (0..runs.len()).collect::<Vec<_>>(), 0, &mut orders);
    let serial = orders.iter().any(|order| {
        let mut m = before.clone();
        for &i in order {
            runs[i].apply(&mut m, &world);
        }
        m == end
    });
    // Every day the reader saw is that day in a state some serial order passes through.
    let mut reachable = Versions::new();
    for order in &orders {
        let mut m = before.clone();
        record(&mut reachable, &m.rows);
        for &i in order {
            runs[i].apply(&mut m, &world);
            record(&mut reachable, &m.rows);
        }
    }
    for (day, versions) in &seen {
        if let Some(v) = versions.iter().find(|v| !reachable[day].contains(*v)) {
            return Err(format!(
                "a reader saw {day} with rows of no version a serial order of {} passes \
                 through: {v:?}",
                writers
                    .iter()
                    .map(Writer::name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if !serial {
        // The closest serial order, to show what differs.
        let closest = orders
            .iter()
            .map(|order| {
                let mut m = before.clone();
                for &i in order {
                    runs[i].apply(&mut m, &world);
                }
                let diff: Vec<String> = m
                    .rows
                    .symmetric_difference(&end.rows)
                    .map(|r| format!("{}{r:?}", if end.rows.contains(r) { "+" } else { "-" }))
                    .collect();
                (diff, order.clone())
            })
            .min_by_key(|(d, _)| d.len())
            .unwrap_or_default();
        return Err(format!(
            "the table matches no serial order of: {}; the closest, {}, differs by {:?}",
            writers
                .iter()
                .map(Writer::name)
                .collect::<Vec<_>>()
                .join(", "),
            closest
                .1
                .iter()
                .map(|&i| runs[i].name())
                .collect::<Vec<_>>()
                .join(" < "),
            closest.0
        ));
    }
    Ok((steps, reads.load(Ordering::SeqCst)))
}

/// Whether no thread of process `pid` is running or in uninterruptible I/O (a gone
/// process is asleep).
pub(crate) fn asleep(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !matches!(state.and_then(|s| s.chars().next()), Some('R' | 'D'))
    })
}

/// The step files of stopped writers (each stepping in its own directory of `dirs`)
/// that were not let go yet.
pub(crate) fn waiting(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        let names: BTreeSet<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        for n in &names {
            if !n.ends_with(".go") && !names.contains(&format!("{n}.go")) {
                out.push(dir.join(n));
            }
        }
    }
    out.sort();
    out
}

fn permutations(items: &mut Vec<usize>, k: usize, out: &mut Vec<Vec<usize>>) {
    if k == items.len() {
        out.push(items.clone());
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items, k + 1, out);
        items.swap(k, i);
    }
}

/// Explores `IDEM_SCHEDULES` (else `default`) schedules from `IDEM_SCHEDULE_SEED` (else 1).
fn explore(s3: bool, default: u64) {
    let var = if s3 {
        "IDEM_S3_SCHEDULES"
    } else {
        "IDEM_SCHEDULES"
    };
    let n: u64 = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    let first: u64 = std::env::var("IDEM_SCHEDULE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let backend = if s3 { "S3" } else { "local" };
    let (mut steps, mut reads) = (0, 0);
    for seed in first..first + n {
        match schedule(seed, s3) {
            Ok((s, r)) => {
                steps += s;
                reads += r;
            }
            Err(e) => panic!(
                "{backend} schedule seed {seed} broke (rerun with {var}=1 \
                 IDEM_SCHEDULE_SEED={seed}): {e}"
            ),
        }
    }
    let text = format!(
        "schedules | {backend} | {n} schedules from seed {first} | {steps} steps, {reads} reads of the whole table\n"
    );
    adversary_report(&text);
}

#[test]
fn random_schedules_of_concurrent_writers_end_in_a_serial_order() {
    explore(false, 200);
}

/// The same on S3 (moto), where each partition commits on its own marker and a
/// table-wide lease serializes publishes. Fewer by default: moto is slow.
#[test]
fn random_schedules_on_an_object_store_end_in_a_serial_order() {
    explore(true, 30);
}
