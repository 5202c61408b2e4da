//! Errors of the engine. Each says which job file, source, key or partition it is
//! about and, where one helps, ends with a hint. [`Error::exit_code`] is the one
//! mapping from an error to the command's exit code.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read job file {path}: {source}")]
    JobUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("job file {path}: {message}")]
    JobInvalid { path: PathBuf, message: String },

    #[error("job file {path}: source `{source_name}`: {message}")]
    Source {
        path: PathBuf,
        source_name: String,
        message: String,
    },

    #[error("job file {path}: SQL error: {message}")]
    Sql { path: PathBuf, message: String },

    #[error(
        "job file {path}: `{function}` is not deterministic (DataFusion marks it {volatility}): \
         two runs of the same date would write different rows. Use the run's parameters \
         instead ($run_date, $run_start, $run_end), or set allow_nondeterministic = true \
         at the top of the job file (idem verify will then report the job as unstable)"
    )]
    Nondeterministic {
        path: PathBuf,
        function: String,
        volatility: String,
    },

    #[error("job file {path}: {message}")]
    Parameter { path: PathBuf, message: String },

    #[error("invalid --date `{value}`: {message}")]
    BadDate { value: String, message: String },

    #[error("invalid --var `{value}`: {message}")]
    BadVar { value: String, message: String },

    #[error("job file {path}: the output {message}")]
    Output { path: PathBuf, message: String },

    #[error("job file {path}: partition {partition}: {message}")]
    Partition {
        path: PathBuf,
        partition: String,
        message: String,
    },

    #[error("job file {path}: [target] path {target}: {message}")]
    Target {
        path: PathBuf,
        target: String,
        message: String,
    },

    #[error("job file {path}: while running the transform: {context}{source}")]
    Execution {
        path: PathBuf,
        /// What was being done, ending in ": " (or empty).
        context: String,
        #[source]
        source: Box<datafusion::error::DataFusionError>,
    },

    #[error("target {target}: {source}")]
    Storage {
        target: PathBuf,
        #[source]
        source: idem_io::Error,
    },

    #[error(
        "job file {path}: check `{check}` failed on partition {partition}: {details}\n\
         Nothing was published; the live partitions are unchanged."
    )]
    CheckFailed {
        path: PathBuf,
        check: String,
        partition: String,
        details: String,
    },

    #[error("target {target}: partition {partition}: {source}")]
    Write {
        target: PathBuf,
        partition: String,
        #[source]
        source: idem_io::Error,
    },

    #[error("table {path}: {}", table_problem(source))]
    Table {
        path: PathBuf,
        #[source]
        source: idem_io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with a table, without repeating its path.
fn table_problem(e: &idem_io::Error) -> String {
    match e {
        idem_io::Error::Missing { .. } => "does not exist".into(),
        idem_io::Error::NotADirectory { .. } => "is not a directory".into(),
        e => e.to_string(),
    }
}

impl Error {
    /// DataFusion's error `source` while running job `path`'s transform, doing
    /// `context` (empty, or ending in ": ").
    pub(crate) fn execution(
        path: &std::path::Path,
        context: impl Into<String>,
        source: datafusion::error::DataFusionError,
    ) -> Self {
        Error::Execution {
            path: path.to_path_buf(),
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// The first error of type `T` in this error's chain of sources.
    pub fn find_source<T: std::error::Error + 'static>(&self) -> Option<&T> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(self);
        while let Some(e) = next {
            if let Some(found) = e.downcast_ref::<T>() {
                return Some(found);
            }
            next = e.source();
        }
        None
    }

    /// The exit code a command that failed with this error ends with: 3 when a check
    /// on the staged output failed, 2 for bad input (the job file, the arguments, the
    /// SQL, a determinism or layout check), 1 for a failure while reading, computing
    /// or writing.
    pub fn exit_code(&self) -> u8 {
        if self.is_check_failure() {
            3
        } else if self.is_bad_input() {
            2
        } else {
            1
        }
    }

    /// True when a check on the staged output failed (exit code 3).
    pub fn is_check_failure(&self) -> bool {
        matches!(self, Error::CheckFailed { .. })
    }

    /// True when the error comes from the job file, the arguments or the SQL, which the
    /// user must fix; false for failures while reading, computing or writing.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::JobUnreadable { .. }
                | Error::JobInvalid { .. }
                | Error::Source { .. }
                | Error::Sql { .. }
                | Error::Nondeterministic { .. }
                | Error::Parameter { .. }
                | Error::BadDate { .. }
                | Error::BadVar { .. }
                | Error::Output { .. }
                | Error::Partition { .. }
                | Error::Target { .. }
        )
    }
}
