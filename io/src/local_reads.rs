//! The local file system as queries read it: ranged reads land in recycled buffers.
//!
//! A Parquet scan reads every column chunk it needs with one ranged read, into a
//! buffer of its own (several MiB for a day of a column) that lives until the row
//! group is decoded. object_store's local store allocates and zeroes a new buffer for
//! each read, and the reads run on tokio's blocking threads, each with an allocator
//! arena of its own, so nearly every one of those buffers is fresh memory: a page
//! fault and a cleared page for every 4 KiB read, about as costly as the copy out of
//! the page cache. Here a buffer the query gives up returns to a process-wide pool,
//! and a later read of a similar size (the next date of a backfill, the next row
//! group) reads into it again, its pages already mapped.
//!
//! Only `get_ranges`, the scan's path, is served this way; every other call, and any
//! read this path cannot complete, goes to object_store's local store, so errors read
//! exactly as they always have. (Queries list through [`crate::empty_parquet`], which
//! refuses an empty `.parquet` file.)

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// Reads shorter than this are not worth a pooled buffer (footers, small columns).
const POOLED_MIN: usize = 64 << 10;

/// The most bytes of idle buffers the pool keeps; a buffer given back beyond it is
/// freed. About what four dates of a backfill read at once from a day of a few
/// million rows.
const KEEP_BYTES: usize = 64 << 20;

/// object_store's local file system, with ranged reads into recycled buffers.
#[derive(Debug, Default)]
pub struct LocalReads {
    inner: LocalFileSystem,
}

impl LocalReads {
    pub fn new() -> Self {
        Self::default()
    }
}

impl std::fmt::Display for LocalReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait]
impl ObjectStore for LocalReads {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let Ok(path) = self.inner.path_to_filesystem(location) else {
            return self.inner.get_ranges(location, ranges).await;
        };
        let wanted = ranges.to_vec();
        let read = tokio::task::spawn_blocking(move || read_ranges(&path, &wanted)).await;
        match read {
            Ok(Ok(bytes)) => Ok(bytes),
            // Missing, shorter than asked, unreadable: the local store says what.
            _ => self.inner.get_ranges(location, ranges).await,
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

fn read_ranges(path: &std::path::Path, ranges: &[Range<u64>]) -> std::io::Result<Vec<Bytes>> {
    let file = File::open(path)?;
    ranges.iter().map(|r| read_range(&file, r)).collect()
}

fn read_range(file: &File, range: &Range<u64>) -> std::io::Result<Bytes> {
    let len = range
        .end
        .checked_sub(range.start)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| std::io::Error::other("not a range"))?;
    if len < POOLED_MIN {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, range.start)?;
        return Ok(Bytes::from(buf));
    }
    let mut buf = POOL.take(len);
    // On an error the buffer is dropped here and freed, not pooled: it is simply
    // memory, whatever it holds.
    file.read_exact_at(&mut buf[..len], range.start)?;
    Ok(Bytes::from_owner(Pooled { buf, len }))
}

/// A buffer lent to a reader: its first `len` bytes are the read; it returns to the
/// pool when the last `Bytes` of it is dropped.
struct Pooled {
    buf: Vec<u8>,
    len: usize,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        POOL.give(std::mem::take(&mut self.buf));
    }
}

static POOL: Pool = Pool {
    idle: Mutex::new(Idle {
        by_size: BTreeMap::new(),
        bytes: 0,
    }),
};

/// Idle buffers by size; every buffer's length is a size class (see [`size_class`])
/// and all of it is initialized, so a reader can be handed a slice of it at once.
struct Pool {
    idle: Mutex<Idle>,
}

struct Idle {
    by_size: BTreeMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
}

impl Pool {
    /// A buffer of at least `len` bytes: an idle one of its size class or up to a
    /// quarter larger, else a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let class = size_class(len);
        {
            let mut idle = self.idle.lock().expect("not poisoned");
            let found = idle
                .by_size
                .range_mut(class..=class + class / 4)
                .find_map(|(size, bufs)| bufs.pop().map(|b| (*size, b)));
            if let Some((size, buf)) = found {
                idle.bytes -= size;
                if idle.by_size.get(&size).is_some_and(Vec::is_empty) {
                    idle.by_size.remove(&size);
                }
                return buf;
            }
        }
        vec![0; class]
    }

    fn give(&self, buf: Vec<u8>) {
        let size = buf.len();
        let mut idle = self.idle.lock().expect("not poisoned");
        if size == 0 || idle.bytes + size > KEEP_BYTES {
            return;
        }
        idle.bytes += size;
        idle.by_size.entry(size).or_default().push(buf);
    }
}

/// `len` rounded up to one of eight steps between consecutive powers of two, so that
/// reads of nearly the same size share buffers and a buffer is at most an eighth
/// larger than the read it was made for.
fn size_class(len: usize) -> usize {
    let top = usize::BITS - 1 - len.max(8).leading_zeros();
    let step = 1usize << (top - 3);
    len.div_ceil(step) * step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_at_most_an_eighth_larger() {
        for len in [8, 9, 100, 4095, 4096, 4097, 65_536, 1_000_001, 8_388_609] {
            let class = size_class(len);
            assert!(class >= len, "{len} -> {class}");
            assert!(class - len <= len / 8, "{len} -> {class}");
            assert_eq!(size_class(class), class, "{len} -> {class} is a class");
        }
    }

    #[tokio::test]
    async fn ranged_reads_return_the_bytes_asked_for_and_errors_as_the_local_store_does() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let store = LocalReads::new();
        let path = Path::from_filesystem_path(dir.path().join("f")).unwrap();
        let ranges = [
            0..10,
            5..300_000,
            300_000..1_000_000,
            999_999..1_000_000,
            7..7,
        ];
        // Twice: the second time through buffers the first gave back.
        for _ in 0..2 {
            let got = store.get_ranges(&path, &ranges).await.unwrap();
            for (r, b) in ranges.iter().zip(&got) {
                assert_eq!(&b[..], &data[r.start as usize..r.end as usize], "{r:?}");
            }
        }
        let local = LocalFileSystem::new();
        let past_end = [0..10, 999_000..1_000_001];
        let ours = store.get_ranges(&path, &past_end).await.unwrap_err();
        let theirs = local.get_ranges(&path, &past_end).await.unwrap_err();
        assert_eq!(ours.to_string(), theirs.to_string());
        let gone = Path::from_filesystem_path(dir.path())
            .unwrap()
            .clone()
            .join("gone");
        let ours = store.get_ranges(&gone, &ranges).await.unwrap_err();
        assert!(
            matches!(ours, object_store::Error::NotFound { .. }),
            "{ours}"
        );
    }
}
