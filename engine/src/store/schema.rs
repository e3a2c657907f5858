//! Every redb table frostline uses, its key layout, its value type and the schema version.
//!
//! Keys use the order-preserving encoding of `encoding`; `keys` builds and reads them. Values are MessagePack (rmp-serde)
//! envelopes `{v: version, ...}`, so a later schema can read an older value and upgrade it.
//!
//! | table            | key                                              | value          |
//! |------------------|--------------------------------------------------|----------------|
//! | `meta`           | name                                             | bytes          |
//! | `tables`         | table id                                         | `TableState`   |
//! | `rows <bucket>`  | event_time ‖ sort_key (one table per bucket)     | `StoredRow`    |
//! | `buckets`        | bucket id = table ‖ partition ‖ bucket_key       | `BucketMeta`   |
//! | `buckets_by_time`| table ‖ partition ‖ start ‖ bucket_key            | ()             |
//! | `buckets_by_end` | table ‖ end ‖ bucket id                          | ()             |
//! | `due`            | due_at ‖ bucket id                               | ()             |
//! | `plan_queue`     | class ‖ end ‖ bucket id                          | ()             |
//! | `manifests`      | bucket id ‖ generation                           | `Manifest`     |
//! | `intents`        | bucket id ‖ generation                           | `UploadIntent` |
//! | `outbox`         | sequence (u64)                                   | `OutboxEvent`  |
//! | `deliveries`     | sink name ‖ sequence                             | delivered-at   |
//! | `holds`          | hold id                                          | `Hold`         |
//! | `tombstones`     | bucket id                                        | `Tombstone`    |
//! | `epochs`         | epoch (16 hex digits)                            | first used at  |
//! | `released`       | target ‖ object key                              | `ReleasedKey`  |
//! | `state_tallies`  | (table, state)                                   | (buckets, rows)|
//! | `buckets_by_state`| table ‖ state ‖ state_since ‖ bucket id         | ()             |
//! | `buckets_by_state_and_start` | table ‖ state ‖ start ‖ bucket id    | ()             |
//! | `archived_by_hash` | table ‖ state ‖ hash of the id ‖ bucket id (archived states only) | () |
//! | `held_tallies`   | table                                            | buckets        |
//! | `deferred_buckets`, `leased_buckets` | bucket id                    | ()             |
//! | `longest_buckets`| table                                            | microseconds   |
//!
//! Each bucket's hot rows live in a table of their own (`rows_table`), so a cleanup drops a
//! small bucket's rows with the table instead of deleting them key by key (schema 2; schema 1
//! kept every row in one `records` table keyed by bucket id ‖ event_time ‖ sort_key, and
//! `Store::open` moves them, see `upgrade`). BENCHMARKS.md has the figures the layout was
//! chosen by. Schema 3 keeps the plan queue by bucket end (schema 2 kept it by bucket id as
//! `unplanned`) and adds `buckets_by_end`. Schema 4 adds the status tallies (`tally`), and
//! schema 5 the length of each table's longest bucket beside them, which lets a query seek
//! the first bucket a time range can reach (`reads`); schema 6 indexes each state's buckets by
//! start, the order a listing of one state pages in; schema 7 indexes each archived bucket by
//! a hash of its id, where a verification's random sample seeks.

use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use super::encoding::{self, Reader};
pub use super::keys::{
    PlanClass, RowsTable, by_end_key, by_time_key, decode_by_end_key, decode_by_time_key, decode_due_key,
    decode_plan_queue_key, decode_row_key, due_key, generation_key, plan_queue_key, row_key, rows_table,
    rows_table_name,
};
use crate::error::{Error, Result};
pub use crate::model::ArchiveTarget;
use crate::model::lifecycle::{self, BucketView, ExpiryProgress, PlanBasis};
use crate::model::{BucketDescriptor, BucketFacts, BucketState, Micros, RetentionPlan};

/// Bumped on any incompatible change of a table or value; `Store::open` refuses a newer one
/// and upgrades an older one.
pub const SCHEMA_VERSION: u32 = 7;

pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub const TABLES: TableDefinition<&str, &[u8]> = TableDefinition::new("tables");
/// Schema 1's one table of every hot row, keyed by bucket id ‖ event_time ‖ sort_key; read
/// only by the upgrade, which empties and deletes it.
pub const SCHEMA_1_RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
pub const BUCKETS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("buckets");
pub const BUCKETS_BY_TIME: TableDefinition<&[u8], ()> = TableDefinition::new("buckets_by_time");
pub const DUE: TableDefinition<&[u8], ()> = TableDefinition::new("due");
/// Schema 2's plan queue, in bucket key order; read only by the upgrade to schema 3, which
/// moves it to `PLAN_QUEUE` and deletes it.
pub const SCHEMA_2_UNPLANNED: TableDefinition<&[u8], ()> = TableDefinition::new("unplanned");
/// Buckets queued for a (new) retention plan, hot ones (to archive) apart from archived ones
/// (to expire), each oldest end first (`plan_queue_key`, `PlanClass`): the end of a bucket is
/// what every age-based retention rule counts from, so the buckets whose due time has most
/// likely come are planned first, whatever their table or partition.
pub const PLAN_QUEUE: TableDefinition<&[u8], ()> = TableDefinition::new("plan_queue");
/// Every bucket of a table by its end (`by_end_key`): the order a reconciliation visits
/// them in, so after a policy change the oldest buckets are queued for a plan first.
pub const BUCKETS_BY_END: TableDefinition<&[u8], ()> = TableDefinition::new("buckets_by_end");
pub const MANIFESTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("manifests");
pub const INTENTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("intents");
pub const OUTBOX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("outbox");
pub const DELIVERIES: TableDefinition<&[u8], i64> = TableDefinition::new("deliveries");
pub const HOLDS: TableDefinition<&str, &[u8]> = TableDefinition::new("holds");
pub const TOMBSTONES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("tombstones");
/// Every epoch of this data directory's lives that made an object key (`storage::keys`), and
/// those of another copy whose archives `adopt` took in: what tells this copy's objects from
/// those of a copy it has not resolved. (The sweep deletes only released keys, whatever their
/// epoch.)
pub const EPOCHS: TableDefinition<&str, i64> = TableDefinition::new("epochs");
/// Keys this data directory recorded in an upload intent and no longer references (an earlier
/// attempt's manifest, a segment no published manifest kept): the only objects of a table's
/// folders the orphan sweep deletes (`ReleasedKey`).
pub const RELEASED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("released");
/// Erasure requests by id, with each matched bucket's progress and receipt
/// (`store::erasure::ErasureRequest`).
pub const ERASURES: TableDefinition<&str, &[u8]> = TableDefinition::new("erasures");
/// The ids of the erasure requests not yet finished: a pass and every claim read the open
/// requests, which would otherwise mean decoding every request ever placed.
pub const OPEN_ERASURES: TableDefinition<&str, ()> = TableDefinition::new("open_erasures");
/// The ids of the finished erasure requests whose receipt is not yet known to lie on every
/// shared target (`archive::fleet_erase`): until it does, the manifests this data directory
/// writes name them among the requests they answer for, so that a host adopting them after
/// this one is lost can tell a finished request from one never carried out.
pub const UNRECEIPTED_ERASURES: TableDefinition<&str, ()> = TableDefinition::new("unreceipted_erasures");
/// Which buckets' publications changed, in the order they changed: `(table, sequence)` to
/// the bucket's id, written by `record_step` in the transaction of the change (a publication,
/// an adoption, an expiry begun, finished or called off). A running engine's Delta sync reads
/// only what is new here (`archive::delta`), and drops what it has read.
pub const PUBLICATION_CHANGES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("publication_changes");
/// The status tallies (`store::tally`, schema 4): per table and state, the buckets and their
/// rows; each bucket by table, state and when it entered it; per table, the buckets a hold
/// parks; the buckets deferred, and those leased.
pub const STATE_TALLIES: TableDefinition<(&str, &str), (u64, u64)> = TableDefinition::new("state_tallies");
pub const BUCKETS_BY_STATE: TableDefinition<&[u8], ()> = TableDefinition::new("buckets_by_state");
pub const HELD_TALLIES: TableDefinition<&str, u64> = TableDefinition::new("held_tallies");
pub const DEFERRED_BUCKETS: TableDefinition<&[u8], ()> = TableDefinition::new("deferred_buckets");
pub const LEASED_BUCKETS: TableDefinition<&[u8], ()> = TableDefinition::new("leased_buckets");
/// Per table, the length (end - start, in microseconds) of the longest bucket it ever had
/// (schema 5, kept with the tallies): no bucket that ends after a time starts more than this
/// before it, so a query seeks its first bucket instead of reading every earlier one.
pub const LONGEST_BUCKETS: TableDefinition<&str, i64> = TableDefinition::new("longest_buckets");
/// Each bucket by table, state, start, then id (schema 6, kept with the tallies): a listing of
/// one state's buckets (`/buckets?state=`) reads its page and no other bucket.
pub const BUCKETS_BY_STATE_AND_START: TableDefinition<&[u8], ()> = TableDefinition::new("buckets_by_state_and_start");
/// Each archived bucket (both states of a published archive) by table, state, the first 8
/// bytes of the SHA-256 of its encoded id, then the id (schema 7, kept with the tallies): the
/// hashes spread the buckets evenly over the key space, so a verification's random sample
/// seeks random points of it instead of walking every archived bucket.
pub const ARCHIVED_BY_HASH: TableDefinition<&[u8], ()> = TableDefinition::new("archived_by_hash");
/// Present while the tallies are being built from every bucket (the upgrades to schemas 4 to 7): the
/// last bucket tallied (empty: none yet), so a restart goes on from it.
pub const META_TALLY_CURSOR: &str = "tally_cursor";
/// The sequence of the last entry written to `PUBLICATION_CHANGES`.
pub const META_PUBLICATION_CHANGES_SEQ: &str = "publication_changes_seq";
/// Set once `OPEN_ERASURES` holds every open request (a data directory written before the
/// index has it built when first opened).
pub const META_OPEN_ERASURES_INDEXED: &str = "open_erasures_indexed";

