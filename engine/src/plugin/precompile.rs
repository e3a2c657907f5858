//! Components compiled on one host for another. The lean edge build has no compiler: it runs
//! the built-ins precompiled into it at build time, and any other component only as an artifact
//! `frostline plugin compile --target --key-file KEY` made for it on a build host
//! (packaging/README.md).
//!
//! An artifact has the compiled cache's format and name, `{component sha256}-{key}.cwasm` with
//! its proof beside it (`plugin::provenance`: an HMAC under the operator's KEY, which the edge
//! engine is given too), so a precompiled directory is copied into an edge host's
//! `plugin-cache` as it is. The key in the name cannot be wasmtime's compatibility hash, which
//! only a build with a compiler can compute; it is `target_key`: wasmtime's version, the
//! target's architecture and operating system, and `ENGINE_SETTINGS`. wasmtime still checks
//! what the key does not name (target, compiler flags, CPU features, tunables) when it loads an
//! artifact, so a key that matches wrongly gets the artifact refused with wasmtime's reason,
//! never run.

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// What of `super::engine_config` changes compiled code, in words; change it with that function
/// so artifacts made for the old settings are no longer looked up.
pub const ENGINE_SETTINGS: &str = "epoch-interruption component-model custom-page-sizes=off memory64=off";

/// A host kind components can be precompiled for (64-bit Linux, as the release artifacts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The triple given to wasmtime, e.g. `aarch64-unknown-linux-musl`.
    pub triple: String,
    /// `x86_64` or `aarch64` (or, for `native` on another host, `std::env::consts::ARCH`).
    pub arch: &'static str,
}

impl Target {
    /// The host this binary runs on. Its architecture is the one it was built for, whichever
    /// that is: a build for an architecture `parse` does not offer looks only for artifacts
    /// named for itself, which no `plugin compile` makes, and so refuses a component clearly
    /// instead of trying another architecture's artifact.
    pub fn native() -> Target {
        let arch = std::env::consts::ARCH;
        Target {
            triple: format!("{arch}-unknown-linux-{}", if cfg!(target_env = "musl") { "musl" } else { "gnu" }),
            arch,
        }
    }

    /// `aarch64`, `x86_64`, or a Linux triple of either (`aarch64-unknown-linux-musl`, ...).
    pub fn parse(text: &str) -> Result<Target> {
        let arch = match text.split('-').next() {
            Some("aarch64" | "arm64") => "aarch64",
            Some("x86_64" | "amd64") => "x86_64",
            _ => {
                return Err(Error::InvalidInput(format!(
                    "--target `{text}`: frostline's edge builds are for aarch64 and x86_64 Linux; use `aarch64`, \
                     `x86_64` or a triple such as aarch64-unknown-linux-musl"
                )));
            }
        };
        let triple = if text.contains('-') { text.to_string() } else { format!("{arch}-unknown-linux-musl") };
        if !triple.contains("-linux") {
            return Err(Error::InvalidInput(format!(
                "--target `{text}`: only Linux targets are built; use for example {arch}-unknown-linux-musl"
            )));
        }
        Ok(Target { triple, arch })
    }

    /// The key that names this target's artifacts: 16 hex digits of a SHA-256 over wasmtime's
    /// version, the architecture, the operating system and `ENGINE_SETTINGS`. The C library
    /// (musl or glibc) does not enter it: compiled components do not call it.
    pub fn key(&self) -> String {
        let text = format!("wasmtime {}\n{}-linux\n{ENGINE_SETTINGS}", super::WASMTIME_VERSION, self.arch);
        hex::encode(&Sha256::digest(text.as_bytes())[..8])
    }

    /// The artifact's file name for a component with SHA-256 `component_hash`.
    pub fn artifact_name(&self, component_hash: &str) -> String {
        format!("{component_hash}-{}.cwasm", self.key())
    }
}

/// Why a build without a compiler cannot load a component, and what to run instead.
#[cfg(not(feature = "compiler"))]
pub(crate) fn not_precompiled(source_name: &str, hash: &str, cache_dir: Option<&std::path::Path>) -> Error {
    let target = Target::native();
    Error::PluginLoad {
        source_name: source_name.to_string(),
        reason: format!(
            "this is an edge build of frostline, without a compiler, and no artifact precompiled for {} was found \
             (looked for {}). {}",
            target.arch,
            target.artifact_name(hash),
            how_to_precompile(source_name, cache_dir),
        ),
    }
}

/// Why a build without a compiler refused the artifact at `artifact`, and what to run instead.
#[cfg(any(test, not(feature = "compiler")))]
pub(crate) fn refused(source_name: &str, artifact: &std::path::Path, reason: &str) -> Error {
    Error::PluginLoad {
        source_name: source_name.to_string(),
        reason: format!(
            "this edge build of frostline, without a compiler, refused its precompiled artifact {}, and runs nothing \
             in its place: {reason}. {}",
            artifact.display(),
            how_to_precompile(source_name, artifact.parent()),
        ),
    }
}

