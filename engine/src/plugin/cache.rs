//! The compiled-component cache: in memory for the process, on disk across restarts.
//!
//! An entry is keyed by the SHA-256 of the component's bytes and wasmtime's compatibility
//! hash (compiler version and settings), so a foreign entry is never even looked at. An entry
//! is native code, and whoever can put a file into the cache directory could name one for a
//! granted component: beside each artifact sits its proof (`plugin::provenance`), an
//! HMAC-SHA256 over its name and bytes under a key this engine holds, written last. An
//! artifact without a proof that verifies (planted, renamed from another component, written by
//! an older frostline with only a SHA-256 beside it, torn or corrupted) is refused and
//! recompiled, never deserialized, and the log says why.
//!
//! A build without the `compiler` feature (the lean edge build) cannot compute wasmtime's
//! hash nor compile: it keys entries by `precompile::Target::key`, loads the built-ins it was
//! built with and what `plugin compile --target --key-file` made for it with the key it was
//! given, and refuses anything else, naming the artifact, why, and the command to run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::provenance::{self, ArtifactKey};
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
    /// Disk artifacts refused (unproven, corrupt, torn or unreadable) and recompiled (or, in
    /// a build without a compiler, refused).
    pub rejected: u64,
}

pub(crate) struct CompiledCache {
    dir: Option<PathBuf>,
    /// Hex of wasmtime's compatibility hash for this engine's settings.
    compat: String,
    /// The keys an artifact on disk must be proven by: the engine's own first (a build with a
    /// compiler, with a cache directory), then the operator's.
    keys: Vec<ArtifactKey>,
    /// Whether `keys[0]` is the engine's own key, which signs what this cache compiles.
    #[cfg_attr(not(feature = "compiler"), allow(dead_code))]
    signs: bool,
    memory: Mutex<HashMap<String, Component>>,
    compiled: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
    rejected: AtomicU64,
}

impl CompiledCache {
    /// A cache in `dir` (`None`: in memory only) that also accepts artifacts proven by
    /// `operator_key`. A build with a compiler uses (and makes at first use) its own key beside
    /// `dir`; when it cannot, it warns and caches in memory only.
    pub(crate) fn new(dir: Option<PathBuf>, engine: &Engine, operator_key: Option<ArtifactKey>) -> Self {
        #[cfg_attr(not(feature = "compiler"), allow(unused_mut))]
        let mut dir = dir;
        let mut keys = Vec::new();
        #[cfg(feature = "compiler")]
        if let Some(cache_dir) = dir.clone() {
            let path = provenance::own_key_path(&cache_dir);
            match ArtifactKey::load_or_create(&path, "the engine's own key") {
                Ok((key, made)) => {
                    if made {
                        tracing::info!(key = %path.display(), id = key.id(), "made the key that proves compiled plugins");
                    }
                    keys.push(key);
                }
                Err(reason) => {
                    tracing::warn!(
                        cache = %cache_dir.display(),
                        %reason,
                        "compiled plugins are not cached on disk: the key that proves them is not usable (remove a \
                         damaged key file and the engine makes a new one; its artifacts are then recompiled)"
                    );
                    dir = None;
                }
            }
        }
        let signs = !keys.is_empty();
        keys.extend(operator_key);
        Self::with_parts(dir, compatibility_key(engine), keys, signs)
    }