pub const META_SCHEMA_VERSION: &str = "schema_version";
pub const META_OUTBOX_SEQUENCE: &str = "outbox_sequence";
/// A random id made when the data directory is created: every object key the installation
/// writes carries it, and the orphan sweep deletes only objects that carry it.
pub const META_INSTALLATION_ID: &str = "installation_id";
/// When this installation began (the engine's clock at the first open of an empty data
/// directory, big-endian micros; `i64::MIN` for one that held data before it was recorded):
/// shared erasure requests placed before it are not taken up (`archive::fleet_erase`).
pub const META_INSTALLATION_SINCE: &str = "installation_since";

/// Why the last orphan sweep stopped without deleting anything (`SweepStop`, JSON), until a
/// sweep completes: shown by `status` and the API.
pub const META_SWEEP_STOPPED: &str = "sweep_stopped";

/// Prefix of the meta entries `delta_log:<table>`: a table's Delta log as the last sync left
/// it (`DeltaLogState`, JSON), for `status`.
pub const META_DELTA_LOG_PREFIX: &str = "delta_log:";

/// A table's Delta log as this installation's last sync left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaLogState {
    /// The log's newest version the sync saw or wrote.
    pub version: u64,
    /// When the sync ran, and when this installation last committed (if it ever did).
    pub synced_at: crate::model::Micros,
    pub last_commit_at: Option<crate::model::Micros>,
    /// The sync's error, when it failed (the version and times are those of the last success).
    pub error: Option<String>,
}

/// Identifies one bucket: `(table, partition_key, bucket_key)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BucketId {
    pub table: String,
    pub partition_key: Vec<u8>,
    pub bucket_key: String,
}

impl BucketId {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.table.len() + self.partition_key.len() + self.bucket_key.len() + 6);
        encoding::put_bytes(&mut out, self.table.as_bytes());
        encoding::put_bytes(&mut out, &self.partition_key);
        encoding::put_bytes(&mut out, self.bucket_key.as_bytes());
        out
    }

    pub fn decode(reader: &mut Reader<'_>) -> Result<Self> {
        let table =
            String::from_utf8(reader.bytes()?).map_err(|_| Error::Corruption("table id is not UTF-8".into()))?;
        let partition_key = reader.bytes()?;
        let bucket_key =
            String::from_utf8(reader.bytes()?).map_err(|_| Error::Corruption("bucket key is not UTF-8".into()))?;
        Ok(BucketId { table, partition_key, bucket_key })
    }

    /// Prefix of every bucket of a table (and partition, when given).
    pub fn table_prefix(table: &str, partition_key: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        encoding::put_bytes(&mut out, table.as_bytes());
        if let Some(p) = partition_key {
            encoding::put_bytes(&mut out, p);
        }
        out
    }

    pub fn display(&self) -> String {
        format!("{}/{}/{}", self.table, String::from_utf8_lossy(&self.partition_key), self.bucket_key)
    }
}

