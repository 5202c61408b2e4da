//! Blocking waits never run on an async runtime's worker threads. A run's storage
//! calls are synchronous (locks are waited for, object-store requests are driven to
//! completion), and a worker blocked on a lock that another task of the same runtime
//! holds is a deadlock once every worker is blocked (a backfill of four merges on two
//! cores did exactly that). So callers in async code hand storage work to the blocking
//! pool through [`allowed`], and every blocking wait calls [`check`] first: in debug
//! builds (every test) a wait reached on a worker thread panics, naming the wait, so
//! the next such path is found by the test suite, not by a hung job.

use std::cell::Cell;

thread_local! {
    static ALLOWED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as blocking work: the caller is a thread of the runtime's blocking pool
/// (inside `spawn_blocking`) or a plain thread.
pub fn allowed<T>(f: impl FnOnce() -> T) -> T {
    let before = ALLOWED.with(|a| a.replace(true));
    let out = f();
    ALLOWED.with(|a| a.set(before));
    out
}

/// Whether this thread may block: it is not a runtime's thread, or it runs work
/// handed to the blocking pool through [`allowed`].
pub fn may_block() -> bool {
    ALLOWED.with(|a| a.get()) || tokio::runtime::Handle::try_current().is_err()
}

/// Called before every blocking wait; `what` names it.
pub fn check(what: &str) {
    if cfg!(debug_assertions) && !may_block() {
        panic!(
            "{what}: a blocking wait on an async runtime's worker thread (hand it to the \
             blocking pool: tokio::task::spawn_blocking with idem_io::blocking::allowed)"
        );
    }
}
