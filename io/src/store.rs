//! Storage URLs: where a source or table lives, and the object store that reaches it.
//!
//! A plain path (or `file://`) is the local filesystem. `s3://bucket/prefix` is Amazon
//! S3 or any S3-compatible server (built with the `s3` feature, on by default);
//! `gs://` (Google Cloud Storage, feature `gcs`) and `az://`/`abfss://` (Azure, feature
//! `azure`) use object_store's backends of the same interface, configured from their
//! usual environment variables.
//! Credentials and defaults come from the usual AWS environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`); a job's `[storage]` options override them,
//! so a MinIO-like server needs no profile. Transient errors are retried with
//! exponential backoff (object_store's retry configuration).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::multipart::MultipartStore;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Options for object stores, from a job's `[storage]` table (or the CLI).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageOptions {
    /// The S3 endpoint, e.g. `http://127.0.0.1:9000` for a local server.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Permit `http://` endpoints.
    pub allow_http: Option<bool>,
    /// Path-style addressing (`endpoint/bucket/key`), which most S3-compatible servers
    /// need; virtual-hosted style (`bucket.endpoint/key`) when false.
    pub path_style: Option<bool>,
}

impl StorageOptions {
    /// These options with `over`'s set fields in their place (a source's own options
    /// over the job's).
    pub fn overlay(&self, over: &StorageOptions) -> StorageOptions {
        StorageOptions {
            endpoint: over.endpoint.clone().or_else(|| self.endpoint.clone()),
            region: over.region.clone().or_else(|| self.region.clone()),
            allow_http: over.allow_http.or(self.allow_http),
            path_style: over.path_style.or(self.path_style),
        }
    }
}

/// Whether `path` names an object store rather than the local filesystem.
pub fn is_url(path: &str) -> bool {
    path.contains("://") && !path.starts_with("file://")
}

/// The scheme and bucket of a URL (`s3://bucket`), under which its store is registered.
pub fn store_base(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let bucket = rest.split('/').next().filter(|b| !b.is_empty())?;
    Some(format!("{scheme}://{bucket}"))
}

/// A bucket's object store, and its multipart interface where it has one.
pub type Stores = (Arc<dyn ObjectStore>, Option<Arc<dyn MultipartStore>>);

/// Builds the object store for `url`'s bucket.
pub fn object_store(url: &str, opts: &StorageOptions) -> Result<Arc<dyn ObjectStore>> {
    Ok(stores(url, opts)?.0)
}

/// The object store for `url`'s bucket, and its multipart interface where it has one
/// (used to record each upload's id, so a killed run's parts can be aborted later).
///
/// Built once per bucket and options in a process and shared, so every table, source,
/// status read and freshness check reuses one client and its connection pool.
pub fn stores(url: &str, opts: &StorageOptions) -> Result<Stores> {
    type Cache = std::collections::HashMap<(String, StorageOptions), Stores>;
    static CACHE: std::sync::OnceLock<std::sync::Mutex<Cache>> = std::sync::OnceLock::new();
    let base = store_base(url).unwrap_or_default();
    let cache = CACHE.get_or_init(Default::default);
    let cache_key = (base, opts.clone());
    if let Some(hit) = cache.lock().expect("not poisoned").get(&cache_key) {
        return Ok(hit.clone());
    }
    // Every store is reached through the fault layer (a pass-through unless a test
    // arms it), so fault tests see each call a run makes.
    let (store, multipart) = build_stores(url, opts)?;
    let faulty = Arc::new(crate::fault::FaultStore::new(store, multipart.clone()));
    let built: Stores = (
        faulty.clone(),
        multipart.map(|_| faulty as Arc<dyn MultipartStore>),
    );
    cache
        .lock()
        .expect("not poisoned")
        .insert(cache_key, built.clone());
    Ok(built)
}

fn build_stores(url: &str, opts: &StorageOptions) -> Result<Stores> {
    let bad = |reason: String| Error::Url {
        url: url.to_string(),
        reason,
    };
    let base = store_base(url).ok_or_else(|| bad("expected scheme://bucket/path".into()))?;
    let scheme = base.split("://").next().unwrap_or_default();
    match scheme {
        #[cfg(feature = "s3")]
        "s3" | "s3a" => {
            use object_store::aws::AmazonS3Builder;
            let mut b = AmazonS3Builder::from_env().with_url(&base);
            if let Some(e) = &opts.endpoint {
                b = b.with_endpoint(e);
            }
            if let Some(r) = &opts.region {
                b = b.with_region(r);
            }
            if let Some(h) = opts.allow_http {
                b = b.with_allow_http(h);
            }
            if let Some(p) = opts.path_style {
                b = b.with_virtual_hosted_style_request(!p);
            }
            let store = Arc::new(b.build().map_err(|e| bad(e.to_string()))?);
            Ok((store.clone(), Some(store)))
        }
        #[cfg(feature = "gcs")]
        "gs" => {
            use object_store::gcp::GoogleCloudStorageBuilder;
            let b = GoogleCloudStorageBuilder::from_env().with_url(&base);
            let store = Arc::new(b.build().map_err(|e| bad(e.to_string()))?);
            Ok((store.clone(), Some(store)))
        }
        #[cfg(feature = "azure")]
        "az" | "abfs" | "abfss" | "azure" => {
            use object_store::azure::MicrosoftAzureBuilder;
            let mut b = MicrosoftAzureBuilder::from_env().with_url(&base);
            if let Some(e) = &opts.endpoint {
                b = b.with_endpoint(e.clone());
            }
            if let Some(h) = opts.allow_http {
                b = b.with_allow_http(h);
            }
            let store = Arc::new(b.build().map_err(|e| bad(e.to_string()))?);
            Ok((store.clone(), Some(store)))
        }
        // In this process's memory, one store per bucket name: for tests, and gone
        // when the process ends.
        "memory" => {
            type Buckets = std::collections::HashMap<String, Arc<object_store::memory::InMemory>>;
            static BUCKETS: std::sync::OnceLock<std::sync::Mutex<Buckets>> =
                std::sync::OnceLock::new();
            let store = BUCKETS
                .get_or_init(Default::default)
                .lock()
                .expect("not poisoned")
                .entry(base.clone())
                .or_default()
                .clone();
            Ok((store.clone(), Some(store)))
        }
        other => Err(bad(format!(
            "`{other}://` is not supported by this build (supported: {})",
            supported_schemes()
        ))),
    }
}