impl std::fmt::Display for BucketId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

/// A record as stored in the hot table (its identity lives in the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRow {
    pub tenant: Option<String>,
    pub kind: Option<String>,
    pub body: String,
}

/// A `StoredRow` borrowed from its stored bytes, for scans that only hash or compare rows.
#[derive(Debug, Deserialize)]
pub struct StoredRowRef<'a> {
    #[serde(borrow)]
    pub tenant: Option<&'a str>,
    #[serde(borrow)]
    pub kind: Option<&'a str>,
    pub body: &'a str,
}

/// What the bucket's records share, for the retention policy's facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shared {
    /// No record has set it.
    #[default]
    Unset,
    /// Every record so far has this value.
    One(String),
    /// Records differ.
    Mixed,
}

impl Shared {
    /// Folds one more record's value in. `earlier_rows` is how many records the bucket held
    /// before this one: `Unset` after some rows means none of them had a value, so a first
    /// value then makes the bucket `Mixed`, not `One` (regression: a bucket of kind-less
    /// records that a `debug` record joined was planned as all-`debug`).
    pub fn observe(&mut self, value: Option<&str>, earlier_rows: u64) {
        *self = match (&*self, value) {
            (Shared::Unset, Some(v)) if earlier_rows == 0 => Shared::One(v.to_string()),
            (Shared::Unset, Some(_)) => Shared::Mixed,
            (Shared::One(current), Some(v)) if current == v => return,
            (Shared::Unset, None) => return,
            (Shared::One(_), None) | (Shared::One(_), Some(_)) => Shared::Mixed,
            (Shared::Mixed, _) => return,
        };
    }

    pub fn single(&self) -> Option<String> {
        match self {
            Shared::One(v) => Some(v.clone()),
            _ => None,
        }
    }
}

/// One row per bucket: everything the protocol needs to decide and to fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketMeta {
    pub id: BucketId,
    pub descriptor: BucketDescriptor,
    /// `StrategyIdentity::fingerprint` of the strategy that made the bucket.
    pub strategy: String,
    pub state: BucketState,
    /// The fencing token; every claim increments it.
    pub generation: u64,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Micros,
    pub attempts: u32,
    pub next_retry_at: Option<Micros>,
    pub last_error: Option<String>,
    pub manifest_key: Option<String>,
    pub row_count: u64,
    pub byte_count: u64,
    pub tenant: Shared,
    pub kind: Shared,
    pub plan: Option<RetentionPlan>,
    /// When the bucket's next action is due (the key of its `due` entry), if any.
    pub due_at: Option<Micros>,
    pub created_at: Micros,
    /// When the state last changed, so status can show each state's age.
    pub state_since: Micros,
    pub archived_at: Option<Micros>,
    pub hot_deleted_at: Option<Micros>,
    /// Holds that stopped this bucket's expiry; it is re-planned when they are lifted.
    #[serde(default)]
    pub held_by: Vec<String>,
    /// What `plan` was made from; a plan whose basis no longer holds is made again before it
    /// acts (`model::lifecycle`). Absent on plans made by earlier versions: they are stale.
    #[serde(default)]
    pub plan_basis: Option<PlanBasis>,
    /// The generation of the published manifest the hot rows were proven to match, once a
    /// cleanup has proven it; the cleanup then deletes them slice by slice, or drops the
    /// bucket's rows table whole (`Store::cleanup_slice`, whose first slice makes the proof).
    #[serde(default)]
    pub cleanup_proven: Option<u64>,
}

