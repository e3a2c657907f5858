//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use frostline::plugin::{PluginHost, PluginLimits, PluginSource, Role, builtin};

/// A component built from `plugins/testing` by the build script.
pub fn test_plugin(name: &str) -> PluginSource {
    let path = Path::new(builtin::GUEST_DIR).join(format!("{name}.wasm"));
    PluginSource::from_file(&path).unwrap_or_else(|e| panic!("test plugin {name}: {e}"))
}

/// The Python and JavaScript examples, built by `plugins/examples/build.sh` into the folder
/// named by FROSTLINE_EXAMPLE_PLUGINS (the test script sets it).
pub fn example_plugin(file: &str) -> PluginSource {
    let dir = std::env::var("FROSTLINE_EXAMPLE_PLUGINS").unwrap_or_else(|_| {
        panic!(
            "FROSTLINE_EXAMPLE_PLUGINS is not set: run the tests with ./scripts/test, or build the examples with \
             `plugins/examples/build.sh DIR` and set FROSTLINE_EXAMPLE_PLUGINS=DIR"
        )
    });
    PluginSource::from_file(&PathBuf::from(dir).join(file)).unwrap_or_else(|e| panic!("{e}"))
}

/// One host per test binary keeps compile work down; tests that need their own cache make one.
pub fn shared_host() -> &'static PluginHost {
    static HOST: OnceLock<PluginHost> = OnceLock::new();
    HOST.get_or_init(|| PluginHost::new(None).expect("plugin host"))
}

pub fn load(
    source: &PluginSource,
    role: Role,
    limits: PluginLimits,
) -> std::sync::Arc<frostline::plugin::LoadedPlugin> {
    shared_host().load(source, role, limits).unwrap_or_else(|e| panic!("{e}"))
}

/// The path of the real binary under test.
pub fn frostline_bin() -> &'static str {
    env!("CARGO_BIN_EXE_frostline")
}

/// Runs the binary and returns its output.
pub fn run_frostline(args: &[&str]) -> Output {
    std::process::Command::new(frostline_bin()).args(args).output().expect("running frostline")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
