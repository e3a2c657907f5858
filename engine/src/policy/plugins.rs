//! Loading one plugin a policy file names (a built-in or a component file): its effective
//! config, its pinned hash checked, its limits, and how to load it again (`declaration`).

use std::path::Path;
use std::sync::Arc;

use super::{RawPlugin, invalid};
use crate::error::Result;
use crate::model;
use crate::plugin::{PluginHost, PluginLimits, PluginSource, Role, builtin};
use crate::store::schema::PluginDeclaration;

/// A plugin loaded for a policy: the component, the config it is initialised with, how to
/// load it again (`declaration`) and, for a file plugin, its bytes.
pub(super) struct PolicyPlugin {
    pub(super) loaded: Arc<crate::plugin::LoadedPlugin>,
    pub(super) config: String,
    pub(super) declaration: PluginDeclaration,
    pub(super) component: Option<PluginSource>,
}

pub(super) fn load_plugin(
    host: &PluginHost,
    dir: &Path,
    file: &Path,
    raw: &RawPlugin,
    role: Role,
    context: &str,
    eligible_before: Option<model::Micros>,
) -> Result<PolicyPlugin> {
    let mut config = raw.config.clone().unwrap_or_default();
    // The process-wide cutoff applies to the built-in policy unless its config sets its own rule.
    if raw.plugin == builtin::DEFAULT_RETENTION
        && !config.contains_key("cutoff")
        && !config.contains_key("archive_after")
        && let Some(cutoff) = eligible_before
    {
        config.insert("cutoff".into(), toml::Value::String(model::time::format_rfc3339(cutoff)));
    }
    let config_json = if config.is_empty() {
        String::new()
    } else {
        serde_json::to_string(&config).map_err(|e| invalid(file, format!("{context}: config: {e}")))?
    };
    let (source, config) = if raw.plugin.starts_with(builtin::BUILTIN_PREFIX) {
        let b = builtin::find(&raw.plugin).ok_or_else(|| {
            let names: Vec<String> = builtin::BUILTINS.iter().map(|b| format!("builtin:{}", b.name)).collect();
            invalid(file, format!("{context}: unknown plugin `{}`; built-ins are {}", raw.plugin, names.join(", ")))
        })?;
        let config = b.effective_config(&config_json).map_err(|e| invalid(file, format!("{context}: {e}")))?;
        (b.source(), config)
    } else {
        let path = dir.join(&raw.plugin);
        (PluginSource::from_file(&path).map_err(|e| invalid(file, format!("{context}: {e}")))?, config_json)
    };
    if let Some(pin) = &raw.sha256 {
        let actual = crate::format::manifest::sha256_hex(&source.bytes);
        if !actual.eq_ignore_ascii_case(pin) {
            return Err(invalid(
                file,
                format!("{context}: `{}` has SHA-256 {actual}, not the pinned {pin}", raw.plugin),
            ));
        }
    }
    let mut limits = PluginLimits::default();
    if let Some(ms) = raw.time_limit_ms {
        limits.call_ms = ms;
    }
    if let Some(mib) = raw.memory_limit_mib {
        limits.memory_bytes = (mib as usize).saturating_mul(1024 * 1024);
    }
    let loaded = host.load(&source, role, limits).map_err(|e| invalid(file, format!("{context}: {e}")))?;
    let declaration = PluginDeclaration {
        plugin: raw.plugin.clone(),
        sha256: loaded.hash.clone(),
        config: config.clone(),
        call_ms: limits.call_ms,
        memory_bytes: limits.memory_bytes,
    };
    let component = (!raw.plugin.starts_with(builtin::BUILTIN_PREFIX)).then_some(source);
    Ok(PolicyPlugin { loaded, config, declaration, component })
}
