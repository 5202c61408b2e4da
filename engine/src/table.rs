//! Opens a job's target table with the commit protocol its storage needs.

use std::sync::Arc;

use idem_io::commit::CommitBackend;

use crate::error::{Error, Result};
use crate::job::Job;

/// The table at the job's target: a directory swapped with `renameat2`, a prefix on an
/// object store committed through per-partition markers (staged locally first, in
/// `$IDEM_STAGING` or the system's temporary directory), or, with `format = "delta"`,
/// a Delta table on either.
pub fn open(job: &Job) -> Result<Arc<dyn CommitBackend>> {
    let path = job.target.path.to_string_lossy();
    idem_io::table::open_as(&path, &job.storage, job.target.format).map_err(|source| match source {
        idem_io::Error::IsDelta { .. } | idem_io::Error::DeltaUnsupported { .. } => Error::Target {
            path: job.path.clone(),
            target: path.to_string(),
            message: source.to_string(),
        },
        source => Error::Storage {
            target: job.target.path.clone(),
            source,
        },
    })
}
