//! The store probe: idem's commit is safe against concurrent writers only on a store
//! that enforces conditional writes, so each store is tried once per process before a
//! run writes to it, and one that ignores them is refused.

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use super::lease::{boot_id, hostname};
use crate::error::{Error, Result};
use crate::store::raw_key;

use super::ObjectTable;

/// Whether `store` enforces the conditional writes the commit protocol stands on:
/// a second create-if-absent of one key must fail with `AlreadyExists`, and an update
/// against a version that is not the object's must fail with `Precondition`. Some
/// S3-compatible servers accept the headers and ignore them; on such a store two
/// writers could both "win" a partition, so idem refuses to write there. Leaves
/// nothing behind at `key`.
pub async fn probe_conditional_writes(
    store: &dyn ObjectStore,
    key: &ObjectPath,
) -> std::result::Result<(), Probe> {
    let put = |mode: PutMode| {
        store.put_opts(
            key,
            PutPayload::from_static(b"idem probe"),
            PutOptions::from(mode),
        )
    };
    let verdict = async {
        put(PutMode::Create).await.map_err(Probe::Failed)?;
        match put(PutMode::Create).await {
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Ok(_) => {
                return Err(Probe::Ignored(
                    "a second create-if-absent of one key succeeded",
                ));
            }
            Err(object_store::Error::NotImplemented { .. }) => {
                return Err(Probe::Ignored("create-if-absent is not implemented"));
            }
            Err(e) => return Err(Probe::Failed(e)),
        }
        let stale = UpdateVersion {
            e_tag: Some("\"00000000000000000000000000000000\"".into()),
            version: Some("1".into()),
        };
        match put(PutMode::Update(stale)).await {
            Err(object_store::Error::Precondition { .. }) => Ok(()),
            Ok(_) => Err(Probe::Ignored(
                "an update against a stale version succeeded",
            )),
            Err(object_store::Error::NotImplemented { .. }) => {
                Err(Probe::Ignored("update-if-match is not implemented"))
            }
            Err(e) => Err(Probe::Failed(e)),
        }
    }
    .await;
    store.delete(key).await.ok();
    verdict
}

/// Why a store failed [`probe_conditional_writes`].
#[derive(Debug)]
pub enum Probe {
    /// The store answered, and does not enforce conditional writes: a verdict.
    Ignored(&'static str),
    /// A request failed (network, permissions): no verdict.
    Failed(object_store::Error),
}

impl ObjectTable {
    /// Probes the store once per process, bucket and options (see
    /// [`probe_conditional_writes`]); a store that ignores conditional writes is refused
    /// with the reason. Only answers are remembered: a failed request is reported as
    /// such, and the next run probes again.
    pub(super) async fn check_conditional_writes(&self) -> Result<()> {
        type Verdicts = std::collections::HashMap<
            (String, crate::store::StorageOptions),
            std::result::Result<(), &'static str>,
        >;
        static VERDICTS: std::sync::OnceLock<std::sync::Mutex<Verdicts>> =
            std::sync::OnceLock::new();
        let store_key = (
            crate::store::store_base(&self.url).unwrap_or_default(),
            self.options.clone(),
        );
        let verdicts = VERDICTS.get_or_init(Default::default);
        let known = verdicts
            .lock()
            .expect("not poisoned")
            .get(&store_key)
            .copied();
        let verdict = match known {
            Some(v) => v,
            None => {
                let key = self.probe_key();
                let v = match probe_conditional_writes(self.store.as_ref(), &key).await {
                    Ok(()) => Ok(()),
                    Err(Probe::Ignored(reason)) => Err(reason),
                    Err(Probe::Failed(e)) => {
                        return Err(self.err("probe conditional writes at", &key)(e));
                    }
                };
                verdicts.lock().expect("not poisoned").insert(store_key, v);
                v
            }
        };
        verdict.map_err(|reason| Error::Url {
            url: self.url.clone(),
            reason: format!(
                "this store does not enforce conditional writes ({reason}), which idem's \
                 commit needs to be safe against concurrent writers; refusing to write"
            ),
        })
    }

    /// A key of its own for each probe (runs of a backfill may probe at once) under
    /// `_idem/<table>/probe/`; `recover` removes any a killed process left.
    pub(super) fn probe_key(&self) -> ObjectPath {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        raw_key(format!(
            "{}/probe/{:016x}-{}-{}",
            self.meta,
            xxhash_rust::xxh3::xxh3_64(format!("{}/{}", hostname(), boot_id()).as_bytes()),
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ))
    }
}
