//! The streaming Parquet writer of one partition.
//!
//! Rows arrive batch by batch and are encoded at once, each column in order on rayon,
//! the columns of successive batches in parallel (see encode.rs), while the content
//! digest is computed beside them; only the encoded pages of
//! the current row group are held in memory, so a partition larger than memory is
//! written in bounded space. Files roll at a target size. Footers are written last,
//! when the partition is complete, because every file's footer carries the manifest
//! of the whole partition (its file list, rows and digest).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowSchemaConverter;
use parquet::arrow::arrow_writer::{ArrowRowGroupWriterFactory, compute_leaves};
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterPropertiesPtr};
use parquet::file::writer::SerializedFileWriter;
use rayon::prelude::*;

use crate::digest::{Difference, DigestState};
use crate::durable;
use crate::encode::RowGroupEncoder;
use crate::error::{Error, Result};
use crate::hive::PartitionPath;
use crate::manifest::{
    ColumnEntry, FileEntry, MANIFEST_FORMAT, MANIFEST_KEY, Manifest, RunInfo, schema_fingerprint,
};

/// How partitions are encoded.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    pub compression: Compression,
    /// Rows per row group (the unit of parallel reading and of statistics pruning).
    pub row_group_rows: usize,
    /// A file is closed and a new one started once it reaches this size.
    pub target_file_bytes: u64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            compression: Compression::SNAPPY,
            // 256 Ki rows, as Polars writes: a reader and a writer each hold one row
            // group of a column chunk at a time, so this bounds their memory (W4, a
            // merge that reads and writes a 5 M-row table: 253 → 202 MiB peak, 6% less
            // CPU than at 1 Mi rows), and a file splits into more units for parallel
            // reading. Files are 0.2% (customers) to 2% (orders: dictionaries repeat per
            // row group) larger.
            row_group_rows: 1 << 18,
            target_file_bytes: 256 << 20,
        }
    }
}

/// A partition fully written to its staging directory, footers included (not yet
/// fsynced: see [`PartitionWriter::finish`]).
#[derive(Debug)]
pub struct WrittenPartition {
    pub partition: PartitionPath,
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// For a read-modify-write (a merge): publish only if the live partition is still
    /// the version it was computed from (`Some(None)`: no partition yet).
    pub expected: Option<Option<crate::commit::Version>>,
}

type FileWriter = SerializedFileWriter<SpillFile>;

/// The Parquet writer's properties; `plain` columns are written without a dictionary.
fn writer_properties(opts: &WriterOptions, plain: &[String]) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(opts.compression)
        .set_max_row_group_row_count(Some(opts.row_group_rows))
        .set_created_by(format!("idem {}", env!("CARGO_PKG_VERSION")));
    for c in plain {
        props = props.set_column_dictionary_enabled(c.as_str().into(), false);
    }
    props.build()
}

/// Rows of the first batch looked at to judge a column's cardinality, and the least
/// that makes a judgement.
const CARDINALITY_SAMPLE: usize = 16 * 1024;
const CARDINALITY_MIN_ROWS: usize = 1024;

/// The top-level flat columns whose values in the first rows of `batch` are nearly all
/// distinct (ids, keys, timestamps). A dictionary cannot pay for itself on them: the
/// writer would intern every value until the dictionary outgrows its page and then
/// fall back to plain encoding anyway, so they are written plain from the start (W1:
/// 12% less wall time, and smaller files).
fn high_cardinality_columns(batch: &RecordBatch) -> Vec<String> {
    let rows = batch.num_rows().min(CARDINALITY_SAMPLE);
    if rows < CARDINALITY_MIN_ROWS {
        return Vec::new();
    }
    let sample = batch.slice(0, rows);
    sample
        .schema()
        .fields()
        .iter()
        .zip(sample.columns())
        .filter(|(f, _)| !f.data_type().is_nested() && !f.data_type().is_null())
        .filter(|(_, col)| {
            let Ok(converter) = arrow::row::RowConverter::new(vec![arrow::row::SortField::new(
                col.data_type().clone(),
            )]) else {
                return false;
            };
            let Ok(values) = converter.convert_columns(&[Arc::clone(col)]) else {
                return false;
            };
            let distinct: std::collections::HashSet<&[u8]> =
                values.iter().map(|r| r.data()).collect();
            distinct.len() * 10 > rows * 9
        })
        .map(|(f, _)| f.name().clone())
        .collect()
}

