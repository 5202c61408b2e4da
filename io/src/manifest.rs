//! The partition manifest. It rides in the key-value metadata (`idem.manifest`) of every
//! data file a run writes, so it is written in the same atomic step as the data and
//! moves with it: the table is its own ledger, with no state kept anywhere else.
//!
//! A merge may keep a file of the old partition as it is (hard-linked into the new one,
//! never rewritten), so that file's footer still carries the manifest of the run that
//! wrote it. Each manifest therefore has a `generation`, one more than the partition's
//! previous manifest: the partition's manifest is the newest generation among its
//! files' footers, and it must list exactly the files in the directory.

use std::path::{Path, PathBuf};

use arrow::datatypes::Schema;
use parquet::file::metadata::ParquetMetaDataReader;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Key of the manifest in the Parquet footer's key-value metadata.
pub const MANIFEST_KEY: &str = "idem.manifest";
/// Version of the manifest's JSON layout.
pub const MANIFEST_FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The partition, as its relative path (`dt=2026-06-04`), or "" for the table root.
    pub partition: String,
    pub files: Vec<FileEntry>,
    pub rows: u64,
    /// Bytes of the data files, each counted up to (not including) its footer.
    pub data_bytes: u64,
    pub schema: Vec<ColumnEntry>,
    pub schema_fingerprint: String,
    /// Content digest of the rows (docs/format.md, "Content digest and canonical encoding").
    pub digest: String,
    /// 0 for a partition written whole; one more than the previous manifest's for a
    /// merge that keeps some files of the old partition.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
    #[serde(flatten)]
    pub run: RunInfo,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    pub rows: u64,
    pub data_bytes: u64,
    /// The file's share of the partition digest (its rows' running sum, see digest.rs),
    /// so a merge can keep the file and still compute the new digest without reading it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub data_type: String,
    pub nullable: bool,
    /// True for the Hive partition columns, which live in directory names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partition: bool,
}

/// What the engine knows about the run that wrote a partition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    pub job: String,
    pub job_fingerprint: String,
    pub logical_date: String,
    pub run_id: String,
    pub idem_version: String,
    /// The `--var` values the run was given, as text.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub vars: std::collections::BTreeMap<String, String>,
    /// What each source reads, by name: which new files beside the inputs it would
    /// read too (so freshness knows which new files matter).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sources: std::collections::BTreeMap<String, SourceScope>,
    pub inputs: Vec<InputFile>,
}

/// The files a source reads: everything under a directory (with an extension), the
/// files a glob matches, or one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceScope {
    /// The directory (ending in `/`), glob or file, resolved (absolute, or a URL).
    pub path: String,
    /// For a directory: the suffix of the files read ("" for every file).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extension: String,
}

impl SourceScope {
    /// Whether the source reads the file at `path` (absolute, or a URL).
    pub fn reads(&self, path: &str) -> bool {
        if self.path.contains(['*', '?', '[']) {
            return glob_match(&self.path, path);
        }
        if self.path.ends_with('/') {
            let name = path.rsplit('/').next().unwrap_or_default();
            return path.starts_with(&self.path)
                && !name.starts_with(['.', '_'])
                && name.ends_with(&self.extension);
        }
        self.path == path
    }
}

/// Whether `path` matches the glob `pattern` as DataFusion matches a source's glob
/// (`*` and `?` within a path segment, `**` across segments).
fn glob_match(pattern: &str, path: &str) -> bool {
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    glob::Pattern::new(pattern).is_ok_and(|p| p.matches_with(path, options))
}

/// One file a run read: enough to tell later whether it changed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InputFile {
    pub source: String,
    pub path: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// When the file belongs to a partition of an idem table: that partition's digest
    /// at the time it was read (its table and partition are the file's directories).
    /// Staleness then compares digests, not file times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idem_digest: Option<String>,
}

/// The name a type is recorded under: view and large string/binary types as their
/// plain equivalents, which hold the same values (so a DataFusion upgrade that switches
/// to view types does not read as a schema change).
pub fn type_name(dt: &arrow::datatypes::DataType) -> String {
    use arrow::datatypes::DataType::*;
    match dt {
        Utf8View | LargeUtf8 => Utf8.to_string(),
        BinaryView | LargeBinary => Binary.to_string(),
        other => other.to_string(),
    }
}

/// Describes a full output schema; `partition_columns` are flagged.
pub fn describe_schema(schema: &Schema, partition_columns: &[String]) -> Vec<ColumnEntry> {
    schema
        .fields()
        .iter()
        .map(|f| ColumnEntry {
            name: f.name().clone(),
            data_type: type_name(f.data_type()),
            nullable: f.is_nullable(),
            partition: partition_columns.iter().any(|p| p == f.name()),
        })
        .collect()
}

/// A fingerprint of a described schema: names, types, nullability and partitioning.
pub fn schema_fingerprint(columns: &[ColumnEntry]) -> String {
    let json = serde_json::to_vec(columns).expect("schema description serializes");
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&json))
}

impl Manifest {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("manifest serializes")
    }

    /// The names of the partition's data files, in the manifest's order.
    pub fn file_names(&self) -> Vec<String> {
        self.files.iter().map(|f| f.name.clone()).collect()
    }
}

