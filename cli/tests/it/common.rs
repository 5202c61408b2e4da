//! Shared fixtures: a sample lake in a temporary directory, the idem binary, snapshots
//! of a table's file tree, and the independent Python readers.

use std::collections::BTreeMap;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// Every failpoint of the write and publish path, in order (io/src/failpoint.rs).
pub const FAILPOINTS: [&str; 8] = [
    "after_first_batch",
    "after_row_group",
    "after_footers",
    "after_stage",
    "before_publish",
    "before_swap",
    "after_swap",
    "after_publish_one",
];

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A working directory holding a copy of `testdata/` (so the example jobs' relative
/// paths work in it, as they do at the repository root).
pub struct Lake {
    pub dir: tempfile::TempDir,
}

impl Lake {
    pub fn new() -> Lake {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(
            &repo_root().join("testdata/lake"),
            &dir.path().join("testdata/lake"),
        );
        copy_dir(
            &repo_root().join("testdata/jobs"),
            &dir.path().join("testdata/jobs"),
        );
        Lake { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Runs idem in this directory.
    pub fn idem(&self, args: &[&str]) -> Output {
        idem_in(self.path(), args, &[])
    }

    /// Runs idem and expects success; returns the JSON lines it printed.
    pub fn idem_ok(&self, args: &[&str]) -> Vec<Value> {
        let out = self.idem(args);
        assert!(
            out.status.success(),
            "idem {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        json_lines(&out)
    }

    /// Writes a job file into the lake and returns its path (relative to the lake).
    pub fn job(&self, name: &str, text: &str) -> String {
        let rel = format!("jobs/{name}.toml");
        let p = self.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        rel
    }
}

pub fn idem_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("IDEM_FAILPOINTS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

pub fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l}: {e}")))
        .collect()
}

/// `(partition, action)` pairs of runs' JSON reports (or backfill events), sorted.
pub fn actions(reports: &[Value]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = reports
        .iter()
        // A run's report, or a backfill's `done` event holding one.
        .map(|r| {
            if r["event"] == "done" {
                &r["report"]
            } else {
                r
            }
        })
        .flat_map(|r| r["partitions"].as_array().cloned().unwrap_or_default())
        .map(|p| {
            (
                p["partition"].as_str().unwrap().to_string(),
                p["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// Every file and directory under `root` with what a reader or a backup tool would
/// notice: size, content hash, modification time and inode.
pub fn snapshot(root: &Path) -> BTreeMap<String, (u64, u64, i64, i64, u64)> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u64, u64, i64, i64, u64)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            let rel = e
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let hash = if m.is_file() {
                xxhash(&std::fs::read(e.path()).unwrap())
            } else {
                0
            };
            out.insert(
                rel,
                (
                    m.len() * m.is_file() as u64,
                    hash,
                    m.mtime(),
                    m.mtime_nsec(),
                    m.ino(),
                ),
            );
            if m.is_dir() {
                walk(root, &e.path(), out);
            }
        }
    }
    if root.exists() {
        walk(root, root, &mut out);
    }
    out
}

fn xxhash(b: &[u8]) -> u64 {
    // FNV-1a: enough to tell files apart in a test.
    let mut h: u64 = 0xcbf29ce484222325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Installs into `dir` once: `install` runs (failing with `failure`) unless
/// `dir/.ready` holds the text of `spec`, the file it was installed from, so a change
/// of `spec` reinstalls. Several test binaries may get here at once: a lock file beside
/// `dir` serialises them.
fn install_once(dir: &Path, spec: &Path, install: impl FnOnce() -> bool, failure: &str) {
    let wanted = std::fs::read_to_string(spec).unwrap();
    let ready = dir.join(".ready");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let lock = std::fs::File::create(dir.with_extension("lock")).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    if std::fs::read_to_string(&ready).ok().as_deref() != Some(wanted.as_str()) {
        assert!(install(), "{failure}");
        std::fs::write(&ready, &wanted).unwrap();
    }
}

/// Runs `cmd` (output discarded) and kills it with SIGKILL after `delay`; whether it
/// was still running then.
pub fn kill_after(mut cmd: Command, delay: std::time::Duration) -> bool {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(delay);
    let running = child.try_wait().unwrap().is_none();
    child.kill().ok();
    child.wait().unwrap();
    running
}

/// Starts every command at once, then waits for all; each must succeed.
pub fn all_at_once(cmds: impl IntoIterator<Item = Command>) -> Vec<Output> {
    let children: Vec<_> = cmds
        .into_iter()
        .map(|mut c| {
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            out
        })
        .collect()
}

/// The Python with DuckDB, Polars and pyarrow: `IDEM_PYTHON` if set, else a virtual
/// environment under `target/py-venv`, created on first use from
/// `testdata/py/requirements.txt` (needs access to PyPI once).
pub fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Ok(p) = std::env::var("IDEM_PYTHON") {
            return PathBuf::from(p);
        }
        let venv = repo_root().join("target/py-venv");
        let py = venv.join("bin/python");
        let req = repo_root().join("testdata/py/requirements.txt");
        install_once(
            &venv,
            &req,
            || {
                (py.exists()
                    || Command::new("python3")
                        .args(["-m", "venv"])
                        .arg(&venv)
                        .status()
                        .is_ok_and(|s| s.success()))
                    && Command::new(&py)
                        .args(["-m", "pip", "install", "-q", "-r"])
                        .arg(&req)
                        .status()
                        .is_ok_and(|s| s.success())
            },
            &format!(
                "could not install the Python readers (duckdb, polars, pyarrow) into {}; \
                 install them with `pip install -r testdata/py/requirements.txt` and set IDEM_PYTHON",
                venv.display()
            ),
        );
        py
    })
}

/// The endpoint of an S3-compatible server: `IDEM_S3_ENDPOINT` if set (CI starts one),
/// else a moto server started from the readers' environment on a free port, which
/// stops when this test process ends.
pub fn s3_endpoint() -> &'static str {
    static EP: OnceLock<String> = OnceLock::new();
    EP.get_or_init(|| {
        if let Ok(e) = std::env::var("IDEM_S3_ENDPOINT") {
            return e;
        }
        let server = python().parent().unwrap().join("moto_server");
        let port = serve(&server, "-H 127.0.0.1 -p {port}", "moto_server", None);
        format!("http://127.0.0.1:{port}")
    })
}

/// The environment a run needs to reach the test S3 server.
pub fn s3_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", s3_endpoint().to_string()),
        ("AWS_ALLOW_HTTP", "true".into()),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

/// Starts `program args` on a free 127.0.0.1 port (`{port}` in `args`), under a watchdog
/// shell that stops it once this test process is gone (then removes `data`, the
/// server's own directory, if any), and waits until it listens.
fn serve(program: &Path, args: &str, name: &str, data: Option<&Path>) -> u16 {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut watchdog = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' {} >/dev/null 2>&1 & s=$!; \
             while kill -0 {me} 2>/dev/null; do sleep 1; done; kill $s; wait $s; {cleanup}",
            program.display(),
            args.replace("{port}", &port.to_string()),
            me = std::process::id(),
            cleanup = data.map_or(String::new(), |d| format!("rm -rf '{}'", d.display()))
        ))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::spawn(move || watchdog.wait());
    for _ in 0..300 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return port;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{name} did not start on port {port}");
}

