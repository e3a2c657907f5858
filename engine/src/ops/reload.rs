//! Atomic policy reload: parse, load, initialise and check the whole directory, check it
//! against live state, then swap it in. A refused reload keeps the previous set and says why.
//!
//! A file caught half-written must never activate a partial policy. The watcher follows each
//! file's writes (created or written, then closed), and reloads `RELOAD_QUIET_MS` after the
//! last change once every write it saw is closed: a file renamed into the tree or a finished
//! copy is active at once. A file still open for writing holds the reload back until it is
//! closed. When the watcher cannot tell (SIGHUP, the API, a platform without close events, a
//! queue overflow, a writer that holds a file open for `RELOAD_OPEN_WRITE_QUIET_MS`), the
//! reload pauses `RELOAD_STABLE_MS` first. Either way, the policy files' content hashes and
//! every file of the tree (plugins, secrets, certificate files, in subfolders too) by size
//! and modification time are taken before and after loading; any change means a writer is
//! still at work, and the reload is refused (and retried when the writes stop).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, CreateKind, EventKind, ModifyKind, RenameMode};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::policy::{PolicySet, ReloadOutcome, hash_files};
use crate::store::schema::Hold;

/// How long the directory must stay unchanged around a reload the watcher cannot vouch for.
pub const RELOAD_STABLE_MS: u64 = 200;
/// How long the watcher waits after the last change when every write it saw was closed: a
/// burst of renames (a deploy tool moving several files) reloads once.
pub const RELOAD_QUIET_MS: u64 = 25;
/// How long the watcher waits after the last change when it cannot tell whether writes are
/// done (events it does not follow, or a dropped event queue).
pub const RELOAD_DEBOUNCE_MS: u64 = 300;
/// How long a file may stay open for writing, with nothing happening, before the watcher
/// stops waiting for it to be closed and reloads with the stability pause.
pub const RELOAD_OPEN_WRITE_QUIET_MS: u64 = 5_000;

/// Reloads the policy directory of `engine`. Returns the outcome; a refusal is an outcome
/// too, with the previous set still active.
pub fn reload(engine: &Engine, trigger: &str) -> ReloadOutcome {
    reload_after(engine, trigger, Duration::from_millis(RELOAD_STABLE_MS))
}

