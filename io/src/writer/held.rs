//! Small parts of a partition's rows, held back and encoded together.
//!
//! With thousands of partitions open, each query batch is routed as thousands of parts
//! of a few rows. Encoded as they come, every part would cost a task per column, a
//! place in the encoders' queue and, in every partition, an open row group's encoder
//! state for a handful of rows. Parts under [`Held::SMALL`] rows are held instead and
//! encoded as one batch once [`Held::ENOUGH`] rows are held, before a larger batch of
//! the partition, and when the partition is flushed or finished, so its rows keep
//! their order. Every [`Held::CHUNK`] parts held are concatenated into one batch, so
//! the per-array overhead of many tiny parts is not held for long: a row is copied at
//! most twice.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatchOptions};
use arrow::compute::concat_batches;
use arrow::datatypes::DataType;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;

#[derive(Default)]
pub(super) struct Held {
    /// Concatenated parts.
    chunks: Vec<RecordBatch>,
    /// Parts not yet concatenated.
    parts: Vec<RecordBatch>,
    rows: usize,
    /// The memory of `parts`, and of `chunks`.
    parts_memory: usize,
    chunks_memory: usize,
}

impl Held {
    /// Batches with fewer rows are held.
    pub(super) const SMALL: usize = 1024;
    /// Held rows are encoded once there are this many.
    const ENOUGH: usize = 8192;
    /// Parts held are concatenated in chunks of this many.
    const CHUNK: usize = 8;

    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    pub(super) fn memory(&self) -> usize {
        self.parts_memory + self.chunks_memory
    }

    /// Holds `part` (of fewer than [`Self::SMALL`] rows); returns whether enough rows
    /// are held to be encoded.
    pub(super) fn hold(&mut self, part: &RecordBatch) -> Result<bool, ArrowError> {
        let part = own_views(part)?;
        self.rows += part.num_rows();
        self.parts_memory += part.get_array_memory_size();
        self.parts.push(part);
        if self.parts.len() >= Self::CHUNK {
            let chunk = concat(std::mem::take(&mut self.parts))?;
            self.parts_memory = 0;
            self.chunks_memory += chunk.get_array_memory_size();
            self.chunks.push(chunk);
        }
        Ok(self.rows >= Self::ENOUGH)
    }

    /// Takes every row held, in the order given, as one batch.
    pub(super) fn take(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        if self.chunks.is_empty() && self.parts.is_empty() {
            return Ok(None);
        }
        let mut all = std::mem::take(&mut self.chunks);
        all.append(&mut self.parts);
        *self = Self::default();
        concat(all).map(Some)
    }
}

fn concat(mut batches: Vec<RecordBatch>) -> Result<RecordBatch, ArrowError> {
    if batches.len() == 1 {
        return Ok(batches.pop().expect("one batch"));
    }
    concat_batches(&batches[0].schema(), &batches)
}

/// `part` with its string and binary views' values copied out of the buffers they
/// share with the rest of the query batch they were routed from: held, they would keep
/// the whole batch's values in memory (and count them, once per part).
fn own_views(part: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let shares = |c: &ArrayRef| match c.data_type() {
        DataType::Utf8View => !c.as_string_view().data_buffers().is_empty(),
        DataType::BinaryView => !c.as_binary_view().data_buffers().is_empty(),
        _ => false,
    };
    if !part.columns().iter().any(shares) {
        return Ok(part.clone());
    }
    let columns = part
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View if shares(c) => Arc::new(c.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView if shares(c) => Arc::new(c.as_binary_view().gc()) as ArrayRef,
            _ => Arc::clone(c),
        })
        .collect();
    RecordBatch::try_new_with_options(
        part.schema(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(part.num_rows())),
    )
}