/// The blob endpoint of Azurite, the Azure Storage emulator: `IDEM_AZURITE_ENDPOINT` if
/// set (CI starts one), else an Azurite started on a free port from `target/azurite`
/// (installed there from `testdata/azurite` with npm on first use), which stops when
/// this test process ends.
pub fn azurite_endpoint() -> &'static str {
    static EP: OnceLock<String> = OnceLock::new();
    EP.get_or_init(|| {
        if let Ok(e) = std::env::var("IDEM_AZURITE_ENDPOINT") {
            return e;
        }
        let dir = repo_root().join("target/azurite");
        let bin = dir.join("node_modules/.bin/azurite-blob");
        install_once(
            &dir,
            &repo_root().join("testdata/azurite/package-lock.json"),
            || {
                std::fs::create_dir_all(&dir).unwrap();
                for f in ["package.json", "package-lock.json"] {
                    std::fs::copy(repo_root().join("testdata/azurite").join(f), dir.join(f))
                        .unwrap();
                }
                Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund", "--silent"])
                    .current_dir(&dir)
                    .status()
                    .is_ok_and(|s| s.success())
            },
            &format!(
                "could not install Azurite with npm into {}; install it there with \
                 `npm ci` (testdata/azurite) or start one and set IDEM_AZURITE_ENDPOINT",
                dir.display()
            ),
        );
        let data = tempfile::tempdir().unwrap().keep();
        let port = serve(
            &bin,
            &format!(
                "--blobHost 127.0.0.1 --blobPort {{port}} --location '{}' --silent --skipApiVersionCheck",
                data.display()
            ),
            "azurite-blob",
            Some(&data),
        );
        format!("http://127.0.0.1:{port}")
    })
}

/// The environment a run needs to reach the test Azurite (object_store's emulator
/// settings: the well-known development account, at `AZURITE_BLOB_STORAGE_URL`).
pub fn az_env() -> Vec<(&'static str, String)> {
    vec![
        ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
        ("AZURITE_BLOB_STORAGE_URL", azurite_endpoint().to_string()),
    ]
}

/// Runs `testdata/py/readers.py` and parses its JSON output.
pub fn readers(args: &[&str]) -> Value {
    let out = Command::new(python())
        .arg(repo_root().join("testdata/py/readers.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "readers.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// partition -> digest of a table, from `idem status`, asserting every partition is a
/// whole idem partition (its files are exactly its manifest's).
pub fn status_digests(lake: &Lake, table: &str) -> BTreeMap<String, String> {
    let out = lake.idem(&["status", table, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    s["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["state"], "managed", "mixed or foreign partition: {p}");
            (
                p["partition"].as_str().unwrap().to_string(),
                p["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}
