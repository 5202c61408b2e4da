//! Fault injection under every storage call, so tests can fail each call of a run in
//! turn instead of the few moments someone thought of.
//!
//! Every filesystem call of the write, publish, recovery and gc paths goes through
//! the `fs` module, and every object-store call through [`FaultStore`]; both ask
//! [`point`] first. Calls are numbered from 1 in the order they reach it. A plan fails
//! one of them:
//!
//! * `fail@N`: call N fails before it has any effect (an I/O error, a refused request);
//! * `lose@N`: the N-th call that changes storage (a put, copy, delete, rename, write,
//!   …) takes effect, then reports failure: a write whose answer is lost. Reads are not
//!   counted, as a lost read is a failed one;
//! * `crash@N`: the process dies at call N. In a test process (armed through [`arm`])
//!   the process cannot die, so from call N on every call fails without effect: what
//!   the dead process did is exactly calls 1 … N−1, and nothing it does afterwards
//!   reaches storage (its locks held by open descriptors are released as a dead
//!   process's would be, and its leases go stale);
//! * `pause@N`: call N waits, before it is made, until the file `fault.resume` appears
//!   in the directory `IDEM_FAULTS_DIR` (it writes `fault.paused` there first, holding
//!   the call), so a test can let another process act at exactly that moment: another
//!   writer's commit between two reads of one file, say.
//!
//! Armed from the environment (`IDEM_FAULTS=crash@17`, for a whole `idem` process; a
//! crash there is `abort()`; `IDEM_FAULTS=pause@2:dt=2026-06-01/part-` counts only the
//! calls whose path or key holds the text after the colon) or by a test through
//! [`arm`]. `IDEM_FAULTS=count` only counts. `IDEM_FAULTS_TRACE=1` prints each injected
//! fault with its call. Unarmed, a call costs one atomic load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub const ENV: &str = "IDEM_FAULTS";

/// What happens at the call a plan names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Fail,
    Lose,
    Crash,
    Pause,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Fail => "fail",
            Mode::Lose => "lose",
            Mode::Crash => "crash",
            Mode::Pause => "pause",
        })
    }
}

/// What the caller of [`point`] must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Make the call.
    Proceed,
    /// Fail without making it.
    Fail,
    /// Make it, then report failure.
    Lose,
}

/// What [`decide`] says of a call: a verdict, or wait first (then make it).
enum Decision {
    Now(Verdict),
    Pause,
}

#[derive(Clone, Debug)]
struct Plan {
    /// `None`: only count.
    fault: Option<(Mode, u64)>,
    /// A crash aborts the process (armed from the environment) instead of failing
    /// every later call.
    abort: bool,
    /// Only calls whose target (path, or object key) holds one of these count; none:
    /// every call. Tests that run beside others in one process name their own.
    scopes: Vec<String>,
}

static ARMED: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);
static DEAD: AtomicBool = AtomicBool::new(false);
static HIT: AtomicBool = AtomicBool::new(false);
static PLAN: Mutex<Option<Plan>> = Mutex::new(None);

/// How many calls (and of them, calls that change storage) were counted since the
/// plan was armed, and whether its fault fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    pub calls: u64,
    pub writes: u64,
    pub fired: bool,
}

fn from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(spec) = std::env::var(ENV) else {
            return;
        };
        let spec = spec.trim();
        let mut scopes = Vec::new();
        let fault = if spec == "count" {
            None
        } else {
            let (spec, scope) = match spec.split_once(':') {
                Some((spec, scope)) => (spec, Some(scope)),
                None => (spec, None),
            };
            let parsed = spec.split_once('@').and_then(|(mode, at)| {
                let mode = match mode {
                    "fail" => Mode::Fail,
                    "lose" => Mode::Lose,
                    "crash" => Mode::Crash,
                    "pause" => Mode::Pause,
                    _ => return None,
                };
                Some((mode, at.parse::<u64>().ok()?))
            });
            let Some((mode, at)) = parsed else {
                eprintln!(
                    "{ENV}={spec}: expected fail@N, lose@N, crash@N or pause@N (each with an \
                     optional :SCOPE), or count; ignored"
                );
                return;
            };
            scopes = scope.map(str::to_string).into_iter().collect();
            Some((mode, at))
        };
        *PLAN.lock().expect("not poisoned") = Some(Plan {
            fault,
            abort: true,
            scopes,
        });
        ARMED.store(true, Ordering::SeqCst);
    });
}

/// Arms `mode` at call `at` for this process (tests), counting from 1 again; only
/// calls whose target holds one of `scopes` count (all calls when it is empty).
pub fn arm_in(scopes: &[&str], mode: Mode, at: u64) {
    set(Plan {
        fault: Some((mode, at)),
        abort: false,
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
    });
}

/// Arms `mode` at call `at` for every call of this process.
pub fn arm(mode: Mode, at: u64) {
    arm_in(&[], mode, at)
}

/// Only counts the calls in `scopes` from now on (tests: how many calls does a clean
/// run make?).
pub fn count_in(scopes: &[&str]) {
    set(Plan {
        fault: None,
        abort: false,
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
    });
}

