//! The streaming Parquet writer of one partition.
//!
//! Rows arrive batch by batch and are encoded at once (small parts of them are held
//! and encoded together, see held.rs), each column in order on rayon, the columns of
//! successive batches in parallel (see encode.rs), while the content digest is
//! computed beside them; only the encoded pages of
//! the current row group are held in memory, so a partition larger than memory is
//! written in bounded space. Files roll at a target size. Footers are written last,
//! when the partition is complete, because every file's footer carries the manifest
//! of the whole partition (its file list, rows and digest).

mod file;
mod held;
mod kept;
mod options;
#[cfg(test)]
mod tests;

pub use crate::staged::WrittenPartition;
pub use kept::KeptFile;
pub use options::WriterOptions;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowSchemaConverter;
use parquet::arrow::arrow_writer::{ArrowRowGroupWriterFactory, compute_leaves};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterPropertiesPtr;
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
use file::{FileWriter, OpenFile, SpillFile, file_token};
use held::Held;
use options::{high_cardinality_columns, plain_schema, writer_properties};

/// Writes one partition's data files into a staging directory.
pub struct PartitionWriter {
    partition: PartitionPath,
    dir: PathBuf,
    schema: SchemaRef,
    props: WriterPropertiesPtr,
    opts: WriterOptions,
    /// Files whose data is complete, waiting for their footer.
    done: Vec<OpenFile>,
    /// Whether the first batch encoded has set which columns are written without a
    /// dictionary.
    dictionary_decided: bool,
    /// Small parts not yet encoded.
    held: Held,
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
            held: Held::default(),
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

    pub fn partition(&self) -> &PartitionPath {
        &self.partition
    }

    pub fn rows(&self) -> u64 {
        let encoding = self.row_group.as_ref().map_or(0, |rg| rg.rows);
        self.digest.rows() + (encoding + self.held.rows()) as u64
    }

    /// Encoded bytes so far, including the buffered row group as of the batches
    /// encoded (a few more may be queued, see encode.rs; rows held are not encoded).
    pub fn bytes(&self) -> u64 {
        let done: u64 = self.done.iter().map(|f| f.bytes).sum();
        let cur = self.current.as_ref().map(|(f, _)| f.bytes).unwrap_or(0);
        let buffered = self.row_group.as_ref().map_or(0, |rg| rg.estimated_bytes());
        done + cur + buffered as u64
    }

    /// Memory held by the buffered row group's writers and the rows held back (the few
    /// batches queued for encoding across the process are bounded separately, see
    /// encode.rs).
    pub fn buffered_memory(&self) -> usize {
        self.row_group.as_ref().map_or(0, |rg| rg.memory()) + self.held.memory()
    }

    fn err(&self) -> impl Fn(parquet::errors::ParquetError) -> Error + '_ {
        move |source| Error::Parquet {
            partition: self.partition.to_string(),
            source,
        }
    }

    /// Writes `batch` (data columns only, in schema order).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if batch.num_rows() < Held::SMALL {
            let enough = self.held.hold(batch).map_err(self.arrow_err())?;
            return if enough { self.encode_held() } else { Ok(()) };
        }
        // The first large batch judges the columns, not the few rows held before it.
        self.decide_dictionaries(batch);
        self.encode_held()?;
        self.encode(batch)
    }

    /// Before the first file opens, from the first rows encoded: which columns skip
    /// dictionary encoding.
    fn decide_dictionaries(&mut self, batch: &RecordBatch) {
        if self.dictionary_decided {
            return;
        }
        self.dictionary_decided = true;
        let plain = high_cardinality_columns(batch);
        if !plain.is_empty() {
            self.props = Arc::new(writer_properties(&self.opts, &plain));
        }
    }

    fn arrow_err(&self) -> impl Fn(arrow::error::ArrowError) -> Error + '_ {
        move |source| Error::Arrow {
            partition: self.partition.to_string(),
            source,
        }
    }

    fn encode_held(&mut self) -> Result<()> {
        match self.held.take().map_err(self.arrow_err())? {
            Some(batch) => self.encode(&batch),
            None => Ok(()),
        }
    }

    fn encode(&mut self, batch: &RecordBatch) -> Result<()> {
        self.decide_dictionaries(batch);
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
        self.encode_held()?;
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
        self.encode_held()?;
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
            rewrite: false,
            uploaded: None,
        })
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
