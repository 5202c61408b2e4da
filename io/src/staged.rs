//! A staged partition: its files complete in a staging directory outside the table,
//! footers included, its manifest, and, for a read-modify-write, the live version it
//! was computed from. What the writer hands to the commit step, which alone makes it
//! live.

use std::path::{Path, PathBuf};

use crate::hive::PartitionPath;
use crate::manifest::Manifest;

/// The version of a live partition, as a read-modify-write must find it again at
/// publish: every publish of the partition makes a new one (an object store's marker
/// sequence number; on disk, the identity of the partition's directory, which every
/// swap replaces).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub String);

/// A partition fully written to its staging directory, footers included (not yet
/// fsynced: see `PartitionWriter::finish`).
#[derive(Debug)]
pub struct WrittenPartition {
    pub(crate) partition: PartitionPath,
    pub(crate) dir: PathBuf,
    pub(crate) manifest: Manifest,
    /// For a read-modify-write (a merge): publish only if the live partition is still
    /// the version it was computed from (`Some(None)`: no partition yet).
    pub(crate) expected: Option<Option<Version>>,
    /// Where its files are already staged on the table's object store, with their
    /// sizes (written by a cluster's executor and uploaded there); `None` while they
    /// are only in `dir`.
    pub(crate) uploaded: Option<Uploaded>,
    /// `--rewrite`: published even over a live partition of the same rows (an object
    /// store's commit otherwise takes such a partition as already live).
    pub(crate) rewrite: bool,
}

/// A partition's files staged on the table's object store: where, and each file's
/// name and size.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Uploaded {
    pub url: String,
    pub files: Vec<(String, u64)>,
}

impl WrittenPartition {
    /// A partition another process wrote and staged for this run (an executor of a
    /// cluster): in `dir` on a filesystem this process sees, or on the table's object
    /// store as `uploaded` says.
    pub fn staged_elsewhere(
        partition: PartitionPath,
        dir: PathBuf,
        manifest: Manifest,
        uploaded: Option<Uploaded>,
    ) -> Self {
        Self {
            partition,
            dir,
            manifest,
            expected: None,
            rewrite: false,
            uploaded,
        }
    }

    /// Where its staged files are on the table's object store, when they are there.
    pub fn uploaded(&self) -> Option<&Uploaded> {
        self.uploaded.as_ref()
    }

    pub fn partition(&self) -> &PartitionPath {
        &self.partition
    }

    /// The staging directory holding the partition's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The live version a read-modify-write was computed from, which publishing
    /// requires (`Some(None)`: no partition yet); `None` for a plain replace.
    pub fn expected(&self) -> Option<&Option<Version>> {
        self.expected.as_ref()
    }

    /// The partition, published only over the live version `version` it was computed
    /// from (`None`: only if there is no partition yet).
    pub fn expecting(mut self, version: Option<Version>) -> Self {
        self.expected = Some(version);
        self
    }

    /// The bytes its staged files take, footers included (a file that cannot be looked
    /// at counts its manifest's data bytes).
    pub fn bytes(&self) -> u64 {
        if let Some(up) = &self.uploaded {
            return up.files.iter().map(|(_, size)| size).sum();
        }
        self.manifest
            .files
            .iter()
            .map(|f| {
                std::fs::metadata(self.dir.join(&f.name))
                    .map(|m| m.len())
                    .unwrap_or(f.data_bytes)
            })
            .sum()
    }
}
