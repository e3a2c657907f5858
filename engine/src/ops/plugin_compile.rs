//! `plugin compile`: precompile components on a build host for an edge build, which has no
//! compiler. The output is in the compiled cache's format and names, each artifact with its
//! proof under the operator's key (`plugin::provenance`), so its files are copied into the
//! edge host's `DATA_DIR/plugin-cache` as they are, and the edge engine, given the same key,
//! runs them and nothing planted beside them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::plugin::builtin;
use crate::plugin::cache::write_artifact;
use crate::plugin::precompile::{CrossCompiler, Target};
use crate::plugin::provenance::{ArtifactKey, KEY_FILE_ENV};

/// What to compile, for which host, and where to.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompileRequest {
    /// `aarch64`, `x86_64`, or a Linux triple of either.
    pub target: String,
    pub out: PathBuf,
    /// The operator's key that proves the artifacts (made when missing); needed for
    /// components, not for built-ins.
    pub key_file: Option<PathBuf>,
    /// Every component the policy files of this directory name.
    pub policy_dir: Option<PathBuf>,
    /// The built-ins too, named by component, for an edge binary of this same source.
    pub builtins: bool,
    pub components: Vec<PathBuf>,
}

/// What a compile did, step by step (a compile takes seconds per component).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CompileEvent {
    /// The key file did not exist and was made.
    KeyMade { path: PathBuf },
    /// The artifacts are proven by this key.
    Signing { key_id: String, path: PathBuf },
    /// One artifact written.
    Compiled { name: String, bytes: usize, triple: String, out: PathBuf, artifact_bytes: usize, millis: u128 },
}

/// Compiles what `request` names, telling `on_event` what it does.
pub fn run(request: &CompileRequest, mut on_event: impl FnMut(CompileEvent)) -> Result<()> {
    let target = Target::parse(&request.target)?;
    let mut components: BTreeSet<PathBuf> = request.components.iter().cloned().collect();
    if let Some(dir) = &request.policy_dir {
        components.extend(referenced_components(dir)?);
    }
    if components.is_empty() && !request.builtins {
        return Err(Error::InvalidInput(
            "nothing to compile: name component files, --policy-dir DIR or --builtins".into(),
        ));
    }
    let mut sources = Vec::new();
    for path in &components {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::InvalidInput(format!("reading the component {}: {e}", path.display())))?;
        sources.push((path.display().to_string(), bytes));
    }
    let key = match (&request.key_file, sources.is_empty()) {
        (_, true) => None,
        (Some(path), false) => Some(signing_key(path, &mut on_event)?),
        (None, false) => {
            return Err(Error::InvalidInput(format!(
                "--key-file FILE is needed: the engine that runs these artifacts runs only those proven by a key it \
                 holds. Name a file (made if missing) and give the engine the same file as {KEY_FILE_ENV}"
            )));
        }
    };
    let compiler = CrossCompiler::new(target)?;
    std::fs::create_dir_all(&request.out).map_err(|e| Error::io(&request.out, e))?;
    for (name, bytes) in &sources {
        let hash = hex::encode(Sha256::digest(bytes));
        let out = request.out.join(compiler.target().artifact_name(&hash));
        on_event(compile_one(&compiler, name, bytes, &out, key.as_ref())?);
    }
    if request.builtins {
        for (component, bytes) in builtin::COMPONENTS {
            let out = request.out.join(format!("{component}.cwasm"));
            on_event(compile_one(&compiler, &format!("builtin {component}"), bytes, &out, None)?);
            // What the edge build's build script compares with the built-in it embeds.
            let made_from = request.out.join(format!("{component}.wasm.sha256"));
            std::fs::write(&made_from, hex::encode(Sha256::digest(bytes))).map_err(|e| Error::io(&made_from, e))?;
        }
    }
    Ok(())
}

/// The operator's key in `path`, made there when there is none.
fn signing_key(path: &Path, on_event: &mut impl FnMut(CompileEvent)) -> Result<ArtifactKey> {
    let (key, made) = ArtifactKey::load_or_create(path, "--key-file")
        .map_err(|why| Error::InvalidInput(format!("--key-file: {why}")))?;
    if made {
        on_event(CompileEvent::KeyMade { path: path.to_path_buf() });
    }
    on_event(CompileEvent::Signing { key_id: key.id().to_string(), path: path.to_path_buf() });
    Ok(key)
}

/// Compiles one component to `out`; with `key`, proves it beside it (a built-in, embedded in a
/// binary, needs no proof).
fn compile_one(
    compiler: &CrossCompiler,
    name: &str,
    bytes: &[u8],
    out: &Path,
    key: Option<&ArtifactKey>,
) -> Result<CompileEvent> {
    let started = Instant::now();
    let artifact = compiler.compile(name, bytes)?;
    match key {
        Some(key) => write_artifact(out, &artifact, key),
        None => std::fs::write(out, &artifact),
    }
    .map_err(|e| Error::io(out, e))?;
    Ok(CompileEvent::Compiled {
        name: name.to_string(),
        bytes: bytes.len(),
        triple: compiler.target().triple.to_string(),
        out: out.to_path_buf(),
        artifact_bytes: artifact.len(),
        millis: started.elapsed().as_millis(),
    })
}

/// The component files a policy directory's files name: every string `plugin = "..."` that is
/// not a built-in, relative to the directory, as the loader reads them.
fn referenced_components(dir: &Path) -> Result<Vec<PathBuf>> {
    fn collect(value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::Table(table) => {
                for (key, value) in table {
                    match value {
                        toml::Value::String(name) if key == "plugin" => out.push(name.clone()),
                        other => collect(other, out),
                    }
                }
            }
            toml::Value::Array(items) => items.iter().for_each(|item| collect(item, out)),
            _ => {}
        }
    }
    let mut components = Vec::new();
    for file in crate::policy::policy_files(dir)? {
        let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
        let value: toml::Value =
            toml::from_str(&text).map_err(|e| Error::InvalidInput(format!("parsing {}: {e}", file.display())))?;
        let mut names = Vec::new();
        collect(&value, &mut names);
        components.extend(
            names.into_iter().filter(|name| !name.starts_with(builtin::BUILTIN_PREFIX)).map(|name| dir.join(name)),
        );
    }
    Ok(components)
}
