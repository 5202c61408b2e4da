//! Listings that refuse a `.parquet` file of zero bytes.
//!
//! DataFusion skips empty files, and a Parquet file is never empty: one is a truncated
//! copy or a failed write, and a run that read around it would publish a partition
//! without its rows. A listing through [`RefuseEmpty`] that meets one fails with
//! [`EmptyParquet`] naming it, on disk or on a store alike.

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// A `.parquet` file of zero bytes met by a listing: not a Parquet file.
#[derive(Debug)]
pub struct EmptyParquet {
    /// The file's path on disk, or its URL.
    pub path: String,
}

impl std::fmt::Display for EmptyParquet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "file {} is empty (0 bytes): not a Parquet file (a truncated copy or a failed \
             write?)",
            self.path
        )
    }
}

impl std::error::Error for EmptyParquet {}

/// `meta` itself, or the error for an empty Parquet file, named as `base` (a store's
/// URL without a trailing `/`, or empty on disk) joined with its location.
fn not_empty(meta: ObjectMeta, base: &str) -> Result<ObjectMeta> {
    if meta.size == 0 && meta.location.as_ref().ends_with(".parquet") {
        return Err(object_store::Error::Generic {
            store: "listing",
            source: Box::new(EmptyParquet {
                path: format!("{base}/{}", meta.location),
            }),
        });
    }
    Ok(meta)
}

/// A store whose listings fail on an empty `.parquet` object; everything else is the
/// inner store's.
#[derive(Debug)]
pub struct RefuseEmpty {
    inner: Arc<dyn ObjectStore>,
    /// The store's URL (`s3://bucket`), naming the objects in errors.
    base: String,
}

impl RefuseEmpty {
    pub fn new(inner: Arc<dyn ObjectStore>, base: &str) -> Self {
        Self {
            inner,
            base: base.trim_end_matches('/').to_string(),
        }
    }
}

impl std::fmt::Display for RefuseEmpty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait]
impl ObjectStore for RefuseEmpty {
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

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        use futures::StreamExt as _;
        let base = self.base.clone();
        self.inner
            .list(prefix)
            .map(move |meta| meta.and_then(|m| not_empty(m, &base)))
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        use futures::StreamExt as _;
        let base = self.base.clone();
        self.inner
            .list_with_offset(prefix, offset)
            .map(move |meta| meta.and_then(|m| not_empty(m, &base)))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let listed = self.inner.list_with_delimiter(prefix).await?;
        let objects = listed
            .objects
            .into_iter()
            .map(|m| not_empty(m, &self.base))
            .collect::<Result<Vec<_>>>()?;
        Ok(ListResult { objects, ..listed })
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}
