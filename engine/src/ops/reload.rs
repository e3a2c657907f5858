//! Atomic policy reload: parse, load, initialise and check the whole directory, check it
//! against live state, then swap it in. A refused reload keeps the previous set and says why.
//!
//! A file caught half-written must never activate a partial policy: before and after loading,
//! with a pause between, the policy files' content hashes are taken, and every file of the
//! directory tree (plugins, secrets, certificate files, in subfolders too) is listed with its
//! size and modification time; any change means a writer is still at work, and the reload is
//! refused (the watcher, which watches the whole tree, tries again when the writes stop).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::policy::{PolicySet, ReloadOutcome, hash_files};

/// How long the directory must stay unchanged around a reload.
pub const RELOAD_STABLE_MS: u64 = 200;
/// How long the watcher waits for writes to stop before reloading.
pub const RELOAD_DEBOUNCE_MS: u64 = 300;

/// Reloads the policy directory of `engine`. Returns the outcome; a refusal is an outcome
/// too, with the previous set still active.
pub fn reload(engine: &Engine, trigger: &str) -> ReloadOutcome {
    let current = engine.policies();
    let outcome = match try_reload(engine, &current) {
        Ok(set) => {
            let generation = set.generation;
            match engine.install_policies(set) {
                Ok(()) => {
                    tracing::info!(generation, trigger, "policy reload accepted");
                    ReloadOutcome {
                        at: engine.clock.now(),
                        accepted: true,
                        generation,
                        error: None,
                        trigger: trigger.into(),
                    }
                }
                Err(e) => refused(engine, &current, trigger, e),
            }
        }
        Err(e) => refused(engine, &current, trigger, e),
    };
    engine.record_reload(outcome.clone());
    outcome
}

fn refused(engine: &Engine, current: &PolicySet, trigger: &str, error: Error) -> ReloadOutcome {
    let message = error.to_string();
    tracing::error!(error = %message, generation = current.generation, trigger, "policy reload refused; the previous policy set stays active");
    ReloadOutcome {
        at: engine.clock.now(),
        accepted: false,
        generation: current.generation,
        error: Some(message),
        trigger: trigger.into(),
    }
}

fn unstable(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Option<String> {
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|name| before.get(*name) != after.get(*name))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "policy files are still being written ({}); the reload will be retried when they settle",
            changed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        )
    })
}

fn try_reload(engine: &Engine, current: &Arc<PolicySet>) -> Result<PolicySet> {
    let dir = current.dir.clone();
    let (before, tree_before) = (hash_files(&dir)?, tree_state(&dir)?);
    std::thread::sleep(Duration::from_millis(RELOAD_STABLE_MS));
    let set = crate::policy::load_with(&dir, &engine.data_dir, &engine.host, &engine.settings, &engine.load_options)?;
    let (after, tree_after) = (hash_files(&dir)?, tree_state(&dir)?);
    if let Some(why) = unstable(&before, &after)
        .or_else(|| unstable(&before, &set.files))
        .or_else(|| unstable(&tree_before, &tree_after))
    {
        return Err(Error::InvalidInput(why));
    }
    succeed(engine, current, set)
}

/// Every file under `dir`, by path relative to it, with its size and modification time: what
/// a writer at work changes, read without reading the files (plugins can be large).
fn tree_state(dir: &std::path::Path) -> Result<BTreeMap<String, String>> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut BTreeMap<String, String>) -> Result<()> {
        let unreadable = |e: std::io::Error| Error::io(dir, e);
        for entry in std::fs::read_dir(dir).map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            let path = entry.path();
            if entry.file_type().map_err(unreadable)?.is_dir() {
                walk(root, &path, out)?;
                continue;
            }
            // A symlinked file is followed, as the loader does; a symlinked folder is not
            // (it could lead back up the tree).
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if !meta.is_dir() {
                let name = path.strip_prefix(root).unwrap_or(&path).display().to_string();
                let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
                out.insert(name, format!("{} bytes, modified {:?}", meta.len(), modified));
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// Makes a freshly loaded `set` the successor of `current`: tables it lacks are carried over
/// as retired (from `current`, or rebuilt from their recorded declarations), it is checked
/// against the store, and it takes the next generation. It is not installed.
pub fn succeed(engine: &Engine, current: &PolicySet, mut set: PolicySet) -> Result<PolicySet> {
    // A removed table keeps its data and its last definition, for archival only.
    for (id, old) in &current.tables {
        if !set.tables.contains_key(id) {
            set.tables.insert(id.clone(), old.clone());
            set.retired.insert(id.clone());
        }
    }
    // And those removed before the engine started, from their recorded declarations.
    crate::policy::retired::restore_recorded(&mut set, &engine.store, &engine.host, &engine.data_dir)?;
    crate::policy::check::check_against_store(&set, &engine.store)?;
    set.generation = current.generation + 1;
    Ok(set)
}

/// A file-system watcher on the policy directory, set up before the engine reports itself
/// running so no change is missed.
pub struct PolicyWatcher {
    _watcher: notify::RecommendedWatcher,
    events: tokio::sync::mpsc::UnboundedReceiver<()>,
}

pub fn start_watcher(dir: &std::path::Path) -> Result<PolicyWatcher> {
    use notify::Watcher;
    let (sender, events) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && !event.kind.is_access()
        {
            let _ = sender.send(());
        }
    })
    .map_err(|e| Error::Internal(format!("cannot watch the policy directory: {e}")))?;
    watcher
        // Recursive: a plugin or a certificate replaced in a subfolder reloads too.
        .watch(dir, notify::RecursiveMode::Recursive)
        .map_err(|e| Error::Internal(format!("cannot watch {}: {e}", dir.display())))?;
    Ok(PolicyWatcher { _watcher: watcher, events })
}

/// Reloads on change (debounced) and on SIGHUP, until `shutdown` fires. The reload itself
/// runs on a blocking thread.
pub async fn watch(
    engine: Arc<Engine>,
    watcher: PolicyWatcher,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let PolicyWatcher { _watcher, mut events } = watcher;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| Error::Internal(format!("cannot listen for SIGHUP: {e}")))?;
    loop {
        let trigger = tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = hangup.recv() => "SIGHUP",
            Some(()) = events.recv() => {
                // Debounce: wait until the directory has been quiet for a while.
                while let Ok(Some(())) =
                    tokio::time::timeout(Duration::from_millis(RELOAD_DEBOUNCE_MS), events.recv()).await
                {}
                "file change"
            }
        };
        let engine2 = engine.clone();
        let outcome = tokio::task::spawn_blocking(move || reload(&engine2, trigger))
            .await
            .map_err(|e| Error::Internal(format!("reload task failed: {e}")))?;
        // A refusal because files were still changing is retried once they settle.
        if !outcome.accepted && outcome.error.as_deref().is_some_and(|e| e.contains("still being written")) {
            tokio::time::sleep(Duration::from_millis(RELOAD_DEBOUNCE_MS)).await;
            let engine2 = engine.clone();
            tokio::task::spawn_blocking(move || reload(&engine2, "retry after settling"))
                .await
                .map_err(|e| Error::Internal(format!("reload task failed: {e}")))?;
        }
        if let Err(e) = crate::ops::status::write_status_file(&engine) {
            tracing::warn!(error = %e, "cannot write the status file");
        }
    }
}
