//! Errors of the engine. Each says which job file, source, key or partition it is
//! about and, where one helps, ends with a hint. `is_bad_input` separates the user's
//! mistakes (exit code 2) from failures while running (exit code 1).

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

    #[error("job file {path}: while running the transform: {message}")]
    Execution { path: PathBuf, message: String },

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

    #[error("table {path}: {message}")]
    Table { path: PathBuf, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
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
