//! The content digest of a partition: an order-independent hash of its rows.
//!
//! It does not depend on row order, batch boundaries or how rows are split into files,
//! so two runs that produce the same multiset of rows produce the same digest, and a
//! run whose digest equals the live partition's leaves it untouched. Specified in
//! docs/format.md, "Content digest and canonical encoding", and pinned by golden tests:
//! it must never change silently.
//!
//! For a row `r` with columns `c_0..c_{n-1}` (the partition's data columns in file
//! order; the partition columns live in the directory name):
//!
//! ```text
//! h_j(r)  = xxh3_64(canonical(c_j[r]), seed = j)          canonical: see canonical.rs
//! row(r)  = xxh3_128(h_0(r) ‖ h_1(r) ‖ … ‖ h_{n-1}(r))    each h_j as u64 little endian
//! S       = Σ row(r)  mod 2^128                           a sum, so duplicates count
//! digest  = hex(xxh3_128("idem-digest-v1" ‖ N ‖ S))       N = row count, u64 LE; S u128 LE
//! ```

use arrow::record_batch::RecordBatch;
use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_128;

use crate::canonical::check_supported;
use crate::error::Result;

/// Running state of a digest; partial digests of disjoint row sets add up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DigestState {
    rows: u64,
    sum: u128,
}

impl DigestState {
    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn merge(&mut self, other: DigestState) {
        self.rows += other.rows;
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// Adds the rows of `batch` (all of its columns, in order).
    pub fn update(&mut self, batch: &RecordBatch) {
        self.merge(digest_batch(batch));
    }

    /// `rows` rows counted but not hashed: a [`Difference`] supplies their sum.
    pub(crate) fn unhashed(rows: usize) -> Self {
        Self {
            rows: rows as u64,
            sum: 0,
        }
    }

    /// Takes the rows of `other` away; `None` if it has more rows than these. For the
    /// result to be a digest, `other`'s rows must be some of these.
    pub fn without(self, other: DigestState) -> Option<Self> {
        Some(Self {
            rows: self.rows.checked_sub(other.rows)?,
            sum: self.sum.wrapping_sub(other.sum),
        })
    }

    /// The running sum as 32 hex digits, recorded per file in the manifest so a merge
    /// that keeps a file can add it to the new partition's digest without reading it.
    pub fn sum_hex(&self) -> String {
        format!("{:032x}", self.sum)
    }

    /// The state of `rows` rows whose running sum is `sum_hex` (see [`Self::sum_hex`]).
    pub fn from_parts(rows: u64, sum_hex: &str) -> Option<Self> {
        let sum = u128::from_str_radix(sum_hex, 16).ok()?;
        Some(Self { rows, sum })
    }

    /// The digest as 32 lowercase hex digits.
    pub fn finish(&self) -> String {
        let mut buf = Vec::with_capacity(14 + 8 + 16);
        buf.extend_from_slice(b"idem-digest-v1");
        buf.extend_from_slice(&self.rows.to_le_bytes());
        buf.extend_from_slice(&self.sum.to_le_bytes());
        format!("{:032x}", xxh3_128(&buf))
    }
}

/// Checks that every column of a schema can be digested.
pub fn check_schema(schema: &arrow::datatypes::Schema) -> Result<()> {
    for f in schema.fields() {
        check_supported(f.name(), f.data_type())?;
    }
    Ok(())
}

/// The digest of rows that replace some of the rows of files whose sums are known, found
/// without hashing the rows kept: the files' sums, less the rows taken out, plus the
/// rows put in. A merge rewriting files records which rows it drops and which it adds,
/// so the writer hashes a tenth of the rows instead of all (see
/// `PartitionWriter::derive_digest`). Shared by the threads that
/// report rows; read once every row is reported.
#[derive(Debug)]
pub struct Difference {
    /// (rows of the files plus rows put in, rows taken out)
    state: std::sync::Mutex<(DigestState, DigestState)>,
}

impl Difference {
    /// `files`: the state of the files whose rows are rewritten (from their sums).
    pub fn new(files: DigestState) -> Self {
        Self {
            state: std::sync::Mutex::new((files, DigestState::default())),
        }
    }

