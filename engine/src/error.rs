//! Errors of the engine. Each says which job file, source, key or partition it is
//! about and, where one helps, ends with a hint. [`Error::exit_code`] is the one
//! mapping from an error to the command's exit code, and [`exit`] the contract.

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

    /// A source could not be listed or read because of I/O or the store (not its
    /// content): a retry may succeed.
    #[error("job file {path}: source `{source_name}`: {message}")]
    SourceUnreachable {
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

    /// An argument that does not fit the others (`--index` past the range's end).
    #[error("{message}")]
    Argument { message: String },

    #[error("job file {path}: the output {message}")]
    Output { path: PathBuf, message: String },

    #[error("job file {path}: partition {partition}: {message}")]
    Partition {
        path: PathBuf,
        partition: String,
        message: String,
    },

    /// The cluster could not run the plan (unreachable, a task failed for good), with
    /// the exit code the failure deserves (what a local run would give it).
    #[error("job file {path}: cluster {cluster}: {message}")]
    Cluster {
        path: PathBuf,
        cluster: String,
        message: String,
        code: u8,
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

    #[error(
        "job file {path}: no input for {window}: {}, so the run would empty {}.\n\
         Nothing was published; the live partitions are unchanged. If the input is gone \
         for good, run again with --allow-missing-input (or set allow_missing_input = true \
         in the job file).",
        missing_sources(sources),
        emptied_partitions(partitions)
    )]
    MissingInput {
        path: PathBuf,
        /// The run's window, as its logical date names it.
        window: String,
        /// The sources the transform reads that have no file for the window: name, path.
        sources: Vec<(String, String)>,
        /// The partitions holding rows the run would empty, with their rows (`None`
        /// where the partition's files are not idem's).
        partitions: Vec<(String, Option<u64>)>,
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

fn missing_sources(sources: &[(String, String)]) -> String {
    let each: Vec<String> = sources
        .iter()
        .map(|(name, path)| format!("source `{name}` ({path})"))
        .collect();
    let verb = if sources.len() == 1 { "has" } else { "have" };
    format!("{} {verb} no file for this window", each.join(" and "))
}

fn emptied_partitions(partitions: &[(String, Option<u64>)]) -> String {
    let rows = |r: &Option<u64>| match r {
        Some(1) => "1 row".to_string(),
        Some(n) => format!("{n} rows"),
        None => "files idem did not write".to_string(),
    };
    match partitions {
        [(p, r)] => format!("partition {p}, which holds {}", rows(r)),
        _ => {
            let shown: Vec<String> = partitions
                .iter()
                .take(5)
                .map(|(p, r)| format!("{p} ({})", rows(r)))
                .collect();
            let more = match partitions.len().saturating_sub(shown.len()) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            format!(
                "{} partitions that hold rows: {}{more}",
                partitions.len(),
                shown.join(", ")
            )
        }
    }
}

/// The exit codes of `idem`: a stable contract that retry policies (Kubernetes'
/// `podFailurePolicy`, Airflow and Dagster retries) key on. [`RETRY`](exit::RETRY) means
/// a retry may succeed; every other failure code means the same input fails again.
pub mod exit {
    /// Every date ran (written, unchanged, emptied or fresh).
    pub const OK: u8 = 0;
    /// Reading, writing or committing failed: I/O, the store, contention with another
    /// writer, a lost lease, memory. Nothing was half-published; a retry may succeed.
    pub const RETRY: u8 = 1;
    /// Bad input: the arguments, the job file, its SQL, a determinism or layout rule.
    pub const BAD_INPUT: u8 = 2;
    /// A check on the staged output failed; nothing was published.
    pub const CHECK_FAILED: u8 = 3;
    /// `idem verify` found that two runs of the same date differ.
    pub const NOT_DETERMINISTIC: u8 = 4;
    /// The transform failed on the date's data (a cast that does not fit, a division
    /// by zero); nothing was published.
    pub const DATA: u8 = 5;
    /// Interrupted (a second Ctrl-C abandoned the running dates).
    pub const INTERRUPTED: u8 = 130;

    /// Whether a retry of a command that ended with `code` may succeed: 1, and any
    /// code outside the contract (killed by a signal, a crash).
    pub fn retryable(code: u8) -> bool {
        !matches!(
            code,
            OK | BAD_INPUT | CHECK_FAILED | NOT_DETERMINISTIC | DATA
        )
    }
}

/// Whether the error chain from `e` shows a fault of the data itself (a cast or a
/// computation that fails on these values, a corrupt or truncated file) before any
/// failure of I/O, of the store, of a task or of memory, which a retry may not meet.
/// An unknown cause is not the data's.
/// Whether the chain from `e` holds a listing's empty `.parquet` file: bad input, as a
/// file whose footer does not read is (the error names it).
pub(crate) fn empty_parquet(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<idem_io::empty_parquet::EmptyParquet>() {
            return true;
        }
        next = e.source();
    }
    false
}

