//! [`FaultStore`]: an object store that asks [`super::point`] before every call to the
//! store it wraps. Every store idem builds is wrapped (a pass-through while no plan is
//! armed), so fault tests reach every call a run makes, the engine's reads included.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartId, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use super::{Verdict, point, point_async, store_error};

/// Wraps a store (and its multipart interface) with fault points.
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    multipart: Option<Arc<dyn MultipartStore>>,
}

impl FaultStore {
    pub fn new(inner: Arc<dyn ObjectStore>, multipart: Option<Arc<dyn MultipartStore>>) -> Self {
        Self { inner, multipart }
    }

    fn multipart(&self) -> Result<&Arc<dyn MultipartStore>> {
        self.multipart
            .as_ref()
            .ok_or_else(|| object_store::Error::NotImplemented {
                operation: "multipart".into(),
                implementer: self.inner.to_string(),
            })
    }
}

impl std::fmt::Debug for FaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

impl std::fmt::Display for FaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.inner)
    }
}

/// Runs a write `call` under the verdict for `op` on `target`.
async fn write<T>(
    op: &str,
    target: &Path,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match point_async(op, target).await {
        Verdict::Proceed => call.await,
        Verdict::Fail => Err(store_error(op, target)),
        Verdict::Lose => {
            call.await?;
            Err(store_error(op, target))
        }
    }
}

/// Runs a read `call`: a lost response is a failed read.
async fn read<T>(
    op: &str,
    target: &Path,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match point_async(op, target).await {
        Verdict::Proceed => call.await,
        Verdict::Fail | Verdict::Lose => Err(store_error(op, target)),
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        write(
            "put",
            location,
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        write(
            "start upload",
            location,
            self.inner.put_multipart_opts(location, opts),
        )
        .await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let op = if options.head { "head" } else { "get" };
        read(op, location, self.inner.get_opts(location, options)).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let inner = Arc::clone(&self.inner);
        locations
            .then(move |location| {
                let inner = Arc::clone(&inner);
                async move {
                    let location = location?;
                    let one = |l: Path| async move {
                        let mut done =
                            inner.delete_stream(futures::stream::once(async { Ok(l) }).boxed());
                        done.next().await.unwrap_or_else(|| {
                            Err(store_error("delete", &"(no answer)".to_string()))
                        })
                    };
                    match point_async("delete", &location).await {
                        Verdict::Proceed => one(location).await,
                        Verdict::Fail => Err(store_error("delete", &location)),
                        Verdict::Lose => {
                            one(location.clone()).await?;
                            Err(store_error("delete", &location))
                        }
                    }
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let target = prefix.cloned().unwrap_or_default();
        match point("list", &target) {
            Verdict::Proceed => self.inner.list(prefix),
            Verdict::Fail | Verdict::Lose => {
                futures::stream::once(async move { Err(store_error("list", &target)) }).boxed()
            }
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let target = prefix.cloned().unwrap_or_default();
        read("list", &target, self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        write("copy", to, self.inner.copy_opts(from, to, options)).await
    }
}

#[async_trait]
impl MultipartStore for FaultStore {
    async fn create_multipart(&self, path: &Path) -> Result<MultipartId> {
        let mp = self.multipart()?;
        write("start upload", path, mp.create_multipart(path)).await
    }

    async fn put_part(
        &self,
        path: &Path,
        id: &MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> Result<PartId> {
        let mp = self.multipart()?;
        write("upload part", path, mp.put_part(path, id, part_idx, data)).await
    }

    async fn complete_multipart(
        &self,
        path: &Path,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> Result<PutResult> {
        let mp = self.multipart()?;
        write(
            "complete upload",
            path,
            mp.complete_multipart(path, id, parts),
        )
        .await
    }

    async fn abort_multipart(&self, path: &Path, id: &MultipartId) -> Result<()> {
        let mp = self.multipart()?;
        write("abort upload", path, mp.abort_multipart(path, id)).await
    }
}
