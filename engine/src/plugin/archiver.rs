//! Archiver backends run as WASM components. The engine owns keys, manifests and every
//! check; a backend only stores bytes, and the host checks that its answers match what was
//! asked. (Capability grants for backends arrive with the policy directory's grants.)

use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::bindings::archiver_world::{Archiver as ArchiverBindings, ArchiverPre};
use super::bindings::wit_types::BackendError;
use super::instance::{PluginInstance, WorldBindings};
use super::{LoadedPlugin, PluginState};
use crate::error::{Error, Result};

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

pub struct WasmArchiver {
    instance: PluginInstance<ArchiverBindings>,
}

impl WasmArchiver {
    pub fn new(plugin: Arc<LoadedPlugin>, config: String) -> Result<Self> {
        Ok(WasmArchiver { instance: PluginInstance::new(plugin, config)? })
    }

    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.instance.plugin
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
