//! What a job file holds, section by section, as TOML deserializes it (every struct
//! refuses unknown keys), and the settings the validated job keeps as they are.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::window::Grain;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JobFile {
    pub(super) name: String,
    #[serde(default)]
    pub(super) allow_nondeterministic: bool,
    /// A run whose sources have no file for its window may empty partitions that hold
    /// rows. It says what to do when input is missing, not what the output is, so it is
    /// not part of the fingerprint.
    #[serde(default, skip_serializing)]
    pub(super) allow_missing_input: bool,
    /// A run for D also owns the `lookback` grain units before D (late rows).
    #[serde(default)]
    pub(super) lookback: u32,
    #[serde(default)]
    pub(super) sources: BTreeMap<String, SourceFile>,
    pub(super) transform: TransformFile,
    pub(super) target: TargetFile,
    #[serde(default)]
    pub(super) checks: Checks,
    /// Options for `s3://` paths (endpoint, region, ...). They say where the data is,
    /// not what it is, so they are not part of the job's fingerprint.
    #[serde(default, skip_serializing)]
    pub(super) storage: idem_io::store::StorageOptions,
    /// Where the transform runs (this process, or a Ballista cluster). It does not
    /// change the rows written, so it is not part of the fingerprint.
    #[serde(default, skip_serializing)]
    pub(super) execution: ExecutionFile,
}

/// The `[execution]` table of a job file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExecutionFile {
    /// `df://HOST:PORT` (a Ballista scheduler) or `standalone` (an in-process cluster).
    pub(super) cluster: Option<String>,
    /// How many tasks each stage of the plan is split into on the cluster.
    pub(super) partitions: Option<usize>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SourceFile {
    pub(super) path: String,
    #[serde(default)]
    pub(super) format: Format,
    pub(super) partitioned_by: Option<Vec<PartitionColumnFile>>,
    /// Only files with this suffix are read from a directory.
    pub(super) extension: Option<String>,
    /// CSV: whether the first line is a header (default true).
    pub(super) header: Option<bool>,
    /// CSV: the field delimiter, one character (default ",").
    pub(super) delimiter: Option<String>,
    /// Keep only the newest row per key (a tie on `latest_by` is an error).
    pub(super) dedupe: Option<Dedupe>,
    /// This source's object-store options, over the job's `[storage]` (where the data
    /// is, not what it is: not part of the fingerprint).
    #[serde(default, skip_serializing)]
    pub(super) storage: Option<idem_io::store::StorageOptions>,
    /// How far before the run's window the transform reads this source, when it is
    /// another job's table: grain units (`6` for a rolling week of days), or `"all"`.
    /// It orders a backfill's units; the output does not depend on it, so it is not
    /// part of the fingerprint.
    #[serde(default, skip_serializing)]
    pub(super) reads_before: Option<toml::Value>,
}

/// `dedupe = { key = [...], latest_by = "..." }` on a source.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Dedupe {
    pub key: Vec<String>,
    pub latest_by: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub(super) enum PartitionColumnFile {
    Name(String),
    Typed {
        name: String,
        #[serde(rename = "type")]
        data_type: String,
    },
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Parquet,
    Csv,
    Json,
}

impl Format {
    /// The suffix of the files a directory source of this format reads.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Parquet => ".parquet",
            Format::Csv => ".csv",
            Format::Json => ".json",
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TransformFile {
    pub(super) sql: Option<String>,
    pub(super) sql_file: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TargetFile {
    pub(super) path: String,
    /// `parquet` (Hive-partitioned Parquet, the default) or `delta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) format: Option<idem_io::table::Format>,
    #[serde(default)]
    pub(super) partition_by: Vec<String>,
    #[serde(default)]
    pub(super) mode: Mode,
    /// Merge: the columns that identify a row (unique in the output and the table).
    #[serde(default)]
    pub(super) key: Vec<String>,
    /// Merge: rows of the run's own window whose key the output lacks are deleted.
    #[serde(default)]
    pub(super) delete_missing: bool,
    #[serde(default)]
    pub(super) grain: Grain,
    /// The partition column that carries the logical date (default: the first DATE or
    /// TIMESTAMP partition column, else the first).
    pub(super) time_column: Option<String>,
    pub(super) compression: Option<String>,
    pub(super) row_group_rows: Option<usize>,
    #[serde(default)]
    pub(super) on_schema_change: OnSchemaChange,
    pub(super) file_size: Option<ByteSize>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub(super) enum ByteSize {
    Bytes(u64),
    Text(String),
}

/// What a run does when its output's schema differs from the live table's.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnSchemaChange {
    /// Refuse, showing both schemas side by side.
    #[default]
    Fail,
    /// Write the new schema; untouched partitions keep theirs until rewritten.
    Allow,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    ReplacePartitions,
    Merge,
}

/// The `[checks]` table of a job file.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Checks {
    /// One key (`["a", "b"]`: unique together) or several (`[["a"], ["b", "c"]]`).
    #[serde(default)]
    pub unique: Option<UniqueKeys>,
    #[serde(default)]
    pub not_null: Vec<String>,
    /// Per partition, counting partitions the run empties.
    pub min_rows: Option<u64>,
    pub max_rows: Option<u64>,
    /// Column -> the values it may hold (NULL passes; add the column to not_null to
    /// forbid it).
    #[serde(default)]
    pub accepted_values: BTreeMap<String, Vec<toml::Value>>,
    /// SQL over `output` returning one boolean; anything but true fails.
    #[serde(default)]
    pub assert: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum UniqueKeys {
    One(Vec<String>),
    Many(Vec<Vec<String>>),
}

impl Checks {
    pub fn is_empty(&self) -> bool {
        self.unique.is_none()
            && self.not_null.is_empty()
            && self.min_rows.is_none()
            && self.max_rows.is_none()
            && self.accepted_values.is_empty()
            && self.assert.is_empty()
    }

    /// Every key that must be unique (`unique` as one key or several).
    pub fn unique_keys(&self) -> Vec<Vec<String>> {
        match &self.unique {
            None => Vec::new(),
            Some(UniqueKeys::One(k)) if k.is_empty() => Vec::new(),
            Some(UniqueKeys::One(k)) => vec![k.clone()],
            Some(UniqueKeys::Many(ks)) => ks.clone(),
        }
    }

    /// Columns the checks name, to validate against the output before running.
    pub fn columns(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        for k in self.unique_keys() {
            out.extend(k.into_iter().map(|c| ("unique", c)));
        }
        out.extend(self.not_null.iter().map(|c| ("not_null", c.clone())));
        out.extend(
            self.accepted_values
                .keys()
                .map(|c| ("accepted_values", c.clone())),
        );
        out
    }
}
