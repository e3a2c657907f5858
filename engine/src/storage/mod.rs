//! Object storage: the backend trait the coordinator speaks to, its object_store
//! implementation (local directory, in-memory; more schemes come with their features), the key
//! layout, and a fault-injecting decorator for tests.
//!
//! Imports the core; knows nothing of redb or the coordinator.

pub mod faults;
pub mod keys;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};

use crate::error::{Error, Result};

/// What a conditional create did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    /// Something is already stored under the key; the caller must compare it.
    AlreadyExists,
}

/// A blob store as the archival protocol needs it. The engine owns keys and every check.
#[async_trait]
pub trait ArchiveBackend: Send + Sync + std::fmt::Debug {
    /// Where objects go (store URL and prefix), recorded in manifests.
    fn target(&self) -> &str;
    /// Creates `key` only if absent; durable when it returns `Created`.
    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome>;
    /// `None` when the key does not exist.
    async fn get(&self, key: &str) -> Result<Option<Bytes>>;
    async fn delete(&self, key: &str) -> Result<()>;
    /// Every object under `prefix`, in ascending key order.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
}

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Last modification, microseconds since the epoch (the store's clock).
    pub last_modified: crate::model::Micros,
}

/// The one place that decides what an object_store error means for the protocol.
pub fn classify(error: object_store::Error, key: &str) -> Error {
    use object_store::Error as E;
    match error {
        E::NotFound { .. } => Error::Storage(format!("`{key}` not found")),
        E::AlreadyExists { .. } | E::Precondition { .. } => Error::Conflict(format!("`{key}` already exists")),
        E::InvalidPath { source } => Error::InvalidInput(format!("invalid object key `{key}`: {source}")),
        other => Error::StorageUnavailable(format!("`{key}`: {other}")),
    }
}

/// An `ArchiveBackend` over any object_store, under a key prefix.
#[derive(Debug, Clone)]
pub struct ObjectStoreBackend {
    store: Arc<dyn ObjectStore>,
    target: String,
}

impl ObjectStoreBackend {
    pub fn new(store: Arc<dyn ObjectStore>, target: impl Into<String>) -> Self {
        ObjectStoreBackend { store, target: target.into() }
    }

    /// Builds a backend from a URL: `file:///abs/dir` (created if missing) or `memory://`.
    pub fn from_url(url: &str) -> Result<Self> {
        if let Some(path) = url.strip_prefix("file://") {
            std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(path)
                .map_err(|e| Error::InvalidInput(format!("archive target `{url}`: {e}")))?;
            return Ok(Self::new(Arc::new(store), url));
        }
        if url == "memory://" || url.starts_with("memory://") {
            return Ok(Self::new(Arc::new(object_store::memory::InMemory::new()), url));
        }
        Err(Error::InvalidInput(format!(
            "archive target `{url}` is not supported: use file:///absolute/dir or memory://"
        )))
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }
}

fn object_path(key: &str) -> Result<ObjectPath> {
    ObjectPath::parse(key).map_err(|e| Error::InvalidInput(format!("invalid object key `{key}`: {e}")))
}

#[async_trait]
impl ArchiveBackend for ObjectStoreBackend {
    fn target(&self) -> &str {
        &self.target
    }

    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(&object_path(key)?, PutPayload::from_bytes(bytes), options).await {
            Ok(_) => Ok(PutOutcome::Created),
            Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => {
                Ok(PutOutcome::AlreadyExists)
            }
            Err(e) => Err(classify(e, key)),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        match self.store.get(&object_path(key)?).await {
            Ok(result) => Ok(Some(result.bytes().await.map_err(|e| classify(e, key))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(classify(e, key)),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&object_path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(classify(e, key)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let trimmed = prefix.trim_end_matches('/');
        let path = if trimmed.is_empty() { None } else { Some(object_path(trimmed)?) };
        let mut objects: Vec<ObjectInfo> = self
            .store
            .list(path.as_ref())
            .map_ok(|meta| ObjectInfo {
                key: meta.location.to_string(),
                size: meta.size,
                last_modified: meta.last_modified.timestamp_micros(),
            })
            .try_collect()
            .await
            .map_err(|e| classify(e, prefix))?;
        objects.retain(|o| o.key.starts_with(prefix));
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }
}
