//! Job files: parsing and validation.
//!
//! A job file is TOML (see docs/jobs.md). Unknown keys are errors that name
//! the key and the file: a misspelt option must never be silently ignored. Relative
//! paths resolve against the current directory, as in the shell that runs idem;
//! `${NAME}` in a path is replaced by the environment variable NAME.

mod file;
mod values;

pub use file::{Checks, Dedupe, Format, Mode, OnSchemaChange, UniqueKeys};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::datatypes::DataType;
use idem_io::writer::WriterOptions;

use crate::error::{Error, Result};
use crate::window::Grain;
use file::{JobFile, PartitionColumnFile, SourceFile};
use values::{
    absolute, byte_size, compression, expand, is_identifier, partition_type, toml_message,
};
pub(crate) use values::{compression as parse_compression, compression_text};

impl Target {
    /// Whether the table lives on an object store.
    pub fn is_remote(&self) -> bool {
        idem_io::store::is_url(&self.path.to_string_lossy())
    }
}

/// A validated job.
#[derive(Clone, Debug)]
pub struct Job {
    pub path: PathBuf,
    pub name: String,
    pub allow_nondeterministic: bool,
    /// A run may empty partitions holding rows although a source it reads has no file
    /// for its window (`allow_missing_input`, or `--allow-missing-input`).
    pub allow_missing_input: bool,
    pub lookback: u32,
    pub sources: Vec<Source>,
    pub sql: String,
    pub target: Target,
    pub checks: Checks,
    /// Options for object-store paths.
    pub storage: idem_io::store::StorageOptions,
    /// Hash of everything that determines the output: the parsed job and its SQL.
    pub fingerprint: String,
    /// Where the transform runs: `[execution]`, which `--cluster` overrides.
    pub execution: Execution,
}

/// Where a job's transform runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Execution {
    /// A Ballista cluster; `None` runs in this process.
    pub cluster: Option<crate::cluster::Cluster>,
    /// Tasks per stage on the cluster (the physical plan's partition count).
    pub partitions: Option<usize>,
}

impl Execution {
    /// Whether plans run in this process, so they may hold idem's own operators and
    /// functions; a cluster's plans travel as DataFusion's.
    pub fn in_process(&self) -> bool {
        self.cluster.is_none()
    }
}

#[derive(Clone, Debug)]
pub struct Source {
    pub name: String,
    /// Absolute local path (possibly with a glob), as given after resolution, or an
    /// object-store URL (`s3://bucket/prefix/`).
    pub path: String,
    pub format: Format,
    /// Hive partition columns; `None` means "infer from the directory names".
    pub partition_columns: Option<Vec<(String, DataType)>>,
    pub extension: Option<String>,
    pub csv_header: bool,
    pub csv_delimiter: u8,
    pub dedupe: Option<Dedupe>,
    /// The options reaching an object-store path: the source's own over the job's.
    pub storage: idem_io::store::StorageOptions,
    /// How far before the run's window the transform reads this source.
    pub reads_before: ReadsBefore,
}

/// The largest `reads_before` in units (ten years of days); beyond, use "all".
const MAX_READS_BEFORE: i64 = 3660;

/// `reads_before` of a source: how far before its run's window a job reads another
/// job's table, in the reading job's grain units (the units of a backfill are ordered
/// by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadsBefore {
    /// This many grain units before the window (0, the default: the window only).
    Units(u32),
    /// Any date.
    All,
}

#[derive(Clone, Debug)]
pub struct Target {
    /// A local path, or an object-store URL (`s3://bucket/prefix/table`) kept as given
    /// (see [`Target::is_remote`]).
    pub path: PathBuf,
    /// How the table is laid out and committed: Hive-partitioned Parquet, or Delta.
    pub format: idem_io::table::Format,
    pub partition_by: Vec<String>,
    pub mode: Mode,
    pub key: Vec<String>,
    pub delete_missing: bool,
    pub grain: Grain,
    pub time_column: Option<String>,
    pub on_schema_change: OnSchemaChange,
    pub writer: WriterOptions,
}

impl Job {
    /// What each source reads, as a run's manifest records it.
    pub fn source_scopes(&self) -> BTreeMap<String, idem_io::manifest::SourceScope> {
        self.sources
            .iter()
            .map(|s| {
                let scope = idem_io::manifest::SourceScope {
                    path: s.path.clone(),
                    extension: if s.path.ends_with('/') {
                        s.extension
                            .clone()
                            .unwrap_or_else(|| s.format.extension().to_string())
                    } else {
                        String::new()
                    },
                };
                (s.name.clone(), scope)
            })
            .collect()
    }