pub(crate) fn data_fault(e: &(dyn std::error::Error + 'static)) -> bool {
    use arrow::error::ArrowError as A;
    use datafusion::error::DataFusionError as D;
    use parquet::errors::ParquetError as P;
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            );
        }
        if e.is::<object_store::Error>() || e.is::<idem_io::Error>() {
            return false;
        }
        match e.downcast_ref::<D>() {
            Some(D::ResourcesExhausted(_) | D::ExecutionJoin(_)) => return false,
            // DataFusion reports a value that does not fit the type it is cast to
            // (a timestamp of year 9999 cast to nanoseconds) as a plain execution
            // error, whose text alone says what it is.
            Some(D::Execution(message)) if message.starts_with("Cannot cast ") => return true,
            _ => {}
        }
        if let Some(a) = e.downcast_ref::<A>() {
            match a {
                A::CastError(_)
                | A::ParseError(_)
                | A::ComputeError(_)
                | A::DivideByZero
                | A::ArithmeticOverflow(_)
                | A::InvalidArgumentError(_)
                | A::CsvError(_)
                | A::JsonError(_)
                | A::DictionaryKeyOverflowError
                | A::RunEndIndexOverflowError
                | A::OffsetOverflowError(_)
                // The Parquet reader's decoding errors (a page that does not
                // decompress, a value out of its column's domain), after its reads.
                | A::ParquetError(_) => return true,
                A::ExternalError(_) | A::IoError(..) => {}
                _ => return false,
            }
        }
        if let Some(p) = e.downcast_ref::<P>() {
            match p {
                P::General(_) | P::EOF(_) | P::IndexOutOfBound(..) | P::NYI(_) => return true,
                P::External(_) => {}
                _ => return false,
            }
        }
        next = e.source();
    }
    false
}

/// Whether the error chain from `e` shows that the query itself cannot be planned
/// (a name, a type, a construct DataFusion does not support), found while turning
/// the logical plan into a physical one or optimizing it: the same SQL fails the same
/// way on any data, so it is bad input, like an error from `ctx.sql`.
pub(crate) fn plan_fault(e: &(dyn std::error::Error + 'static)) -> bool {
    use datafusion::error::DataFusionError as D;
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<std::io::Error>() || e.is::<object_store::Error>() || e.is::<idem_io::Error>() {
            return false;
        }
        match e.downcast_ref::<D>() {
            Some(D::Plan(_) | D::SchemaError(..) | D::SQL(..) | D::NotImplemented(_)) => {
                return true;
            }
            // The logical optimizer reads no data: whatever fails in it (a constant
            // of the SQL that does not fit its type) fails the same way on any input.
            Some(D::Context(context, _)) if context.starts_with("Optimizer rule ") => {
                return true;
            }
            Some(D::ArrowError(..) | D::ParquetError(_) | D::ObjectStore(_) | D::IoError(_)) => {
                return false;
            }
            _ => {}
        }
        next = e.source();
    }
    false
}

