//! Files a merge keeps: live files carried into the new partition by hard link, listed
//! in its manifest with their digest sums, and the digest derived from what the merge
//! took out and put in rather than from every row written.

use std::path::PathBuf;
use std::sync::Arc;

use super::PartitionWriter;
use super::file::file_index;
use crate::digest::{Difference, DigestState};
use crate::error::{Error, Result};
use crate::manifest::FileEntry;

/// A file of the live partition that a merge keeps as it is: it holds no row the merge
/// changes, so it is linked into the new partition instead of being rewritten.
#[derive(Clone, Debug)]
pub struct KeptFile {
    pub path: PathBuf,
    /// Its entry in the live manifest (the entry must carry the file's digest sum).
    pub entry: FileEntry,
}

impl PartitionWriter {
    /// Carries `files` of the live partition over unchanged: each is hard-linked into
    /// the staging directory (copied where links are not supported) and listed in the
    /// new manifest, whose `generation` must be one more than the live one's. New files
    /// are named after the kept ones. Call before the first write.
    pub fn keep(&mut self, files: Vec<KeptFile>, generation: u64) -> Result<()> {
        assert!(
            self.current.is_none() && self.done.is_empty() && self.held.rows() == 0,
            "keep() before any write"
        );
        self.generation = generation;
        for f in files {
            let sum = f.entry.sum.as_deref().ok_or_else(|| Error::BadManifest {
                path: f.path.clone(),
                reason: "the file's entry has no digest sum; it cannot be kept".into(),
            })?;
            let part =
                DigestState::from_parts(f.entry.rows, sum).ok_or_else(|| Error::BadManifest {
                    path: f.path.clone(),
                    reason: format!("bad digest sum {sum:?}"),
                })?;
            let to = self.dir.join(&f.entry.name);
            // A copy is made durable with the partition's other files, at publish.
            if let Err(e) = crate::fs::hard_link(&f.path, &to) {
                match crate::fs::copy(&f.path, &to) {
                    Ok(_) => {}
                    // The live partition was replaced since the merge read it: the
                    // merge must be computed again on top of the new one.
                    Err(c)
                        if e.kind() == std::io::ErrorKind::NotFound
                            && c.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Err(Error::Conflict {
                            partition: self.partition.to_string(),
                        });
                    }
                    Err(c) => return Err(Error::io("copy", &f.path)(c)),
                }
            }
            if let Some(index) = file_index(&f.entry.name) {
                self.first_index = self.first_index.max(index + 1);
            }
            self.kept_digest.merge(part);
            self.kept.push(f.entry);
        }
        Ok(())
    }

    /// The rows this writer will be given are the rows of live files less some the
    /// caller takes out, plus some it puts in, all reported to `rows`: their digest is
    /// `rows`' total, so the rows of the first file written are counted, not hashed
    /// (a merge hashes only what it changes). The
    /// rows of any later file are hashed as usual, and the first file's sum is what
    /// they leave of the total. [`Self::finish`] fails if the rows counted and the
    /// total's differ. Call before the first write.
    pub fn derive_digest(&mut self, rows: Arc<Difference>) {
        assert!(
            self.current.is_none() && self.done.is_empty() && self.held.rows() == 0,
            "derive_digest() before any write"
        );
        self.derived = Some(rows);
    }

    /// Sets the digest of the rows written, and of the first file, from `rows`' total.
    pub(super) fn derive_first_file(&mut self, rows: &Difference) -> Result<()> {
        let fail = |reason: String| Error::Digest {
            partition: self.partition.to_string(),
            reason,
        };
        let total = rows
            .total()
            .ok_or_else(|| fail("more rows were taken out than the files held".into()))?;
        if total.rows() != self.digest.rows() {
            return Err(fail(format!(
                "{} rows were written where {} were expected",
                self.digest.rows(),
                total.rows()
            )));
        }
        let mut first = total;
        for f in &self.done[1..] {
            first = first
                .without(f.digest)
                .ok_or_else(|| fail("later files hold more rows than were written".into()))?;
        }
        self.done[0].digest = first;
        self.digest = total;
        Ok(())
    }
}
