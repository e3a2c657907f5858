//! Capability grants (`[[grant]]`) and archive targets backed by a WASM archiver
//! (`[[target]]` with `plugin`). See policies/README.md for the format.
//!
//! Default-deny: a plugin gets a capability only from a grant naming its exact SHA-256, so a
//! changed component loses every grant. Only archiver targets receive grants; strategies and
//! retention policies stay pure whatever the directory says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::plugins::{PolicyPlugin, load_plugin};
use super::{PluginRecord, RawPlugin, RawTarget, invalid};
use crate::error::Result;
use crate::plugin::archiver::{ARCHIVER_CALL_MS_DEFAULT, WasmArchiver};
use crate::plugin::grants::{BlobStoreGrant, Capabilities, Preopen, PreopenMode};
use crate::plugin::http::HttpGrant;
use crate::plugin::{PluginHost, Role, conformance};
use crate::storage::ArchiveBackend;

/// Seed of the conformance check an archiver target passes at load.
const LOAD_CHECK_ARCHIVER_SEED: u64 = 0x00f1_0571;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrant {
    /// The component's SHA-256 (64 hex digits); the grant applies to exactly that content.
    sha256: String,
    #[serde(default)]
    preopen: Vec<RawPreopen>,
    /// A native `[[target]]` lent through the `blob-store` import.
    blob_store: Option<String>,
    /// Origins (`scheme://host:port`) the archiver may send `wasi:http` requests to.
    #[serde(default)]
    http_hosts: Vec<String>,
    /// Origins of `http_hosts` whose names may resolve to loopback, link-local or private
    /// addresses (refused otherwise; an IP literal in `http_hosts` needs no entry here).
    #[serde(default)]
    http_private_hosts: Vec<String>,
    /// Bytes of one request or response body, at most, in MiB (default 256).
    http_body_limit_mib: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPreopen {
    /// A host directory, relative to the policy directory or absolute.
    host: PathBuf,
    /// Where the plugin sees it: an absolute guest path such as `/data`.
    guest: String,
    mode: PreopenMode,
}

/// A validated grant.
#[derive(Debug, Clone)]
pub struct Grant {
    pub sha256: String,
    pub preopens: Vec<Preopen>,
    pub blob_store: Option<String>,
    /// Outgoing HTTP, when `http_hosts` lists any origin.
    pub http: Option<Arc<HttpGrant>>,
    /// The file that declared it.
    pub file: PathBuf,
}

/// Validated grants by (lower-case) SHA-256.
pub type Grants = BTreeMap<String, Grant>;

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Checks every grant: a well-formed hash granted once, preopens that exist (a read-write one
/// is created) under distinct absolute guest paths, a blob store naming a native target.
pub(super) fn validate(dir: &Path, raw: Vec<(PathBuf, RawGrant)>, native_targets: &[String]) -> Result<Grants> {
    let mut grants = Grants::new();
    for (file, g) in raw {
        let sha256 = g.sha256.to_ascii_lowercase();
        if !is_sha256_hex(&sha256) {
            return Err(invalid(&file, format!("grant: sha256 `{}` is not 64 hexadecimal digits", g.sha256)));
        }
        let what = format!("grant for sha256 {}", &sha256[..12]);
        if let Some(other) = grants.get(&sha256) {
            return Err(invalid(
                &file,
                format!("{what}: also granted in {}; give one grant per hash", other.file.display()),
            ));
        }
        let http = HttpGrant::parse_with_private(&g.http_hosts, &g.http_private_hosts, g.http_body_limit_mib)
            .map_err(|e| invalid(&file, format!("{what}: {e}")))?;
        let mut preopens: Vec<Preopen> = Vec::new();
        for p in g.preopen {
            let guest = p.guest.trim_end_matches('/').to_string();
            if !p.guest.starts_with('/') || guest.split('/').any(|s| s == ".." || s == ".") {
                return Err(invalid(
                    &file,
                    format!("{what}: preopen guest path `{}` must be absolute, without `.` or `..`", p.guest),
                ));
            }
            let guest = if guest.is_empty() { "/".to_string() } else { guest };
            if preopens.iter().any(|q| q.guest == guest) {
                return Err(invalid(&file, format!("{what}: guest path `{guest}` is preopened twice")));
            }
            let host = if p.host.is_absolute() { p.host.clone() } else { dir.join(&p.host) };
            if p.mode == PreopenMode::Rw && !host.exists() {
                std::fs::create_dir_all(&host).map_err(|e| {
                    invalid(&file, format!("{what}: cannot create preopen directory {}: {e}", host.display()))
                })?;
            }
            let host = host
                .canonicalize()
                .map_err(|e| invalid(&file, format!("{what}: preopen directory {}: {e}", host.display())))?;
            if !host.is_dir() {
                return Err(invalid(&file, format!("{what}: preopen {} is not a directory", host.display())));
            }
            preopens.push(Preopen { host, guest, mode: p.mode });
        }
        if let Some(target) = &g.blob_store
            && !native_targets.contains(target)
        {
            return Err(invalid(
                &file,
                format!(
                    "{what}: blob_store `{target}` is not a native target; declare it with [[target]] name = \"{target}\" url = \"...\" \
                     (native targets here: {})",
                    native_targets.join(", ")
                ),
            ));
        }
        grants.insert(sha256.clone(), Grant { sha256, preopens, blob_store: g.blob_store, http, file });
    }
    Ok(grants)
}

/// What a component with content hash `sha256` may use: its grant's capabilities, or nothing.
pub fn capabilities_for(
    grants: &Grants,
    sha256: &str,
    targets: &BTreeMap<String, Arc<dyn ArchiveBackend>>,
) -> Capabilities {
    let Some(grant) = grants.get(&sha256.to_ascii_lowercase()) else { return Capabilities::none() };
    Capabilities {
        preopens: grant.preopens.clone(),
        blob_store: grant.blob_store.as_ref().and_then(|name| {
            targets.get(name).map(|backend| BlobStoreGrant { target: name.clone(), backend: backend.clone() })
        }),
        http: grant.http.clone(),
    }
}

/// A `[[target]]` is either native (`url`) or a WASM archiver (`plugin`), never both.
pub(super) enum TargetKind {
    Native(String),
    Plugin(RawPlugin),
}

pub(super) fn target_kind(file: &Path, raw: RawTarget) -> Result<TargetKind> {
    let plugin_fields =
        raw.sha256.is_some() || raw.config.is_some() || raw.time_limit_ms.is_some() || raw.memory_limit_mib.is_some();
    match (raw.url, raw.plugin) {
        (Some(url), None) if !plugin_fields => Ok(TargetKind::Native(url)),
        (Some(_), None) => Err(invalid(
            file,
            format!(
                "target `{}`: sha256, config, time_limit_ms and memory_limit_mib belong to a plugin target (`plugin = ...`), not a `url` target",
                raw.name
            ),
        )),
        (None, Some(plugin)) => Ok(TargetKind::Plugin(RawPlugin {
            plugin,
            sha256: raw.sha256,
            config: raw.config,
            time_limit_ms: raw.time_limit_ms.or(Some(ARCHIVER_CALL_MS_DEFAULT)),
            memory_limit_mib: raw.memory_limit_mib,
        })),
        (Some(_), Some(_)) => Err(invalid(
            file,
            format!("target `{}` sets both `url` and `plugin`; a target is one or the other", raw.name),
        )),
        (None, None) => Err(invalid(
            file,
            format!("target `{}` needs `url` (a native store) or `plugin` (a WASM archiver component)", raw.name),
        )),
    }
}

/// Loads an archiver target: the component (pinned by `sha256` when given) with the
/// capabilities of the grant for its hash, checked by the archiver conformance checks (against
/// scratch keys it removes again) before any table may use it.
pub(super) fn load_plugin_target(
    host: &PluginHost,
    dir: &Path,
    file: &Path,
    name: &str,
    raw: &RawPlugin,
    grants: &Grants,
    targets: &BTreeMap<String, Arc<dyn ArchiveBackend>>,
) -> Result<(Arc<dyn ArchiveBackend>, PluginRecord)> {
    let context = format!("target `{name}`");
    let PolicyPlugin { loaded, config, .. } = load_plugin(host, dir, file, raw, Role::Archiver, &context, None)?;
    let record = PluginRecord::of(&format!("target:{name}"), &loaded);
    let capabilities = capabilities_for(grants, &loaded.hash, targets);
    tracing::info!(target_name = name, plugin = %loaded.name, sha256 = %loaded.hash, granted = %capabilities.describe(), "archiver target loaded");
    let archiver = WasmArchiver::with_capabilities(loaded, config, capabilities)
        .map_err(|e| invalid(file, format!("{context}: {e}")))?;
    // Leftovers of interrupted checks age in the store in real time: the system clock's.
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    let report = conformance::check_archiver(&archiver, LOAD_CHECK_ARCHIVER_SEED, now)
        .map_err(|e| invalid(file, format!("{context}: {e}")))?;
    if !report.passed() {
        return Err(invalid(
            file,
            format!(
                "{context}: fails its conformance checks (granted: {}):\n{report}",
                archiver.capabilities().describe()
            ),
        ));
    }
    Ok((Arc::new(archiver), record))
}
