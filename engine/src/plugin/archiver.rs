//! Archiver backends run as WASM components. The engine owns keys, manifests and every
//! check; a backend only stores bytes, and the host checks that its answers match what was
//! asked. A backend gets only the capabilities of the policy's grant for its content hash
//! (`grants`). `WasmArchiver` is an `ArchiveBackend`, so a table can archive through it; its
//! calls run on blocking threads, never on the async executor.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::bindings::archiver_world::{Archiver as ArchiverBindings, ArchiverPre};
use super::bindings::wit_types::BackendError;
use super::instance::{PluginInstance, WorldBindings};
use super::{Capabilities, LoadedPlugin, PluginState};
use crate::error::{Error, Result};
use crate::storage::{ArchiveBackend, ObjectInfo, PutOutcome};

/// Per-call time limit of an archiver unless its policy sets one: a call includes its storage
/// I/O (a blob store call waits for the native target), so it is longer than other roles'.
pub const ARCHIVER_CALL_MS_DEFAULT: u64 = 10_000;
/// Keys asked for per `list` call when the engine lists a whole prefix.
pub const ARCHIVER_LIST_PAGE: u32 = 1_000;

impl WorldBindings for ArchiverBindings {
    fn instantiate(pre: &InstancePre<PluginState>, store: &mut Store<PluginState>) -> wasmtime::Result<Self> {
        ArchiverPre::new(pre.clone())?.instantiate(store)
    }

    fn call_init(&self, store: &mut Store<PluginState>, config: &str) -> wasmtime::Result<Result<(), String>> {
        ArchiverBindings::call_init(self, store, config)
    }
}

/// What a backend answered, with its domain error kept apart from host faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendAnswer<T> {
    Ok(T),
    NotFound,
    AlreadyExists,
    Transient(String),
    Permanent(String),
}

impl<T> From<std::result::Result<T, BackendError>> for BackendAnswer<T> {
    fn from(r: std::result::Result<T, BackendError>) -> Self {
        match r {
            Ok(v) => BackendAnswer::Ok(v),
            Err(BackendError::NotFound) => BackendAnswer::NotFound,
            Err(BackendError::AlreadyExists) => BackendAnswer::AlreadyExists,
            Err(BackendError::Transient(m)) => BackendAnswer::Transient(m),
            Err(BackendError::Permanent(m)) => BackendAnswer::Permanent(m),
        }
    }
}

/// An archiver component behind the host's answer checks. Cheap to clone (one instance).
#[derive(Clone)]
pub struct WasmArchiver {
    instance: Arc<PluginInstance<ArchiverBindings>>,
    /// Recorded in manifests: the plugin and its content hash.
    target: String,
}

impl std::fmt::Debug for WasmArchiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmArchiver")
            .field("target", &self.target)
            .field("capabilities", &self.instance.capabilities.describe())
            .finish()
    }
}

impl WasmArchiver {
    /// An archiver with nothing granted.
    pub fn new(plugin: Arc<LoadedPlugin>, config: String) -> Result<Self> {
        Self::with_capabilities(plugin, config, Capabilities::none())
    }

    /// An archiver whose instances get `capabilities` (from the grant for its hash).
    pub fn with_capabilities(plugin: Arc<LoadedPlugin>, config: String, capabilities: Capabilities) -> Result<Self> {
        let target = format!("plugin:{}?sha256={}", plugin.name, plugin.hash);
        Ok(WasmArchiver {
            instance: Arc::new(PluginInstance::with_capabilities(plugin, config, capabilities)?),
            target,
        })
    }

    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.instance.plugin
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.instance.capabilities
    }

    pub fn counters(&self) -> &super::instance::PluginCounters {
        &self.instance.counters
    }

    pub fn put(&self, key: &str, bytes: &[u8]) -> Result<BackendAnswer<()>> {
        Ok(self.instance.call("put", |b, s| b.frostline_plugin_backend().call_put(s, key, bytes))?.into())
    }

    pub fn get(&self, key: &str) -> Result<BackendAnswer<Vec<u8>>> {
        Ok(self.instance.call("get", |b, s| b.frostline_plugin_backend().call_get(s, key))?.into())
    }

    pub fn delete(&self, key: &str) -> Result<BackendAnswer<()>> {
        Ok(self.instance.call("delete", |b, s| b.frostline_plugin_backend().call_delete(s, key))?.into())
    }

    /// Lists keys and checks the answer: every key has the prefix, comes after `after`, the
    /// list is strictly ascending and no longer than `limit`.
    pub fn list(&self, prefix: &str, after: Option<&str>, limit: u32) -> Result<BackendAnswer<Vec<String>>> {
        let answer: BackendAnswer<Vec<String>> =
            self.instance.call("list", |b, s| b.frostline_plugin_backend().call_list(s, prefix, after, limit))?.into();
        if let BackendAnswer::Ok(keys) = &answer {
            let problem = if keys.len() > limit as usize {
                Some(format!("returned {} keys for a limit of {limit}", keys.len()))
            } else if let Some(k) = keys.iter().find(|k| !k.starts_with(prefix)) {
                Some(format!("returned `{k}`, which lacks the prefix `{prefix}`"))
            } else if let Some(k) = keys.iter().find(|k| after.is_some_and(|a| k.as_str() <= a)) {
                Some(format!("returned `{k}`, which is not after `{}`", after.unwrap_or_default()))
            } else {
                keys.windows(2)
                    .find(|w| w[0] >= w[1])
                    .map(|w| format!("returned keys out of order: `{}` then `{}`", w[0], w[1]))
            };
            if let Some(reason) = problem {
                return Err(self.instance.invalid_answer("list", reason));
            }
        }
        Ok(answer)
    }
}

