//! A world for one table: its source files, its jobs, where the table lives (a local
//! directory, an in-memory object store, or a bucket on moto) and its format (Hive
//! Parquet or Delta), with a token in every path and key of it so fault plans can be
//! scoped to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_engine::job::Job;
use idem_engine::run::{Quiet, RunOptions};
use object_store::ObjectStoreExt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Local,
    Memory,
    Moto,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Memory => "in-memory",
            Backend::Moto => "moto (S3)",
        }
    }

    pub fn is_object_store(self) -> bool {
        self != Backend::Local
    }
}

/// Two states of three days of raw orders: A and B (same keys, other values).
pub struct Sources {
    pub a: tempfile::TempDir,
    pub b: tempfile::TempDir,
}

impl Sources {
    pub fn new() -> Sources {
        let generate = |seed| {
            let dir = tempfile::tempdir().unwrap();
            let spec = idem_testdata::OrdersSpec {
                days: 3,
                rows_per_day: 12,
                customers: 20,
                seed,
                ..Default::default()
            };
            idem_testdata::write_orders(dir.path(), &spec).unwrap();
            dir
        };
        Sources {
            a: generate(1),
            b: generate(2),
        }
    }
}

pub struct World {
    pub backend: Backend,
    /// A Delta table (`format = "delta"`), else Hive-partitioned Parquet.
    pub delta: bool,
    pub dir: tempfile::TempDir,
    /// In every path and key of this world's table.
    pub token: String,
    pub target: String,
    /// Extra `[storage]` lines of its jobs (moto's endpoint).
    storage: String,
}

/// A world's table, to start others from: its token and its objects (key, bytes).
pub struct Snapshot {
    token: String,
    objects: Vec<(String, Vec<u8>)>,
}

/// partition → digest.
pub type Digests = BTreeMap<String, String>;

impl World {
    pub fn new(backend: Backend, tag: &str, sources: &Sources) -> World {
        World::of(backend, false, tag, sources)
    }

