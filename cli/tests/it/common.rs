//! Shared fixtures: a sample lake in a temporary directory, the idem binary, snapshots
//! of a table's file tree, and the independent Python readers.

use std::collections::BTreeMap;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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

pub use idem_testdata::servers::{
    az_env, azurite_endpoint, python, repo_root, s3_endpoint, s3_env,
};

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

/// The `idem` binary under test: this build's, or the one `IDEM_TEST_BIN` names (to
/// show that a regression test fails on an older build).
pub fn bin() -> PathBuf {
    std::env::var_os("IDEM_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_idem")))
}

pub fn idem_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
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

/// The one data file of the partition directory `dir` (each version of a partition
/// names its files anew, so tests do not spell them).
pub fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    assert_eq!(files.len(), 1, "{}: {files:?}", dir.display());
    files.into_iter().next().unwrap()
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
    status_digests_with(lake, table, &[])
}

/// [`status_digests`] with `env` set (an object store's server and credentials).
pub fn status_digests_with(
    lake: &Lake,
    table: &str,
    env: &[(&str, &str)],
) -> BTreeMap<String, String> {
    let out = idem_in(lake.path(), &["status", table, "--json"], env);
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

/// Prints a line of what an adversarial test did and appends it to
/// `target/adversary-report.txt`, which `.ci/run` prints at its end.
pub fn adversary_report(text: &str) {
    eprint!("{text}");
    let path = repo_root().join("target/adversary-report.txt");
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(text.as_bytes());
    }
}