impl BucketMeta {
    /// What a retention policy is shown of this bucket.
    pub fn facts(&self) -> BucketFacts {
        BucketFacts {
            table: self.id.table.clone(),
            partition_key: self.id.partition_key.clone(),
            tenant: self.tenant.single(),
            kind: self.kind.single(),
            bucket: self.descriptor.clone(),
            row_count: self.row_count,
            byte_count: self.byte_count,
            state: self.state,
            archived_at: self.archived_at,
        }
    }

    /// Whether the bucket's plan may act under the retention policy whose identity is `policy`
    /// (`None`: the table has no policy loaded, so no plan is current).
    pub fn plan_is_current(&self, policy: Option<&str>) -> bool {
        policy.is_some_and(|policy| {
            lifecycle::plan_is_current(self.plan_basis.as_ref(), policy, &lifecycle::facts_digest(&self.facts()))
        })
    }

    /// Whether the bucket has an archive that reads, the Delta log and the catalog include: it
    /// is archived, or rows appended since wait for its next generation (`ArchivedPending`, or
    /// `Archiving` that generation while the last one is still the published archive).
    pub fn has_published_archive(&self) -> bool {
        self.manifest_key.is_some() && (self.state.has_archive() || self.state == crate::model::BucketState::Archiving)
    }

    /// Whether the archives its published one replaced were released to the sweep: it is
    /// published and its cleanup, which releases them, is done.
    pub fn replaced_archives_released(&self) -> bool {
        self.has_published_archive() && self.state != (crate::model::BucketState::Archived { hot_deleted: false })
    }

    /// The lifecycle's view of this bucket under the retention policy in force (`None`: its
    /// table has no definition), with the holds that cover it and its expiry's tombstone.
    pub fn view<'a>(
        &'a self,
        policy: Option<&str>,
        held: bool,
        expiry: Option<&Tombstone>,
        now: Micros,
    ) -> BucketView<'a> {
        BucketView {
            state: self.state,
            plan: self.plan.as_ref(),
            plan_current: self.plan_is_current(policy),
            plan_refresh_due: lifecycle::plan_refresh_due(self.plan_basis.as_ref(), now),
            managed: policy.is_some(),
            lease_owner: self.lease_owner.as_deref(),
            lease_expires_at: self.lease_expires_at,
            next_retry_at: self.next_retry_at,
            held,
            expiry: expiry.map(Tombstone::progress),
        }
    }
}

/// Per-table state the engine must remember across restarts and policy changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableState {
    pub id: String,
    /// The strategy that made the table's buckets; it may never change.
    pub strategy: crate::model::StrategyIdentity,
    pub created_at: Micros,
    /// `lifecycle::policy_identity` of the retention policy last registered for the table.
    #[serde(default)]
    pub retention: Option<String>,
    /// Where the reconciliation of the table's buckets continues (a `BUCKETS_BY_END` key;
    /// empty: from the bucket that ended first): every bucket is queued for a plan if its
    /// plan is stale and rescheduled, oldest first. Started when the retention policy changes, when the table returns to
    /// the policy directory, and every `REPLAN_PERIOD_US`; `None` when no scan is running.
    #[serde(default)]
    pub reconcile_from: Option<Vec<u8>>,
    #[serde(default)]
    pub reconcile_started_at: Micros,
    /// The table is absent from the policy directory: its buckets are taken out of the due
    /// index (they cannot be planned or archived without a definition) until it returns.
    #[serde(default)]
    pub unmanaged_since: Option<Micros>,
    /// The table's last definition in the policy directory: a table removed from it keeps
    /// being archived (never appended to) under this definition, across restarts.
    #[serde(default)]
    pub declaration: Option<TableDeclaration>,
}

/// What a table was declared as, enough to rebuild its policy without its policy file: the
/// plugins by hash and initialisation config (a file plugin's bytes are kept in the data
/// directory, under `plugins/<sha256>.wasm`), its format and its target's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDeclaration {
    pub strategy: PluginDeclaration,
    pub retention: PluginDeclaration,
    pub format: crate::format::Format,
    pub writable_buckets: Option<u32>,
    pub target_name: String,
    /// The policy file that declared it (for messages).
    pub file: String,
    /// Its typed columns (`[[table.column]]`), in declaration order; empty for a table that
    /// declares none (and in declarations recorded before columns existed).
    #[serde(default)]
    pub columns: Vec<crate::model::columns::ColumnSpec>,
}