/// Runs a plugin call on a blocking thread.
async fn blocking<R: Send + 'static>(
    archiver: &WasmArchiver,
    f: impl FnOnce(&WasmArchiver) -> Result<R> + Send + 'static,
) -> Result<R> {
    let archiver = archiver.clone();
    tokio::task::spawn_blocking(move || f(&archiver))
        .await
        .map_err(|e| Error::Internal(format!("archiver call task failed: {e}")))?
}

#[async_trait]
impl ArchiveBackend for WasmArchiver {
    fn target(&self) -> &str {
        &self.target
    }

    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        let key = key.to_string();
        blocking(self, move |a| match a.put(&key, &bytes)? {
            BackendAnswer::Ok(()) => Ok(PutOutcome::Created),
            BackendAnswer::AlreadyExists => Ok(PutOutcome::AlreadyExists),
            BackendAnswer::NotFound => {
                Err(a.instance.invalid_answer("put", format!("answered not-found to a put of `{key}`")))
            }
            other => other.into_result(&key).map(|()| PutOutcome::Created),
        })
        .await
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let key = key.to_string();
        blocking(self, move |a| match a.get(&key)? {
            BackendAnswer::Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            BackendAnswer::NotFound => Ok(None),
            BackendAnswer::AlreadyExists => {
                Err(a.instance.invalid_answer("get", format!("answered already-exists to a get of `{key}`")))
            }
            other => other.into_result(&key).map(|b| Some(Bytes::from(b))),
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let key = key.to_string();
        blocking(self, move |a| match a.delete(&key)? {
            BackendAnswer::Ok(()) | BackendAnswer::NotFound => Ok(()),
            BackendAnswer::AlreadyExists => {
                Err(a.instance.invalid_answer("delete", format!("answered already-exists to a delete of `{key}`")))
            }
            other => other.into_result(&key),
        })
        .await
    }

    /// Pages through the plugin's `list`. It knows neither sizes nor modification times, so
    /// objects are listed with size 0 and `last_modified` = `i64::MAX` ("unknown"): the orphan
    /// sweep then counts them as too young and never deletes from a plugin target.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let prefix = prefix.to_string();
        blocking(self, move |a| {
            let mut out: Vec<ObjectInfo> = Vec::new();
            loop {
                let after = out.last().map(|o| o.key.clone());
                let page = match a.list(&prefix, after.as_deref(), ARCHIVER_LIST_PAGE)? {
                    BackendAnswer::Ok(keys) => keys,
                    BackendAnswer::NotFound => Vec::new(),
                    other => other.into_result(&prefix)?,
                };
                // `list` checked that every key comes after `after`, so each page makes progress.
                let full = page.len() == ARCHIVER_LIST_PAGE as usize;
                out.extend(page.into_iter().map(|key| ObjectInfo { key, size: 0, last_modified: i64::MAX }));
                if !full {
                    return Ok(out);
                }
            }
        })
        .await
    }
}

impl<T> BackendAnswer<T> {
    /// Turns a domain error into the engine's error for callers that need the value.
    pub fn into_result(self, key: &str) -> Result<T> {
        match self {
            BackendAnswer::Ok(v) => Ok(v),
            BackendAnswer::NotFound => Err(Error::Storage(format!("object `{key}` not found"))),
            BackendAnswer::AlreadyExists => Err(Error::Conflict(format!("object `{key}` already exists"))),
            BackendAnswer::Transient(m) => Err(Error::StorageUnavailable(format!("`{key}`: {m}"))),
            BackendAnswer::Permanent(m) => Err(Error::Storage(format!("`{key}`: {m}"))),
        }
    }
}
