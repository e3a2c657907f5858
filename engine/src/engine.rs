//! The runtime that wires the adapters together: one hot store, one plugin host, the active
//! policy set, the clock and the settings. Applications append and query through it; the
//! coordinator runs passes against it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::clock::SharedClock;
use crate::error::{Error, Result};
use crate::model::{BucketDescriptor, BucketState, Record};
use crate::plugin::PluginHost;
use crate::policy::{PolicySet, TablePolicy};
use crate::settings::Settings;
use crate::store::fleet_key::FleetKey;
use crate::store::schema::{BucketId, BucketMeta, TableState};
use crate::store::{AppendBatch, AppendOutcome, PreparedRow, Store};

/// File name of the hot database inside the data directory.
pub const DATABASE_FILE: &str = "hot.redb";
/// Records per atomic append at most.
pub const APPEND_BATCH_RECORDS_MAX: usize = 10_000;

/// An open data directory and its policy set. Its parts are read through accessors and never
/// replaced from outside: work takes a `Context` (`Engine::context`), and every operation a
/// user can ask for goes through `ops`.
pub struct Engine {
    store: Store,
    host: PluginHost,
    clock: SharedClock,
    settings: Settings,
    data_dir: PathBuf,
    /// This data directory's installation id (see `storage::keys`): in every object key the
    /// engine writes, and the only keys its orphan sweep may delete.
    installation_id: String,
    /// How the policy directory is loaded, at open and on every reload.
    load_options: crate::policy::LoadOptions,
    policies: RwLock<Arc<PolicySet>>,
    last_reload: std::sync::Mutex<Option<crate::policy::ReloadOutcome>>,
    /// Held for the whole of a reload: two at once (the watcher's and the API's) would both
    /// build on the same active set, take the same generation, and run an archiver's load
    /// checks against its store together.
    reloading: std::sync::Mutex<()>,
    /// Reload attempts since start: accepted, refused (for metrics).
    reloads: [std::sync::atomic::AtomicU64; 2],
    /// This opening of the data directory: its epoch, its random source, what the archival
    /// remembers; shared with every `Context` taken from the engine.
    life: Arc<Life>,
}

/// What lasts as long as one opening of a data directory, shared by the engine and every
/// `Context` taken from it.
struct Life {
    /// The epoch of this life of the data directory (`storage::keys`): in every object key the
    /// engine writes, recorded in the store before the first of them (`Context::writer`).
    epoch: String,
    epoch_recorded: std::sync::atomic::AtomicBool,
    /// Every random choice the engine's behaviour depends on comes from here
    /// (`Settings::random_seed`, so a seeded simulation replays it). Names that must differ
    /// between processes and copies of a data directory even under one seed (the
    /// installation id, this epoch, temporary and probe keys) come from the OS instead.
    rng: std::sync::Mutex<rand::rngs::StdRng>,
    /// What the archival remembers between passes, this engine's own.
    memory: PassMemory,
    /// The fleet's key for shared erasure requests (`--share-erasures`), when they are shared.
    fleet_key: Option<FleetKey>,
}

/// The narrow context a pass, a query or a maintenance operation works with, taken once from
/// the engine (`Engine::context`): the store, the clock, the settings, one snapshot of the
/// policy set, the installation, and the engine's random source and archival memory. The
/// snapshot does not change while the context is used: a reload installs a new set for the
/// next context taken, and work in flight finishes under the set it started with.
pub struct Context {
    pub store: Store,
    pub clock: SharedClock,
    pub settings: Settings,
    pub policies: Arc<PolicySet>,
    pub data_dir: PathBuf,
    /// This data directory's installation id (see `storage::keys`).
    pub installation_id: String,
    life: Arc<Life>,
}

impl Context {
    /// The writer this life of the data directory puts in every object key it makes
    /// (`storage::keys::writer`). Its epoch is recorded durably in the store by the first call,
    /// before any key made with it can be uploaded, so this data directory (and a copy made of
    /// it later) knows the key as its own, and a copy made earlier knows it is not.
    pub fn writer(&self) -> Result<String> {
        use std::sync::atomic::Ordering;
        if !self.life.epoch_recorded.load(Ordering::Acquire) {
            self.store.record_epoch(self.life.epoch.clone(), self.clock.now())?;
            self.life.epoch_recorded.store(true, Ordering::Release);
        }
        Ok(crate::storage::keys::writer(&self.installation_id, &self.life.epoch))
    }