/// A file that holds its descriptor only while bytes are being written: the handle is
/// released after each row group, so a run writing thousands of partitions does not
/// run out of file descriptors. Reopened in append mode on the next write.
struct SpillFile {
    path: PathBuf,
    file: Option<File>,
    /// Bytes written, and how many of them the disk has been asked to take already.
    written: u64,
    flushing: u64,
}

impl SpillFile {
    fn create(path: PathBuf) -> Result<Self> {
        // create_new: two writers must never share a file.
        let file = crate::fs::create_new(&path).map_err(Error::io("create", &path))?;
        Ok(Self {
            path,
            file: Some(file),
            written: 0,
            flushing: 0,
        })
    }

    fn handle(&mut self) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            self.file = Some(crate::fs::open_append(&self.path)?);
        }
        Ok(self.file.as_mut().expect("just opened"))
    }

    /// Closes the handle, after starting the write-back of the bytes written since the
    /// last release (`POSIX_FADV_DONTNEED` on dirty pages starts it and returns; they
    /// stay cached). The fsync at publish then waits for the last row group only,
    /// instead of the whole file (W4: 37 → 6 ms at the end of the run).
    fn release(&mut self) {
        if let Some(file) = self.file.take()
            && let Some(len) = std::num::NonZeroU64::new(self.written - self.flushing)
        {
            let advice = rustix::fs::Advice::DontNeed;
            // Only a hint: the fsync at publish is what makes the file durable.
            let _ = rustix::fs::fadvise(&file, self.flushing, Some(len), advice);
            self.flushing = self.written;
        }
    }
}

