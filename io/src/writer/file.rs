//! One data file being written: its handle released between row groups (a run with
//! many partitions open holds few descriptors, and the write-back of what it wrote
//! starts early), each closed row group appended on a thread of its own so the next
//! one's encoding does not wait.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use parquet::file::writer::SerializedFileWriter;

use crate::digest::DigestState;
use crate::error::{Error, Result};

pub(super) type FileWriter = SerializedFileWriter<SpillFile>;

/// A file that holds its descriptor only while bytes are being written: the handle is
/// released after each row group, so a run writing thousands of partitions does not
/// run out of file descriptors. Reopened in append mode on the next write.
pub(super) struct SpillFile {
    path: PathBuf,
    file: Option<File>,
    /// Bytes written, and how many of them the disk has been asked to take already.
    written: u64,
    flushing: u64,
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

pub(super) struct OpenFile {
    pub(super) name: String,
    /// `None` while a thread appends a row group to the file (see [`Appending`]).
    pub(super) writer: Option<FileWriter>,
    pub(super) appending: Option<Appending>,
    /// Row groups started, and the bytes of those closed (for rolling files).
    pub(super) row_groups: usize,
    pub(super) bytes: u64,
    pub(super) rows: u64,
    pub(super) digest: DigestState,
}

/// A closed row group being appended to its file on a thread of its own, so the next
/// row group is encoded meanwhile: the append copies every page into the page cache,
/// which the encoders would otherwise wait for. One per file at a time; the thread
/// hands the file's writer back.
pub(super) type Appending = std::thread::JoinHandle<std::result::Result<FileWriter, Error>>;

impl Drop for OpenFile {
    /// An abandoned file's append finishes before the staging directory can go.
    fn drop(&mut self) {
        if let Some(appending) = self.appending.take() {
            let _ = appending.join();
        }
    }
}

/// The number in a data file's name, `part-1a2b3c4d-00042.parquet` (or, as idem named
/// files before, `part-00042.parquet`) → 42.
pub(super) fn file_index(name: &str) -> Option<usize> {
    let stem = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    stem.rsplit('-').next()?.parse().ok()
}

/// A random token for the file names of one writer.
pub(super) fn file_token() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish() as u32
}

impl SpillFile {
    pub(super) fn create(path: PathBuf) -> Result<Self> {
        // create_new: two writers must never share a file.
        let file = crate::fs::create_new(&path).map_err(Error::io("create", &path))?;
        Ok(Self {
            path,
            file: Some(file),
            written: 0,
            flushing: 0,
        })
    }

    pub(super) fn handle(&mut self) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            self.file = Some(crate::fs::open_append(&self.path)?);
        }
        Ok(self.file.as_mut().expect("just opened"))
    }

    /// Closes the handle, after starting the write-back of the bytes written since the
    /// last release (`POSIX_FADV_DONTNEED` on dirty pages starts it and returns; they
    /// stay cached). The fsync at publish then waits for the last row group only,
    /// instead of the whole file.
    pub(super) fn release(&mut self) {
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

impl OpenFile {
    /// The file's writer, once its last row group is appended.
    pub(super) fn writer(&mut self) -> Result<&mut FileWriter> {
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
