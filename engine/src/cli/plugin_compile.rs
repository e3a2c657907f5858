//! `frostline plugin compile`: precompile components on a build host for an edge build, which
//! has no compiler. The output is in the compiled cache's format and names, each artifact with
//! its proof under the operator's key (`plugin::provenance`), so its files are copied into the
//! edge host's `DATA_DIR/plugin-cache` as they are, and the edge engine, given the same key,
//! runs them and nothing planted beside them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::plugin::builtin;
use crate::plugin::cache::write_artifact;
use crate::plugin::precompile::{CrossCompiler, Target};
use crate::plugin::provenance::{ArtifactKey, KEY_FILE_ENV};

#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// The host kind to compile for: `aarch64`, `x86_64`, or a Linux triple of either.
    #[arg(long)]
    pub target: String,
    /// Where to write the artifacts (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// The key that proves the artifacts to the engine that runs them: give the engine the same
    /// file (FROSTLINE_PLUGIN_CACHE_KEY_FILE or --plugin-cache-key-file), which runs no
    /// precompiled artifact its keys do not prove. Made (32 random bytes as hex, mode 0600) when
    /// missing; any file of at least 32 bytes serves. Needed for components, not for --builtins.
    #[arg(long, env = "FROSTLINE_PLUGIN_CACHE_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Compile every component the policy files of this directory name.
    #[arg(long, value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,
    /// Also write the built-ins, named by component (`calendar_utc.cwasm`, ...), for building
    /// an edge binary of this same source with FROSTLINE_PRECOMPILED_BUILTINS=OUT (they are
    /// embedded in it, which proves them: they carry no MAC).
    #[arg(long)]
    pub builtins: bool,
    /// Component files to compile.
    pub components: Vec<PathBuf>,
}

pub fn run(args: CompileArgs) -> anyhow::Result<ExitCode> {
    let target = Target::parse(&args.target)?;
    let mut components: BTreeMap<PathBuf, ()> = args.components.iter().map(|c| (c.clone(), ())).collect();
    if let Some(dir) = &args.policy_dir {
        for component in referenced_components(dir)? {
            components.insert(component, ());
        }
    }
    if components.is_empty() && !args.builtins {
        anyhow::bail!("nothing to compile: name component files, --policy-dir DIR or --builtins");
    }
    let mut sources = Vec::new();
    for path in components.keys() {
        let bytes = std::fs::read(path).with_context(|| format!("reading the component {}", path.display()))?;
        sources.push((path.display().to_string(), bytes));
    }
    let key = match (&args.key_file, sources.is_empty()) {
        (_, true) => None,
        (Some(path), false) => Some(signing_key(path)?),
        (None, false) => anyhow::bail!(
            "--key-file FILE is needed: the engine that runs these artifacts runs only those proven by a key it holds. \
             Name a file (made if missing) and give the engine the same file as {KEY_FILE_ENV}"
        ),
    };
    let compiler = CrossCompiler::new(target)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating --out {}", args.out.display()))?;
    for (name, bytes) in &sources {
        let hash = hex::encode(Sha256::digest(bytes));
        let out = args.out.join(compiler.target().artifact_name(&hash));
        compile_one(&compiler, name, bytes, &out, key.as_ref())?;
    }
    if args.builtins {
        for (component, bytes) in builtin::COMPONENTS {
            let out = args.out.join(format!("{component}.cwasm"));
            compile_one(&compiler, &format!("builtin {component}"), bytes, &out, None)?;
            // What the edge build's build script compares with the built-in it embeds.
            let made_from = args.out.join(format!("{component}.wasm.sha256"));
            std::fs::write(&made_from, hex::encode(Sha256::digest(bytes)))
                .with_context(|| format!("writing {}", made_from.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The operator's key in `path`, made there when there is none.
fn signing_key(path: &Path) -> anyhow::Result<ArtifactKey> {
    let (key, made) =
        ArtifactKey::load_or_create(path, "--key-file").map_err(|why| anyhow::anyhow!("--key-file: {why}"))?;
    if made {
        eprintln!(
            "made a new key in {} (mode 0600): give the engine that runs these artifacts the same file, as \
             {KEY_FILE_ENV} or --plugin-cache-key-file, and keep it from anyone who should not sign native code for it",
            path.display()
        );
    }
    eprintln!("signing the artifacts with key {} ({})", key.id(), path.display());
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
) -> anyhow::Result<()> {
    let started = Instant::now();
    let artifact = compiler.compile(name, bytes)?;
    let written = match key {
        Some(key) => write_artifact(out, &artifact, key),
        None => std::fs::write(out, &artifact),
    };
    written.with_context(|| format!("writing {}", out.display()))?;
    println!(
        "{name}: {} bytes for {} -> {} ({} bytes, {} ms)",
        bytes.len(),
        compiler.target().triple,
        out.display(),
        artifact.len(),
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The component files a policy directory's files name: every string `plugin = "..."` that is
/// not a built-in, relative to the directory, as the loader reads them.
fn referenced_components(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
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
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let value: toml::Value = toml::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
        let mut names = Vec::new();
        collect(&value, &mut names);
        components.extend(
            names.into_iter().filter(|name| !name.starts_with(builtin::BUILTIN_PREFIX)).map(|name| dir.join(name)),
        );
    }
    Ok(components)
}