    /// A world whose table is a Delta table when `delta`.
    pub fn of(backend: Backend, delta: bool, tag: &str, sources: &Sources) -> World {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let token = format!(
            "fx{}{tag}{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new().prefix(&token).tempdir().unwrap();
        let (target, storage) = match backend {
            Backend::Local => (dir.path().join("t").display().to_string(), String::new()),
            Backend::Memory => (format!("memory://faults/{token}/t"), String::new()),
            Backend::Moto => {
                let endpoint = idem_testdata::servers::s3_endpoint();
                // A bucket of its own: the server lists a prefix by scanning its
                // bucket's keys, so a shared bucket slows every list of the search.
                // The keys hold the token too: fault plans are scoped by key.
                idem_testdata::servers::create_bucket(endpoint, &format!("s3://{token}/"));
                (
                    format!("s3://{token}/{token}/t"),
                    format!(
                        "[storage]\nendpoint = \"{endpoint}\"\nallow_http = true\npath_style = true\nregion = \"us-east-1\"\n"
                    ),
                )
            }
        };
        let w = World {
            backend,
            delta,
            dir,
            token,
            target,
            storage,
        };
        w.use_source(&sources.a);
        w
    }

    /// The fault scopes of this world: its table's paths and keys, and the local
    /// staging of object-store tables.
    pub fn scopes(&self) -> Vec<String> {
        vec![self.token.clone(), "idem-staging".into()]
    }

    /// Makes the world's source hold `state`'s files.
    pub fn use_source(&self, state: &tempfile::TempDir) {
        let to = self.dir.path().join("src");
        let _ = std::fs::remove_dir_all(&to);
        copy_dir(state.path(), &to);
    }

    fn job(&self, name: &str, body: &str) -> Job {
        let text = format!("name = \"{name}\"\n{body}\n{}", self.storage)
            .replace("SRC", &self.dir.path().join("src").display().to_string())
            .replace("TARGET", &self.target)
            .replace(
                "[target]\n",
                if self.delta {
                    "[target]\nformat = \"delta\"\n"
                } else {
                    "[target]\n"
                },
            );
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        Job::load(&path).unwrap()
    }

    /// A daily job; with `lookback = 2` a run owns three days.
    pub fn daily(&self, lookback: u32) -> Job {
        self.job(
            "daily",
            &format!(
                r#"lookback = {lookback}
[sources.orders]
path = "SRC/"
partitioned_by = [{{ name = "created_date", type = "date" }}]
[transform]
sql = """
select order_id, customer_id, amount_usd, status, created_date as dt
from orders
where created_date >= cast($run_start as date) and created_date < cast($run_end as date)
"""
[target]
path = "TARGET"
partition_by = ["dt"]
"#
            ),
        )
    }

    /// A merge of each day's orders into an unpartitioned table clustered by key, in
    /// small files, so a merge of one day keeps the other days' files.
    pub fn merge(&self) -> Job {
        self.job(
            "merged",
            r#"[sources.orders]
path = "SRC/"
partitioned_by = [{ name = "created_date", type = "date" }]
[transform]
sql = """
select order_id, customer_id, amount_usd, status
from orders
where created_date = $run_date
order by order_id
"""
[target]
path = "TARGET"
mode = "merge"
key = ["order_id"]
row_group_rows = 4
file_size = "1 KiB"
"#,
        )
    }

    pub fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    pub fn run(&self, job: &Job, date: &str) -> Result<(), String> {
        self.run_as(job, date, None)
    }

    /// A run on this process's in-process cluster (`--cluster standalone`): the
    /// executor's tasks write and stage the partitions, this client publishes them.
    pub fn run_on_cluster(&self, job: &Job, date: &str) -> Result<(), String> {
        self.run_as(job, date, Some(idem_engine::cluster::Cluster::Standalone))
    }

    fn run_as(
        &self,
        job: &Job,
        date: &str,
        cluster: Option<idem_engine::cluster::Cluster>,
    ) -> Result<(), String> {
        let opts = RunOptions {
            date: date.into(),
            cluster,
            ..Default::default()
        };
        Self::runtime()
            .block_on(idem_engine::run::run(job, &opts, Arc::new(Quiet)))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    pub fn backfill(&self, job: &Job, dates: &[&str]) -> Result<(), String> {
        self.backfill_as(job, dates, false)
    }

    /// A backfill of `dates`, two at once; with `atomic` (Delta), one commit or none.
    pub fn backfill_as(&self, job: &Job, dates: &[&str], atomic: bool) -> Result<(), String> {
        let opts = idem_engine::backfill::BackfillOptions {
            dates: dates.iter().map(|d| d.to_string()).collect(),
            vars: Vec::new(),
            concurrency: 2,
            fail_fast: false,
            skip_fresh: false,
            cluster: None,
            stop: Default::default(),
            rewrite: false,
            atomic,
        };
        let outcomes = Self::runtime().block_on(idem_engine::backfill::backfill(
            job,
            &opts,
            Arc::new(|_| {}),
        ));
        let failed: Vec<String> = outcomes
            .into_iter()
            .filter_map(|o| o.result.err().map(|e| format!("{}: {e}", o.date)))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }

    pub fn gc(&self) -> Result<(), String> {
        idem_engine::status::gc(Path::new(&self.target))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// `idem vacuum --retain-hours 0` on a Delta table: every file no version reads
    /// goes now.
    pub fn vacuum(&self) -> Result<(), String> {
        idem_engine::status::vacuum(
            Path::new(&self.target),
            Some(std::time::Duration::ZERO),
            false,
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    /// On a Delta table, [`Self::vacuum`]; nothing to do on a Parquet one.
    pub fn sweep(&self) -> Result<(), String> {
        match self.delta {
            true => self.vacuum(),
            false => Ok(()),
        }
    }

    /// The data files of the Delta table that its latest version does not read (a
    /// lister's view against the log's), relative to the table.
    pub fn unread_files(&self) -> Vec<String> {
        let scan = idem_io::table::delta_scan(&self.target, &self.job_storage())
            .unwrap()
            .expect("a Delta table");
        let root = self.target.trim_end_matches('/').to_string() + "/";
        let read: std::collections::BTreeSet<String> = scan
            .partitions
            .into_iter()
            .flat_map(|(_, urls)| urls)
            .map(|u| {
                let u = u.strip_prefix("file://").unwrap_or(&u);
                u.strip_prefix(&root).unwrap_or(u).to_string()
            })
            .collect();
        let all: Vec<String> = match self.backend {
            Backend::Local => {
                let mut files = Vec::new();
                walk(Path::new(&self.target), &mut files);
                files
                    .into_iter()
                    .map(|f| f.strip_prefix(&root).unwrap_or(&f).to_string())
                    .collect()
            }
            _ => {
                let (store, prefix) = self.store_root();
                let table = format!("{prefix}t/");
                Self::runtime().block_on(async {
                    use futures::TryStreamExt;
                    store
                        .list(Some(&idem_io::store::raw_key(&table)))
                        .map_ok(|o| {
                            let k = o.location.to_string();
                            k.strip_prefix(&table).unwrap_or(&k).to_string()
                        })
                        .try_collect()
                        .await
                        .unwrap()
                })
            }
        };
        all.into_iter()
            .filter(|f| !f.starts_with("_delta_log/") && !read.contains(f))
            .collect()
    }

    /// The table's partitions as `idem status` reports them: (state, digest).
    pub fn status(&self) -> Result<BTreeMap<String, (String, String)>, String> {
        let status =
            idem_engine::status::status(Path::new(&self.target)).map_err(|e| e.to_string())?;
        Ok(status
            .partitions
            .into_iter()
            .map(|p| {
                (
                    p.partition,
                    (p.state.to_string(), p.digest.unwrap_or_default()),
                )
            })
            .collect())
    }

    /// partition → digest, every partition whole (its files exactly its manifest's).
    pub fn digests(&self) -> Digests {
        let status = self.status().unwrap_or_default();
        status
            .into_iter()
            .map(|(p, (state, digest))| {
                assert_eq!(state, "managed", "{}: {p} is {state}", self.backend.name());
                (p, digest)
            })
            .collect()
    }

    /// What runs left staged: directories under the local staging area, or keys under
    /// the object store's (and their local staging, for object stores).
    pub fn staged(&self) -> Vec<String> {
        let list = |dir: &Path| -> Vec<String> {
            std::fs::read_dir(dir)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.path().display().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        match self.backend {
            Backend::Local => list(&self.dir.path().join("_idem/t/staging")),
            _ => {
                let (store, root) = self.store_root();
                let meta = format!("{root}_idem/t/staging");
                let rt = Self::runtime();
                let mut keys: Vec<String> = rt.block_on(async {
                    use futures::TryStreamExt;
                    store
                        .list(Some(&idem_io::store::raw_key(&meta)))
                        .map_ok(|o| o.location.to_string())
                        .try_collect()
                        .await
                        .unwrap()
                });
                // Its runs' local staging directories, if any is left.
                let local = idem_io::store::local_staging_root().join(format!(
                    "{:016x}",
                    xxhash_rust::xxh3::xxh3_64(self.target.as_bytes())
                ));
                keys.extend(list(&local));
                keys
            }
        }
    }

    /// The objects of this world's table (data and `_idem`), to start other worlds
    /// from its state (object stores only).
    pub fn snapshot(&self) -> Snapshot {
        assert!(self.backend.is_object_store());
        let (store, root) = self.store_root();
        let objects = Self::runtime().block_on(async {
            use futures::TryStreamExt;
            let listed: Vec<_> = store
                .list(Some(&idem_io::store::raw_key(&root)))
                .try_collect()
                .await
                .unwrap();
            let mut objects = Vec::new();
            for o in listed {
                let bytes = store.get(&o.location).await.unwrap().bytes().await.unwrap();
                objects.push((o.location.to_string(), bytes.to_vec()));
            }
            objects
        });
        Snapshot {
            token: self.token.clone(),
            objects,
        }
    }

    /// Makes this new world's table hold `snapshot`'s objects, with the other world's
    /// keys made this one's, in object names and in the records that name keys (a
    /// commit marker names its staging). Paths of the other world's source, recorded
    /// in manifests as what a run read, are kept. The world's own source is left as
    /// it is.
    pub fn restore(&self, snapshot: &Snapshot) {
        let (store, _) = self.store_root();
        let (from, to) = (format!("{}/", snapshot.token), format!("{}/", self.token));
        Self::runtime().block_on(async {
            for (key, bytes) in &snapshot.objects {
                let key = key.replace(&from, &to);
                let bytes = if key.ends_with(".json") {
                    String::from_utf8(bytes.clone())
                        .unwrap()
                        .replace(&from, &to)
                        .into_bytes()
                } else {
                    assert!(
                        !bytes.windows(from.len()).any(|w| w == from.as_bytes()),
                        "{key} names a key of its world"
                    );
                    bytes.clone()
                };
                store
                    .put(&idem_io::store::raw_key(&key), bytes.into())
                    .await
                    .unwrap();
            }
        });
    }

    /// This world's store, and the prefix of its table's keys and `_idem`.
    fn store_root(&self) -> (Arc<dyn object_store::ObjectStore>, String) {
        let store = idem_io::store::object_store(&self.target, &self.job_storage()).unwrap();
        let key = idem_io::store::key_of(&self.target);
        let root = key
            .strip_suffix("/t")
            .expect("the table is `t`")
            .to_string()
            + "/";
        (store, root)
    }

    fn job_storage(&self) -> idem_io::store::StorageOptions {
        match self.backend {
            Backend::Moto => idem_io::store::StorageOptions {
                endpoint: Some(idem_testdata::servers::s3_endpoint().to_string()),
                region: Some("us-east-1".into()),
                allow_http: Some(true),
                path_style: Some(true),
            },
            _ => Default::default(),
        }
    }
}

fn walk(dir: &Path, files: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&e.path(), files);
        } else {
            files.push(e.path().display().to_string());
        }
    }
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target: PathBuf = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