/// Whether the error chain from `e` holds a failure of I/O or of the store (not a
/// corrupt file): reading a source failed in a way a retry may not meet.
pub(crate) fn unreachable_cause(e: &(dyn std::error::Error + 'static)) -> bool {
    if empty_parquet(e) {
        return false;
    }
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return !matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            );
        }
        if e.is::<object_store::Error>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<idem_io::Error>() {
            return matches!(
                io,
                idem_io::Error::Io { .. }
                    | idem_io::Error::ObjectStore { .. }
                    | idem_io::Error::Contention { .. }
            );
        }
        next = e.source();
    }
    false
}

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

    /// The exit code a command that failed with this error ends with (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        if let Error::Cluster { code, .. } = self {
            *code
        } else if self.is_check_failure() {
            exit::CHECK_FAILED
        } else if self.is_bad_input() {
            exit::BAD_INPUT
        } else if self.is_data_error() {
            exit::DATA
        } else {
            exit::RETRY
        }
    }

    /// True when retrying the same command on the same input may succeed: a failure
    /// of I/O, of the store, of contention with another writer or of memory.
    pub fn is_retryable(&self) -> bool {
        self.exit_code() == exit::RETRY
    }

    /// True when the transform itself failed on the date's data (a cast that does
    /// not fit, a division by zero, a corrupt file): the same input fails the same way
    /// again. Anything not known to be the data's fault may succeed on a retry.
    pub fn is_data_error(&self) -> bool {
        match self {
            Error::Execution { source, .. } => data_fault(source.as_ref()),
            _ => false,
        }
    }

    /// The partition the error is about, when it names one.
    pub fn partition(&self) -> Option<&str> {
        match self {
            Error::MissingInput { partitions, .. } => partitions.first().map(|(p, _)| p.as_str()),
            Error::Partition { partition, .. }
            | Error::CheckFailed { partition, .. }
            | Error::Write { partition, .. }
            | Error::Storage {
                source: idem_io::Error::Conflict { partition },
                ..
            } => Some(partition),
            _ => None,
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
                | Error::Argument { .. }
                | Error::Output { .. }
                | Error::Partition { .. }
                | Error::Target { .. }
                | Error::MissingInput { .. }
                | Error::Storage {
                    source: idem_io::Error::OtherHost { .. }
                        | idem_io::Error::DeltaUnsupported { .. },
                    ..
                }
        ) || matches!(
            self,
            Error::Execution { source, .. }
                if plan_fault(source.as_ref()) || empty_parquet(source.as_ref())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::error::ArrowError;
    use datafusion::error::DataFusionError as D;
    use parquet::errors::ParquetError;

    fn store_error() -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: "503 Slow Down".into(),
        }
    }

    #[test]
    fn only_the_datas_own_faults_are_final() {
        let io = |kind| std::io::Error::new(kind, "x");
        let data = [
            D::ArrowError(
                Box::new(ArrowError::CastError("'paid' to Int32".into())),
                None,
            ),
            D::ArrowError(Box::new(ArrowError::DivideByZero), None),
            D::ArrowError(
                Box::new(ArrowError::ParquetError(
                    "External: snappy: corrupt input".into(),
                )),
                None,
            ),
            D::ParquetError(Box::new(ParquetError::General("Corrupt footer".into()))),
            D::IoError(io(std::io::ErrorKind::InvalidData)),
            D::Execution(
                "Cannot cast Timestamp(µs, \"UTC\") value 27700358466206695 to Timestamp(ns): \
                 converted value exceeds the representable i64 range"
                    .into(),
            ),
            D::Context(
                "reading".into(),
                Box::new(D::ArrowError(
                    Box::new(ArrowError::ArithmeticOverflow("i64".into())),
                    None,
                )),
            ),
        ];
        for e in &data {
            assert!(data_fault(e), "{e}");
        }
        let transient = [
            D::ObjectStore(Box::new(store_error())),
            D::External(Box::new(ParquetError::External(Box::new(store_error())))),
            D::ArrowError(
                Box::new(ArrowError::ExternalError(Box::new(store_error()))),
                None,
            ),
            D::IoError(io(std::io::ErrorKind::ConnectionReset)),
            D::ResourcesExhausted("memory".into()),
            D::Execution("a cause idem does not know".into()),
            D::Shared(std::sync::Arc::new(D::ObjectStore(Box::new(store_error())))),
        ];
        for e in &transient {
            assert!(!data_fault(e), "{e}");
        }
        assert!(unreachable_cause(&D::ObjectStore(Box::new(store_error()))));
        assert!(!unreachable_cause(&D::ParquetError(Box::new(
            ParquetError::General("Corrupt footer".into())
        ))));
    }

    #[test]
    fn only_1_and_codes_outside_the_contract_are_retryable() {
        for code in [1, 130, 137, 101] {
            assert!(exit::retryable(code), "{code}");
        }
        for code in [0, 2, 3, 4, 5] {
            assert!(!exit::retryable(code), "{code}");
        }
    }
}
