//! Errors of the storage layer. Every variant names the path or partition it is about,
//! so the engine can report it without guessing.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("writing Parquet for partition {partition}: {source}")]
    Parquet {
        partition: String,
        #[source]
        source: parquet::errors::ParquetError,
    },

    #[error("reading Parquet file {path}: {source}")]
    ParquetRead {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },

    #[error("arrow error in partition {partition}: {source}")]
    Arrow {
        partition: String,
        #[source]
        source: arrow::error::ArrowError,
    },

    #[error("column `{column}` has type {data_type}, which idem cannot {what}")]
    UnsupportedType {
        column: String,
        data_type: String,
        what: &'static str,
    },

    #[error("manifest in {path} is not readable: {reason}")]
    BadManifest { path: PathBuf, reason: String },

    #[error(
        "the staging area {staging} is on a different filesystem than the table {table}; \
         an atomic rename between them is impossible. Put the table and its metadata \
         directory on one filesystem"
    )]
    CrossDevice { staging: PathBuf, table: PathBuf },

    #[error(
        "{table} is a Delta table (it has a _delta_log); set format = \"delta\" in \
         [target] to write it, or write to another path"
    )]
    IsDelta { table: String },

    #[error("Delta table {table}: {message}")]
    Delta { table: String, message: String },

    /// A Delta table with a feature idem cannot read or keep; not a failure a retry
    /// mends.
    #[error("Delta table {table}: {message}")]
    DeltaUnsupported { table: String, message: String },

    #[error("{path} does not exist")]
    Missing { path: PathBuf },

    #[error("target path {path} exists and is not a directory")]
    NotADirectory { path: PathBuf },

    #[error("failpoint `{name}` armed to fail")]
    Failpoint { name: String },

    #[error("invalid partition path `{path}`: {reason}")]
    BadPartitionPath { path: String, reason: String },

    #[error(
        "partition {partition} changed while this run computed it (another writer committed \
         first); its new content must be computed again"
    )]
    Conflict { partition: String },

    #[error("the digest of partition {partition} could not be derived: {reason}")]
    Digest { partition: String, reason: String },

    #[error("{}", layout_message(table, problem))]
    Layout {
        table: String,
        problem: LayoutProblem,
    },

    /// Other writers kept a partition, or a lock, busy past every retry: a later run
    /// may succeed.
    #[error("{op} {location}: {reason}")]
    Contention {
        op: &'static str,
        location: String,
        reason: String,
    },

    #[error("storage URL {url}: {reason}")]
    Url { url: String, reason: String },

    /// A local-disk table used from a second machine: file locks do not reach across
    /// machines, so idem cannot keep two hosts' writers apart there.
    #[error(
        "a run from another machine (`{theirs}`; this is `{ours}`) left its lock \
         {lock}. A local-disk table is single-host: file locks do not reach across machines, \
         so writers on two hosts could mix a partition. Write from many hosts to an object \
         store (s3://, gs://, az://). If no run is alive on `{theirs}` any more (it was \
         killed, or the disk moved here), delete {lock} and run again."
    )]
    OtherHost {
        lock: PathBuf,
        theirs: String,
        ours: String,
    },

    #[error("{op} {url}: {source}")]
    ObjectStore {
        op: &'static str,
        url: String,
        #[source]
        source: Box<object_store::Error>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What turns an I/O error of `op` on `path` into an [`Error::Io`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}

fn layout_message(table: &str, problem: &LayoutProblem) -> String {
    match problem {
        LayoutProblem::OtherLayout { found } => format!(
            "the table {table} is partitioned by {}",
            show_columns(found)
        ),
        LayoutProblem::NotATable { found } => format!(
            "{table} is not a table: it holds {}. idem replaces a table's partitions \
             whole, so it writes only where there is nothing but Parquet files and \
             partition directories of the job's layout",
            found.join(", ")
        ),
    }
}

/// Partition columns for a message: `` `dt`, `region` ``, or "nothing (unpartitioned)".
pub fn show_columns(cols: &[String]) -> String {
    if cols.is_empty() {
        "nothing (unpartitioned)".to_string()
    } else {
        cols.iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why a root is not a table of the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutProblem {
    /// Its data files sit under partition columns `found`, not the job's.
    OtherLayout { found: Vec<String> },
    /// It holds things that are not part of any table of the layout (the first few).
    NotATable { found: Vec<String> },
}