impl Write for SpillFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let path = self.path.clone();
        let n = crate::fs::write(self.handle()?, &path, buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

struct OpenFile {
    name: String,
    /// `None` while a thread appends a row group to the file (see [`Appending`]).
    writer: Option<FileWriter>,
    appending: Option<Appending>,
    /// Row groups started, and the bytes of those closed (for rolling files).
    row_groups: usize,
    bytes: u64,
    rows: u64,
    digest: DigestState,
}

/// A closed row group being appended to its file on a thread of its own, so the next
/// row group is encoded meanwhile: the append copies every page into the page cache,
/// which took the writer's thread a tenth of W4 while the encoders waited. One per file
/// at a time; the thread hands the file's writer back.
type Appending = std::thread::JoinHandle<std::result::Result<FileWriter, Error>>;

impl OpenFile {
    /// The file's writer, once its last row group is appended.
    fn writer(&mut self) -> Result<&mut FileWriter> {
        if let Some(appending) = self.appending.take() {
            let writer = appending
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
            self.writer = Some(writer);
        }
        Ok(self
            .writer
            .as_mut()
            .expect("a file has its writer or an append"))
    }
}

impl Drop for OpenFile {
    /// An abandoned file's append finishes before the staging directory can go.
    fn drop(&mut self) {
        if let Some(appending) = self.appending.take() {
            let _ = appending.join();
        }
    }
}

/// A file of the live partition that a merge keeps as it is: it holds no row the merge
/// changes, so it is linked into the new partition instead of being rewritten.
#[derive(Clone, Debug)]
pub struct KeptFile {
    pub path: PathBuf,
    /// Its entry in the live manifest (the entry must carry the file's digest sum).
    pub entry: FileEntry,
}

/// Writes one partition's data files into a staging directory.
pub struct PartitionWriter {
    partition: PartitionPath,
    dir: PathBuf,
    schema: SchemaRef,
    props: WriterPropertiesPtr,
    opts: WriterOptions,
    /// Files whose data is complete, waiting for their footer.
    done: Vec<OpenFile>,
    /// Whether the first batch has set which columns are written without a dictionary.
    dictionary_decided: bool,
    current: Option<(OpenFile, ArrowRowGroupWriterFactory)>,
    row_group: Option<RowGroupEncoder>,
    /// The number of Parquet leaf columns of each field.
    leaves: Vec<usize>,
    digest: DigestState,
    /// Files carried over from the live partition, and their digest.
    kept: Vec<FileEntry>,
    kept_digest: DigestState,
    /// Where the digest of the rows written comes from when they are not all hashed
    /// (see [`Self::derive_digest`]).
    derived: Option<Arc<Difference>>,
    /// Index of the first file this writer names (after the kept files' names).
    first_index: usize,
    generation: u64,
    /// Random, in every file name this writer gives: no two versions of a partition
    /// share a file name, so a reader that lists a partition and then opens its files
    /// one by one fails on a file a publish removed meanwhile, instead of reading a
    /// newer version's file of the same name.
    token: u32,
}

impl PartitionWriter {
    /// `schema` is the schema of the data columns (partition columns excluded).
    pub fn new(
        partition: PartitionPath,
        dir: PathBuf,
        schema: SchemaRef,
        opts: WriterOptions,
    ) -> Result<Self> {
        crate::digest::check_schema(&schema)?;
        let leaves = schema
            .fields()
            .iter()
            .map(|f| {
                let empty = arrow::array::new_empty_array(f.data_type());
                compute_leaves(f, &empty).map(|l| l.len())
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(|source| Error::Parquet {
                partition: partition.to_string(),
                source,
            })?;
        durable::create_dir_all(&dir)?;
        let props = writer_properties(&opts, &[]);
        Ok(Self {
            partition,
            dir,
            schema,
            props: Arc::new(props),
            dictionary_decided: false,
            opts,
            done: Vec::new(),
            current: None,
            row_group: None,
            leaves,
            digest: DigestState::default(),
            kept: Vec::new(),
            kept_digest: DigestState::default(),
            derived: None,
            first_index: 0,
            generation: 0,
            token: file_token(),
        })
    }

    /// Carries `files` of the live partition over unchanged: each is hard-linked into
    /// the staging directory (copied where links are not supported) and listed in the
    /// new manifest, whose `generation` must be one more than the live one's. New files
    /// are named after the kept ones. Call before the first write.
    pub fn keep(&mut self, files: Vec<KeptFile>, generation: u64) -> Result<()> {
        assert!(
            self.current.is_none() && self.done.is_empty(),
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
    /// (a merge hashes only what it changes; W4: 5.1 M rows hashed down to 0.9 M). The
    /// rows of any later file are hashed as usual, and the first file's sum is what
    /// they leave of the total. [`Self::finish`] fails if the rows counted and the
    /// total's differ. Call before the first write.
    pub fn derive_digest(&mut self, rows: Arc<Difference>) {
        assert!(
            self.current.is_none() && self.done.is_empty(),
            "derive_digest() before any write"
        );
        self.derived = Some(rows);
    }

    pub fn partition(&self) -> &PartitionPath {
        &self.partition
    }

    pub fn rows(&self) -> u64 {
        self.digest.rows() + self.row_group.as_ref().map_or(0, |rg| rg.rows as u64)
    }

    /// Encoded bytes so far, including the buffered row group as of the batches
    /// encoded (a few more may be queued, see encode.rs).
    pub fn bytes(&self) -> u64 {
        let done: u64 = self.done.iter().map(|f| f.bytes).sum();
        let cur = self.current.as_ref().map(|(f, _)| f.bytes).unwrap_or(0);
        let buffered = self.row_group.as_ref().map_or(0, |rg| rg.estimated_bytes());
        done + cur + buffered as u64
    }

    /// Memory held by the buffered row group's writers (the few batches queued for
    /// encoding across the process are bounded separately, see encode.rs).
    pub fn buffered_memory(&self) -> usize {
        self.row_group.as_ref().map_or(0, |rg| rg.memory())
    }

    fn err(&self) -> impl Fn(parquet::errors::ParquetError) -> Error + '_ {
        move |source| Error::Parquet {
            partition: self.partition.to_string(),
            source,
        }
    }

    /// Encodes `batch` (data columns only, in schema order).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if !self.dictionary_decided && batch.num_rows() > 0 {
            // Before the first file opens: which columns skip dictionary encoding.
            self.dictionary_decided = true;
            let plain = high_cardinality_columns(batch);
            if !plain.is_empty() {
                self.props = Arc::new(writer_properties(&self.opts, &plain));
            }
        }
        let mut offset = 0;
        while offset < batch.num_rows() {
            if self.row_group.is_none() {
                self.start_row_group()?;
            }
            let rg = self.row_group.as_ref().expect("row group started");
            let room = self.opts.row_group_rows - rg.rows;
            let take = room.min(batch.num_rows() - offset);
            let slice = if offset == 0 && take == batch.num_rows() {
                batch.clone()
            } else {
                batch.slice(offset, take)
            };
            self.write_to_row_group(&slice)?;
            offset += take;
            if self
                .row_group
                .as_ref()
                .is_some_and(|rg| rg.rows >= self.opts.row_group_rows)
            {
                self.flush_row_group()?;
            }
        }
        Ok(())
    }

    fn write_to_row_group(&mut self, batch: &RecordBatch) -> Result<()> {
        // The first file's digest is derived when a `Difference` gives it.
        let hash = self.derived.is_none() || !self.done.is_empty();
        let rg = self.row_group.as_mut().expect("row group started");
        rg.push(batch, hash).map_err(|source| Error::Parquet {
            partition: self.partition.to_string(),
            source,
        })
    }

    fn start_row_group(&mut self) -> Result<()> {
        if self.current.is_none() {
            self.open_file()?;
        }
        let (file, factory) = self.current.as_mut().expect("file open");
        let index = file.row_groups;
        file.row_groups += 1;
        let columns = factory.create_column_writers(index).map_err(self.err())?;
        self.row_group = Some(RowGroupEncoder::new(
            self.schema.fields(),
            columns,
            &self.leaves,
        ));
        Ok(())
    }

    fn open_file(&mut self) -> Result<()> {
        let index = self.first_index + self.done.len();
        let name = format!("part-{:08x}-{index:05}.parquet", self.token);
        let file = SpillFile::create(self.dir.join(&name))?;
        let parquet_schema = ArrowSchemaConverter::new()
            .with_coerce_types(self.props.coerce_types())
            .convert(&self.schema)
            .map_err(self.err())?;
        let writer = SerializedFileWriter::new(
            file,
            parquet_schema.root_schema_ptr(),
            Arc::clone(&self.props),
        )
        .map_err(self.err())?;
        let factory = ArrowRowGroupWriterFactory::new(&writer, Arc::clone(&self.schema));
        self.current = Some((
            OpenFile {
                name,
                writer: Some(writer),
                appending: None,
                row_groups: 0,
                bytes: 0,
                rows: 0,
                digest: DigestState::default(),
            },
            factory,
        ));
        Ok(())
    }

    /// Writes the buffered row group out now (to bound memory across many partitions),
    /// waiting for its append so that its memory is free on return.
    pub fn flush(&mut self) -> Result<()> {
        self.flush_row_group()?;
        let current = self.current.iter_mut().map(|(f, _)| f);
        for f in self.done.iter_mut().chain(current) {
            f.writer()?;
        }
        Ok(())
    }

    fn flush_row_group(&mut self) -> Result<()> {
        let Some(rg) = self.row_group.take() else {
            return Ok(());
        };
        let partition = self.partition.to_string();
        let rows = rg.rows;
        let (columns, digest) = rg.finish().map_err(self.err())?;
        let chunks: Vec<_> = columns
            .into_par_iter()
            .map(|c| c.close())
            .collect::<Result<_, _>>()
            .map_err(self.err())?;
        self.digest.merge(digest);
        let (file, _) = self.current.as_mut().expect("file open");
        file.digest.merge(digest);
        file.writer()?; // the previous row group is in the file
        let mut writer = file.writer.take().expect("writer ready");
        file.bytes += chunks.iter().map(|c| c.close().bytes_written).sum::<u64>();
        file.rows += rows as u64;
        let append = move || -> Result<FileWriter> {
            let err = |source| Error::Parquet { partition, source };
            let append = |writer: &mut FileWriter| {
                let mut group = writer.next_row_group()?;
                for chunk in chunks {
                    chunk.append_to_row_group(&mut group)?;
                }
                group.close()?;
                writer.flush()?;
                Ok(())
            };
            append(&mut writer).map_err(err)?;
            writer.inner_mut().release();
            crate::failpoint::hit("after_row_group")?;
            Ok(writer)
        };
        file.appending = Some(
            std::thread::Builder::new()
                .name("idem-append".into())
                .spawn(append)
                .map_err(Error::io("spawn a thread for", &self.dir))?,
        );
        if file.bytes >= self.opts.target_file_bytes {
            let (file, _) = self.current.take().expect("file open");
            self.done.push(file);
        }
        Ok(())
    }

    /// Completes the partition: writes every footer with the manifest. A partition with
    /// no rows becomes one zero-row file. Nothing is fsynced yet: the backend makes the
    /// files durable when it publishes them, so a partition found unchanged (most
    /// re-runs) is discarded without waiting for the disk.
    pub fn finish(mut self, run: &RunInfo, schema: Vec<ColumnEntry>) -> Result<WrittenPartition> {
        self.flush_row_group()?;
        if let Some((file, _)) = self.current.take() {
            self.done.push(file);
        }
        if self.done.is_empty() {
            self.open_file()?;
            let (file, _) = self.current.take().expect("file open");
            self.done.push(file);
        }
        for f in self.done.iter_mut() {
            f.writer()?;
        }
        if let Some(rows) = self.derived.take() {
            self.derive_first_file(&rows)?;
        }
        let mut files = std::mem::take(&mut self.kept);
        files.extend(self.done.iter().map(|f| FileEntry {
            name: f.name.clone(),
            rows: f.rows,
            data_bytes: f.writer.as_ref().expect("appended").bytes_written() as u64,
            sum: Some(f.digest.sum_hex()),
        }));
        let mut digest = self.digest;
        digest.merge(self.kept_digest);
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            partition: self.partition.rel_path().to_string_lossy().into_owned(),
            rows: digest.rows(),
            data_bytes: files.iter().map(|f| f.data_bytes).sum(),
            files,
            schema_fingerprint: schema_fingerprint(&schema),
            schema,
            digest: digest.finish(),
            generation: self.generation,
            run: run.clone(),
        };
        let manifest_json = manifest.to_json();
        let arrow_schema = parquet::arrow::encode_arrow_schema(&plain_schema(&self.schema));
        let partition = self.partition.to_string();
        std::mem::take(&mut self.done)
            .into_par_iter()
            .try_for_each(|mut f| -> Result<()> {
                let err = |source| Error::Parquet {
                    partition: partition.clone(),
                    source,
                };
                let mut writer = f.writer.take().expect("appended");
                writer.append_key_value_metadata(KeyValue::new(
                    MANIFEST_KEY.into(),
                    manifest_json.clone(),
                ));
                writer.append_key_value_metadata(KeyValue::new(
                    "ARROW:schema".into(),
                    arrow_schema.clone(),
                ));
                writer.into_inner().map_err(err)?;
                crate::failpoint::hit("after_footers")
            })?;
        Ok(WrittenPartition {
            partition: self.partition,
            dir: self.dir,
            manifest,
            expected: None,
        })
    }

    /// Sets the digest of the rows written, and of the first file, from `rows`' total.
    fn derive_first_file(&mut self, rows: &Difference) -> Result<()> {
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

    /// Abandons the partition, removing what was staged.
    pub fn abort(self) -> Result<()> {
        let dir = self.dir.clone();
        drop(self);
        durable::remove_dir_all(&dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The number in a data file's name, `part-1a2b3c4d-00042.parquet` (or, as idem named
/// files before, `part-00042.parquet`) → 42.
fn file_index(name: &str) -> Option<usize> {
    let stem = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    stem.rsplit('-').next()?.parse().ok()
}

/// A random token for the file names of one writer.
fn file_token() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish() as u32
}

/// The schema recorded in the footer for Arrow readers: view types are recorded as
/// their plain equivalents, which every reader understands.
fn plain_schema(schema: &Schema) -> Schema {
    fn plain(dt: &DataType) -> DataType {
        match dt {
            DataType::Utf8View => DataType::Utf8,
            DataType::BinaryView => DataType::Binary,
            DataType::List(f) => DataType::List(Arc::new(plain_field(f))),
            DataType::LargeList(f) => DataType::LargeList(Arc::new(plain_field(f))),
            DataType::Struct(fs) => {
                DataType::Struct(fs.iter().map(|f| Arc::new(plain_field(f))).collect())
            }
            other => other.clone(),
        }
    }
    fn plain_field(f: &Field) -> Field {
        f.clone().with_data_type(plain(f.data_type()))
    }
    Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| Arc::new(plain_field(f)))
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::digest_batch;
    use crate::manifest::{describe_schema, read_from_file};
    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn batch(start: i64, n: i64) -> RecordBatch {
        let ids: Vec<i64> = (start..start + n).collect();
        let names: Vec<String> = ids.iter().map(|i| format!("name-{i}")).collect();
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("name", Arc::new(StringArray::from(names)) as ArrayRef),
        ])
        .unwrap()
    }

    fn write(dir: &Path, opts: WriterOptions, batches: &[RecordBatch]) -> WrittenPartition {
        let schema = batches[0].schema();
        let p = PartitionPath::new(vec![("dt".into(), Some("2026-06-01".into()))]);
        let mut w = PartitionWriter::new(p, dir.to_path_buf(), Arc::clone(&schema), opts).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish(&RunInfo::default(), describe_schema(&schema, &[]))
            .unwrap()
    }

    /// Nearly-unique columns are written without a dictionary, repetitive ones with
    /// one, and the rows read back the same either way.
    #[test]
    fn high_cardinality_columns_skip_the_dictionary() {
        let dir = tempfile::tempdir().unwrap();
        let n = 5000i64;
        let ids: Vec<i64> = (0..n).collect();
        let status: Vec<&str> = (0..n)
            .map(|i| ["paid", "shipped"][i as usize % 2])
            .collect();
        let b = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("status", Arc::new(StringArray::from(status)) as ArrayRef),
        ])
        .unwrap();
        let written = write(
            dir.path(),
            WriterOptions::default(),
            std::slice::from_ref(&b),
        );
        let file = File::open(written.dir.join(&written.manifest.files[0].name)).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let chunk = |i: usize| {
            reader
                .metadata()
                .row_group(0)
                .column(i)
                .dictionary_page_offset()
        };
        assert_eq!(chunk(0), None, "id has a dictionary");
        assert!(chunk(1).is_some(), "status has no dictionary");
        let back: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
        let back = arrow::compute::concat_batches(&back[0].schema(), &back).unwrap();
        assert_eq!(back.columns(), b.columns());
        // Too few rows to judge: every column keeps its dictionary.
        let small = tempfile::tempdir().unwrap();
        let written = write(small.path(), WriterOptions::default(), &[batch(0, 100)]);
        let file = File::open(written.dir.join(&written.manifest.files[0].name)).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        assert!(
            reader
                .metadata()
                .row_group(0)
                .column(0)
                .dictionary_page_offset()
                .is_some()
        );
    }

    /// A nested column's leaves are written by that column's writers, in order: a
    /// struct of two leaves between flat columns, and a list, read back the same over
    /// several row groups.
    #[test]
    fn nested_columns_are_written_leaf_by_leaf() {
        use arrow::array::{Int32Array, ListArray, StructArray};
        use arrow::datatypes::{Field, Int64Type};
        let dir = tempfile::tempdir().unwrap();
        let n = 2500;
        let point = StructArray::from(vec![
            (
                Arc::new(Field::new("x", DataType::Int32, true)),
                Arc::new(Int32Array::from_iter(
                    (0..n).map(|i| (i % 7 != 0).then_some(i)),
                )) as ArrayRef,
            ),
            (
                Arc::new(Field::new("label", DataType::Utf8, true)),
                Arc::new(StringArray::from_iter(
                    (0..n).map(|i| Some(format!("p{i}"))),
                )) as ArrayRef,
            ),
        ]);
        let tags = ListArray::from_iter_primitive::<Int64Type, _, _>(
            (0..n).map(|i| (i % 5 != 0).then(|| (0..i as i64 % 4).map(Some).collect::<Vec<_>>())),
        );
        let b = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
            ),
            ("point", Arc::new(point) as ArrayRef),
            ("tags", Arc::new(tags) as ArrayRef),
            (
                "note",
                Arc::new(StringArray::from_iter(
                    (0..n).map(|i| Some(["a", "b"][i as usize % 2])),
                )) as ArrayRef,
            ),
        ])
        .unwrap();
        let opts = WriterOptions {
            row_group_rows: 1000,
            ..Default::default()
        };
        let written = write(dir.path(), opts, &[b.slice(0, 1200), b.slice(1200, 1300)]);
        assert_eq!(written.manifest.rows, n as u64);
        let file = File::open(written.dir.join(&written.manifest.files[0].name)).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 3);
        let back: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
        let back = arrow::compute::concat_batches(&back[0].schema(), &back).unwrap();
        assert_eq!(back.columns(), b.columns());
    }

    #[test]
    fn files_roll_and_every_footer_carries_the_whole_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let batches: Vec<_> = (0..20).map(|i| batch(i * 1000, 1000)).collect();
        let small = WriterOptions {
            row_group_rows: 3000,
            target_file_bytes: 16 << 10,
            ..Default::default()
        };
        let rolled = write(&dir.path().join("a"), small, &batches);
        let one = write(&dir.path().join("b"), WriterOptions::default(), &batches);
        assert!(
            rolled.manifest.files.len() > 1,
            "{:?}",
            rolled.manifest.files
        );
        assert_eq!(one.manifest.files.len(), 1);
        assert_eq!(rolled.manifest.rows, 20_000);
        // The digest does not depend on how rows are split into files.
        assert_eq!(rolled.manifest.digest, one.manifest.digest);

        let mut rows = 0;
        for f in &rolled.manifest.files {
            let path = rolled.dir.join(&f.name);
            assert_eq!(read_from_file(&path).unwrap().unwrap(), rolled.manifest);
            let reader =
                ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
                    .unwrap()
                    .build()
                    .unwrap();
            let n: usize = reader.map(|b| b.unwrap().num_rows()).sum();
            assert_eq!(n as u64, f.rows);
            rows += n;
        }
        assert_eq!(rows, 20_000);
    }

    #[test]
    fn an_empty_partition_is_one_zero_row_file_with_schema_and_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let schema = batch(0, 1).schema();
        let p = PartitionPath::new(vec![("dt".into(), Some("2026-06-02".into()))]);
        let w = PartitionWriter::new(
            p,
            dir.path().join("e"),
            Arc::clone(&schema),
            WriterOptions::default(),
        )
        .unwrap();
        let written = w
            .finish(&RunInfo::default(), describe_schema(&schema, &[]))
            .unwrap();
        assert_eq!(written.manifest.rows, 0);
        assert_eq!(written.manifest.files.len(), 1);
        let path = written.dir.join(&written.manifest.files[0].name);
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(builder.schema().fields().len(), 2);
        assert_eq!(builder.metadata().file_metadata().num_rows(), 0);
        assert_eq!(
            read_from_file(&path).unwrap().unwrap().digest,
            written.manifest.digest
        );
    }

    /// A writer given a `Difference` hashes no row of its first file and still records
    /// the digest, and every file's sum, that hashing every row gives; it refuses to
    /// finish when the rows it was given are not the rows the difference counts.
    #[test]
    fn a_derived_digest_equals_hashing_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let schema = batch(0, 1).schema();
        // The live file: rows 0..3000. The merge drops rows 1000..1500 and adds 5000..5600.
        let live = digest_batch(&batch(0, 3000));
        let kept = [batch(0, 1000), batch(1500, 1500)];
        let added = batch(5000, 600);
        let written = |name: &str, opts: WriterOptions, derive: Option<Arc<Difference>>| {
            let mut w = PartitionWriter::new(
                PartitionPath::root(),
                dir.path().join(name),
                Arc::clone(&schema),
                opts,
            )
            .unwrap();
            if let Some(rows) = derive {
                w.derive_digest(rows);
            }
            for b in kept.iter().chain([&added]) {
                w.write(b).unwrap();
            }
            w.finish(&RunInfo::default(), describe_schema(&schema, &[]))
        };
        let difference = || {
            let rows = Difference::new(live);
            rows.remove(digest_batch(&batch(1000, 500)));
            rows.add(digest_batch(&added));
            Arc::new(rows)
        };
        for opts in [
            WriterOptions::default(),
            // Several files: the later ones are hashed, the first gets what is left.
            WriterOptions {
                row_group_rows: 500,
                target_file_bytes: 1,
                ..Default::default()
            },
        ] {
            let hashed = written("hashed", opts.clone(), None).unwrap();
            let derived = written("derived", opts.clone(), Some(difference())).unwrap();
            assert_eq!(derived.manifest.digest, hashed.manifest.digest);
            // The same files but for their names (each writer names its own).
            let unnamed = |w: &WrittenPartition| {
                let files = w.manifest.files.iter();
                files
                    .map(|f| (f.rows, f.data_bytes, f.sum.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(unnamed(&derived), unnamed(&hashed));
            assert_eq!(derived.manifest.rows, 3100);
            std::fs::remove_dir_all(dir.path().join("hashed")).unwrap();
            std::fs::remove_dir_all(dir.path().join("derived")).unwrap();
        }
        // One dropped row too few: the rows written are not the rows counted.
        let wrong = Difference::new(live);
        wrong.remove(digest_batch(&batch(1000, 499)));
        wrong.add(digest_batch(&added));
        let err = written("wrong", WriterOptions::default(), Some(Arc::new(wrong))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the digest of partition (table) could not be derived: 3100 rows were written where 3101 were expected"
        );
    }

    #[test]
    fn kept_files_are_linked_listed_and_counted_in_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let small = WriterOptions {
            row_group_rows: 1000,
            target_file_bytes: 1,
            ..Default::default()
        };
        // The old partition: three files of 1000 rows each.
        let old = write(
            &dir.path().join("old"),
            small.clone(),
            &[batch(0, 1000), batch(1000, 1000), batch(2000, 1000)],
        );
        assert_eq!(old.manifest.files.len(), 3);
        // A merge keeps files 0 and 2 and rewrites the middle one with new rows.
        let kept: Vec<KeptFile> = [0, 2]
            .iter()
            .map(|&i| KeptFile {
                path: old.dir.join(&old.manifest.files[i].name),
                entry: old.manifest.files[i].clone(),
            })
            .collect();
        let schema = batch(0, 1).schema();
        let mut w = PartitionWriter::new(
            old.partition.clone(),
            dir.path().join("new"),
            Arc::clone(&schema),
            small,
        )
        .unwrap();
        w.keep(kept, old.manifest.generation + 1).unwrap();
        w.write(&batch(1000, 1000)).unwrap();
        let new = w
            .finish(&RunInfo::default(), describe_schema(&schema, &[]))
            .unwrap();
        // Same rows as before: the same digest, computed without reading the kept files.
        assert_eq!(new.manifest.digest, old.manifest.digest);
        assert_eq!(new.manifest.rows, 3000);
        assert_eq!(new.manifest.generation, 1);
        // The kept files keep their names; the new file is numbered after them, with a
        // token of its own (no version of a partition reuses another's file names).
        let names: Vec<&str> = new.manifest.files.iter().map(|f| f.name.as_str()).collect();
        let old_names: Vec<&str> = old.manifest.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names[..2], [old_names[0], old_names[2]]);
        assert!(names[2].ends_with("-00003.parquet"), "{names:?}");
        assert!(!old_names.contains(&names[2]), "{names:?}");
        // Kept files are the same inodes; the partition reads as the newest manifest.
        use std::os::unix::fs::MetadataExt;
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&old.dir.join(names[1])), ino(&new.dir.join(names[1])));
        match crate::manifest::read_partition(&new.dir).unwrap() {
            crate::manifest::LiveState::Managed(m) => assert_eq!(*m, new.manifest),
            other => panic!("{other:?}"),
        }
    }
}
