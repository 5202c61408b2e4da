//! Named failpoints on the write and publish path, armed by tests through the environment:
//! `IDEM_FAILPOINTS="before_publish=pause:/tmp/dir;after_stage=abort"`.
//!
//! Points, in order: `after_first_batch` (rows staged, files open), `after_row_group`
//! (a row group written, the file incomplete), `after_footers` (files complete, not
//! yet fsynced), `after_stage` (every partition staged), `before_publish` (checks
//! passed), `before_swap`, `after_swap` (the new partition live, the old copy not yet
//! removed), `after_publish_one` (a partition published, others maybe not); Delta
//! tables add `before_commit` (every file in the table, the commit not written).
//!
//! Object stores add `after_upload_part` and `after_apply_copy`; merges `merge_read`
//! (the table read, nothing staged yet); cleaners `gc_step` (before each dead run's
//! leftovers are removed or rolled forward).
//!
//! Actions: `pause:DIR` creates `DIR/NAME.paused` and waits until `DIR/NAME.resume`
//! exists (so a test can look at the table mid-run); `step:DIR` is a pause at every
//! hit, for a scheduler: the Nth hit of any stepped point in the process creates
//! `DIR/N.NAME` and waits for `DIR/N.NAME.go`; `abort` kills the process on the spot,
//! as a crash would; `error` fails the run there. `*` as NAME arms every point.
//! Unset, a failpoint costs one environment lookup per run.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

pub const ENV: &str = "IDEM_FAILPOINTS";

/// Runs the action armed for `name`, if any.
pub fn hit(name: &str) -> Result<()> {
    static SPEC: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let Some(spec) = SPEC.get_or_init(|| std::env::var(ENV).ok()) else {
        return Ok(());
    };
    for entry in spec.split(';') {
        let Some((point, action)) = entry.split_once('=') else {
            continue;
        };
        if point.trim() != name && point.trim() != "*" {
            continue;
        }
        let action = action.trim();
        if let Some(dir) = action.strip_prefix("step:") {
            static STEP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            crate::blocking::check("a failpoint's pause");
            let n = STEP.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let dir = PathBuf::from(dir);
            let at = dir.join(format!("{n}.{name}"));
            let _ = std::fs::write(&at, std::process::id().to_string());
            let go = dir.join(format!("{n}.{name}.go"));
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
        } else if let Some(dir) = action.strip_prefix("pause:") {
            crate::blocking::check("a failpoint's pause");
            let dir = PathBuf::from(dir);
            let _ = std::fs::write(
                dir.join(format!("{name}.paused")),
                std::process::id().to_string(),
            );
            let resume = dir.join(format!("{name}.resume"));
            while !resume.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        } else if action == "abort" {
            std::process::abort();
        } else if action == "enospc" {
            return Err(Error::Io {
                op: "write (failpoint)",
                path: PathBuf::from(name),
                source: std::io::Error::from_raw_os_error(28),
            });
        } else if action == "error" {
            return Err(Error::Failpoint {
                name: name.to_string(),
            });
        }
    }
    Ok(())
}