/// Where runs writing to object stores stage their files locally: `$IDEM_STAGING`, else
/// `idem-staging` in the system's temporary directory.
pub fn local_staging_root() -> std::path::PathBuf {
    std::env::var_os("IDEM_STAGING")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("idem-staging"))
}

/// The URL schemes this build can reach, as its cargo features decide.
fn supported_schemes() -> String {
    let mut out = Vec::new();
    if cfg!(feature = "s3") {
        out.push("s3://");
    }
    if cfg!(feature = "gcs") {
        out.push("gs://");
    }
    if cfg!(feature = "azure") {
        out.push("az://, abfss://");
    }
    out.push("memory:// (this process only)");
    if out.is_empty() {
        "local paths only".into()
    } else {
        out.join(", ")
    }
}

/// The runtime object-store calls run on: one per process, never dropped (a runtime
/// cannot be dropped from inside another one's tasks).
pub(crate) fn io_runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("idem-store")
            .enable_all()
            .build()
            .expect("start the object-store runtime")
    })
}

/// Runs `f` on the object-store runtime and waits for it. The caller is a thread that
/// may block (see [`crate::blocking`]): a plain thread, or one of a runtime's blocking
/// pool — never a runtime's worker, and never one of this runtime's own.
pub(crate) fn block<T: Send>(f: impl std::future::Future<Output = T> + Send) -> T {
    crate::blocking::check("waiting for an object-store request");
    crate::blocking::allowed(|| io_runtime().block_on(f))
}

/// Size and ETag of the object at `url`; `None` when it does not exist or cannot be
/// reached.
pub fn head(url: &str, opts: &StorageOptions) -> Option<(u64, Option<String>)> {
    let store = object_store(url, opts).ok()?;
    let key = raw_key(key_of(url));
    block(async {
        use object_store::ObjectStoreExt;
        store.head(&key).await.ok().map(|m| (m.size, m.e_tag))
    })
}

/// The URLs of the objects directly under the "directory" `url`.
pub fn list_dir(url: &str, opts: &StorageOptions) -> Option<Vec<String>> {
    let store = object_store(url, opts).ok()?;
    let base = store_base(url)?;
    let prefix = raw_key(key_of(url));
    block(async {
        let listed = store.list_with_delimiter(Some(&prefix)).await.ok()?;
        Some(
            listed
                .objects
                .into_iter()
                .map(|o| format!("{base}/{}", o.location))
                .collect(),
        )
    })
}

/// The object path whose key is exactly `key`, as idem writes keys: partition paths
/// are already escaped as Hive escapes them (`dt=2026-06-04 01%3A00%3A00`), and must
/// reach the store as they are. (`Path::from` would percent-encode the `%` again, so
/// readers would see `%253A`.) Listings give keys back the same way.
pub fn raw_key(key: impl AsRef<str>) -> object_store::path::Path {
    let key = key.as_ref();
    object_store::path::Path::parse(key).unwrap_or_else(|_| {
        // Only a key holding control characters or empty segments fails to parse;
        // idem's own keys never do (Hive escaping covers control characters).
        object_store::path::Path::from(key)
    })
}

/// `url` (`scheme://bucket/` and a raw key) as a URL that DataFusion's listing parses
/// back to the same key: it percent-decodes the URL's path once, so the key's `%`,
/// `#` and `?` are encoded first.
pub fn datafusion_url(url: &str) -> String {
    let Some(base) = store_base(url) else {
        return url.to_string();
    };
    let key = key_of(url);
    let mut out = String::with_capacity(url.len() + 8);
    out.push_str(&base);
    out.push('/');
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '#' => out.push_str("%23"),
            '?' => out.push_str("%3F"),
            c => out.push(c),
        }
    }
    out
}

/// The object's key under its bucket: `s3://bucket/a/b` → `a/b`.
pub fn key_of(url: &str) -> String {
    url.split_once("://")
        .map(|(_, rest)| rest.split_once('/').map(|(_, k)| k).unwrap_or(""))
        .unwrap_or(url)
        .trim_start_matches('/')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_store_and_key() {
        assert!(is_url("s3://b/raw/orders/"));
        assert!(!is_url("/data/raw"));
        assert!(!is_url("file:///data/raw"));
        assert_eq!(store_base("s3://b/raw/orders/").as_deref(), Some("s3://b"));
        assert_eq!(store_base("s3:///x"), None);
        assert_eq!(
            key_of("s3://b/raw/orders/x.parquet"),
            "raw/orders/x.parquet"
        );
        assert_eq!(key_of("s3://b"), "");
    }

    #[test]
    fn unknown_schemes_are_refused_by_name() {
        let e = object_store("gopher://b/x", &StorageOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("gopher://"), "{e}");
    }
}