    /// A random number from the engine's source (`Settings::random_seed`).
    pub fn random_u64(&self) -> u64 {
        rand::Rng::random(&mut *self.life.rng.lock().expect("rng lock"))
    }

    /// What the archival remembers between passes.
    pub(crate) fn memory(&self) -> &PassMemory {
        &self.life.memory
    }

    /// The fleet's key when this engine shares erasure requests (`archive::fleet_erase`).
    pub fn fleet_key(&self) -> Option<&FleetKey> {
        self.life.fleet_key.as_ref()
    }
}

/// Which files the Delta logs no longer list, so their objects may be deleted: a bucket takes a
/// ticket once the files to delete are no longer published (an expiry's tombstone is durable,
/// or a newer generation replaced them), and a successful sync of its table covers every ticket
/// taken before it read the store, since it committed the removes of every file that was not
/// published then. An expiry or an erasure deletes only once its ticket is covered, so the
/// pass's one sync serves all of them (`archive::expiry`, `archive::erase`) instead of a sync
/// each.
#[cfg(feature = "delta")]
#[derive(Default)]
pub(crate) struct DeltaCoverage {
    /// The last ticket taken (tickets start at 1).
    pub last_ticket: u64,
    /// The ticket of each bucket whose expiry has not deleted its objects yet.
    pub expiries: HashMap<BucketId, u64>,
    /// The ticket of each bucket whose erasure has not deleted the replaced generations yet,
    /// with the manifest published when it was taken (a newer one needs a new ticket).
    pub erasures: HashMap<BucketId, (u64, String)>,
    /// Per table, the last ticket a successful sync covered.
    pub covered: HashMap<String, u64>,
}

/// What the archival remembers between passes: kept by the engine, so two engines in one
/// process (tests, the simulation, a restored copy opened after the original closed) never
/// share it, and an engine that closes forgets it, as a process that exits does.
#[derive(Default)]
pub(crate) struct PassMemory {
    /// Whether a full sweep finished in this life. Until one has, every sweep is full: a copy
    /// of a data directory (a restored backup) begins with a life, and only a full listing
    /// finds what the other copy wrote wherever it lies (`archive::sweep`).
    pub swept_fully: std::sync::atomic::AtomicBool,
    /// Tables whose Delta log the last sync left matching this installation's manifests.
    #[cfg(feature = "delta")]
    pub delta_in_sync: std::sync::Mutex<std::collections::HashSet<String>>,
    /// One Delta sync at a time per table: two at once would each see a file missing and both
    /// add it. The lock holds what the table's syncs keep between them (`archive::delta`'s
    /// index of this installation's files, which this layer does not know the type of).
    #[cfg(feature = "delta")]
    pub delta_locks: std::sync::Mutex<HashMap<String, DeltaSyncLock>>,
    /// What the Delta logs have caught up with (`DeltaCoverage`).
    #[cfg(feature = "delta")]
    pub delta_coverage: std::sync::Mutex<DeltaCoverage>,
    /// Objects of the shared erasure exchange (`archive::fleet_erase`) this life created or
    /// found on a target, or passed over ("target\nkey"), so each is created or read once.
    pub shared_erasure_keys: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Per sink: when its next delivery may be tried (on the engine's clock, so a simulation
    /// drives it) and how many failed in a row.
    pub sink_backoffs: std::sync::Mutex<HashMap<String, (crate::model::Micros, u32)>>,
    /// Per webhook sink: its HTTP client, kept so deliveries reuse connections and the trust
    /// store is built once, and the configuration it was made for.
    pub webhook_agents: std::sync::Mutex<HashMap<String, (crate::policy::SinkConfig, ureq::Agent)>>,
    /// One catalog write at a time per table (`archive::catalog`): two at once could each
    /// delete a day's catalog the other just made.
    pub catalog_locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// What the previous pass did, which paces the next one's planning (`archive::plan_budget`)
    /// and estimates when the plan queue is empty (`ops::status`).
    pub planning: std::sync::Mutex<Planning>,
}

/// A table's Delta sync lock, holding what its syncs keep between them.
#[cfg(feature = "delta")]
pub(crate) type DeltaSyncLock = Arc<tokio::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>>;

/// What the previous pass of this life did, as far as planning cares.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Planning {
    pub previous_work: PreviousWork,
    /// Buckets the previous pass planned.
    pub planned: u64,
}