/// One plugin of a `TableDeclaration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginDeclaration {
    /// `builtin:NAME`, or the path it was loaded from, relative to the policy directory.
    pub plugin: String,
    /// SHA-256 of the component's bytes, hex.
    pub sha256: String,
    /// The configuration it was initialised with (JSON; empty when none).
    pub config: String,
    pub call_ms: u64,
    pub memory_bytes: usize,
}

/// Before the first upload of a claim: what it is about to write (invariant 10).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadIntent {
    pub bucket: BucketId,
    pub generation: u64,
    pub target: String,
    pub keys: Vec<String>,
    pub recorded_at: Micros,
}

/// An object key released by this data directory: it was recorded in an upload intent (so
/// this directory wrote whatever lies under it) and the bucket's published archive does not
/// reference it. The orphan sweep deletes it once older than its grace period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasedKey {
    pub table: String,
    /// The target's URL, as the intent recorded it.
    pub target: String,
    pub key: String,
    pub released_at: Micros,
    /// The bucket whose archive or attempt wrote it, so the incremental sweep checks that
    /// bucket's references alone (`archive::sweep`). `None` in rows released before it was
    /// recorded: only a full sweep, which reads every reference, deletes those.
    #[serde(default)]
    pub bucket: Option<BucketId>,
}

impl ReleasedKey {
    pub fn store_key(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.target.len() + self.key.len() + 4);
        encoding::put_bytes(&mut out, self.target.as_bytes());
        encoding::put_bytes(&mut out, self.key.as_bytes());
        out
    }
}

/// Why an orphan sweep stopped before deleting anything: proof that another copy of this data
/// directory writes to a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepStop {
    pub at: Micros,
    pub target: String,
    /// The object that proves it.
    pub key: String,
    pub reason: String,
}

/// A durable event, delivered at least once to the configured sinks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEvent {
    pub sequence: u64,
    pub kind: String,
    /// The bucket the event is about (none for events about holds).
    pub bucket: Option<BucketId>,
    pub generation: u64,
    pub at: Micros,
    pub detail: serde_json::Value,
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    v: u32,
    value: T,
}

/// A hot row's stored value. Rows are the bulk of the store, so they are written compactly
/// (MessagePack arrays, no field names); `decode_value` reads both this and the named form rows
/// were first written in, so older data directories read unchanged.
pub fn encode_row<T: Serialize>(row: &T) -> Result<Vec<u8>> {
    rmp_serde::to_vec(&Envelope { v: SCHEMA_VERSION, value: row })
        .map_err(|e| Error::Internal(format!("cannot encode a stored row: {e}")))
}

pub fn encode_value<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    rmp_serde::to_vec_named(&Envelope { v: SCHEMA_VERSION, value })
        .map_err(|e| Error::Internal(format!("cannot encode a stored value: {e}")))
}

/// A stored row without copying its strings (either encoding, as `decode_value`).
pub fn decode_row_ref(bytes: &[u8]) -> Result<StoredRowRef<'_>> {
    let envelope: Envelope<StoredRowRef<'_>> =
        rmp_serde::from_slice(bytes).map_err(|e| Error::Corruption(format!("cannot decode a stored row: {e}")))?;
    if envelope.v > SCHEMA_VERSION {
        return Err(Error::Corruption(format!(
            "a stored row has schema version {} but this binary knows {SCHEMA_VERSION}; upgrade frostline",
            envelope.v
        )));
    }
    Ok(envelope.value)
}

pub fn decode_value<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T> {
    let envelope: Envelope<T> =
        rmp_serde::from_slice(bytes).map_err(|e| Error::Corruption(format!("cannot decode a stored value: {e}")))?;
    if envelope.v > SCHEMA_VERSION {
        return Err(Error::Corruption(format!(
            "a stored value has schema version {} but this binary knows {SCHEMA_VERSION}; upgrade frostline",
            envelope.v
        )));
    }
    Ok(envelope.value)
}

/// A legal hold: while it exists, nothing it covers is expired or deleted from the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub id: String,
    pub table: String,
    /// Narrow the hold to one partition, tenant or bucket; none of them: the whole table.
    pub partition_key: Option<String>,
    pub tenant: Option<String>,
    pub bucket_key: Option<String>,
    pub reason: String,
    pub placed_by: String,
    pub placed_at: Micros,
    /// `cli`, `api` or `policy:<file>`.
    pub source: String,
}