#[cfg(any(test, not(feature = "compiler")))]
fn how_to_precompile(source_name: &str, cache_dir: Option<&std::path::Path>) -> String {
    let place = match cache_dir {
        Some(dir) => format!("into {}", dir.display()),
        None => "into the engine's plugin cache (DATA_DIR/plugin-cache, or --cache-dir for plugin check)".to_string(),
    };
    format!(
        "On a build host with the full build of this version, run `frostline plugin compile --target {} --key-file \
         KEY --out DIR {source_name}` (or `--policy-dir` for a whole policy directory), copy DIR's files {place}, and \
         give this engine the same KEY file as {} (--plugin-cache-key-file; --cache-key-file for plugin check): it \
         runs only artifacts proven by that key",
        Target::native().arch,
        super::provenance::KEY_FILE_ENV,
    )
}

/// Compiles components for another host with wasmtime's Cranelift, in `engine_config`'s settings.
#[cfg(feature = "compiler")]
pub struct CrossCompiler {
    target: Target,
    engine: wasmtime::Engine,
}

#[cfg(feature = "compiler")]
impl CrossCompiler {
    pub fn new(target: Target) -> Result<CrossCompiler> {
        let mut config = super::engine_config();
        config
            .target(&target.triple)
            .map_err(|e| Error::InvalidInput(format!("--target `{}`: {e:#}", target.triple)))?;
        let engine = wasmtime::Engine::new(&config).map_err(|e| {
            Error::Internal(format!("cannot make a wasm engine that compiles for {}: {e:#}", target.triple))
        })?;
        Ok(CrossCompiler { target, engine })
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The artifact of one component, in the format `wasmtime::component::Component::deserialize`
    /// loads on the target.
    pub fn compile(&self, source_name: &str, bytes: &[u8]) -> Result<Vec<u8>> {
        super::check_component_header(source_name, bytes)?;
        self.engine.precompile_component(bytes).map_err(|e| Error::PluginLoad {
            source_name: source_name.to_string(),
            reason: format!("it does not compile for {}: {e:#}", self.target.triple),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_from_short_names_and_triples() {
        let short = Target::parse("aarch64").unwrap();
        assert_eq!(short, Target { triple: "aarch64-unknown-linux-musl".into(), arch: "aarch64" });
        assert_eq!(Target::parse("x86_64-unknown-linux-gnu").unwrap().arch, "x86_64");
        for bad in ["riscv64", "aarch64-apple-darwin", "", "wasm32-wasip2"] {
            let err = Target::parse(bad).unwrap_err().to_string();
            assert!(err.contains("--target"), "{bad}: {err}");
        }
    }

    /// The key depends on the architecture, not on the C library: a glibc and a musl build of
    /// one architecture load the same artifacts.
    #[test]
    fn the_key_names_the_architecture_only() {
        let musl = Target::parse("aarch64-unknown-linux-musl").unwrap();
        let gnu = Target::parse("aarch64-unknown-linux-gnu").unwrap();
        let x86 = Target::parse("x86_64").unwrap();
        assert_eq!(musl.key(), gnu.key());
        assert_ne!(musl.key(), x86.key());
        assert_eq!(musl.key().len(), 16);
        assert_eq!(musl.artifact_name("ab"), format!("ab-{}.cwasm", musl.key()));
    }

    /// An artifact compiled for this host's architecture in `engine_config`'s settings loads in
    /// the host's engine (the settings of the two agree); one compiled for the other
    /// architecture is refused by wasmtime, naming the architecture.
    #[cfg(feature = "compiler")]
    #[test]
    fn artifacts_load_on_their_architecture_only() {
        let (_, calendar) = super::super::builtin::COMPONENTS[0];
        let engine = wasmtime::Engine::new(&super::super::engine_config()).unwrap();
        let native = CrossCompiler::new(Target::native()).unwrap().compile("calendar", calendar).unwrap();
        // SAFETY: made just above by wasmtime for this architecture.
        unsafe { wasmtime::component::Component::deserialize(&engine, &native) }.expect("it loads on its host");
        let other = Target::parse(if Target::native().arch == "x86_64" { "aarch64" } else { "x86_64" }).unwrap();
        let foreign = CrossCompiler::new(other.clone()).unwrap().compile("calendar", calendar).unwrap();
        // SAFETY: wasmtime checks the artifact's target before anything runs; that is the test.
        let refused = unsafe { wasmtime::component::Component::deserialize(&engine, &foreign) }
            .expect_err("an artifact for another architecture is refused");
        assert!(format!("{refused:#}").contains(other.arch), "{refused:#}");
        let not_a_component = CrossCompiler::new(other).unwrap().compile("junk", b"hello").unwrap_err();
        assert!(not_a_component.to_string().contains("not WebAssembly"), "{not_a_component}");
    }
}