/// How long the previous pass of this life spent on due work (claims, archival, cleanups,
/// expiries), on the engine's clock, and whether it left a backlog.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreviousWork {
    /// No pass has run in this life yet.
    #[default]
    NoPassYet,
    /// The previous pass found nothing due.
    NothingDue,
    /// The previous pass spent `micros` on due work; `backlog` when it left one
    /// (`PassReport::leaves_backlog`: the next pass follows at once).
    Took { micros: crate::model::Micros, backlog: bool },
}

/// File in the data directory where a running engine publishes its status (read by
/// `frostline status` while the engine holds the database).
pub const STATUS_FILE: &str = "status.json";
/// File in the data directory holding the running engine's process id (for `frostline reload`).
pub const PID_FILE: &str = "frostline.pid";

/// How often one batch is compared again with an archive that published its next generation
/// meanwhile before the append gives up with `ArchiveChanged` (each retry follows a whole
/// archival of the bucket, so more than one is rare).
const APPEND_ARCHIVE_CHANGED_ATTEMPTS: u32 = 4;

/// A batch split by `Engine::split_archived`.
struct SplitRows {
    /// What the store appends: rows of hot buckets and late records of archived ones.
    rows: Vec<PreparedRow>,
    already_archived: u64,
    archives_checked: Vec<(BucketId, String)>,
}

impl Engine {
    /// Opens the data directory and loads the policy directory. Every table's strategy is
    /// registered (or checked against the one its buckets were made with).
    pub fn open(data_dir: &Path, policies_dir: &Path, settings: Settings, clock: SharedClock) -> Result<Arc<Engine>> {
        Self::open_with(data_dir, policies_dir, settings, clock, crate::policy::LoadOptions::default())
    }

    /// `open`, loading the policy directory (now and on reloads) with `load_options`.
    pub fn open_with(
        data_dir: &Path,
        policies_dir: &Path,
        settings: Settings,
        clock: SharedClock,
        load_options: crate::policy::LoadOptions,
    ) -> Result<Arc<Engine>> {
        // Relative paths (the default `frostline-data`, `--policies policies`) are resolved
        // against the working directory once, here: everything built from them (the default
        // target's file:// URL, the pid and address files) needs an absolute path.
        let data_dir = &std::path::absolute(data_dir).map_err(|e| Error::io(data_dir, e))?;
        let policies_dir = &std::path::absolute(policies_dir).map_err(|e| Error::io(policies_dir, e))?;
        std::fs::create_dir_all(data_dir).map_err(|e| Error::io(data_dir, e))?;
        let store = Store::open_with_cache(&data_dir.join(DATABASE_FILE), settings.store_cache_bytes)?;
        let fleet_key = settings.share_erasures.as_deref().map(FleetKey::from_file).transpose()?;
        if let Some(key) = &fleet_key {
            crate::store::fleet_key::register(key);
        }
        store.check_fleet_keys()?;
        let host = PluginHost::with_cache(
            Some(settings.plugin_cache_dir(data_dir)),
            settings.plugin_cache_key_file.as_deref(),
        )?;
        let mut policies = crate::policy::load_with(policies_dir, data_dir, &host, &settings, &load_options)?;
        crate::policy::retired::restore_recorded(&mut policies, &store, &host, data_dir)?;
        let installation_id = store.installation_id()?;
        store.record_installation_since(clock.now())?;
        let settings_seed = settings.random_seed;
        let engine = Engine {
            installation_id,
            store,
            host,
            clock,
            settings,
            data_dir: data_dir.to_path_buf(),
            load_options,
            policies: RwLock::new(Arc::new(policies)),
            last_reload: std::sync::Mutex::new(None),
            reloading: std::sync::Mutex::new(()),
            reloads: Default::default(),
            life: Arc::new(Life {
                // From the operating system even where tests seed the engine's generator: two
                // copies of a data directory opened with one seed must still differ.
                epoch: format!("{:016x}", rand::random::<u64>()),
                epoch_recorded: Default::default(),
                rng: std::sync::Mutex::new(match settings_seed {
                    Some(seed) => rand::SeedableRng::seed_from_u64(seed),
                    None => rand::SeedableRng::from_os_rng(),
                }),
                memory: PassMemory::default(),
                fleet_key,
            }),
        };
        engine.register_tables()?;
        Ok(Arc::new(engine))
    }

