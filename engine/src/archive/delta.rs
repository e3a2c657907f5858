//! The Delta log of a table's archive (feature `delta`): every Parquet table's archive on an
//! object store is also a Delta Lake table at `delta/<table>/`, which Spark, polars, DuckDB
//! and delta-rs read without frostline.
//!
//! The log is derived, like the catalog: frostline's manifests stay the source of truth, and
//! [`sync`] makes this installation's files in the log match them. It takes the files of every
//! published bucket of the table (on the target the log lives on) from an index it keeps
//! between syncs (`FileIndex`: made whole from every manifest by a process's first sync, then
//! updated from the buckets whose publication changed, so a sync reads what changed, not the
//! table's history), compares them with the files the log's newest version holds that this
//! installation answers for (on a running engine only at the paths that changed on either
//! side since its last sync, `plan`), then commits remove actions for what is no longer published and
//! add actions (with partition values and statistics) for what is. Other installations' files are never touched (except those of
//! archives it adopted from a lost installation, which it now answers for), so several engines
//! can share one table: their commits race through the store's conditional create, and a
//! commit that lost the race, or whose outcome is unknown, is not retried blindly; the log is
//! read again and the difference recomputed, so no file is added twice and none is lost.
//! Every commit carries an application transaction (`frostline-<installation>`, one version
//! more than the last) for readers that track what a writer committed.
//!
//! A file's `path` in the log is its key relative to the table root, percent-encoded once as
//! the protocol says (a URI): delta-rs's serializer does that encoding, so the actions hold
//! the key itself, and the folder `partition=site-a%2Fsensor-0` is listed as
//! `partition=site-a%252Fsensor-0`. Its `partitionValues` are the real values (the manifest's),
//! never read back from folder names (an empty value is null, a long one's folder a hash).
//! Builds before this encoding wrote every `%` of a key twice more (`%25252F`), which no reader
//! can open; a sync finds this installation's files listed so and replaces them in one commit
//! (an `FSCK` of removes and adds without data change), so readers see every file throughout.
//!
//! When it runs: after every pass that published or expired a bucket, on the first pass of a
//! process and after a failed sync (so a crash between publication and commit is caught up),
//! and by `frostline delta sync`, which also rebuilds a lost log. An expiry deletes its first
//! object only once a sync that started after the bucket was unpublished has succeeded (so a
//! reader of the newest version is never sent to a deleted file): the pass's own sync serves
//! every expiry of the pass (`engine::DeltaCoverage`), where one sync per expired bucket, each
//! reading the whole log and every manifest, made a pass over a large table last many minutes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use deltalake::DeltaTable;
use deltalake::kernel::transaction::CommitData;
use deltalake::kernel::{Action, Add, Remove, Transaction};
use deltalake::logstore::{CommitOrBytes, LogStoreRef, StorageConfig, default_logstore};
use deltalake::protocol::{DeltaOperation, SaveMode};
use object_store::ObjectStore;
use object_store::prefix::PrefixStore;

use super::blocking;
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, SegmentInfo};
use crate::model::Micros;
use crate::model::columns::{ColumnSpec, ColumnType};
use crate::policy::TablePolicy;
use crate::storage::keys;
use crate::store::schema::{BucketId, BucketMeta, DeltaLogState};

/// The Delta table's partition columns, in the order of the folders below its root.
pub const DELTA_PARTITION_COLUMNS: [&str; 3] = ["installation", "bucket", "partition"];

/// Commits between two checkpoints of the log (`delta.checkpointInterval`).
pub const DELTA_CHECKPOINT_INTERVAL: u32 = 10;

/// Times a sync reads the log again after a commit that lost a race or failed.
pub const DELTA_COMMIT_ATTEMPTS_MAX: u32 = 20;

/// What one sync changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeltaSync {
    pub table: String,
    /// Files added and removed by this installation's commits.
    pub added: usize,
    pub removed: usize,
    /// Files whose entry, written with the path encoding of earlier builds, was replaced by
    /// one with the right path (module documentation).
    pub repaired: usize,
    /// Buckets whose manifests the sync read from the store: every one the table ever
    /// archived when it made its index whole, else only those whose publication changed since
    /// the last sync (`FileIndex`).
    pub buckets_read: usize,
    /// Log entries and published files the sync's plans compared (summed over its attempts):
    /// those of the buckets and log entries that changed since the last successful sync of
    /// this process, or every one when it read the index or the log whole (`plan`).
    #[serde(default)]
    pub files_compared: usize,
    /// The log's version after the sync.
    pub version: u64,
    /// Whether this sync wrote the table's first version.
    pub created: bool,
    /// Commits that lost a race with another writer of the log (another installation, a
    /// reader's VACUUM) or failed, and were made again after reading the log.
    #[serde(default)]
    pub retried_commits: usize,
    /// Declared columns this sync added to the log's schema (a metadata commit of their own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns_added: Vec<String>,
}

/// Syncs when the table's log may lag its manifests: `changed` (the pass published or expired
/// something), an expiry or erasure waits for a sync (`engine::DeltaCoverage`), or no sync of
/// this process has succeeded since it started or since the last failure.
pub async fn sync_if_needed(ctx: &Arc<Context>, table: &Arc<TablePolicy>, changed: bool) -> Option<Result<DeltaSync>> {
    if !table.delta_log()
        || (!changed
            && !awaits_sync(ctx, &table.id)
            && ctx.memory().delta_in_sync.lock().expect("delta sync state").contains(&table.id))
    {
        return None;
    }
    Some(sync(ctx, table).await)
}

/// One sync at a time per table of this installation: two at once would each see a file
/// missing and both add it. The lock holds the table's `FileIndex` between syncs.
fn sync_lock(ctx: &Context, table: &TablePolicy) -> crate::engine::DeltaSyncLock {
    let mut locks = ctx.memory().delta_locks.lock().expect("delta sync locks");
    locks.entry(table.id.clone()).or_default().clone()
}

/// Makes this installation's files in the table's Delta log match its published manifests
/// (module documentation). Errors are retryable: nothing is deleted on the strength of a
/// sync, and the next one starts again from what the log holds.
pub async fn sync(ctx: &Arc<Context>, table: &Arc<TablePolicy>) -> Result<DeltaSync> {
    let lock = sync_lock(ctx, table);
    let mut kept = lock.lock().await;
    ctx.memory().delta_in_sync.lock().expect("delta sync state").remove(&table.id);
    // Every ticket taken so far is of a bucket that is unpublished in what the sync reads next.
    let issued = ctx.memory().delta_coverage.lock().expect("delta coverage").last_ticket;
    let KeptSync { index, mut log } =
        kept.take().and_then(|k| k.downcast::<KeptSync>().ok()).map_or_else(KeptSync::default, |k| *k);
    let result = match file_index(ctx, table, index).await {
        Ok(mut index) => {
            if log.is_some() && index.updates == 0 {
                log = None; // a whole index: the log is read whole too
            }
            let result = sync_serialized(ctx, table, &index, &mut log).await;
            // Kept only after a sync that succeeded: a failed one reads everything again.
            if result.is_ok() {
                let (store, id, through) = (ctx.store.clone(), table.id.clone(), index.changes_read);
                let replaced = std::mem::take(&mut index.replaced);
                *kept = Some(Box::new(KeptSync { index: Some(index), log }));
                // What the index has taken in is dropped from the store's list of changes, and
                // the copies of replaced archives whose files the log no longer lists with it.
                let dropped = blocking(move || {
                    store.drop_publication_changes(&id, through)?;
                    store.drop_replaced_copies_after_sync(replaced)
                })
                .await;
                match dropped {
                    Ok(0) => {}
                    Ok(copies) => tracing::debug!(table = %table.id, copies, "replaced manifests' copies dropped"),
                    Err(e) => tracing::warn!(table = %table.id, error = %e,
                        "cannot drop the publication changes a Delta sync read, or the replaced manifests' copies"),
                }
            }
            result
        }
        Err(e) => Err(e),
    };
    if result.is_ok() {
        ctx.memory().delta_in_sync.lock().expect("delta sync state").insert(table.id.clone());
        let mut coverage = ctx.memory().delta_coverage.lock().expect("delta coverage");
        let covered = coverage.covered.entry(table.id.clone()).or_default();
        *covered = (*covered).max(issued);
    }
    record(ctx, table, &result).await?;
    result
}