    /// Records rows put in.
    pub fn add(&self, rows: DigestState) {
        self.state.lock().expect("digest lock").0.merge(rows);
    }

    /// Records rows of the files taken out.
    pub fn remove(&self, rows: DigestState) {
        self.state.lock().expect("digest lock").1.merge(rows);
    }

    /// The state of the rows left; `None` if more rows were taken out than there were.
    pub fn total(&self) -> Option<DigestState> {
        let (plus, minus) = *self.state.lock().expect("digest lock");
        plus.without(minus)
    }
}

/// The digest state of one batch. Columns are hashed in parallel on rayon.
pub fn digest_batch(batch: &RecordBatch) -> DigestState {
    digest_columns(batch.columns(), batch.num_rows())
}

/// Batches of fewer rows are hashed on the calling thread: handing a batch of a few
/// rows to rayon and waiting for it costs more than hashing it (a day routed into
/// thousands of partitions is hundreds of thousands of such batches).
const PARALLEL_ROWS: usize = 4096;

/// The digest state of `rows` rows given as columns (the data columns, in order).
pub fn digest_columns(columns: &[arrow::array::ArrayRef], rows: usize) -> DigestState {
    let hash = |(j, col): (usize, &arrow::array::ArrayRef)| column_hashes(col.as_ref(), j as u64);
    let per_column: Vec<Vec<u64>> = if rows < PARALLEL_ROWS {
        columns.iter().enumerate().map(hash).collect()
    } else {
        columns.par_iter().enumerate().map(hash).collect()
    };
    let columns: Vec<&[u64]> = per_column.iter().map(|c| c.as_slice()).collect();
    let sum = crate::xxh3::sum_row_hashes(&columns, rows);
    DigestState {
        rows: rows as u64,
        sum,
    }
}

fn column_hashes(col: &dyn arrow::array::Array, seed: u64) -> Vec<u64> {
    crate::canonical::hash_column(col, seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use std::sync::Arc;

    fn batch(ids: Vec<i64>, names: Vec<Option<&str>>) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("name", Arc::new(StringArray::from(names)) as ArrayRef),
        ])
        .unwrap()
    }

    #[test]
    fn order_and_split_do_not_matter() {
        let whole = batch(vec![1, 2, 3], vec![Some("a"), None, Some("")]);
        let mut a = DigestState::default();
        a.update(&whole);
        let mut b = DigestState::default();
        b.update(&batch(vec![3], vec![Some("")]));
        b.update(&batch(vec![2, 1], vec![None, Some("a")]));
        assert_eq!(a.finish(), b.finish());
        // A file's recorded (rows, sum) adds up with the rest, as a kept file's does.
        let kept = digest_batch(&batch(vec![3], vec![Some("")]));
        let mut c = DigestState::from_parts(1, &kept.sum_hex()).unwrap();
        c.update(&batch(vec![2, 1], vec![None, Some("a")]));
        assert_eq!(c.finish(), a.finish());
    }

    #[test]
    fn duplicates_and_values_count() {
        let one = batch(vec![1], vec![Some("a")]);
        let two = batch(vec![1, 1], vec![Some("a"), Some("a")]);
        let null = batch(vec![1], vec![None]);
        let empty = batch(vec![1], vec![Some("")]);
        let d = |b: &RecordBatch| {
            let mut s = DigestState::default();
            s.update(b);
            s.finish()
        };
        assert_ne!(d(&one), d(&two));
        assert_ne!(d(&null), d(&empty));
        assert_ne!(d(&one), d(&batch(vec![2], vec![Some("a")])));
    }

    /// Golden values: if this fails, the digest changed and every live table would
    /// be rewritten on its next run. Do not update these without a format version bump.
    #[test]
    fn golden() {
        assert_eq!(DigestState::default().finish(), GOLDEN_EMPTY);
        let mut s = DigestState::default();
        s.update(&batch(vec![1, 2, 3], vec![Some("a"), None, Some("")]));
        assert_eq!(s.finish(), GOLDEN_THREE_ROWS);
    }

    const GOLDEN_EMPTY: &str = "7c86095e0a958fbc6f7e50c637396d1b";
    const GOLDEN_THREE_ROWS: &str = "ab760ca73defa368128b473c393a595e";
}