/// `reload`, with `pause` between the first look at the directory and the load (zero when
/// the watcher saw every write closed).
fn reload_after(engine: &Engine, trigger: &str, pause: Duration) -> ReloadOutcome {
    let _only_reload = engine.one_reload_at_a_time();
    let current = engine.policies();
    let outcome = match try_reload(engine, &current, pause) {
        Ok((set, released_holds)) => {
            let generation = set.generation;
            match engine.install_policies(set) {
                Ok(()) => {
                    if released_holds.is_empty() {
                        tracing::info!(generation, trigger, "policy reload accepted");
                    } else {
                        let released = released_holds.iter().map(describe_hold).collect::<Vec<_>>().join("; ");
                        tracing::warn!(
                            generation, trigger, %released,
                            "policy reload accepted; it releases {} policy hold(s) whose [[hold]] left the policy directory",
                            released_holds.len()
                        );
                    }
                    ReloadOutcome {
                        at: engine.clock().now(),
                        accepted: true,
                        generation,
                        error: None,
                        trigger: trigger.into(),
                        released_holds,
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
        at: engine.clock().now(),
        accepted: false,
        generation: current.generation,
        error: Some(message),
        trigger: trigger.into(),
        released_holds: Vec::new(),
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

/// A hold as a log line shows it: id, what it covers, why, and where it was declared.
fn describe_hold(hold: &Hold) -> String {
    let scope = [("partition", &hold.partition_key), ("tenant", &hold.tenant), ("bucket", &hold.bucket_key)]
        .into_iter()
        .filter_map(|(what, value)| value.as_ref().map(|v| format!(" {what} {v}")))
        .collect::<String>();
    format!("{} (table `{}`{scope}, reason {:?}, from {})", hold.id, hold.table, hold.reason, hold.source)
}

/// Loads and checks the directory; returns the set to install and the policy holds it releases.
fn try_reload(engine: &Engine, current: &Arc<PolicySet>, pause: Duration) -> Result<(PolicySet, Vec<Hold>)> {
    let dir = current.dir.clone();
    let (before, tree_before) = (hash_files(&dir)?, tree_state(&dir)?);
    if !pause.is_zero() {
        engine.clock().pause(pause);
    }
    let set =
        crate::policy::load_with(&dir, engine.data_dir(), engine.host(), engine.settings(), engine.load_options())?;
    let (after, tree_after) = (hash_files(&dir)?, tree_state(&dir)?);
    if let Some(why) = unstable(&before, &after)
        .or_else(|| unstable(&before, &set.files))
        .or_else(|| unstable(&tree_before, &tree_after))
    {
        return Err(Error::InvalidInput(why));
    }
    let set = succeed(engine, current, set)?;
    // Reloads run one at a time, so the store's policy holds do not change before the install.
    let released = crate::policy::released_holds(engine.store().holds()?, &set);
    Ok((set, released))
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
    crate::policy::retired::restore_recorded(&mut set, engine.store(), engine.host(), engine.data_dir())?;
    crate::policy::check::check_against_store(&set, engine.store())?;
    set.generation = current.generation + 1;
    Ok(set)
}

/// A file-system watcher on the policy directory, set up before the engine reports itself
/// running so no change is missed.
pub struct PolicyWatcher {
    _watcher: notify::RecommendedWatcher,
    events: tokio::sync::mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
}

pub fn start_watcher(dir: &std::path::Path) -> Result<PolicyWatcher> {
    use notify::Watcher;
    let (sender, events) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let _ = sender.send(event);
    })
    .map_err(|e| Error::Internal(format!("cannot watch the policy directory: {e}")))?;
    watcher
        // Recursive: a plugin or a certificate replaced in a subfolder reloads too.
        .watch(dir, notify::RecursiveMode::Recursive)
        .map_err(|e| Error::Internal(format!("cannot watch {}: {e}", dir.display())))?;
    Ok(PolicyWatcher { _watcher: watcher, events })
}

/// What the watcher has seen since the last reload: whether anything changed, which files
/// are open for writing (created or written, not yet closed), and whether an event came that
/// it cannot account for.
#[derive(Debug, Default)]
pub struct Settling {
    changed: bool,
    open_writes: BTreeSet<PathBuf>,
    unaccounted: bool,
}

impl Settling {
    pub fn see(&mut self, event: &notify::Result<notify::Event>) {
        let Ok(event) = event else {
            // A watcher error (an overflowed queue, say): some change may have gone unseen.
            self.changed = true;
            self.unaccounted = true;
            return;
        };
        match event.kind {
            // The engine's own reads while loading, and anyone else's.
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => {
                self.changed = true;
                for path in &event.paths {
                    self.open_writes.remove(path);
                }
            }
            EventKind::Access(_) => {}
            EventKind::Create(CreateKind::Folder) | EventKind::Modify(ModifyKind::Metadata(_)) => self.changed = true,
            EventKind::Create(CreateKind::File) | EventKind::Modify(ModifyKind::Data(_)) => {
                self.changed = true;
                // A symbolic link is created whole; it is never written, so never closed.
                let written =
                    event.paths.iter().filter(|p| !std::fs::symlink_metadata(p).is_ok_and(|m| m.is_symlink()));
                self.open_writes.extend(written.cloned());
            }
            // A rename carries a file's open writes to its new name; a file renamed into the
            // tree was written elsewhere.
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                self.changed = true;
                if let [from, to] = event.paths.as_slice()
                    && self.open_writes.remove(from)
                {
                    self.open_writes.insert(to.clone());
                }
            }
            EventKind::Modify(ModifyKind::Name(RenameMode::From | RenameMode::To)) => self.changed = true,
            EventKind::Remove(_) => {
                self.changed = true;
                for path in &event.paths {
                    self.open_writes.remove(path);
                }
            }
            _ => {
                self.changed = true;
                self.unaccounted = true;
            }
        }
    }

    /// Every change seen is accounted for and every write closed: the reload needs no pause.
    pub fn settled(&self) -> bool {
        self.open_writes.is_empty() && !self.unaccounted
    }

    /// How long to wait for the next event before reloading.
    fn quiet(&self) -> Duration {
        Duration::from_millis(if self.settled() {
            RELOAD_QUIET_MS
        } else if self.open_writes.is_empty() {
            RELOAD_DEBOUNCE_MS
        } else {
            RELOAD_OPEN_WRITE_QUIET_MS
        })
    }
}

/// Reloads on change and on SIGHUP, until `shutdown` fires. After a change it waits until the
/// tree is quiet and every write it saw is closed (`Settling`). The reload itself runs on a
/// blocking thread.
pub async fn watch(
    engine: Arc<Engine>,
    watcher: PolicyWatcher,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let PolicyWatcher { _watcher, mut events } = watcher;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| Error::Internal(format!("cannot listen for SIGHUP: {e}")))?;
    let stable = Duration::from_millis(RELOAD_STABLE_MS);
    loop {
        let mut seen = Settling::default();
        let (trigger, pause) = tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = hangup.recv() => ("SIGHUP", stable),
            Some(event) = events.recv() => {
                seen.see(&event);
                if !seen.changed {
                    continue;
                }
                loop {
                    tokio::select! {
                        _ = shutdown.changed() => return Ok(()),
                        next = tokio::time::timeout(seen.quiet(), events.recv()) => match next {
                            Ok(Some(event)) => seen.see(&event),
                            Ok(None) => return Ok(()),
                            Err(_quiet) => break,
                        },
                    }
                }
                ("file change", if seen.settled() { Duration::ZERO } else { stable })
            }
        };
        let engine2 = engine.clone();
        let outcome = tokio::task::spawn_blocking(move || reload_after(&engine2, trigger, pause))
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

#[cfg(test)]
mod tests {
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, EventKind, ModifyKind, RenameMode};

    use super::*;

    fn event(kind: EventKind, paths: &[&str]) -> notify::Result<notify::Event> {
        Ok(paths.iter().fold(notify::Event::new(kind), |e, p| e.add_path(PathBuf::from(p))))
    }

    fn seen(events: &[notify::Result<notify::Event>]) -> Settling {
        let mut seen = Settling::default();
        events.iter().for_each(|e| seen.see(e));
        seen
    }

    const WRITTEN: EventKind = EventKind::Modify(ModifyKind::Data(DataChange::Any));
    const CLOSED: EventKind = EventKind::Access(AccessKind::Close(AccessMode::Write));

    #[test]
    fn a_file_renamed_into_the_tree_is_settled_at_once() {
        let s = seen(&[event(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &["/p/next.toml"])]);
        assert!(s.changed && s.settled());
        assert_eq!(s.quiet(), Duration::from_millis(RELOAD_QUIET_MS));
    }

    #[test]
    fn a_file_open_for_writing_holds_the_reload_until_it_is_closed() {
        let mut s =
            seen(&[event(EventKind::Create(CreateKind::File), &["/p/next.toml"]), event(WRITTEN, &["/p/next.toml"])]);
        assert!(s.changed && !s.settled());
        assert_eq!(s.quiet(), Duration::from_millis(RELOAD_OPEN_WRITE_QUIET_MS));
        s.see(&event(CLOSED, &["/p/other.toml"]));
        assert!(!s.settled(), "another file's close settles nothing");
        s.see(&event(CLOSED, &["/p/next.toml"]));
        assert!(s.settled());
    }

    #[test]
    fn a_rename_carries_an_open_write_to_the_new_name() {
        let mut s = seen(&[
            event(WRITTEN, &["/p/.next.toml.tmp"]),
            event(EventKind::Modify(ModifyKind::Name(RenameMode::Both)), &["/p/.next.toml.tmp", "/p/next.toml"]),
        ]);
        assert!(!s.settled());
        s.see(&event(CLOSED, &["/p/next.toml"]));
        assert!(s.settled());
    }

    #[test]
    fn reads_change_nothing_and_unknown_events_need_the_pause() {
        let s = seen(&[
            event(EventKind::Access(AccessKind::Open(notify::event::AccessMode::Any)), &["/p/a.toml"]),
            event(EventKind::Access(AccessKind::Close(AccessMode::Read)), &["/p/a.toml"]),
        ]);
        assert!(!s.changed, "the engine's own reads while loading must not trigger a reload");
        let s = seen(&[event(EventKind::Other, &[])]);
        assert!(s.changed && !s.settled());
        assert_eq!(s.quiet(), Duration::from_millis(RELOAD_DEBOUNCE_MS));
        let s = seen(&[Err(notify::Error::generic("queue overflow"))]);
        assert!(s.changed && !s.settled());
    }
}