/// A new ticket for a bucket whose expiry's tombstone was just written (`engine::DeltaCoverage`),
/// replacing any older one: an expiry called off by a hold published the bucket again, and a
/// sync since may have listed its files again.
pub(super) fn take_expiry_ticket(ctx: &Context, bucket: &BucketId) {
    let mut coverage = ctx.memory().delta_coverage.lock().expect("delta coverage");
    coverage.last_ticket += 1;
    let ticket = coverage.last_ticket;
    coverage.expiries.insert(bucket.clone(), ticket);
}

/// The ticket of a bucket that is no longer published: the one it took when its expiry began
/// in this process, or a new one (after a restart, say).
fn expiry_ticket(ctx: &Context, bucket: &BucketId) -> u64 {
    let mut coverage = ctx.memory().delta_coverage.lock().expect("delta coverage");
    if let Some(ticket) = coverage.expiries.get(bucket) {
        return *ticket;
    }
    coverage.last_ticket += 1;
    let ticket = coverage.last_ticket;
    coverage.expiries.insert(bucket.clone(), ticket);
    ticket
}

/// Whether a successful sync of the expiring bucket's table has committed the removes of its
/// files since it took its ticket: its objects may be deleted without sending a reader of the
/// log's newest version to a missing file.
pub(super) fn expired_files_dropped(ctx: &Context, bucket: &BucketId) -> bool {
    let ticket = expiry_ticket(ctx, bucket);
    covered(ctx, &bucket.table, ticket)
}

/// Whether a successful sync has committed the removes of the files of every generation that
/// `published` (the bucket's published manifest) replaced; takes a ticket when it has none for
/// that manifest.
pub(super) fn replaced_files_dropped(ctx: &Context, bucket: &BucketId, published: &str) -> bool {
    let ticket = {
        let mut coverage = ctx.memory().delta_coverage.lock().expect("delta coverage");
        match coverage.erasures.get(bucket) {
            Some((ticket, manifest)) if manifest == published => *ticket,
            _ => {
                coverage.last_ticket += 1;
                let ticket = coverage.last_ticket;
                coverage.erasures.insert(bucket.clone(), (ticket, published.to_string()));
                ticket
            }
        }
    };
    covered(ctx, &bucket.table, ticket)
}

fn covered(ctx: &Context, table: &str, ticket: u64) -> bool {
    let coverage = ctx.memory().delta_coverage.lock().expect("delta coverage");
    coverage.covered.get(table).is_some_and(|covered| *covered >= ticket)
}

/// Whether an expiry or an erasure of `table` waits for a sync that has not run yet.
fn awaits_sync(ctx: &Context, table: &str) -> bool {
    let coverage = ctx.memory().delta_coverage.lock().expect("delta coverage");
    let covered = coverage.covered.get(table).copied().unwrap_or(0);
    coverage.expiries.iter().any(|(bucket, ticket)| bucket.table == table && *ticket > covered)
        || coverage.erasures.iter().any(|(bucket, (ticket, _))| bucket.table == table && *ticket > covered)
}

/// Forgets a bucket's expiry ticket once its expiry is over (finished, or called off).
pub(super) fn forget_expiry(ctx: &Context, bucket: &BucketId) {
    ctx.memory().delta_coverage.lock().expect("delta coverage").expiries.remove(bucket);
}

/// Forgets a bucket's erasure ticket once the replaced generations are deleted.
pub(super) fn forget_erasure(ctx: &Context, bucket: &BucketId) {
    ctx.memory().delta_coverage.lock().expect("delta coverage").erasures.remove(bucket);
}

/// Records the sync's outcome for `status`: the version and the last commit of a success, the
/// error of a failure (keeping the last success's figures).
async fn record(ctx: &Arc<Context>, table: &TablePolicy, result: &Result<DeltaSync>) -> Result<()> {
    let (store, id, now) = (ctx.store.clone(), table.id.clone(), ctx.clock.now());
    let outcome = result.as_ref().map(|r| (r.version, r.added + r.removed + r.repaired > 0)).map_err(|e| e.to_string());
    blocking(move || {
        let previous = store.delta_log_state(&id)?;
        let state = match outcome {
            Ok((version, committed)) => DeltaLogState {
                version,
                synced_at: now,
                last_commit_at: if committed { Some(now) } else { previous.and_then(|p| p.last_commit_at) },
                error: None,
            },
            Err(error) => DeltaLogState {
                error: Some(error),
                synced_at: now,
                ..previous.unwrap_or(DeltaLogState { version: 0, synced_at: now, last_commit_at: None, error: None })
            },
        };
        store.set_delta_log_state(&id, &state)
    })
    .await
}

/// What a table's syncs keep between them: this installation's files (`FileIndex`) and the
/// log as the last sync left it (`KeptLog`), which the next one brings up to date by reading
/// only the commits made since, not the whole log.
#[derive(Default)]
struct KeptSync {
    index: Option<FileIndex>,
    log: Option<KeptLog>,
}

/// The log as a sync left it: where it lives, its version then, the bytes of that version's
/// commit, and what the log says at that version. The next sync brings it up to date only when
/// the log at the same place still holds that commit: a log deleted and written anew, rolled
/// back, or moved with its target (the same name, another URL) is read whole instead.
struct KeptLog {
    location: String,
    version: u64,
    commit: bytes::Bytes,
    view: LogView,
}

/// What a sync needs of the log at one version: every file it lists (the path as delta-rs
/// decodes it, and its size) and this installation's application transaction version. Kept
/// from the commits themselves, a sync after one publication reads one commit and writes one,
/// where a delta-rs snapshot replays every file of the log after each commit (its cost grows
/// with the table). The whole log is read (by delta-rs) only when a sync starts without one,
/// when a commit changes the table's metadata or protocol, and for a checkpoint.
#[derive(Debug, Clone, Default, PartialEq)]
struct LogView {
    files: BTreeMap<String, i64>,
    app_version: i64,
    /// The table's metadata action at this version (JSON, as the log holds it): its schema
    /// says which declared columns the log lacks (`schema_change`).
    metadata: serde_json::Value,
}

impl LogView {
    /// The log read whole at `version`, or its newest: (version, view).
    async fn load(
        log_store: &LogStoreRef,
        app_id: &str,
        version: Option<u64>,
    ) -> deltalake::DeltaResult<(u64, LogView)> {
        let mut delta = DeltaTable::new(log_store.clone());
        match version {
            Some(version) => delta.load_version(version).await?,
            None => delta.load().await?,
        }
        let state = delta.snapshot()?;
        let files = state.log_data().into_iter().map(|file| (file.path().into_owned(), file.size())).collect();
        let app_version = state.transaction_version(log_store.as_ref(), app_id).await?.unwrap_or(0);
        let metadata = serde_json::to_value(state.metadata()).unwrap_or_default();
        Ok((state.version(), LogView { files, app_version, metadata }))
    }

