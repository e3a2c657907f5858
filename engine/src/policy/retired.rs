//! Tables removed from the policy directory. Such a table keeps its data, accepts no appends
//! and is still archived and expired under its last declaration: the store records the
//! declaration of every table at registration (`TableState::declaration`), and the bytes of its
//! file plugins are kept in `<data>/plugins/<sha256>.wasm`, so the table is rebuilt from them
//! after a restart even when its plugin files are gone from the directory.
//!
//! A table whose declaration cannot be rebuilt (its target is no longer declared, a recorded
//! plugin is missing or fails to load) is left out of the set: the store marks it unmanaged and
//! its buckets wait, out of the due index, until the table or its target returns.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::plugins::PolicyPlugin;
use super::{PolicySet, TablePolicy, build_table};
use crate::error::{Error, Result};
use crate::plugin::{PluginHost, PluginLimits, PluginSource, Role, builtin};
use crate::store::Store;
use crate::store::schema::{PluginDeclaration, TableState};

/// The data directory's folder of kept plugin components.
pub const COMPONENTS_DIR: &str = "plugins";

fn component_path(data_dir: &Path, sha256: &str) -> PathBuf {
    data_dir.join(COMPONENTS_DIR).join(format!("{sha256}.wasm"))
}

/// Keeps the file plugins of `table` in the data directory, durably, before its declaration
/// is recorded: a declaration never names a component the data directory lacks. Content
/// addressed, so each component is written once.
pub fn keep_components(data_dir: &Path, table: &TablePolicy) -> Result<()> {
    for source in &table.components {
        let sha = crate::format::manifest::sha256_hex(&source.bytes);
        let path = component_path(data_dir, &sha);
        if path.exists() {
            continue;
        }
        let dir = data_dir.join(COMPONENTS_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let tmp = dir.join(format!("{sha}.wasm.tmp"));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&source.bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&dir)?.sync_all()
        };
        write().map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

/// Adds to `set`, marked retired, every recorded table that it lacks and that can be rebuilt
/// from its declaration. Returns the tables that cannot, each with the reason.
pub fn restore(
    set: &mut PolicySet,
    states: &[TableState],
    host: &PluginHost,
    data_dir: &Path,
) -> Vec<(String, String)> {
    let mut unrestorable = Vec::new();
    for state in states {
        if set.tables.contains_key(&state.id) {
            continue;
        }
        let Some(declaration) = &state.declaration else {
            unrestorable.push((state.id.clone(), "no declaration was recorded for it".to_string()));
            continue;
        };
        let rebuilt = (|| {
            let backend = set.targets.get(&declaration.target_name).cloned().ok_or_else(|| {
                Error::InvalidInput(format!(
                    "its target `{}` is no longer declared in {}; declare it again",
                    declaration.target_name,
                    set.dir.display()
                ))
            })?;
            let strategy = load_declared(host, data_dir, &declaration.strategy, Role::BucketStrategy)?;
            let retention = load_declared(host, data_dir, &declaration.retention, Role::RetentionPolicy)?;
            let file = PathBuf::from(&declaration.file);
            build_table(&state.id, &file, declaration.clone(), strategy, retention, backend, false)
        })();
        match rebuilt {
            Ok(table) => {
                set.tables.insert(state.id.clone(), Arc::new(table));
                set.retired.insert(state.id.clone());
            }
            Err(e) => unrestorable.push((state.id.clone(), e.to_string())),
        }
    }
    unrestorable
}

fn load_declared(host: &PluginHost, data_dir: &Path, declared: &PluginDeclaration, role: Role) -> Result<PolicyPlugin> {
    let source = if declared.plugin.starts_with(builtin::BUILTIN_PREFIX) {
        // A built-in is taken from this binary: an upgrade changes its hash, and with it the
        // retention identity, so the table's plans are made again.
        builtin::find(&declared.plugin)
            .ok_or_else(|| Error::InvalidInput(format!("this binary has no plugin `{}`", declared.plugin)))?
            .source()
    } else {
        let path = component_path(data_dir, &declared.sha256);
        let source = PluginSource::from_file(&path)?;
        let actual = crate::format::manifest::sha256_hex(&source.bytes);
        if actual != declared.sha256 {
            return Err(Error::InvalidInput(format!(
                "{} has SHA-256 {actual}, not the recorded {}",
                path.display(),
                declared.sha256
            )));
        }
        source
    };
    let limits = PluginLimits { call_ms: declared.call_ms, memory_bytes: declared.memory_bytes };
    let loaded = host.load(&source, role, limits)?;
    Ok(PolicyPlugin { loaded, config: declared.config.clone(), declaration: declared.clone(), component: None })
}

/// `restore` from the tables recorded in `store`, logging each that cannot be rebuilt (it is
/// left unmanaged).
pub fn restore_recorded(set: &mut PolicySet, store: &Store, host: &PluginHost, data_dir: &Path) -> Result<()> {
    for (table, why) in restore(set, &store.table_states()?, host, data_dir) {
        tracing::warn!(table, reason = %why, "a table gone from the policy directory cannot be archived under its last declaration; its buckets wait for it");
    }
    Ok(())
}
