//! The object stores a run reaches, carried to the cluster in the session's
//! configuration (`idem.stores`: per base URL, the job's storage options) so that the
//! scheduler and every executor open the sources and the table as the client does.
//! Credentials are not carried: each process takes them from its own environment, as
//! the client does.

use std::any::Any;
use std::sync::Arc;

use ballista_core::extension::SessionConfigExt;
use datafusion::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::prelude::SessionConfig;

use super::Stores;
use crate::job::Job;

/// The `idem.*` options of a session.
#[derive(Clone, Debug, Default)]
pub(super) struct IdemOptions {
    /// [`Stores`] as JSON.
    stores: String,
}

impl ExtensionOptions for IdemOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "stores" => {
                self.stores = value.to_string();
                Ok(())
            }
            _ => Err(DataFusionError::Configuration(format!(
                "unknown option idem.{key}"
            ))),
        }
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        vec![ConfigEntry {
            key: format!("{}.stores", Self::PREFIX),
            value: Some(self.stores.clone()),
            description: "the object stores of a run: base URL -> storage options (JSON)",
        }]
    }
}

impl ConfigExtension for IdemOptions {
    const PREFIX: &'static str = "idem";
}

/// Every object store the job reads or writes, with its options.
pub(super) fn stores_of(job: &Job) -> Stores {
    let target = job.target.path.to_string_lossy().into_owned();
    job.sources
        .iter()
        .map(|s| (s.path.as_str(), &s.storage))
        .chain(std::iter::once((target.as_str(), &job.storage)))
        .filter(|(path, _)| idem_io::store::is_url(path))
        .filter_map(|(path, opts)| Some((idem_io::store::store_base(path)?, opts.clone())))
        .collect()
}

/// A Ballista session configuration with idem's options (empty: a scheduler's or
/// executor's, which each job's settings then fill).
pub(super) fn session_config(stores: &Stores) -> SessionConfig {
    let options = IdemOptions {
        stores: serde_json::to_string(stores).expect("stores serialize"),
    };
    let mut config = SessionConfig::new_with_ballista().with_option_extension(options);
    // The scheduler and executors plan and run with the paths known to give wrong
    // rows off, as a local run does.
    crate::known_wrong::switch_off(config.options_mut());
    config
}

/// A runtime whose object stores are those the session's `idem.stores` names.
pub(super) fn runtime(config: &SessionConfig) -> Result<Arc<RuntimeEnv>> {
    let runtime = RuntimeEnvBuilder::new().build()?;
    let Some(options) = config.options().extensions.get::<IdemOptions>() else {
        return Ok(Arc::new(runtime));
    };
    if options.stores.is_empty() {
        return Ok(Arc::new(runtime));
    }
    let stores: Stores = serde_json::from_str(&options.stores)
        .map_err(|e| DataFusionError::Configuration(format!("idem.stores does not parse: {e}")))?;
    for (base, opts) in &stores {
        let store = idem_io::store::object_store(base, opts)
            .map_err(|e| DataFusionError::Configuration(format!("{base}: {e}")))?;
        let url = ListingTableUrl::parse(base)?.object_store();
        runtime.register_object_store(url.as_ref(), store);
    }
    Ok(Arc::new(runtime))
}