    /// Records every table of the active set (its strategy, checked; its retention identity,
    /// which starts a reconciliation when it changed), marks recorded tables that are gone
    /// from the directory, and makes the store's policy holds those of the set.
    fn register_tables(&self) -> Result<()> {
        let now = self.clock.now();
        let policies = self.policies();
        for table in policies.tables.values() {
            crate::policy::retired::keep_components(&self.data_dir, table)?;
            self.store.register_table(TableState {
                id: table.id.clone(),
                strategy: table.strategy.identity().clone(),
                created_at: now,
                retention: Some(table.retention_identity.clone()),
                reconcile_from: None,
                reconcile_started_at: now,
                unmanaged_since: None,
                declaration: Some(table.declaration.clone()),
            })?;
        }
        let unmanaged = self.store.mark_unmanaged(policies.tables.keys().cloned().collect(), now)?;
        if !unmanaged.is_empty() {
            tracing::warn!(tables = ?unmanaged, "tables with data are not in the policy directory; their buckets wait for them");
        }
        crate::failpoints::hit("before_policy_holds_sync")?;
        let sync = self.store.sync_policy_holds(policies.holds.clone(), now)?;
        if !sync.released.is_empty() {
            // A reload says so in its outcome too (`ops::reload`); at start, this line is all.
            tracing::warn!(holds = ?sync.released, "policy holds released: they are no longer in the policy directory");
        }
        if !sync.too_late.is_empty() {
            tracing::warn!(buckets = ?sync.too_late, "a policy hold came after these buckets' expiry started deleting");
        }
        Ok(())
    }

    /// Swaps in a new, fully validated policy set atomically. Work in flight keeps the set it
    /// started with (it holds an `Arc` to it).
    pub fn install_policies(&self, set: PolicySet) -> Result<()> {
        *self.policies.write().expect("policy lock") = Arc::new(set);
        self.register_tables()
    }

    /// The context a pass, a query or a maintenance operation works with: the store, the
    /// clock, the settings and the policy set in force now (`Context`).
    pub fn context(&self) -> Arc<Context> {
        Arc::new(Context {
            store: self.store.clone(),
            clock: self.clock.clone(),
            settings: self.settings.clone(),
            policies: self.policies(),
            data_dir: self.data_dir.clone(),
            installation_id: self.installation_id.clone(),
            life: self.life.clone(),
        })
    }

    /// The hot store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The plugin host the policy set's components were loaded by.
    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// The engine's clock (a manual one in tests and simulations).
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// This data directory's installation id (see `storage::keys`).
    pub fn installation_id(&self) -> &str {
        &self.installation_id
    }

    /// How the policy directory is loaded, at open and on every reload.
    pub fn load_options(&self) -> &crate::policy::LoadOptions {
        &self.load_options
    }

    /// Buckets the last pass of this life planned (0 before its first pass).
    pub fn planned_last_pass(&self) -> u64 {
        self.life.memory.planning.lock().expect("planning lock").planned
    }

    /// Waits for a reload in progress to finish; the caller reloads while it holds the guard.
    pub fn one_reload_at_a_time(&self) -> std::sync::MutexGuard<'_, ()> {
        // A reload that panicked left nothing half-installed (a set is swapped in whole).
        self.reloading.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn record_reload(&self, outcome: crate::policy::ReloadOutcome) {
        let counter = &self.reloads[usize::from(!outcome.accepted)];
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.last_reload.lock().expect("reload lock") = Some(outcome);
    }

    pub fn last_reload(&self) -> Option<crate::policy::ReloadOutcome> {
        self.last_reload.lock().expect("reload lock").clone()
    }

