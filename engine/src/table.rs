//! Opens a job's target table with the commit protocol its storage needs.

use std::sync::Arc;

use idem_io::commit::CommitBackend;

use crate::error::{Error, Result};
use crate::job::Job;

/// The table at the job's target: a directory swapped with `renameat2`, or a prefix on
/// an object store committed through per-partition markers (staged locally first, in
/// `$IDEM_STAGING` or the system's temporary directory).
pub fn open(job: &Job) -> Result<Arc<dyn CommitBackend>> {
    idem_io::table::open(&job.target.path.to_string_lossy(), &job.storage).map_err(|source| {
        Error::Storage {
            target: job.target.path.clone(),
            source,
        }
    })
}