    /// The storage options reaching `url`: those of the sources in its bucket (they
    /// all agree, see [`Job::load`]), else the job's `[storage]`.
    pub fn storage_for(&self, url: &str) -> &idem_io::store::StorageOptions {
        let base = idem_io::store::store_base(url);
        self.sources
            .iter()
            .find(|s| base.is_some() && idem_io::store::store_base(&s.path) == base)
            .map(|s| &s.storage)
            .unwrap_or(&self.storage)
    }

    /// Reads and validates a job file.
    pub fn load(path: &Path) -> Result<Job> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::JobUnreadable {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Validates the text of a job file; `path` names it in errors and anchors `sql_file`.
    pub fn parse(path: &Path, text: &str) -> Result<Job> {
        let invalid = |message: String| Error::JobInvalid {
            path: path.to_path_buf(),
            message,
        };
        let file: JobFile = toml::from_str(text).map_err(|e| invalid(toml_message(&e)))?;
        if file.name.trim().is_empty() {
            return Err(invalid("`name` must not be empty".into()));
        }
        let sql = match (&file.transform.sql, &file.transform.sql_file) {
            (Some(sql), None) => sql.clone(),
            (None, Some(rel)) => {
                let base = path.parent().unwrap_or(Path::new("."));
                let sql_path = base.join(rel);
                std::fs::read_to_string(&sql_path).map_err(|e| {
                    invalid(format!(
                        "[transform] sql_file `{}` cannot be read: {e}",
                        sql_path.display()
                    ))
                })?
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "[transform] has both `sql` and `sql_file`; keep one".into(),
                ));
            }
            (None, None) => {
                return Err(invalid(
                    "[transform] needs `sql` (inline) or `sql_file` (relative to the job file)"
                        .into(),
                ));
            }
        };
        if sql.trim().is_empty() {
            return Err(invalid("[transform] sql is empty".into()));
        }

        let mut sources = Vec::new();
        for (name, s) in &file.sources {
            sources.push(source(path, name, s, &file.storage)?);
        }
        // A query reaches each bucket through one client: sources in one bucket must
        // agree on its options.
        for (i, a) in sources.iter().enumerate() {
            for b in &sources[i + 1..] {
                let base = idem_io::store::store_base(&a.path);
                if base.is_some()
                    && base == idem_io::store::store_base(&b.path)
                    && a.storage != b.storage
                {
                    return Err(invalid(format!(
                        "sources `{}` and `{}` are both in {} but with different storage \
                         options; give them the same",
                        a.name,
                        b.name,
                        base.unwrap_or_default()
                    )));
                }
            }
        }

