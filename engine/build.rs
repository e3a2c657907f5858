//! Builds the guest plugins in `plugins/` for `wasm32-wasip2`, so a plain `cargo build` or
//! `cargo test` produces the built-in components that are embedded in the binary, and the
//! test-only and Rust example components the integration tests load from `FROSTLINE_GUEST_DIR`.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

const GUEST_TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let plugins = manifest_dir.join("../plugins");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("guests");

    for watched in [
        "../plugins/Cargo.toml",
        "../plugins/Cargo.lock",
        "../plugins/builtin",
        "../plugins/examples/dir-archiver-rs",
        "../plugins/examples/http-archiver-rs",
        "../plugins/shared",
        "../plugins/testing",
        "../wit",
    ] {
        println!("cargo:rerun-if-changed={watched}");
    }

    check_target_installed();

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--locked", "--target", GUEST_TARGET, "--manifest-path"])
        .arg(plugins.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer build's settings are for the host; the guests get their own.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_PROFILE_RELEASE_DEBUG",
    ] {
        command.env_remove(var);
    }
    let output = command.output().expect("running cargo to build the guest plugins");
    if !output.status.success() {
        panic!(
            "building the guest plugins in {} for {GUEST_TARGET} failed:\n{}\n{}",
            plugins.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let guest_dir = target_dir.join(GUEST_TARGET).join("release");
    for component in ["calendar_utc", "eligible_before"] {
        let path = guest_dir.join(format!("{component}.wasm"));
        assert!(Path::new(&path).exists(), "the guest build did not produce {}", path.display());
    }
    println!("cargo:rustc-env=FROSTLINE_GUEST_DIR={}", guest_dir.display());
    if std::env::var_os("CARGO_FEATURE_COMPILER").is_none() {
        embed_precompiled_builtins(&guest_dir);
    }
}

/// A build without a compiler (the lean edge build) embeds the built-ins precompiled for its
/// target by `frostline plugin compile --target T --builtins DIR` (scripts/release does this),
/// and only if DIR's artifacts were made from the built-ins just built.
fn embed_precompiled_builtins(guest_dir: &Path) {
    const VAR: &str = "FROSTLINE_PRECOMPILED_BUILTINS";
    println!("cargo:rerun-if-env-changed={VAR}");
    let target = std::env::var("TARGET").unwrap_or_default();
    let Some(dir) = std::env::var_os(VAR).map(PathBuf::from) else {
        panic!(
            "\n\nThis build has no compiler (feature `compiler` is off), so the built-in plugins must be \
             precompiled for {target}.\nWith a full build of this same source, run\n\n    \
             frostline plugin compile --target {target} --builtins DIR\n\nthen build again with {VAR}=DIR \
             (scripts/release does both).\n"
        )
    };
    for component in ["calendar_utc", "eligible_before"] {
        let wasm = std::fs::read(guest_dir.join(format!("{component}.wasm"))).expect("the built-in was just built");
        let built = hex::encode(Sha256::digest(&wasm));
        let made_from = dir.join(format!("{component}.wasm.sha256"));
        println!("cargo:rerun-if-changed={}", made_from.display());
        println!("cargo:rerun-if-changed={}", dir.join(format!("{component}.cwasm")).display());
        let made_from = std::fs::read_to_string(&made_from).unwrap_or_else(|e| {
            panic!("{VAR}: cannot read {}: {e}; run `frostline plugin compile --builtins` again", made_from.display())
        });
        assert!(
            made_from.trim() == built,
            "{VAR}: {}/{component}.cwasm was compiled from a different {component}.wasm ({}) than this build's \
             ({built}); run `frostline plugin compile --target {target} --builtins` with a full build of this source",
            dir.display(),
            made_from.trim()
        );
    }
    println!("cargo:rustc-env={VAR}={}", dir.canonicalize().expect("the directory exists").display());
}

/// Stops the build with the command to run when the wasm target is missing: machines with
/// `RUSTUP_AUTO_INSTALL=0` do not install it from rust-toolchain.toml by themselves.
fn check_target_installed() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(sysroot) = sysroot {
        let lib = Path::new(&sysroot).join("lib/rustlib").join(GUEST_TARGET);
        if !lib.exists() {
            panic!(
                "\n\nThe {GUEST_TARGET} target is not installed, so the built-in plugins cannot be built.\n\
                 Run:\n\n    rustup target add {GUEST_TARGET}\n\nthen build again.\n"
            );
        }
    }
}