impl Hold {
    /// What every hold must carry, however it is placed (CLI, API, policy directory): why the
    /// data is held, and who placed it. The refusal names the missing field.
    pub fn check_declared(reason: &str, placed_by: &str) -> std::result::Result<(), String> {
        if reason.trim().is_empty() {
            return Err("a hold's `reason` must say why the data is held; nothing was placed".into());
        }
        if placed_by.trim().is_empty() {
            return Err("a hold's `placed_by` must say who places it; nothing was placed".into());
        }
        Ok(())
    }
}

impl Hold {
    /// Whether the hold covers a bucket. A tenant hold covers buckets whose records are all of
    /// that tenant and, conservatively, buckets that mix tenants.
    pub fn covers(&self, meta: &BucketMeta) -> bool {
        self.table == meta.id.table
            && self.partition_key.as_ref().is_none_or(|p| p.as_bytes() == meta.id.partition_key.as_slice())
            && self.bucket_key.as_ref().is_none_or(|b| b == &meta.id.bucket_key)
            && self.tenant.as_ref().is_none_or(|t| match &meta.tenant {
                Shared::One(one) => one == t,
                Shared::Mixed => true,
                Shared::Unset => false,
            })
    }
}

/// The durable record of an archive's expiry: written before any object is deleted, completed
/// once their absence is proved by listing, purged after the replay period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub bucket: BucketId,
    pub bounds: BucketDescriptor,
    pub manifest_key: String,
    /// Every object the expiry deletes, manifest first.
    pub keys: Vec<String>,
    pub reason: String,
    pub expired_at: Micros,
    pub completed_at: Option<Micros>,
    pub purge_at: Option<Micros>,
    /// The target the archive lives on (name and URL, from its manifest): deletions and the
    /// proof of absence go there, whatever the table's target is now.
    #[serde(default)]
    pub target: ArchiveTarget,
    /// Set, durably, just before the first delete call. Until then a hold placed on the
    /// bucket calls the expiry off; from then on it comes too late for this bucket.
    #[serde(default)]
    pub deletes_started_at: Option<Micros>,
}

impl Tombstone {
    pub fn progress(&self) -> ExpiryProgress {
        ExpiryProgress {
            completed: self.completed_at.is_some(),
            deletes_started: self.deletes_started_at.is_some() || self.completed_at.is_some(),
            purge_at: self.purge_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Shared, StoredRow, decode_row_ref, decode_value, encode_row, encode_value};

    #[test]
    fn a_value_shared_by_every_record_is_one_and_anything_else_is_mixed() {
        let fold = |values: &[Option<&str>]| {
            let mut shared = Shared::Unset;
            for (i, v) in values.iter().enumerate() {
                shared.observe(*v, i as u64);
            }
            shared
        };
        assert_eq!(fold(&[Some("debug"), Some("debug")]), Shared::One("debug".into()));
        assert_eq!(fold(&[None, None]), Shared::Unset);
        assert_eq!(fold(&[Some("debug"), None]), Shared::Mixed);
        assert_eq!(fold(&[None, Some("debug")]), Shared::Mixed, "kind-less records are not debug records");
        assert_eq!(fold(&[Some("debug"), Some("invoice")]), Shared::Mixed);
    }

    #[test]
    fn a_row_reads_the_same_from_the_compact_and_the_named_form() {
        let row = StoredRow { tenant: Some("acme".into()), kind: None, body: r#"{"n":1}"#.into() };
        let compact = encode_row(&row).unwrap();
        let named = encode_value(&row).unwrap();
        assert!(compact.len() < named.len(), "{} vs {}", compact.len(), named.len());
        assert_eq!(decode_value::<StoredRow>(&compact).unwrap(), row);
        assert_eq!(decode_value::<StoredRow>(&named).unwrap(), row);
        for bytes in [&compact, &named] {
            let borrowed = decode_row_ref(bytes).unwrap();
            assert_eq!((borrowed.tenant, borrowed.kind, borrowed.body), (Some("acme"), None, r#"{"n":1}"#));
        }
    }
}