    /// Reload attempts since the engine opened: `(accepted, refused)`.
    pub fn reload_counts(&self) -> (u64, u64) {
        let [accepted, refused] = &self.reloads;
        (accepted.load(std::sync::atomic::Ordering::Relaxed), refused.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// A random number from the engine's source (`Settings::random_seed`).
    pub fn random_u64(&self) -> u64 {
        rand::Rng::random(&mut *self.life.rng.lock().expect("rng lock"))
    }

    /// A fresh owner token for this process's passes: the process id and a random part.
    pub fn new_owner_token(&self) -> String {
        format!("{}-{:016x}", std::process::id(), self.random_u64())
    }

    /// The active policy set; work started under it finishes under it.
    pub fn policies(&self) -> Arc<PolicySet> {
        self.policies.read().expect("policy lock").clone()
    }

    /// Appends records to a table. Each batch of up to `APPEND_BATCH_RECORDS_MAX` records is
    /// atomic and acknowledged after its commit; an identical duplicate is accepted unchanged.
    pub fn append(&self, table: &str, records: Vec<Record>) -> Result<AppendOutcome> {
        self.append_checked(table, crate::model::CheckedRecords::check(records)?)
    }

    /// `append` for records already checked (the wire parser checks them as it parses).
    pub fn append_checked(&self, table: &str, records: crate::model::CheckedRecords) -> Result<AppendOutcome> {
        let records = records.into_inner();
        let policies = self.policies();
        let policy = policies.table(table)?.clone();
        if policies.retired.contains(table) {
            return Err(Error::InvalidInput(format!(
                "table `{table}` was removed from the policy directory: it keeps its data and its buckets are \
                 still archived under its last definition, but it accepts no appends"
            )));
        }
        // Every record is checked against the table's columns before any batch is written:
        // a refusal writes nothing.
        let column_misses = crate::model::columns::check_records(policy.columns(), &records)?;
        let mut total = AppendOutcome { column_misses, ..AppendOutcome::default() };
        let mut rest = records;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(APPEND_BATCH_RECORDS_MAX));
            let outcome = self.append_batch(&policy, std::mem::replace(&mut rest, tail))?;
            total.appended += outcome.appended;
            total.duplicates += outcome.duplicates;
            total.already_archived += outcome.already_archived;
        }
        Ok(total)
    }

    /// One atomic batch of checked records.
    fn append_batch(&self, policy: &TablePolicy, records: Vec<Record>) -> Result<AppendOutcome> {
        let times: Vec<i64> = records.iter().map(|r| r.event_time).collect();
        let descriptors = policy.strategy.buckets_for(&times)?;
        let writable_horizons = match policy.writable_buckets {
            Some(n) => Some(self.horizons(policy, &descriptors, n)?),
            None => None,
        };
        let rows: Vec<PreparedRow> = records
            .into_iter()
            .zip(descriptors)
            .map(|(record, descriptor)| PreparedRow { descriptor, record })
            .collect();
        // A bucket that publishes its next generation between the comparison with its archive
        // and the commit refuses the batch (`ArchiveChanged`): compare again with the new one.
        let mut attempts = 0;
        loop {
            attempts += 1;
            // Rows of archived buckets are compared with the archive before anything is
            // written: the batch stays all or nothing.
            let split = self.split_archived(policy, rows.clone())?;
            let mut outcome = if split.rows.is_empty() {
                AppendOutcome::default()
            } else {
                match self.store.append(AppendBatch {
                    table: policy.id.clone(),
                    strategy: policy.strategy.identity().fingerprint(),
                    rows: split.rows,
                    writable_horizons: writable_horizons.clone(),
                    writable_buckets: policy.writable_buckets.unwrap_or(0),
                    now: self.clock.now(),
                    archives_checked: split.archives_checked,
                    late_grace_us: self.settings.late_grace_us,
                }) {
                    Err(Error::ArchiveChanged { .. }) if attempts < APPEND_ARCHIVE_CHANGED_ATTEMPTS => continue,
                    outcome => outcome?,
                }
            };
            outcome.already_archived = split.already_archived;
            return Ok(outcome);
        }
    }