    fn with_parts(dir: Option<PathBuf>, compat: String, keys: Vec<ArtifactKey>, signs: bool) -> Self {
        CompiledCache {
            dir,
            compat,
            keys,
            signs,
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
            // bytes (the build script checked their SHA-256) and embedded at build time: being
            // in the binary proves who made it. wasmtime checks the header and settings before use.
            let component = unsafe { Component::deserialize(engine, artifact) }.map_err(|e| Error::PluginLoad {
                source_name: name.to_string(),
                reason: format!("wasmtime refused the built-in's precompiled artifact: {e:#}"),
            })?;
            self.remember(hash, &component);
            return Ok(component);
        }
        let artifact = self.dir.as_ref().map(|dir| dir.join(format!("{hash}-{}.cwasm", self.compat)));
        if let Some(path) = &artifact {
            match self.load_artifact(engine, path) {
                Ok(Some(component)) => {
                    self.disk_hits.fetch_add(1, Ordering::Relaxed);
                    self.remember(hash, &component);
                    return Ok(component);
                }
                Ok(None) => {}
                Err(reason) => {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    #[cfg(not(feature = "compiler"))]
                    return Err(super::precompile::refused(name, path, &reason));
                    #[cfg(feature = "compiler")]
                    tracing::warn!(
                        plugin = name,
                        artifact = %path.display(),
                        %reason,
                        "compiled plugin cache entry refused, not run; recompiling it from the component"
                    );
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
            && let Some(key) = self.keys.first().filter(|_| self.signs)
            && let Err(e) =
                component.serialize().map_err(std::io::Error::other).and_then(|b| write_artifact(path, &b, key))
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

    /// `Ok(None)` when there is no entry; `Err` (why) when there is one that must not be run.
    fn load_artifact(&self, engine: &Engine, path: &Path) -> std::result::Result<Option<Component>, String> {
        let proof_path = provenance::proof_path(path);
        let proof = match std::fs::read_to_string(&proof_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return if !path.exists() {
                    Ok(None)
                } else if provenance::legacy_digest_path(path).exists() {
                    Err("it has only a SHA-256 beside it, as an older frostline wrote (or someone who copied that \
                         form): that proves it whole, not who compiled it"
                        .into())
                } else {
                    Err(format!(
                        "nothing proves who compiled it: {} is missing (a torn write, or an artifact put there by hand)",
                        proof_path.display()
                    ))
                };
            }
            Err(e) => return Err(format!("cannot read its proof {}: {e}", proof_path.display())),
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read it: {e}")),
        };
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let key = provenance::verify(&self.keys, &name, &bytes, &proof)?;
        tracing::debug!(artifact = %path.display(), key = key.id(), "compiled plugin proven");
        // SAFETY: its MAC, over its name and bytes, verifies under a key this engine holds: its
        // own (this engine compiled it) or the operator's (`plugin compile --key-file` made it on
        // a host the operator trusts). Its name carries this engine's compatibility key, and
        // wasmtime additionally checks the header and settings before use.
        unsafe { Component::deserialize(engine, &bytes) }
            .map(Some)
            .map_err(|e| format!("wasmtime refused the artifact: {e:#}"))
    }
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

/// Writes an artifact and then its proof under `key`, each atomically: a reader that finds a
/// proof that verifies finds the whole artifact. A SHA-256 an older frostline left beside it is
/// removed. Only a build that compiles writes artifacts.
#[cfg(feature = "compiler")]
pub(crate) fn write_artifact(path: &Path, bytes: &[u8], key: &ArtifactKey) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    write_atomically(path, bytes)?;
    write_atomically(&provenance::proof_path(path), key.prove(&name, bytes).as_bytes())?;
    match std::fs::remove_file(provenance::legacy_digest_path(path)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes through a new file beside `path`, made with O_EXCL: whatever is at the temporary
/// name (a link planted in the cache directory) is removed, never written through.
#[cfg(feature = "compiler")]
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    // Unique per writer: engines of one process (or several processes) may share a cache
    // folder and compile the same component at once; each renames its own whole file.
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let tmp = path.with_extension(format!("tmp{}-{thread}", std::process::id()));
    if let Err(e) = std::fs::remove_file(&tmp)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(e);
    }
    std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?.write_all(bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(all(test, feature = "compiler"))]
mod tests {
    use super::super::precompile::{CrossCompiler, Target};
    use super::*;
    use sha2::Digest as _;

    fn key(dir: &Path, name: &str) -> ArtifactKey {
        let path = dir.join(name);
        ArtifactKey::load_or_create(&path, "test").unwrap().0
    }

    /// What the lean edge build does with the artifacts `plugin compile --target --key-file`
    /// makes for it: it loads one proven by the operator's key under the target's name, and
    /// refuses (here: recompiles) one proven by another key, saying which.
    #[test]
    fn an_artifact_proven_by_the_operators_key_loads_where_the_edge_build_looks() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("plugin-cache");
        let operator = key(dir.path(), "operator.key");
        let stranger = key(dir.path(), "stranger.key");
        let engine = wasmtime::Engine::new(&super::super::engine_config()).unwrap();
        let (_, calendar) = super::super::builtin::COMPONENTS[0];
        let hash = hex::encode(sha2::Sha256::digest(calendar));
        let target = Target::native();
        let artifact = CrossCompiler::new(target.clone()).unwrap().compile("calendar", calendar).unwrap();
        let path = cache.join(target.artifact_name(&hash));
        write_artifact(&path, &artifact, &operator).unwrap();
        let edge = |keys| CompiledCache::with_parts(Some(cache.clone()), target.key(), keys, false);

        let proven = edge(vec![key(dir.path(), "operator.key")]);
        proven.load_or_compile(&engine, "calendar", &hash, calendar).unwrap();
        assert_eq!((proven.stats().disk_hits, proven.stats().compiled), (1, 0));

        write_artifact(&path, &artifact, &stranger).unwrap();
        let reason = edge(vec![key(dir.path(), "operator.key")]).load_artifact(&engine, &path).unwrap_err();
        assert!(reason.contains(&format!("signed with key {}", stranger.id())), "{reason}");
        assert!(reason.contains(operator.id()), "{reason}");
        let message = super::super::precompile::refused("my.wasm", &path, &reason).to_string();
        for says in [path.display().to_string(), reason.clone(), "--key-file".into(), provenance::KEY_FILE_ENV.into()] {
            assert!(message.contains(&says), "{says}: {message}");
        }
        let none = edge(Vec::new()).load_artifact(&engine, &path).unwrap_err();
        assert!(none.contains("holds none"), "{none}");
        // Nothing is written where nothing signs: the refused artifact is recompiled in memory.
        let unsigned = edge(vec![key(dir.path(), "operator.key")]);
        unsigned.load_or_compile(&engine, "calendar", &hash, calendar).unwrap();
        assert_eq!((unsigned.stats().rejected, unsigned.stats().compiled), (1, 1));
        assert!(std::fs::read_to_string(provenance::proof_path(&path)).unwrap().contains(stranger.id()));
    }
}