fn set(plan: Plan) {
    let mut current = PLAN.lock().expect("not poisoned");
    *current = Some(plan);
    CALLS.store(0, Ordering::SeqCst);
    WRITES.store(0, Ordering::SeqCst);
    DEAD.store(false, Ordering::SeqCst);
    HIT.store(false, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
}

/// Disarms; what the plan saw.
pub fn disarm() -> Stats {
    let _plan = PLAN.lock().expect("not poisoned").take();
    ARMED.store(false, Ordering::SeqCst);
    DEAD.store(false, Ordering::SeqCst);
    stats()
}

/// What the armed plan has seen so far.
pub fn stats() -> Stats {
    Stats {
        calls: CALLS.load(Ordering::SeqCst),
        writes: WRITES.load(Ordering::SeqCst),
        fired: HIT.load(Ordering::SeqCst),
    }
}

/// Whether a plan from the environment is armed (the CLI reports its count at exit).
pub fn armed_from_env() -> bool {
    from_env();
    std::env::var_os(ENV).is_some() && ARMED.load(Ordering::SeqCst)
}

/// Counts a storage call, `op` on `target`, and says whether it may go ahead (after
/// waiting, at a pause: this call blocks its thread; an async caller uses
/// [`point_async`]).
pub fn point(op: &str, target: &dyn std::fmt::Display) -> Verdict {
    match decide(op, target) {
        Decision::Now(verdict) => verdict,
        Decision::Pause => {
            let resume = pause_files(op, target);
            while !resume.exists() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Verdict::Proceed
        }
    }
}

/// [`point`] for an async caller: a pause waits without holding its thread.
pub async fn point_async(op: &str, target: &(dyn std::fmt::Display + Sync)) -> Verdict {
    match decide(op, target) {
        Decision::Now(verdict) => verdict,
        Decision::Pause => {
            let resume = pause_files(op, target);
            while !resume.exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Verdict::Proceed
        }
    }
}

/// Writes `fault.paused` (naming the call) in `IDEM_FAULTS_DIR`; the file that ends
/// the pause.
fn pause_files(op: &str, target: &dyn std::fmt::Display) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(std::env::var_os("IDEM_FAULTS_DIR").unwrap_or_default());
    let _ = std::fs::write(dir.join("fault.paused"), format!("{op} {target}"));
    dir.join("fault.resume")
}

fn decide(op: &str, target: &dyn std::fmt::Display) -> Decision {
    from_env();
    if !ARMED.load(Ordering::Relaxed) {
        return Decision::Now(Verdict::Proceed);
    }
    let plan = PLAN.lock().expect("not poisoned");
    let Some(plan) = plan.as_ref() else {
        return Decision::Now(Verdict::Proceed);
    };
    if !plan.scopes.is_empty() {
        let target = target.to_string();
        if !plan.scopes.iter().any(|s| target.contains(s.as_str())) {
            return Decision::Now(Verdict::Proceed);
        }
    }
    if DEAD.load(Ordering::SeqCst) {
        return Decision::Now(Verdict::Fail);
    }
    let n = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    let write = changes_storage(op);
    let w = if write {
        WRITES.fetch_add(1, Ordering::SeqCst) + 1
    } else {
        0
    };
    let Some((mode, at)) = plan.fault else {
        return Decision::Now(Verdict::Proceed);
    };
    // A lost answer is counted among the calls that change storage only.
    let (n, counted) = if mode == Mode::Lose {
        (w, write)
    } else {
        (n, true)
    };
    if !counted || n != at {
        return Decision::Now(Verdict::Proceed);
    }
    HIT.store(true, Ordering::SeqCst);
    tracing::debug!(n, %op, %target, %mode, "injected fault");
    if std::env::var_os("IDEM_FAULTS_TRACE").is_some() {
        eprintln!("injected {mode} at call {n}: {op} {target}");
    }
    match mode {
        Mode::Fail => Decision::Now(Verdict::Fail),
        Mode::Lose => Decision::Now(Verdict::Lose),
        Mode::Crash if plan.abort => {
            eprintln!("{ENV}: crash at call {n}: {op} {target}");
            std::process::abort()
        }
        Mode::Crash => {
            DEAD.store(true, Ordering::SeqCst);
            Decision::Now(Verdict::Fail)
        }
        Mode::Pause => Decision::Pause,
    }
}

/// Whether `op` (as [`point`] names it) can change storage: for any other call a lost
/// answer is a failed call.
fn changes_storage(op: &str) -> bool {
    !matches!(
        op,
        "get" | "head" | "list" | "stat" | "open" | "read" | "lock"
    )
}

/// The error an injected filesystem fault gives.
pub fn io_error(op: &str) -> std::io::Error {
    std::io::Error::other(format!("injected fault ({op})"))
}

/// The error an injected object-store fault gives.
pub fn store_error(op: &str, target: &dyn std::fmt::Display) -> object_store::Error {
    object_store::Error::Generic {
        store: "fault",
        source: format!("injected fault ({op} {target})").into(),
    }
}

mod store;
pub use store::FaultStore;