    /// Takes out of `rows` those identical to a record their bucket's published archive holds
    /// (counted as already archived) and refuses the batch if one has the identity of an
    /// archived record with another body, or is for a bucket whose archive expired or whose
    /// cleanup is under way. Every other row goes to the store: a row for an archived bucket
    /// that its archive does not hold is a late record, kept hot until the next generation
    /// takes it in. The store refuses the batch if an archive changed since it was compared
    /// (`archives_checked`). One read of the bucket states per batch: the common case (every
    /// bucket hot) costs nothing more.
    fn split_archived(&self, policy: &TablePolicy, rows: Vec<PreparedRow>) -> Result<SplitRows> {
        let mut buckets: Vec<BucketId> = Vec::new();
        for row in &rows {
            if !buckets
                .iter()
                .any(|b| b.partition_key == row.record.partition_key && b.bucket_key == row.descriptor.key)
            {
                buckets.push(BucketId {
                    table: policy.id.clone(),
                    partition_key: row.record.partition_key.clone(),
                    bucket_key: row.descriptor.key.clone(),
                });
            }
        }
        let snapshot = self.store.snapshot()?;
        let mut closed: HashMap<BucketId, BucketMeta> = HashMap::new();
        for id in buckets {
            if let Some(meta) = snapshot.bucket(&id)?
                && (meta.state.has_archive() || meta.state == BucketState::Expired)
            {
                closed.insert(id, meta);
            }
        }
        if closed.is_empty() {
            return Ok(SplitRows { rows, already_archived: 0, archives_checked: Vec::new() });
        }
        let policies = self.policies();
        let (mut open, mut archived): (Vec<PreparedRow>, Vec<PreparedRow>) = (Vec::new(), Vec::new());
        for row in rows {
            let id = BucketId {
                table: policy.id.clone(),
                partition_key: row.record.partition_key.clone(),
                bucket_key: row.descriptor.key.clone(),
            };
            if closed.contains_key(&id) { archived.push(row) } else { open.push(row) }
        }
        let mut identical = 0;
        let mut archives_checked = Vec::new();
        for (id, meta) in &closed {
            if meta.state == BucketState::Expired {
                let reason = meta.plan.as_ref().map(|p| p.reason.clone()).unwrap_or_default();
                return Err(Error::BucketExpired { table: id.table.clone(), bucket: id.display(), reason });
            }
            let manifest = snapshot
                .latest_manifest(id)?
                .ok_or_else(|| Error::Internal(format!("archived bucket {id} has no recorded manifest")))?;
            let key =
                meta.manifest_key.clone().ok_or_else(|| Error::Internal(format!("bucket {id} names no manifest")))?;
            let backend = policies.archive_backend(policy, &manifest.archive_target())?;
            let in_bucket = || {
                archived
                    .iter()
                    .filter(|r| r.record.partition_key == id.partition_key && r.descriptor.key == id.bucket_key)
            };
            // Only the segments whose event times cover a row can hold its identity: a late
            // record reads one segment (or none, past the archive's ends), not the bucket.
            let from = in_bucket().map(|r| r.record.event_time).min();
            let to = in_bucket().map(|r| r.record.event_time).max().and_then(|t| t.checked_add(1));
            let stored =
                crate::storage::block_on(crate::format::reader::read_archive(backend.as_ref(), &key, from, to))?;
            let stored: HashMap<(i64, &[u8]), &Record> =
                stored.iter().map(|r| ((r.event_time, r.sort_key.as_slice()), r)).collect();
            let mut late = false;
            for row in in_bucket() {
                match stored.get(&(row.record.event_time, row.record.sort_key.as_slice())) {
                    Some(found) if **found == row.record => identical += 1,
                    Some(_) => {
                        return Err(Error::Conflict(format!(
                            "a record with identity (bucket {id}, event_time {}, sort_key `{}`) is already archived \
                             with a different body, tenant or kind; nothing in this batch was applied",
                            row.record.event_time,
                            String::from_utf8_lossy(&row.record.sort_key)
                        )));
                    }
                    None => {
                        // Published but its hot rows not yet deleted: the cleanup fences the
                        // bucket for a moment (the answer says so, and a retry succeeds).
                        if meta.state == (BucketState::Archived { hot_deleted: false }) {
                            return Err(Error::BucketFenced {
                                table: id.table.clone(),
                                bucket: id.display(),
                                state: meta.state.to_string(),
                            });
                        }
                        open.push(row.clone());
                        late = true;
                    }
                }
            }
            if late {
                archives_checked.push((id.clone(), key));
            }
        }
        Ok(SplitRows { rows: open, already_archived: identical, archives_checked })
    }

    /// For each bucket, the start of the bucket `n` strategy buckets later: once a partition
    /// has a bucket starting there, this one is no longer among its `n` newest.
    fn horizons(&self, policy: &TablePolicy, descriptors: &[BucketDescriptor], n: u32) -> Result<HashMap<String, i64>> {
        let mut out = HashMap::new();
        for d in descriptors {
            if out.contains_key(&d.key) {
                continue;
            }
            let mut current = d.clone();
            for _ in 0..n {
                match policy.strategy.bucket_for(current.end) {
                    Ok(next) => current = next,
                    // The strategy answers that the time has no bucket: past its range there
                    // is no newer bucket that could exist.
                    Err(Error::InvalidInput(_)) => {
                        current.start = i64::MAX;
                        break;
                    }
                    // A fault or a refused answer says nothing about newer buckets: the batch
                    // cannot be checked, so it is refused.
                    Err(e) => return Err(e),
                }
            }
            out.insert(d.key.clone(), current.start);
        }
        Ok(out)
    }
}
