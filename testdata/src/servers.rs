//! The servers and tools idem's tests run against, shared by every test binary: the
//! Python readers (DuckDB, Polars, pyarrow) in a virtual environment, moto's S3 server
//! and Azurite, each installed once (on first use, from the package registries) and
//! started once per test process, unless the environment names running ones
//! (`IDEM_PYTHON`, `IDEM_S3_ENDPOINT`, `IDEM_AZURITE_ENDPOINT`, as CI sets them).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The repository's root (this crate lives in `testdata/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testdata has a parent")
        .to_path_buf()
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
        private_s3_endpoint()
    })
}

/// A moto server of its own, started on a free port, which stops when this test
/// process ends: for a search whose requests would queue behind others' on the
/// shared one (moto answers on one core).
pub fn private_s3_endpoint() -> String {
    let script = repo_root().join("testdata/py/s3_server.py");
    let args = format!("'{}' 127.0.0.1 {{port}}", script.display());
    let port = serve(python(), &args, "the S3 server (moto)", None);
    format!("http://127.0.0.1:{port}")
}

/// A faulty network in front of the S3 server at `upstream`
/// (`testdata/py/wire_proxy.py`): a seeded share `rate` of the requests through it is
/// reset, loses its answer, gets a truncated answer, a burst of 503 SlowDown, a stall
/// or a duplicate; with `down`, every request gets 503. It counts what it did in the
/// JSON file `stats`. Returns its endpoint; it stops when this test process ends.
pub fn wire_proxy(upstream: &str, seed: u64, rate: f64, down: bool, stats: &Path) -> String {
    let script = repo_root().join("testdata/py/wire_proxy.py");
    let args = format!(
        "'{}' {{port}} '{upstream}' {seed} {rate} '{}' {}",
        script.display(),
        stats.display(),
        if down { "down" } else { "" }
    );
    let port = serve(python(), &args, "the wire proxy", None);
    format!("http://127.0.0.1:{port}")
}

/// The environment a run needs to reach the test S3 server.
pub fn s3_env() -> Vec<(&'static str, String)> {
    s3_env_of(s3_endpoint())
}

/// The environment a run needs to reach the S3 server at `endpoint`.
pub fn s3_env_of(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
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
    // Up to two minutes: several servers may start at once on two cores, each
    // importing its Python packages from source (PYTHONDONTWRITEBYTECODE).
    for _ in 0..1200 {
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
        let data = unique_temp_dir("azurite");
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

/// `PUT /name` on the test S3 server (it takes unsigned requests): a bucket in a few
/// milliseconds, where a Python client takes a second to start.
fn create_s3_bucket(endpoint: &str, name: &str) {
    use std::io::{Read, Write};
    let host = endpoint
        .strip_prefix("http://")
        .expect("the test S3 server speaks plain HTTP");
    let mut s = std::net::TcpStream::connect(host).expect("connect to the test S3 server");
    write!(
        s,
        "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("send to the test S3 server");
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .expect("read the test S3 server's answer");
    let status = answer.lines().next().unwrap_or_default();
    assert!(
        status.contains(" 200 ") || answer.contains("BucketAlreadyOwnedByYou"),
        "creating bucket {name} on {endpoint}: {answer}"
    );
}

/// A new directory under the system's temporary directory.
fn unique_temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "idem-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    dir
}

/// Creates the bucket (S3) or container (Azure) of `url` (`s3://name/`, `az://name/`)
/// on the server at `endpoint`: on the test S3 server with one request, on Azurite
/// through the Python readers.
pub fn create_bucket(endpoint: &str, url: &str) {
    if let Some(name) = url.strip_prefix("s3://") {
        return create_s3_bucket(endpoint, name.trim_end_matches('/'));
    }
    let empty = unique_temp_dir("empty");
    let out = Command::new(python())
        .arg(repo_root().join("testdata/py/readers.py"))
        .args(["put", endpoint, empty.to_str().expect("utf-8 path"), url])
        .output()
        .expect("run the Python readers");
    let _ = std::fs::remove_dir(&empty);
    assert!(
        out.status.success(),
        "creating {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
