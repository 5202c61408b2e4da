//! Named failpoints on the write and publish path, armed by tests through the environment:
//! `IDEM_FAILPOINTS="before_publish=pause:/tmp/dir;after_stage=abort"`.
//!
//! Points, in order: `after_first_batch` (rows staged, files open), `after_row_group`
//! (a row group written, the file incomplete), `after_footers` (files complete, not
//! yet fsynced), `after_stage` (every partition staged), `before_publish` (checks
//! passed), `before_swap`, `after_swap` (the new partition live, the old copy not yet
//! removed), `after_publish_one` (a partition published, others maybe not).
//!
//! Actions: `pause:DIR` creates `DIR/NAME.paused` and waits until `DIR/NAME.resume`
//! exists (so a test can look at the table mid-run); `abort` kills the process on the
//! spot, as a crash would; `error` fails the run there. Unset, a failpoint costs one
//! environment lookup per run.

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
        if point.trim() != name {
            continue;
        }
        let action = action.trim();
        if let Some(dir) = action.strip_prefix("pause:") {
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
