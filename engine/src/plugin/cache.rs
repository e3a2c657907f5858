//! The compiled-component cache: in memory for the process, on disk across restarts.
//!
//! An entry is keyed by the SHA-256 of the component's bytes and wasmtime's compatibility
//! hash (compiler version and settings), so a foreign entry is never even looked at. Beside
//! each artifact sits the SHA-256 of the artifact itself, written last: a torn or corrupted
//! artifact fails that check and is recompiled instead of being deserialized.
//!
//! A build without the `compiler` feature (the lean edge build) cannot compute wasmtime's
//! hash nor compile: it keys entries by `precompile::Target::key`, loads the built-ins it was
//! built with and what `plugin compile --target` made for it, and refuses anything else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::{Error, Result};

/// Counters that show whether the cache is doing its job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Components compiled from their bytes.
    pub compiled: u64,
    /// Components loaded from a compiled artifact on disk.
    pub disk_hits: u64,
    /// Components found already compiled in this process.
    pub memory_hits: u64,
    /// Disk artifacts refused (corrupt, torn or unreadable) and recompiled.
    pub rejected: u64,
}

pub(crate) struct CompiledCache {
    dir: Option<PathBuf>,
    /// Hex of wasmtime's compatibility hash for this engine's settings.
    compat: String,
    memory: Mutex<HashMap<String, Component>>,
    compiled: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
    rejected: AtomicU64,
}

impl CompiledCache {
    pub(crate) fn new(dir: Option<PathBuf>, engine: &Engine) -> Self {
        CompiledCache {
            dir,
            compat: compatibility_key(engine),
            memory: Mutex::new(HashMap::new()),
            compiled: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            compiled: self.compiled.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }

    #[cfg_attr(not(feature = "compiler"), allow(unused_variables))]
    pub(crate) fn load_or_compile(&self, engine: &Engine, name: &str, hash: &str, bytes: &[u8]) -> Result<Component> {
        if let Some(component) = self.memory.lock().expect("cache lock").get(hash) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(component.clone());
        }
        if let Some(artifact) = super::builtin::precompiled(hash) {
            // SAFETY: made by `plugin compile --builtins` for this target from these very
            // bytes (the build script checked their SHA-256) and embedded at build time;
            // wasmtime checks the header and settings before use.
            let component = unsafe { Component::deserialize(engine, artifact) }.map_err(|e| Error::PluginLoad {
                source_name: name.to_string(),
                reason: format!("wasmtime refused the built-in's precompiled artifact: {e:#}"),
            })?;
            self.remember(hash, &component);
            return Ok(component);
        }
        let artifact = self.dir.as_ref().map(|dir| dir.join(format!("{hash}-{}.cwasm", self.compat)));
        if let Some(path) = &artifact {
            match load_artifact(engine, path) {
                Ok(Some(component)) => {
                    self.disk_hits.fetch_add(1, Ordering::Relaxed);
                    self.remember(hash, &component);
                    return Ok(component);
                }
                Ok(None) => {}
                Err(reason) => {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    if cfg!(not(feature = "compiler")) {
                        return Err(Error::PluginLoad {
                            source_name: name.to_string(),
                            reason: format!(
                                "its precompiled artifact {} was refused ({reason}); precompile it again with \
                                 `frostline plugin compile --target` of this frostline's version",
                                path.display()
                            ),
                        });
                    }
                    tracing::warn!(artifact = %path.display(), %reason, "compiled plugin cache entry refused; recompiling");
                }
            }
        }
        #[cfg(not(feature = "compiler"))]
        return Err(super::precompile::not_precompiled(name, hash, self.dir.as_deref()));
        #[cfg(feature = "compiler")]
        self.compile(engine, name, hash, bytes, artifact.as_deref())
    }

    #[cfg(feature = "compiler")]
    fn compile(
        &self,
        engine: &Engine,
        name: &str,
        hash: &str,
        bytes: &[u8],
        artifact: Option<&Path>,
    ) -> Result<Component> {
        let component = Component::from_binary(engine, bytes).map_err(|e| Error::PluginLoad {
            source_name: name.to_string(),
            reason: format!("it is not a valid component: {e:#}"),
        })?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        if let Some(path) = artifact
            && let Err(e) = store_artifact(&component, path)
        {
            // The cache only saves time; a plugin still loads without it.
            tracing::warn!(artifact = %path.display(), error = %e, "cannot write the compiled plugin cache");
        }
        self.remember(hash, &component);
        Ok(component)
    }

    fn remember(&self, hash: &str, component: &Component) {
        self.memory.lock().expect("cache lock").insert(hash.to_string(), component.clone());
    }
}

fn digest_path(artifact: &Path) -> PathBuf {
    artifact.with_extension("cwasm.sha256")
}

/// `Ok(None)` when there is no entry; `Err` when there is one that must not be trusted.
fn load_artifact(engine: &Engine, path: &Path) -> std::result::Result<Option<Component>, String> {
    let expected = match std::fs::read_to_string(digest_path(path)) {
        Ok(text) => text.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return if path.exists() { Err("artifact has no digest (torn write)".into()) } else { Ok(None) };
        }
        Err(e) => return Err(format!("cannot read digest: {e}")),
    };
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read artifact: {e}"))?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != expected {
        return Err(format!("artifact digest mismatch: expected {expected}, got {actual}"));
    }
    // SAFETY: the artifact was written by `store_artifact` of this cache (its digest, written
    // after it, matches) and its name carries this engine's compatibility hash; wasmtime
    // additionally checks the header and settings before use.
    unsafe { Component::deserialize(engine, &bytes) }
        .map(Some)
        .map_err(|e| format!("wasmtime refused the artifact: {e:#}"))
}

/// The key in artifact names: wasmtime's compatibility hash where there is a compiler to
/// compute it, the target's key where there is not.
#[cfg(feature = "compiler")]
fn compatibility_key(engine: &Engine) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

#[cfg(not(feature = "compiler"))]
fn compatibility_key(_engine: &Engine) -> String {
    super::precompile::Target::native().key()
}

#[cfg(feature = "compiler")]
fn store_artifact(component: &Component, path: &Path) -> std::io::Result<()> {
    write_artifact(path, &component.serialize().map_err(std::io::Error::other)?)
}

/// Writes an artifact and then its digest, each atomically: a reader that finds the digest
/// finds the whole artifact. Only a build that compiles writes artifacts.
#[cfg(feature = "compiler")]
pub(crate) fn write_artifact(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_atomically(path, bytes)?;
    write_atomically(&digest_path(path), hex::encode(Sha256::digest(bytes)).as_bytes())
}

#[cfg(feature = "compiler")]
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