/// Reads the footer metadata of the Parquet file at `path`.
pub fn read_footer(path: &Path) -> Result<parquet::file::metadata::ParquetMetaData> {
    let file = crate::fs::open(path).map_err(Error::io("open", path))?;
    ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .map_err(|source| Error::ParquetRead {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads the manifest from one Parquet file's footer; `Ok(None)` if it has none.
pub fn read_from_file(path: &Path) -> Result<Option<Manifest>> {
    let meta = read_footer(path)?;
    manifest_of(&meta).map_err(|reason| Error::BadManifest {
        path: path.to_path_buf(),
        reason,
    })
}

/// The manifest in a Parquet file's footer metadata; `Ok(None)` if it has none, the
/// reason when it is not readable.
pub fn manifest_of(
    meta: &parquet::file::metadata::ParquetMetaData,
) -> std::result::Result<Option<Manifest>, String> {
    let Some(kv) = meta.file_metadata().key_value_metadata() else {
        return Ok(None);
    };
    let Some(json) = kv
        .iter()
        .find(|kv| kv.key == MANIFEST_KEY)
        .and_then(|kv| kv.value.as_deref())
    else {
        return Ok(None);
    };
    serde_json::from_str(json)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The state of a live partition directory as idem sees it.
#[derive(Debug)]
pub enum LiveState {
    /// The directory holds exactly the files its manifest lists.
    Managed(Box<Manifest>),
    /// The directory exists but is not (or no longer) what an idem run left there:
    /// no Parquet file, no manifest, or files added or removed since.
    Foreign { files: Vec<PathBuf> },
    /// Object stores: the partition's commit marker names `manifest`, but a plain
    /// lister of the partition sees something else: `extra` objects the manifest does
    /// not list (files of an older commit whose apply has not finished, or files
    /// another tool put there), or not yet all of the manifest's files. idem reads the
    /// manifest's files (from staging where they are not applied yet); the partition is
    /// never reported unchanged or fresh, so the next run that owns it publishes it
    /// again, which removes the extra objects.
    Unclean {
        manifest: Box<Manifest>,
        extra: Vec<PathBuf>,
    },
}

impl LiveState {
    /// The manifest idem's own readers go by (a clean or an unclean commit's).
    pub fn manifest(&self) -> Option<&Manifest> {
        match self {
            LiveState::Managed(m) | LiveState::Unclean { manifest: m, .. } => Some(m),
            LiveState::Foreign { .. } => None,
        }
    }
}

/// Reads a live partition directory's manifest and checks it against the listing.
///
/// A directory swapped or removed by a concurrent writer while it is read reads as
/// `Foreign`, which only ever makes a run rewrite a partition (always safe).
pub fn read_partition(dir: &Path) -> Result<LiveState> {
    let gone = |e: &Error| matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
    let files = match list_parquet_files(dir) {
        Ok(f) => f,
        Err(e) if gone(&e) => return Ok(LiveState::Foreign { files: Vec::new() }),
        Err(e) => return Err(e),
    };
    // Anything unreadable reads as Foreign: idem then simply replaces the partition.
    let mut found = Vec::with_capacity(files.len());
    for file in &files {
        match read_from_file(file) {
            Ok(Some(m)) => found.push(m),
            Ok(None) | Err(_) => return Ok(LiveState::Foreign { files }),
        }
    }
    let Some(manifest) = newest(found) else {
        return Ok(LiveState::Foreign { files });
    };
    // Every entry must be a file the manifest lists: a stray `_SUCCESS` or a directory
    // inside the partition makes it Foreign, so the next run replaces it.
    let Ok(entries) = crate::fs::read_dir(dir) else {
        return Ok(LiveState::Foreign { files });
    };
    let all: Vec<String> = entries.into_iter().map(|(name, _)| name).collect();
    if !lists_exactly(&manifest, all.iter().map(String::as_str)) {
        return Ok(LiveState::Foreign { files });
    }
    Ok(LiveState::Managed(Box::new(manifest)))
}

/// A partition's manifest among those its files' footers carry: the newest generation
/// (older ones ride in files a merge kept, see [`Manifest::generation`]); the first of
/// them on a tie.
pub fn newest(manifests: impl IntoIterator<Item = Manifest>) -> Option<Manifest> {
    manifests
        .into_iter()
        .reduce(|a, b| if b.generation > a.generation { b } else { a })
}

/// Whether `manifest` lists exactly the files `names`, in any order: otherwise the
/// partition holds files it does not know, or lacks some, and is not idem's whole.
pub fn lists_exactly<'a>(manifest: &Manifest, names: impl IntoIterator<Item = &'a str>) -> bool {
    let mut listed: Vec<&str> = names.into_iter().collect();
    listed.sort_unstable();
    let mut expected: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
    expected.sort_unstable();
    listed == expected
}

/// The Parquet files directly inside `dir`, sorted by name (listing order is not trusted).
pub fn list_parquet_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for (name, file_type) in crate::fs::read_dir(dir)? {
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        if name.ends_with(".parquet") && file_type.is_file() {
            out.push(dir.join(name));
        }
    }
    out.sort();
    Ok(out)
}

/// Whether `name` is the name of a data file an idem commit copied into a partition
/// on an object store (`part-<seq>-<n>.parquet`, see docs/format.md).
pub fn written_by_idem(name: &str) -> bool {
    seq_of(name).is_some()
}

/// The sequence number in a data file's name, `part-000003-00000.parquet` → 3 (six
/// digits at least: `part-1234567-00000.parquet` follows `part-999999-…`).
pub fn seq_of(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("part-")?;
    let (seq, rest) = rest.split_once('-')?;
    let index = rest.strip_suffix(".parquet")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if seq.len() < 6 || !digits(seq) || !digits(index) {
        return None;
    }
    seq.parse().ok()
}
