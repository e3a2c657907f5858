//! The plugins of the policy set in force, with the calls made into each, and the outcome of
//! the last reload.

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::model::CallCounts;
pub use crate::plugin::Role;
pub use crate::policy::{PluginRecord, ReloadOutcome};

/// One plugin of the active policy set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginStatus {
    #[serde(flatten)]
    pub record: PluginRecord,
    /// Calls into its instance since the policy set was loaded (strategies and retention
    /// policies; an archiver's calls are not counted).
    #[serde(flatten)]
    pub counts: Option<CallCounts>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginsPage {
    pub generation: u64,
    pub plugins: Vec<PluginStatus>,
}

/// The plugins in force, with their call counts.
pub fn list(engine: &Engine) -> PluginsPage {
    let policies = engine.policies();
    let plugins = policies
        .plugins
        .iter()
        .map(|record| {
            let table = policies.tables.get(&record.table);
            let counts = table.and_then(|t| match record.role {
                Role::BucketStrategy => t.strategy.call_counts(),
                Role::RetentionPolicy => t.retention.call_counts(),
                Role::Archiver => None,
            });
            PluginStatus { record: record.clone(), counts }
        })
        .collect();
    PluginsPage { generation: policies.generation, plugins }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LastReload {
    pub generation: u64,
    pub last_reload: Option<ReloadOutcome>,
}

/// The generation in force and the last reload attempt.
pub fn last_reload(engine: &Engine) -> LastReload {
    LastReload { generation: engine.policies().generation, last_reload: engine.last_reload() }
}

/// What `frostline --version` prints after the version: the plugin contract, the wasmtime
/// that runs plugins, the build's features and the SHA-256 of every built-in plugin, so an
/// operator can tell which components and compiled caches a binary accepts.
pub fn version_text() -> String {
    use sha2::Digest as _;
    let mut text = format!(
        "{}\nplugin contract {}@{} (runs {})\nwasmtime {}\nfeatures: {}\n",
        env!("CARGO_PKG_VERSION"),
        crate::plugin::CONTRACT_PACKAGE,
        crate::plugin::CONTRACT_VERSION,
        crate::plugin::CONTRACT_VERSIONS_SUPPORTED.join(", "),
        crate::plugin::WASMTIME_VERSION,
        features(),
    );
    for builtin in crate::plugin::builtin::BUILTINS {
        let sha = hex::encode(sha2::Sha256::digest(builtin.bytes));
        text.push_str(&format!("builtin:{} {} sha256 {sha}\n", builtin.name, builtin.role));
    }
    let native = crate::plugin::precompile::Target::native();
    text.push_str(&format!("precompiled plugins for this host: {}\n", native.artifact_name("COMPONENT_SHA256")));
    text.trim_end().to_string()
}

/// The optional features this binary was built with.
fn features() -> String {
    let features: Vec<&str> = [
        (cfg!(feature = "compiler"), "compiler (compiles plugins; an edge build without it runs precompiled ones)"),
        (cfg!(feature = "delta"), "delta (Parquet archives are Delta Lake tables)"),
        (cfg!(feature = "gcs"), "gcs"),
        (cfg!(feature = "azure"), "azure"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if features.is_empty() { "none (the lean edge build)".to_string() } else { features.join(", ") }
}