    /// Applies one commit's actions, putting the paths they add or remove in `touched`; `false`
    /// when the commit changes what this view does not follow (the table's metadata or
    /// protocol) or cannot be read as actions: then the log is read whole.
    fn apply(&mut self, commit: &[u8], app_id: &str, touched: &mut BTreeSet<String>) -> bool {
        for line in commit.split(|b| *b == b'\n').filter(|line| !line.iter().all(u8::is_ascii_whitespace)) {
            match serde_json::from_slice::<Action>(line) {
                Ok(Action::Add(add)) => {
                    touched.insert(add.path.clone());
                    self.files.insert(add.path, add.size);
                }
                Ok(Action::Remove(remove)) => {
                    self.files.remove(&remove.path);
                    touched.insert(remove.path);
                }
                Ok(Action::Txn(txn)) if txn.app_id == app_id => self.app_version = txn.version,
                Ok(Action::Metadata(_) | Action::Protocol(_)) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        true
    }
}

/// Brings `log` up to the log's newest version by reading the commits since its own, putting
/// the paths they add or remove in `touched`; `false` when one of them needs the log read
/// whole (`LogView::apply`).
async fn catch_up(
    log_store: &LogStoreRef,
    log: &mut KeptLog,
    app_id: &str,
    touched: &mut BTreeSet<String>,
) -> deltalake::DeltaResult<bool> {
    while let Some(commit) = log_store.read_commit_entry(log.version + 1).await? {
        if !log.view.apply(&commit, app_id, touched) {
            return Ok(false);
        }
        log.version += 1;
        log.commit = commit;
    }
    Ok(true)
}

/// The log read whole, as a sync keeps it.
async fn load_log(log_store: &LogStoreRef, location: &str, app_id: &str) -> deltalake::DeltaResult<KeptLog> {
    let (version, view) = LogView::load(log_store, app_id, None).await?;
    let commit = log_store.read_commit_entry(version).await?.unwrap_or_default();
    Ok(KeptLog { location: location.to_string(), version, commit, view })
}

/// `kept_log`: the log as the last sync of this process left it (read whole when `None`);
/// left as this sync leaves it when it succeeds, `None` when it fails.
async fn sync_serialized(
    ctx: &Arc<Context>,
    table: &Arc<TablePolicy>,
    index: &FileIndex,
    kept_log: &mut Option<KeptLog>,
) -> Result<DeltaSync> {
    let store = table.backend.object_store().ok_or_else(|| {
        Error::InvalidInput(format!("table `{}`: its target is not an object store; it has no Delta log", table.id))
    })?;
    let root = keys::delta_table_root(&table.id);
    let log_store = log_store(store, table.backend.local_dir(), &root)?;
    let location = log_store.root_url().to_string();
    // A log this process synced, still holding the commit it left it at, exists: only a sync
    // without one makes sure (a listing of the log's folder, which grows with its history).
    let kept = match kept_log.take() {
        Some(kept)
            if kept.location == location
                && log_store.read_commit_entry(kept.version).await.ok().flatten().as_ref() == Some(&kept.commit) =>
        {
            Some(kept)
        }
        _ => None,
    };
    // The paths where the log and the index can differ: after a sync that left them agreeing,
    // only those of the buckets whose publication changed since (`FileIndex::touched`) and
    // those the log's commits since touched (another writer's, a reader's DELETE or OPTIMIZE). Every path
    // (`None`) when either is read whole.
    let mut scope = kept.as_ref().and(index.touched.clone());
    let created = match kept {
        Some(_) => false,
        None => create_if_absent(&log_store, table, ctx.clock.now()).await?,
    };
    let mut report =
        DeltaSync { table: table.id.clone(), created, buckets_read: index.buckets_read, ..Default::default() };
    let app_id = format!("frostline-{}", ctx.installation_id);
    let read_log = |e| unavailable(&table.id, "cannot read its Delta log", e);
    let mut attempt = 0;
    // Only the commits since the last sync are read, when the log still holds the commit the
    // last sync left it at; any other log is read whole.
    let mut log = match kept {
        Some(kept) => kept,
        None => load_log(&log_store, &location, &app_id).await.map_err(read_log)?,
    };
    loop {
        attempt += 1;
        let mut touched = BTreeSet::new();
        if catch_up(&log_store, &mut log, &app_id, &mut touched).await.map_err(read_log)? {
            if let Some(scope) = &mut scope {
                scope.extend(touched);
            }
        } else {
            log = load_log(&log_store, &location, &app_id).await.map_err(read_log)?;
            scope = None;
        }
        let now_ms = ctx.clock.now().div_euclid(1_000);
        // A declared column the log holds under another type stops the sync; columns the log
        // lacks are added first, in a commit of their own, so that the files added next, which
        // carry them, are read with them.
        let change = schema_change(&log.view.metadata, table.columns()).map_err(|(name, logged)| {
            Error::Conflict(format!(
                "table `{}`: its Delta log at {location} holds column `{name}` as `{logged}`, but this policy \
                 declares it {} (another installation on the shared table declares it otherwise); no file is \
                 added until the declarations agree: a column never changes type, so declare the same type on \
                 every installation, or archive the new shape under a new table id",
                table.id,
                table.columns().iter().find(|c| c.name == name).map_or("", |c| c.kind.name())
            ))
        })?;
        if let Some((metadata, added)) = change {
            let commit = metadata_commit(metadata, &added, now_ms);
            let version = log.version + 1;
            match log_store
                .write_commit_entry(version, CommitOrBytes::LogBytes(commit.into()), uuid::Uuid::new_v4())
                .await
            {
                Ok(()) => {
                    tracing::info!(table = %table.id, version, columns = ?added, "Delta log schema: columns added");
                    report.columns_added.extend(added);
                }
                Err(e) if attempt < DELTA_COMMIT_ATTEMPTS_MAX => {
                    report.retried_commits += 1;
                    tracing::debug!(table = %table.id, attempt, error = %e, "Delta schema commit lost a race; reading the log again");
                    lost_race_pause(ctx, attempt).await;
                }
                Err(e) => return Err(unavailable(&table.id, "cannot add its declared columns to its Delta log", e)),
            }
            // A metadata commit is not followed commit by commit (`LogView::apply`).
            log = load_log(&log_store, &location, &app_id).await.map_err(read_log)?;
            scope = None;
            continue;
        }
        let planned = plan(&log.view, index, scope.as_ref(), now_ms);
        report.files_compared += planned.compared;
        if cfg!(debug_assertions) && scope.is_some() {
            // A debug build checks the plan over what changed against one over every file, so
            // every test and long run with a Delta table checks the scope.
            let whole = plan(&log.view, index, None, now_ms);
            if planned.actions() != whole.actions() {
                return Err(Error::Internal(format!(
                    "table `{}`: the Delta sync's plan over {} changed paths differs from one over every file: {:?} \
                     against {:?}",
                    table.id,
                    scope.as_ref().map_or(0, BTreeSet::len),
                    planned.actions(),
                    whole.actions()
                )));
            }
        }
        let Planned { repairs, removes, rewrites, adds, .. } = planned;
        if repairs.is_empty() && removes.is_empty() && adds.is_empty() && rewrites.is_empty() {
            report.version = log.version;
            check_view(&log_store, &log, &app_id, &table.id).await?;
            *kept_log = Some(log);
            return Ok(report);
        }
        // Repairs, removes, rewrites and adds in separate commits, each the operation a reader
        // expects of it (a repair of the log, a delete, an update that replaces files, an
        // append); each carries the next application transaction version.
        let mut outcome = Ok(());
        for (actions, operation) in [
            (repairs, DeltaOperation::FileSystemCheck {}),
            (removes, DeltaOperation::Delete { predicate: None }),
            (rewrites, DeltaOperation::Update { predicate: None }),
            (adds, DeltaOperation::Write { mode: SaveMode::Append, partition_by: None, predicate: None }),
        ] {
            if actions.is_empty() {
                continue;
            }
            // Files added, removed and repaired (a remove and an add each) by the commit.
            let (added, removed, repaired) = match operation {
                DeltaOperation::FileSystemCheck {} => (0, 0, actions.len() / 2),
                DeltaOperation::Delete { .. } => (0, actions.len(), 0),
                DeltaOperation::Update { .. } => {
                    let removed = actions.iter().filter(|a| matches!(a, Action::Remove(_))).count();
                    (actions.len() - removed, removed, 0)
                }
                _ => (actions.len(), 0, 0),
            };
            let transaction = Transaction::new_with_last_update(&app_id, log.view.app_version + 1, Some(now_ms));
            crate::failpoints::hit("before_delta_commit")?;
            // Written as delta-rs writes a commit (commit info, the actions, the application
            // transaction), created only if the version is free: a lost race is resolved here,
            // by reading the log again, never by rebasing a commit whose first attempt may
            // have landed.
            let commit = CommitData::new(actions, operation, HashMap::new(), vec![transaction])
                .get_bytes()
                .map_err(|e| Error::Internal(format!("table `{}`: cannot encode a Delta commit: {e}", table.id)))?;
            let version = log.version + 1;
            let written = log_store
                .write_commit_entry(version, CommitOrBytes::LogBytes(commit.clone()), uuid::Uuid::new_v4())
                .await;
            match written {
                Ok(()) => {
                    if !log.view.apply(&commit, &app_id, &mut BTreeSet::new()) {
                        return Err(Error::Internal(format!(
                            "table `{}`: a Delta commit of its own unreadable",
                            table.id
                        )));
                    }
                    log.version = version;
                    log.commit = commit;
                    report.version = version;
                    report.added += added;
                    report.removed += removed;
                    report.repaired += repaired;
                    tracing::info!(table = %table.id, version, removed, added, repaired, "Delta log commit");
                    crate::failpoints::hit("after_delta_commit")?;
                    if (version + 1).is_multiple_of(u64::from(DELTA_CHECKPOINT_INTERVAL)) {
                        checkpoint(&log_store, version)
                            .await
                            .map_err(|e| unavailable(&table.id, "cannot write a checkpoint of its Delta log", e))?;
                    }
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        match outcome {
            Ok(()) => {
                check_view(&log_store, &log, &app_id, &table.id).await?;
                *kept_log = Some(log);
                return Ok(report);
            }
            Err(e) if attempt < DELTA_COMMIT_ATTEMPTS_MAX => {
                report.retried_commits += 1;
                tracing::debug!(table = %table.id, attempt, error = %e, "Delta commit lost a race; reading the log again");
                lost_race_pause(ctx, attempt).await;
            }
            Err(e) => return Err(unavailable(&table.id, "cannot commit to its Delta log", e)),
        }
    }
}

/// A pause before a commit that lost a race is tried again, longer with each attempt and
/// jittered, so installations syncing one table at once do not collide again in step.
async fn lost_race_pause(ctx: &Context, attempt: u32) {
    let pause = 10 * u64::from(attempt) + ctx.random_u64() % 20;
    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
}

/// The commits a sync makes, each empty when nothing of its kind is due.
struct Planned {
    /// Files the log lists only under the path earlier builds wrote, listed again under the
    /// right one (a remove and an add each, no data change).
    repairs: Vec<Action>,
    /// Files of archives no longer published (expired).
    removes: Vec<Action>,
    /// Files of generations a newer one replaced, removed with the newer one's files added.
    rewrites: Vec<Action>,
    /// Files of archives newly published.
    adds: Vec<Action>,
    /// Log entries and published files compared to make it (`DeltaSync::files_compared`).
    compared: usize,
}

impl Planned {
    /// The commits' actions as JSON values (whose objects compare whatever their keys' order,
    /// unlike the partition values' hash maps), to compare two plans.
    fn actions(&self) -> Vec<serde_json::Value> {
        [&self.repairs, &self.removes, &self.rewrites, &self.adds]
            .iter()
            .flat_map(|actions| actions.iter())
            .map(|action| serde_json::to_value(action).unwrap_or_default())
            .collect()
    }
}

/// The difference between this installation's published files (`index`) and the files the log
/// lists of those this database recorded (`view`), as commits, over the paths in `scope` (and
/// their spellings by earlier builds, `doubly_encoded`) or over every file when it is `None`.
/// A sync after one publication on a table of 100,000 files compares that publication's files,
/// not the table's.
fn plan(view: &LogView, index: &FileIndex, scope: Option<&BTreeSet<String>>, now_ms: i64) -> Planned {
    let Some(scope) = scope else { return compare(&view.files, &index.wanted, &index.known, index, now_ms) };
    let paths: BTreeSet<String> =
        scope.iter().flat_map(|path| [path.clone(), doubly_encoded(path), path.replace("%25", "%")]).collect();
    let files = paths.iter().filter_map(|p| view.files.get_key_value(p)).map(|(p, size)| (p.clone(), *size)).collect();
    let wanted =
        paths.iter().filter_map(|p| index.wanted.get_key_value(p)).map(|(p, f)| (p.clone(), f.clone())).collect();
    let known =
        paths.iter().filter_map(|p| index.known.get_key_value(p)).map(|(p, k)| (p.clone(), k.clone())).collect();
    compare(&files, &wanted, &known, index, now_ms)
}

/// The difference between the published files `wanted` and the log's files `listed` that are
/// `known` (recorded by this database), as commits; `index` says which buckets are published.
/// The lists are walked once, in the order of their paths (a merge of sorted maps), without a
/// lookup per file.
fn compare(
    listed: &BTreeMap<String, i64>,
    wanted: &BTreeMap<String, PublishedFile>,
    known: &KnownFiles,
    index: &FileIndex,
    now_ms: i64,
) -> Planned {
    let compared = listed.len() + wanted.len();
    // The files the log lists that this database recorded: another installation's, or another
    // copy's of this one, are never its to remove, whatever folder they lie in.
    let mut present: Vec<(&str, i64)> = Vec::new();
    let mut known_paths = known.keys().peekable();
    for (path, size) in listed {
        while known_paths.next_if(|k| k.as_str() < path.as_str()).is_some() {}
        if known_paths.peek().is_some_and(|k| *k == path) || misencoded_known(known, path) {
            present.push((path, *size));
        }
    }
    // Files listed and not wanted, and files wanted and not listed, by one merge.
    let mut listed_only: BTreeMap<&str, i64> = BTreeMap::new();
    let mut wanted_only: Vec<(&str, &PublishedFile)> = Vec::new();
    let mut listed = present.iter().peekable();
    for (path, file) in wanted {
        while let Some((listed_path, size)) = listed.next_if(|(p, _)| *p < path.as_str()) {
            listed_only.insert(listed_path, *size);
        }
        if listed.next_if(|(p, _)| *p == path.as_str()).is_none() {
            wanted_only.push((path, file));
        }
    }
    listed_only.extend(listed.map(|(path, size)| (*path, *size)));
    // Published files the log lists only under the path earlier builds wrote: each entry is
    // replaced (the same file, no data change), not removed and added again.
    let mut repairs = Vec::new();
    let mut adding: Vec<(&str, &PublishedFile)> = Vec::new();
    for (path, file) in wanted_only {
        let old = doubly_encoded(path);
        match listed_only.remove(old.as_str()) {
            Some(size) if old != path => {
                repairs.push(Action::Remove(remove_action(&old, size, now_ms, false)));
                repairs.push(Action::Add(add_action(path, file, false)));
            }
            _ => adding.push((path, file)),
        }
    }
    // A file of a generation that a newer one replaced is removed in the commit that adds the
    // newer one's files (a reader sees the bucket's rows before or after, never without them);
    // the files of expired archives in a delete of their own.
    let (mut rewrites, mut removes) = (Vec::new(), Vec::new());
    let mut rewritten_buckets: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (path, size) in listed_only {
        let action = Action::Remove(remove_action(path, size, now_ms, true));
        match known.get(path) {
            Some((partition, bucket)) if index.publishes(partition, bucket) => {
                rewritten_buckets.insert((partition.as_str(), bucket.as_str()));
                rewrites.push(action);
            }
            _ => removes.push(action),
        }
    }
    let mut adds = Vec::new();
    for (path, file) in adding {
        let action = Action::Add(add_action(path, file, true));
        if rewritten_buckets.contains(&(file.partition_key.as_str(), file.bucket_key.as_str())) {
            rewrites.push(action);
        } else {
            adds.push(action);
        }
    }
    Planned { repairs, removes, rewrites, adds, compared }
}

/// Whether `path`, which this database did not record, is one of its files as an earlier
/// build wrote it to the log (`doubly_encoded`).
fn misencoded_known(known: &KnownFiles, path: &str) -> bool {
    if !path.contains("%25") {
        return false;
    }
    let key = path.replace("%25", "%");
    known.contains_key(&key) && doubly_encoded(&key) == path
}

/// A debug build checks the view a sync keeps against the log read whole by delta-rs at the
/// same version, so every test and long run with a Delta table checks it.
async fn check_view(log_store: &LogStoreRef, log: &KeptLog, app_id: &str, table: &str) -> Result<()> {
    if cfg!(debug_assertions) {
        let (_, whole) = LogView::load(log_store, app_id, Some(log.version))
            .await
            .map_err(|e| unavailable(table, "cannot read its Delta log", e))?;
        if whole != log.view {
            return Err(Error::Internal(format!(
                "table `{table}`: the Delta log view kept from commits differs at version {} from the log read whole \
                 ({} files against {}; application version {} against {})",
                log.version,
                log.view.files.len(),
                whole.files.len(),
                log.view.app_version,
                whole.app_version
            )));
        }
    }
    Ok(())
}

/// Writes the checkpoint of `version` (the log read whole at it, once every
/// `DELTA_CHECKPOINT_INTERVAL` commits, as delta-rs's own commits do) and deletes the log
/// entries older than the table's log retention that a checkpoint makes unneeded.
async fn checkpoint(log_store: &LogStoreRef, version: u64) -> deltalake::DeltaResult<()> {
    let mut delta = DeltaTable::new(log_store.clone());
    delta.load_version(version).await?;
    deltalake::checkpoints::create_checkpoint(&delta, None).await?;
    if delta.snapshot()?.table_config().enable_expired_log_cleanup.unwrap_or(true) {
        deltalake::checkpoints::cleanup_metadata(&delta, None).await?;
    }
    Ok(())
}

fn unavailable(table: &str, what: &str, error: impl std::fmt::Display) -> Error {
    Error::StorageUnavailable(format!("table `{table}`: {what}: {error}; the next pass tries again"))
}

/// One file of a published bucket, as the log should hold it.
#[derive(Debug, Clone, PartialEq)]
struct PublishedFile {
    segment: SegmentInfo,
    installation: String,
    bucket_key: String,
    partition_key: String,
    created_at: Micros,
}

/// Every file this installation answers for in a table's log, by path relative to the Delta
/// root: the partition key and bucket key it holds rows of.
type KnownFiles = BTreeMap<String, (String, String)>;

/// This installation's files of a table's log as its store has them (`file_index`): the
/// published segments of `table` below the Delta root on the table's current target, by path
/// relative to the root (`wanted`); and every file this installation answers for in the log
/// (`known`): the segments of every manifest its database ever recorded there (published,
/// adopted from a lost installation, or since expired), whose entries it removes once they are
/// no longer published. Nothing else in the log is its own, not even a file below its own
/// installation's folder that a copy of its data directory wrote (ARCHITECTURE.md, "The
/// ownership rule").
///
/// Made whole by a process's first sync (and every `FULL_INDEX_EVERY` syncs, and after a
/// failed one), from every manifest of the store; then kept up to date from the store's list
/// of the buckets whose publication changed (`Store::publication_changes`), so a sync reads
/// what changed, not the table's history. A debug build checks every update against a whole
/// reading.
#[derive(Debug, Clone, PartialEq)]
struct FileIndex {
    target: String,
    wanted: BTreeMap<String, PublishedFile>,
    known: KnownFiles,
    /// The paths each bucket put in `wanted` and `known`, so an update can take them out.
    by_bucket: HashMap<BucketId, (Vec<String>, Vec<String>)>,
    /// Files in `wanted` of each (partition key, bucket key): the buckets that are published.
    published: HashMap<(String, String), usize>,
    /// The paths the last update put in or took out (`None` when the index was made whole):
    /// where the index can differ from the log after a sync that left them agreeing.
    touched: Option<BTreeSet<String>>,
    /// The last publication change taken in.
    changes_read: u64,
    /// Syncs since the index was made whole.
    updates: u32,
    /// Buckets read to make or update it, in the last `file_index`.
    buckets_read: usize,
    /// Buckets read then whose replaced archives were released, with more than one manifest
    /// recorded: (bucket, generation of its newest manifest). Once a sync with this index
    /// has committed, their older copies go (`Store::drop_replaced_copies_after_sync`).
    replaced: Vec<(BucketId, u64)>,
}

/// A kept index is made whole again after this many updates: a change that reached the store
/// some other way than `record_step` is taken in within that many syncs.
const FULL_INDEX_EVERY: u32 = 100;

impl FileIndex {
    fn new(target: String, changes_read: u64) -> FileIndex {
        FileIndex {
            target,
            wanted: BTreeMap::new(),
            known: BTreeMap::new(),
            by_bucket: HashMap::new(),
            published: HashMap::new(),
            touched: None,
            changes_read,
            updates: 0,
            buckets_read: 0,
            replaced: Vec::new(),
        }
    }

    /// Notes bucket `id` for `replaced` when its cleanup released the archives its newest
    /// manifest replaced and their copies are still recorded.
    fn note_replaced(&mut self, id: &BucketId, meta: Option<&BucketMeta>, manifests: &[Manifest]) {
        if manifests.len() > 1
            && meta.is_some_and(BucketMeta::replaced_archives_released)
            && let Some(newest) = manifests.last()
        {
            self.replaced.push((id.clone(), newest.generation));
        }
    }

    /// Puts bucket `id`'s files in, as its manifests say now (replacing what it had).
    fn set_bucket(&mut self, root: &str, id: &BucketId, manifests: &[Manifest], published: Option<&Manifest>) {
        if let Some((wanted, known)) = self.by_bucket.remove(id) {
            for path in wanted {
                if let Some(file) = self.wanted.remove(&path) {
                    self.uncount(file);
                }
                self.touch(path);
            }
            for path in known {
                self.known.remove(&path);
                self.touch(path);
            }
        }
        let (mut wanted, mut known) = (Vec::new(), Vec::new());
        let target = self.target.clone();
        for manifest in manifests.iter().filter(|m| m.target == target) {
            for path in manifest.segments.iter().filter_map(|s| s.key.strip_prefix(root)) {
                self.known.insert(path.to_string(), (manifest.partition_key.clone(), manifest.bucket.key.clone()));
                self.touch(path.to_string());
                known.push(path.to_string());
            }
        }
        // Archived on another target, whose log is not this one: nothing of it is wanted here.
        if let Some(manifest) = published.filter(|m| m.target == self.target) {
            for segment in &manifest.segments {
                let Some(relative) = segment.key.strip_prefix(root) else { continue };
                let Some(writer) = relative.strip_prefix("installation=").and_then(|r| r.split('/').next()) else {
                    continue;
                };
                self.touch(relative.to_string());
                let replaced = self.wanted.insert(
                    relative.to_string(),
                    PublishedFile {
                        // Installation ids are hex digits: their folder names are the ids.
                        installation: writer.to_string(),
                        bucket_key: id.bucket_key.clone(),
                        partition_key: manifest.partition_key.clone(),
                        created_at: manifest.created_at,
                        segment: segment.clone(),
                    },
                );
                // A path listed twice is counted once, as taking the bucket out uncounts it once.
                if let Some(earlier) = replaced {
                    self.uncount(earlier);
                }
                *self.published.entry((manifest.partition_key.clone(), id.bucket_key.clone())).or_default() += 1;
                wanted.push(relative.to_string());
            }
        }
        if !wanted.is_empty() || !known.is_empty() {
            self.by_bucket.insert(id.clone(), (wanted, known));
        }
    }

    /// Takes `file` out of the count of its bucket's published files.
    fn uncount(&mut self, file: PublishedFile) {
        let published = (file.partition_key, file.bucket_key);
        if let Some(files) = self.published.get_mut(&published) {
            *files -= 1;
            if *files == 0 {
                self.published.remove(&published);
            }
        }
    }

    fn touch(&mut self, path: String) {
        if let Some(touched) = &mut self.touched {
            touched.insert(path);
        }
    }

    /// Whether the bucket (partition key, bucket key) has a published file in the index.
    fn publishes(&self, partition: &str, bucket: &str) -> bool {
        self.published.contains_key(&(partition.to_string(), bucket.to_string()))
    }
}

/// The table's `FileIndex`: `kept` brought up to date, or a whole one when there is none (or it
/// is of another target, or due to be made whole again).
async fn file_index(ctx: &Arc<Context>, table: &Arc<TablePolicy>, kept: Option<FileIndex>) -> Result<FileIndex> {
    let (store, id, target) = (ctx.store.clone(), table.id.clone(), table.backend.target().to_string());
    let root = keys::delta_table_root(&table.id);
    blocking(move || {
        let kept = kept.filter(|index| index.target == target && index.updates < FULL_INDEX_EVERY);
        let Some(mut index) = kept else { return whole_index(&store, &id, &target, &root) };
        let (changed, through) = store.publication_changes(&id, index.changes_read)?;
        index.touched = Some(BTreeSet::new());
        index.replaced.clear();
        for (bucket, recorded) in &changed {
            index.set_bucket(&root, bucket, &recorded.manifests, recorded.published());
            index.note_replaced(bucket, recorded.meta.as_ref(), &recorded.manifests);
        }
        index.changes_read = through;
        index.updates += 1;
        index.buckets_read = changed.len();
        if cfg!(debug_assertions) {
            let whole = whole_index(&store, &id, &target, &root)?;
            // Compared only when no publication changed between the two readings (a hold
            // calling an expiry off, an adoption through the API): the update saw the store
            // as it was before.
            if whole.changes_read == through && (&whole.wanted, &whole.known, &whole.published) != (&index.wanted, &index.known, &index.published) {
                return Err(Error::Internal(format!(
                    "table `{id}`: the Delta sync's index, kept up to date from {} changed buckets, differs from one                      made from every manifest: {} and {} wanted files, {} and {} known",
                    changed.len(),
                    index.wanted.len(),
                    whole.wanted.len(),
                    index.known.len(),
                    whole.known.len()
                )));
            }
        }
        Ok(index)
    })
    .await
}

/// A `FileIndex` made from every manifest of the store. The changes are counted first, so a
/// change made while it reads is read again by the next update (which is harmless: an update
/// puts a bucket's files in as they are).
fn whole_index(store: &crate::store::Store, id: &str, target: &str, root: &str) -> Result<FileIndex> {
    let mut index = FileIndex::new(target.to_string(), store.publication_changes_seq()?);
    let mut manifests: BTreeMap<BucketId, Vec<Manifest>> = BTreeMap::new();
    store.snapshot()?.visit_table_manifests(id, |bucket, manifest| {
        manifests.entry(bucket).or_default().push(manifest);
        Ok(())
    })?;
    let published: HashMap<BucketId, (BucketMeta, Manifest)> =
        store.published(id)?.into_iter().map(|(meta, manifest)| (meta.id.clone(), (meta, manifest))).collect();
    let buckets: BTreeSet<&BucketId> = manifests.keys().chain(published.keys()).collect();
    index.buckets_read = buckets.len();
    for bucket in buckets {
        let recorded = manifests.get(bucket).map(Vec::as_slice).unwrap_or_default();
        let published = published.get(bucket);
        index.set_bucket(root, bucket, recorded, published.map(|(_, manifest)| manifest));
        index.note_replaced(bucket, published.map(|(meta, _)| meta), recorded);
    }
    Ok(index)
}

/// A log store over the target's own object store (the same client, credentials and limits
/// as every other request of the target), rooted at `root`. A local directory is the
/// exception: delta-rs sorts listings and opens files by absolute path only for `file://`
/// tables, so it gets a local file system of its own over the same directory.
fn log_store(store: Arc<dyn ObjectStore>, local_dir: Option<std::path::PathBuf>, root: &str) -> Result<LogStoreRef> {
    if let Some(dir) = local_dir {
        let table_dir = dir.join(root);
        std::fs::create_dir_all(&table_dir).map_err(|e| Error::io(&table_dir, e))?;
        let location = url::Url::from_directory_path(&table_dir)
            .map_err(|()| Error::Internal(format!("`{}` is no absolute directory", table_dir.display())))?;
        let prefixed = object_store::local::LocalFileSystem::new_with_prefix(&table_dir)
            .map_err(|e| unavailable(root, "cannot open its Delta table's folder", e))?;
        let root_store: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
        return Ok(default_logstore(Arc::new(prefixed), root_store, &location, &StorageConfig::default()));
    }
    let prefixed: Arc<dyn ObjectStore> = Arc::new(PrefixStore::new(store.clone(), root.trim_end_matches('/')));
    // delta-rs maps the URL's path onto the root store, percent-decoded: a `%` of a key is
    // written `%25`. The scheme names no store; every request goes to `store`.
    let location = url::Url::parse(&format!("memory:///{}", url_path(root)))
        .map_err(|e| Error::Internal(format!("Delta table root `{root}` is no URL path: {e}")))?;
    Ok(default_logstore(prefixed, store, &location, &StorageConfig::default()))
}

/// A key as a URL path: frostline's keys hold only `A-Z a-z 0-9 - _ . : % ~ = /`, of which
/// only `%` needs encoding.
fn url_path(key: &str) -> String {
    key.replace('%', "%25")
}

/// The path of `key` (relative to the table root) as delta-rs decodes it from a log written
/// by builds before the encoding was fixed: they encoded the key as a URL path before delta-rs
/// encoded it again, so each `%` was written `%2525`, and reads back `%25`.
fn doubly_encoded(key: &str) -> String {
    url_path(key)
}

/// Writes the table's first version unless it exists: protocol, schema and partition columns,
/// created conditionally, so that engines creating the table at once agree on one.
async fn create_if_absent(log_store: &LogStoreRef, table: &TablePolicy, now: Micros) -> Result<bool> {
    let (id, table) = (table.id.as_str(), table);
    let exists = log_store
        .get_latest_version(0)
        .await
        .map(|_| true)
        .or_else(|e| match e {
            deltalake::DeltaTableError::InvalidVersion(_) | deltalake::DeltaTableError::NotATable(_) => Ok(false),
            other => Err(other),
        })
        .map_err(|e| unavailable(id, "cannot read its Delta log", e))?;
    if exists {
        return Ok(false);
    }
    let bytes = first_version(id, table.columns(), now);
    match log_store.write_commit_entry(0, CommitOrBytes::LogBytes(bytes.into()), uuid::Uuid::new_v4()).await {
        Ok(()) => {
            tracing::info!(table = id, "Delta table created");
            Ok(true)
        }
        Err(deltalake::kernel::transaction::TransactionError::VersionAlreadyExists(_)) => Ok(false),
        Err(e) => Err(unavailable(id, "cannot create its Delta table", e)),
    }
}

/// The fields of a Delta schema: frostline's columns, the table's typed columns (nullable:
/// older files hold none) and the partition columns of the layout.
fn schema_fields(columns: &[ColumnSpec]) -> Vec<serde_json::Value> {
    let mut fields = vec![
        schema_field("partition_key", "string", false),
        schema_field("event_time", "timestamp", false),
        schema_field("sort_key", "string", false),
        schema_field("tenant", "string", true),
        schema_field("kind", "string", true),
        schema_field("body", "string", false),
    ];
    fields.extend(columns.iter().map(typed_field));
    fields.extend(DELTA_PARTITION_COLUMNS.iter().map(|name| schema_field(name, "string", true)));
    fields
}

fn schema_field(name: &str, kind: &str, nullable: bool) -> serde_json::Value {
    serde_json::json!({"name": name, "type": kind, "nullable": nullable, "metadata": {}})
}

/// A declared column's field: nullable whatever its declaration, since older files hold none.
fn typed_field(column: &ColumnSpec) -> serde_json::Value {
    schema_field(&column.name, delta_type(column.kind), true)
}

/// The Delta primitive type of a declared column's type.
fn delta_type(kind: ColumnType) -> &'static str {
    match kind {
        ColumnType::String => "string",
        ColumnType::Int64 => "long",
        ColumnType::Float64 => "double",
        ColumnType::Bool => "boolean",
        ColumnType::Timestamp => "timestamp",
    }
}

/// The first version of a table's log, as the Delta protocol writes it: commit info,
/// protocol (reader 1, writer 2), metadata with the schema of frostline's Parquet segments
/// (with the table's typed `columns`) and the partition columns of the layout.
fn first_version(table: &str, columns: &[ColumnSpec], now: Micros) -> Vec<u8> {
    let schema = serde_json::json!({"type": "struct", "fields": schema_fields(columns)});
    let now_ms = now.div_euclid(1_000);
    let lines = [
        serde_json::json!({"commitInfo": {
            "timestamp": now_ms,
            "operation": "CREATE TABLE",
            "operationParameters": {"mode": "ErrorIfExists"},
            "clientVersion": format!("frostline-{}", env!("CARGO_PKG_VERSION")),
        }}),
        serde_json::json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
        serde_json::json!({"metaData": {
            "id": uuid::Uuid::new_v4().to_string(),
            "name": table,
            "description": "frostline archive: one file per archived segment; see frostline's docs/FLEET.md",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema.to_string(),
            "partitionColumns": DELTA_PARTITION_COLUMNS,
            "configuration": {"delta.checkpointInterval": DELTA_CHECKPOINT_INTERVAL.to_string()},
            "createdTime": now_ms,
        }}),
    ];
    lines.iter().map(|line| format!("{line}\n")).collect::<String>().into_bytes()
}

/// The log's metadata with declared columns added, and their names (`schema_change`).
type EvolvedSchema = (serde_json::Value, Vec<String>);

/// What the log's schema needs for the declared `columns`: nothing (`Ok(None)`); the columns
/// it lacks, added nullable at the end of its fields (`Ok(Some((metadata, their names)))`); or
/// nothing it can take (`Err((name, the log's type))`), a declared column the log holds under
/// another type: another installation on the shared table declared it so, and files with this
/// declaration's values would contradict the schema readers apply to every file. A column is
/// only ever added: one the log has and the table no longer declares stays (another
/// installation, or an older policy, may still write it), so installations never undo each
/// other.
fn schema_change(
    metadata: &serde_json::Value,
    columns: &[ColumnSpec],
) -> std::result::Result<Option<EvolvedSchema>, (String, String)> {
    let Some(mut schema) = (!columns.is_empty())
        .then(|| metadata.get("schemaString")?.as_str())
        .flatten()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
    else {
        return Ok(None);
    };
    let Some(fields) = schema.get_mut("fields").and_then(|f| f.as_array_mut()) else { return Ok(None) };
    let mut missing: Vec<&ColumnSpec> = Vec::new();
    for column in columns {
        let logged = fields.iter().find(|f| f.get("name").and_then(|n| n.as_str()) == Some(column.name.as_str()));
        match logged.map(|f| f.get("type").and_then(|t| t.as_str()).unwrap_or_default()) {
            None => missing.push(column),
            Some(kind) if kind == delta_type(column.kind) => {}
            Some(kind) => return Err((column.name.clone(), kind.to_string())),
        }
    }
    if missing.is_empty() {
        return Ok(None);
    }
    fields.extend(missing.iter().map(|c| typed_field(c)));
    let mut metadata = metadata.clone();
    metadata["schemaString"] = serde_json::Value::String(schema.to_string());
    Ok(Some((metadata, missing.iter().map(|c| c.name.clone()).collect())))
}

/// A commit that changes the table's metadata only (`schema_change`), as Delta's `ADD
/// COLUMNS` writes it.
fn metadata_commit(metadata: serde_json::Value, added: &[String], now_ms: i64) -> Vec<u8> {
    let lines = [
        serde_json::json!({"commitInfo": {
            "timestamp": now_ms,
            "operation": "ADD COLUMNS",
            "operationParameters": {"columns": serde_json::to_string(added).unwrap_or_default()},
            "clientVersion": format!("frostline-{}", env!("CARGO_PKG_VERSION")),
        }}),
        serde_json::json!({"metaData": metadata}),
    ];
    lines.iter().map(|line| format!("{line}\n")).collect::<String>().into_bytes()
}

fn partition_values(file: &PublishedFile) -> HashMap<String, Option<String>> {
    let value = |v: &str| (!v.is_empty()).then(|| v.to_string());
    HashMap::from([
        ("installation".to_string(), value(&file.installation)),
        ("bucket".to_string(), value(&file.bucket_key)),
        ("partition".to_string(), value(&file.partition_key)),
    ])
}

/// The add action of `file`, whose key relative to the table root is `path`: delta-rs
/// percent-encodes the path once when it writes the action, as the protocol says.
fn add_action(path: &str, file: &PublishedFile, data_change: bool) -> Add {
    let segment = &file.segment;
    // Times to the millisecond, the minimum rounded down and the maximum up, so a reader that
    // skips files by these bounds never skips a row.
    let min = segment.min_event_time.div_euclid(1_000) * 1_000;
    let max = (segment.max_event_time + 999).div_euclid(1_000) * 1_000;
    let (mut min_values, mut max_values, mut null_count) =
        (serde_json::Map::new(), serde_json::Map::new(), serde_json::Map::new());
    min_values.insert("event_time".into(), stats_time(min).into());
    max_values.insert("event_time".into(), stats_time(max).into());
    // Every column's null count, where it is known: a reader that prunes by a column's bounds
    // without its null count can skip a file whose rows are null there.
    for never_null in ["partition_key", "event_time", "sort_key", "body"] {
        null_count.insert(never_null.into(), 0.into());
    }
    for column in &segment.columns {
        null_count.insert(column.name.clone(), column.nulls.into());
        let bound = |value: &Option<serde_json::Value>, round_up: bool| {
            let value = value.as_ref()?;
            Some(match column.kind {
                // Microseconds, written to the millisecond outward as `event_time` is.
                ColumnType::Timestamp => {
                    let micros = value.as_i64()?;
                    let ms = if round_up { (micros + 999).div_euclid(1_000) } else { micros.div_euclid(1_000) };
                    stats_time(ms * 1_000).into()
                }
                _ => value.clone(),
            })
        };
        if let (Some(low), Some(high)) = (bound(&column.min, false), bound(&column.max, true)) {
            min_values.insert(column.name.clone(), low);
            max_values.insert(column.name.clone(), high);
        }
    }
    let stats = serde_json::json!({
        "numRecords": segment.rows,
        "minValues": min_values,
        "maxValues": max_values,
        "nullCount": null_count,
    });
    Add {
        path: path.to_string(),
        partition_values: partition_values(file),
        size: segment.bytes as i64,
        modification_time: file.created_at.div_euclid(1_000),
        data_change,
        stats: Some(stats.to_string()),
        tags: None,
        deletion_vector: None,
        base_row_id: None,
        default_row_commit_version: None,
        clustering_provider: None,
    }
}

fn stats_time(micros: Micros) -> String {
    ::time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1_000)
        .ok()
        .and_then(|t| {
            t.format(::time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
            ))
            .ok()
        })
        .unwrap_or_default()
}

/// The remove action of the file the log lists as `path`, as delta-rs decoded it from the log
/// (it encodes it again when it writes the action, giving back the path the log holds).
fn remove_action(path: &str, size: i64, now_ms: i64, data_change: bool) -> Remove {
    Remove {
        path: path.to_string(),
        data_change,
        deletion_timestamp: Some(now_ms),
        extended_file_metadata: Some(false),
        partition_values: None,
        size: Some(size),
        tags: None,
        deletion_vector: None,
        base_row_id: None,
        default_row_commit_version: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A published file of two rows between `times` (min, max).
    fn published_file(times: (Micros, Micros), installation: &str, bucket: &str, partition: &str) -> PublishedFile {
        PublishedFile {
            segment: SegmentInfo {
                key: String::new(),
                sha256: String::new(),
                bytes: 10,
                rows: 2,
                min_event_time: times.0,
                max_event_time: times.1,
                summary: crate::model::rows::RowSummary { rows: 2, first: None, last: None, checksum: String::new() },
                columns: Vec::new(),
            },
            installation: installation.into(),
            bucket_key: bucket.into(),
            partition_key: partition.into(),
            created_at: 0,
        }
    }

    #[test]
    fn statistics_round_the_bounds_outwards_to_the_millisecond() {
        assert_eq!(stats_time(1_700_000_000_123_000), "2023-11-14T22:13:20.123Z");
        let file = published_file((1_700_000_000_123_456, 1_700_000_000_124_001), "i", "b", "");
        let add =
            add_action("installation=i/bucket=b/partition=__HIVE_DEFAULT_PARTITION__/seg-a%b.parquet", &file, true);
        let stats: serde_json::Value = serde_json::from_str(add.stats.as_deref().unwrap()).unwrap();
        assert_eq!(stats["minValues"]["event_time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(stats["maxValues"]["event_time"], "2023-11-14T22:13:20.125Z");
        assert_eq!(add.path, "installation=i/bucket=b/partition=__HIVE_DEFAULT_PARTITION__/seg-a%b.parquet");
        assert_eq!(add.partition_values["partition"], None, "an empty partition key is a null partition value");
    }

    #[test]
    fn a_files_statistics_bound_its_typed_columns_and_count_every_columns_nulls() {
        use crate::model::columns::ColumnStats;
        let mut file = published_file((0, 0), "i", "b", "p");
        let stats = |name: &str, kind, min: Option<serde_json::Value>, max: Option<serde_json::Value>, nulls| {
            ColumnStats { name: name.into(), kind, min, max, nulls }
        };
        file.segment.columns = vec![
            stats("tenant", ColumnType::String, None, None, 2),
            stats("carrier", ColumnType::String, Some("AA".into()), Some("UA".into()), 0),
            stats(
                "sched_dep",
                ColumnType::Timestamp,
                Some(1_700_000_000_123_456i64.into()),
                Some(1_700_000_000_124_001i64.into()),
                1,
            ),
            stats("long_text", ColumnType::String, None, None, 0),
        ];
        let add = add_action("a.parquet", &file, true);
        let stats: serde_json::Value = serde_json::from_str(add.stats.as_deref().unwrap()).unwrap();
        assert_eq!(stats["minValues"]["carrier"], "AA");
        assert_eq!(stats["maxValues"]["carrier"], "UA");
        // Times outward to the millisecond, as `event_time`.
        assert_eq!(stats["minValues"]["sched_dep"], "2023-11-14T22:13:20.123Z");
        assert_eq!(stats["maxValues"]["sched_dep"], "2023-11-14T22:13:20.125Z");
        // A column without bounds (all null, or strings too long to keep) has its null count only.
        assert!(stats["minValues"].get("tenant").is_none() && stats["maxValues"].get("long_text").is_none());
        let nulls = &stats["nullCount"];
        assert_eq!(
            (nulls["tenant"].as_u64(), nulls["sched_dep"].as_u64(), nulls["long_text"].as_u64()),
            (Some(2), Some(1), Some(0))
        );
        for never_null in ["partition_key", "event_time", "sort_key", "body"] {
            assert_eq!(nulls[never_null], 0, "{never_null}");
        }
    }

    #[test]
    fn a_log_gains_the_declared_columns_it_lacks_and_keeps_the_ones_it_has() {
        use crate::model::columns::ColumnSpec;
        let column = ColumnSpec::nullable;
        let first = String::from_utf8(first_version("t", &[column("carrier", ColumnType::String)], 0)).unwrap();
        let metadata = first
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find_map(|a| a.get("metaData").cloned())
            .unwrap();
        assert_eq!(schema_change(&metadata, &[column("carrier", ColumnType::String)]), Ok(None));
        assert_eq!(schema_change(&metadata, &[]), Ok(None), "a column the table no longer declares stays");
        let (evolved, added) =
            schema_change(&metadata, &[column("carrier", ColumnType::String), column("delay", ColumnType::Int64)])
                .unwrap()
                .unwrap();
        assert_eq!(added, ["delay"]);
        assert_eq!(evolved["id"], metadata["id"], "the same table");
        let schema: serde_json::Value = serde_json::from_str(evolved["schemaString"].as_str().unwrap()).unwrap();
        let names: Vec<&str> =
            schema["fields"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
        assert_eq!(&names[names.len() - 2..], ["partition", "delay"]);
        assert_eq!(schema["fields"].as_array().unwrap().last().unwrap()["type"], "long");
        // The same name under another type is no column to add: the sync refuses it.
        assert_eq!(
            schema_change(&metadata, &[column("delay", ColumnType::Int64), column("carrier", ColumnType::Int64)]),
            Err(("carrier".to_string(), "string".to_string()))
        );
        let commit = String::from_utf8(metadata_commit(evolved, &added, 0)).unwrap();
        let actions: Vec<Action> = commit.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(matches!(actions[..], [Action::CommitInfo(_), Action::Metadata(_)]), "{commit}");
    }

    /// The protocol's `path` is a URI: the key's `%` is written `%25`, once, by delta-rs's
    /// serializer; an action read back holds the key again.
    #[test]
    fn a_files_path_is_its_key_percent_encoded_once() {
        let file = published_file((0, 0), "00aa", "day:2024-03-01", "site-a/sensor-0");
        let key = "installation=00aa/bucket=day:2024-03-01/partition=site-a%2Fsensor-0/seg-00aa-00000-0123456789abcdef.parquet";
        let add = serde_json::to_value(Action::Add(add_action(key, &file, true))).unwrap();
        assert_eq!(add["add"]["path"], key.replace("%2F", "%252F"));
        assert_eq!(add["add"]["partitionValues"]["partition"], "site-a/sensor-0", "the real value, not the folder's");
        let read: Action = serde_json::from_value(add).unwrap();
        assert!(matches!(&read, Action::Add(add) if add.path == key), "{read:?}");
        let remove = serde_json::to_value(Action::Remove(remove_action(key, 10, 0, true))).unwrap();
        assert_eq!(remove["remove"]["path"], key.replace("%2F", "%252F"));
        // What earlier builds wrote, and how delta-rs reads it back: the path a sync replaces.
        assert_eq!(doubly_encoded(key), key.replace("%2F", "%252F"));
    }
}
