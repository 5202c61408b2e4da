//! Turning DataFusion's execution errors into what the user must fix: a dedupe tie,
//! a source file that cannot be read, or a file a newer commit removed (a conflict:
//! the run is computed again).

use datafusion::execution::context::SessionContext;

use crate::error::{Error, Result};
use crate::job::Job;

/// Fails the run as a conflict (computed again) when a file it read by name is gone:
/// it may have been read as no rows (see `session::ReadFiles`).
pub(super) async fn read_files_still_there(ctx: &SessionContext, job: &Job) -> Result<()> {
    let (ctx, job) = (ctx.clone(), job.clone());
    crate::blocking(
        move || match crate::session::missing_read_file(&ctx, &job) {
            None => Ok(()),
            Some(file) => Err(Error::Storage {
                target: job.target.path.clone(),
                source: idem_io::Error::Conflict {
                    partition: format!("(a file it read, {file}, was replaced meanwhile)"),
                },
            }),
        },
    )
    .await
}

/// Turns an execution error from before the plan's file list is known into what the
/// user must fix, where it is one: a dedupe tie, or a source file that cannot be read
/// (DataFusion reads footers while planning, and its errors do not name the file).
/// An error reading a file that a newer commit removed since is a conflict: the run
/// is computed again.
pub(super) async fn explain(job: &Job, ctx: &SessionContext, e: Error) -> Error {
    let e = dedupe_tie(job, e);
    // A query DataFusion cannot plan is not about the inputs.
    if !matches!(e, Error::Execution { .. }) || e.is_bad_input() {
        return e;
    }
    if let Err(conflict) = read_files_still_there(ctx, job).await {
        return conflict;
    }
    let files = crate::session::all_source_files(ctx, job).await;
    crate::session::diagnose_inputs(job, &files, &e)
        .await
        .unwrap_or(e)
}

/// A dedupe tie surfaces from DataFusion as an execution error; it is bad input.
pub(super) fn dedupe_tie(job: &Job, e: Error) -> Error {
    match e.find_source::<crate::key::DedupeTie>() {
        Some(tie) => Error::Output {
            path: job.path.clone(),
            message: format!("cannot be computed: {tie}"),
        },
        None => e,
    }
}