        let t = &file.target;
        let target_path = expand(&t.path).map_err(|m| invalid(format!("[target] path: {m}")))?;
        let remote = idem_io::store::is_url(&target_path);
        if remote
            && idem_io::store::key_of(&target_path)
                .trim_matches('/')
                .is_empty()
        {
            return Err(invalid(format!(
                "[target] path `{target_path}`: a table needs a prefix inside the bucket (s3://bucket/table)"
            )));
        }
        // The target is reached with the job's options (a merge also reads it in the
        // query): a source in its bucket must use them too.
        if let Some(s) = sources.iter().find(|s| {
            remote
                && idem_io::store::store_base(&s.path) == idem_io::store::store_base(&target_path)
                && s.storage != file.storage
        }) {
            return Err(invalid(format!(
                "source `{}` is in the target's bucket {} but with its own storage options; \
                 the target uses the job's [storage], so put them there",
                s.name,
                idem_io::store::store_base(&target_path).unwrap_or_default()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &t.partition_by {
            if c.is_empty() || !seen.insert(c) {
                return Err(invalid(format!(
                    "[target] partition_by has an empty or repeated column `{c}`"
                )));
            }
            // Readers skip directories named `_…` and `.…` (pyarrow, Spark, idem's
            // own listings): such a partition column would hide every partition.
            if c.starts_with(['_', '.']) {
                return Err(invalid(format!(
                    "[target] partition_by column `{c}` starts with `{}`: readers take \
                     directories named so for hidden ones and skip them. Rename the column",
                    &c[..1]
                )));
            }
        }
        if let Some(tc) = &t.time_column
            && !t.partition_by.contains(tc)
        {
            return Err(invalid(format!(
                "[target] time_column `{tc}` is not one of partition_by {:?}",
                t.partition_by
            )));
        }
        match (t.mode, t.key.is_empty()) {
            (Mode::Merge, true) => {
                return Err(invalid(
                    "[target] mode = \"merge\" needs `key`, the columns that identify a row".into(),
                ));
            }
            _ if t.delete_missing && t.mode != Mode::Merge => {
                return Err(invalid(
                    "[target] `delete_missing` applies only to mode = \"merge\"".into(),
                ));
            }
            (Mode::ReplacePartitions, false) => {
                return Err(invalid(
                    "[target] `key` applies only to mode = \"merge\"".into(),
                ));
            }
            _ => {}
        }
        let mut writer = WriterOptions::default();
        if let Some(c) = &t.compression {
            writer.compression =
                compression(c).map_err(|m| invalid(format!("[target] compression: {m}")))?;
        }
        if let Some(r) = t.row_group_rows {
            if r == 0 {
                return Err(invalid("[target] row_group_rows must be positive".into()));
            }
            writer.row_group_rows = r;
        }
        if let Some(size) = &t.file_size {
            writer.target_file_bytes =
                byte_size(size).map_err(|m| invalid(format!("[target] file_size: {m}")))?;
        }
        let target = Target {
            path: if remote {
                PathBuf::from(target_path.trim_end_matches('/'))
            } else {
                absolute(
                    target_path
                        .strip_prefix("file://")
                        .unwrap_or(&target_path)
                        .trim_end_matches('/'),
                )
            },
            format: t.format.unwrap_or_default(),
            partition_by: t.partition_by.clone(),
            mode: t.mode,
            key: t.key.clone(),
            delete_missing: t.delete_missing,
            grain: t.grain,
            time_column: t.time_column.clone(),
            on_schema_change: t.on_schema_change,
            writer,
        };

        // Everything that decides what a run reads and writes: the job as written, its
        // SQL (from `sql_file` too), and every path as resolved (`${NAME}` expanded,
        // relative paths made absolute), so pointing a variable or the working
        // directory at other data is another job to `--skip-fresh`.
        let fingerprint = {
            let mut canon = serde_json::to_string(&file).expect("job serializes");
            canon.push('\n');
            canon.push_str(&sql);
            for s in &sources {
                canon.push_str(&format!("\nsource {} {}", s.name, s.path));
            }
            canon.push_str(&format!("\ntarget {}", target.path.display()));
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(canon.as_bytes()))
        };
        let execution = Execution {
            cluster: match &file.execution.cluster {
                None => None,
                Some(c) => Some(
                    crate::cluster::Cluster::parse(c)
                        .map_err(|m| invalid(format!("[execution] cluster: {m}")))?,
                ),
            },
            partitions: match file.execution.partitions {
                Some(0) => {
                    return Err(invalid("[execution] partitions must be positive".into()));
                }
                p => p,
            },
        };
        if execution.cluster.is_some() && target.mode == Mode::Merge {
            return Err(invalid(crate::cluster::MERGE_REFUSED.into()));
        }
        if execution.cluster.is_some() && target.format == idem_io::table::Format::Delta {
            return Err(invalid(crate::cluster::DELTA_REFUSED.into()));
        }
        Ok(Job {
            execution,
            path: path.to_path_buf(),
            name: file.name,
            allow_nondeterministic: file.allow_nondeterministic,
            allow_missing_input: file.allow_missing_input,
            lookback: file.lookback,
            sources,
            sql,
            target,
            checks: file.checks,
            storage: file.storage,
            fingerprint,
        })
    }
}

fn source(
    job: &Path,
    name: &str,
    s: &SourceFile,
    job_storage: &idem_io::store::StorageOptions,
) -> Result<Source> {
    let err = |message: String| Error::Source {
        path: job.to_path_buf(),
        source_name: name.to_string(),
        message,
    };
    if !is_identifier(name) {
        return Err(err(
            "a source name must be a SQL identifier (letters, digits, _)".into(),
        ));
    }
    let raw = expand(&s.path).map_err(|m| err(format!("path: {m}")))?;
    let path = if idem_io::store::is_url(&raw) {
        if idem_io::store::store_base(&raw).is_none() {
            return Err(err(format!(
                "path `{raw}`: expected scheme://bucket/prefix"
            )));
        }
        raw.clone()
    } else {
        let raw = raw.strip_prefix("file://").unwrap_or(&raw).to_string();
        let abs = absolute(&raw);
        let mut path = abs.to_string_lossy().into_owned();
        if raw.ends_with('/') && !path.ends_with('/') {
            path.push('/');
        }
        if abs.is_dir() && !path.ends_with('/') {
            path.push('/');
        }
        path
    };
    let partition_columns = match &s.partitioned_by {
        None => None,
        Some(cols) => {
            let mut out = Vec::new();
            for c in cols {
                out.push(match c {
                    PartitionColumnFile::Name(n) => (n.clone(), DataType::Utf8),
                    PartitionColumnFile::Typed { name, data_type } => (
                        name.clone(),
                        partition_type(data_type)
                            .map_err(|m| err(format!("partitioned_by `{name}`: {m}")))?,
                    ),
                });
            }
            Some(out)
        }
    };
    let delimiter = match s.delimiter.as_deref() {
        None => b',',
        Some(d) if d.len() == 1 => d.as_bytes()[0],
        Some("\\t") => b'\t',
        Some(d) => return Err(err(format!("delimiter `{d}` must be one character"))),
    };
    if s.format != Format::Csv && (s.header.is_some() || s.delimiter.is_some()) {
        return Err(err(
            "`header` and `delimiter` apply only to format = \"csv\"".into(),
        ));
    }
    if s.storage.is_some() && !idem_io::store::is_url(&path) {
        return Err(err(
            "`storage` applies only to object-store paths (s3://, az://, gs://)".into(),
        ));
    }
    let storage = job_storage.overlay(&s.storage.clone().unwrap_or_default());
    let reads_before = match &s.reads_before {
        None => ReadsBefore::Units(0),
        Some(toml::Value::Integer(n)) if (0..=MAX_READS_BEFORE).contains(n) => {
            ReadsBefore::Units(*n as u32)
        }
        Some(toml::Value::String(w)) if w == "all" => ReadsBefore::All,
        Some(other) => {
            return Err(err(format!(
                "reads_before = {other}: expected a number of this job's grain units \
                 (0 to {MAX_READS_BEFORE}) or \"all\""
            )));
        }
    };
    Ok(Source {
        name: name.to_string(),
        path,
        format: s.format,
        storage,
        partition_columns,
        extension: s.extension.clone(),
        csv_header: s.header.unwrap_or(true),
        csv_delimiter: delimiter,
        reads_before,
        dedupe: match &s.dedupe {
            Some(d) if d.key.is_empty() => {
                return Err(err("dedupe needs a non-empty `key`".into()));
            }
            other => other.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::file::ByteSize;
    use super::*;

    fn parse(text: &str) -> Result<Job> {
        Job::parse(Path::new("jobs/t.toml"), text)
    }

    const MINIMAL: &str = r#"
name = "t"
[transform]
sql = "select 1 as x, date '2026-01-01' as dt"
[target]
path = "out/t"
partition_by = ["dt"]
"#;

    #[test]
    fn execution_names_a_cluster_outside_the_fingerprint() {
        let local = parse(MINIMAL).unwrap();
        assert_eq!(local.execution, Execution::default());
        let text =
            format!("{MINIMAL}[execution]\ncluster = \"df://sched:50050\"\npartitions = 8\n");
        let on = parse(&text).unwrap();
        assert_eq!(
            on.execution.cluster.as_ref().unwrap().to_string(),
            "df://sched:50050"
        );
        assert_eq!(on.execution.partitions, Some(8));
        assert_eq!(on.fingerprint, local.fingerprint);

        let bad = parse(&format!(
            "{MINIMAL}[execution]\ncluster = \"sched:50050\"\n"
        ));
        let err = bad.unwrap_err().to_string();
        assert!(
            err.contains("jobs/t.toml") && err.contains("[execution] cluster"),
            "{err}"
        );
        let zero = parse(&format!("{MINIMAL}[execution]\npartitions = 0\n"));
        assert!(
            zero.unwrap_err()
                .to_string()
                .contains("partitions must be positive")
        );
        let merge = MINIMAL.replace(
            "partition_by = [\"dt\"]",
            "partition_by = [\"dt\"]\nmode = \"merge\"\nkey = [\"x\"]",
        );
        let err = parse(&format!("{merge}[execution]\ncluster = \"standalone\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot run on a cluster"), "{err}");
    }

    #[test]
    fn minimal_job_parses() {
        let job = parse(MINIMAL).unwrap();
        assert_eq!(job.name, "t");
        assert_eq!(job.target.grain, Grain::Day);
        assert!(job.target.path.is_absolute());
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let text = MINIMAL.replace("[target]", "[target]\npartiton_by = [\"dt\"]");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("jobs/t.toml"), "{err}");
        assert!(err.contains("partiton_by"), "{err}");
    }

    #[test]
    fn fingerprint_follows_content() {
        let a = parse(MINIMAL).unwrap();
        let b = parse(&MINIMAL.replace("select 1", "select 2")).unwrap();
        assert_eq!(a.fingerprint, parse(MINIMAL).unwrap().fingerprint);
        assert_ne!(a.fingerprint, b.fingerprint);
    }

    #[test]
    fn sizes_and_codecs() {
        assert_eq!(
            byte_size(&ByteSize::Text("256MiB".into())).unwrap(),
            256 << 20
        );
        assert_eq!(byte_size(&ByteSize::Bytes(4096)).unwrap(), 4096);
        assert!(compression("zstd(3)").is_ok());
        assert!(compression("brotli").unwrap_err().contains("unknown codec"));
    }
}
