//! Erasure requests: which records to erase (a tenant, a partition key or exact identities,
//! within a table and a time range), the buckets they matched when the request was placed, and
//! each bucket's progress and receipt. The store keeps them durable and does what needs a
//! transaction: hot rows deleted (a hot bucket's outright, one being archived only by its lease
//! holder), an archived bucket sent to its next generation (`Step::Erase`), counts and receipts
//! recorded. `archive::erase` drives them from the pass.
//!
//! A request erases what matches while it is open: records present when it is placed, and any
//! appended to a matched bucket before that bucket's part is done. Holds beat erasure: a bucket
//! a hold covers is left as it is and named in the request until the hold is lifted.

use redb::ReadableTable;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{BucketState, Micros, Record};

use super::fleet_key::{self, FleetKey};
use super::keys::{decode_row_key, rows_table, rows_table_name};
use super::outbox::push_outbox;
use super::schema::{
    BUCKETS, BucketId, BucketMeta, ERASURES, META, META_OPEN_ERASURES_INDEXED, OPEN_ERASURES, RELEASED, ReleasedKey,
    Shared, StoredRow, UNRECEIPTED_ERASURES, decode_value, encode_value,
};
use super::{Store, check_lease, load_meta, record_step, save_meta};
use crate::model::lifecycle::Step;

/// The selector fields whose values a keyed selector names by digest, as the digests cover them.
const TENANT: &str = "tenant";
const PARTITION_KEY: &str = "partition_key";
const SORT_KEY: &str = "sort_key";

/// Identities an erasure request may name at most (larger sets: by partition key or tenant).
pub const ERASURE_IDENTITIES_MAX: usize = 10_000;

/// One record's identity, as an erasure request names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordIdentity {
    pub partition_key: String,
    pub event_time: Micros,
    pub sort_key: String,
}

/// Which records a request erases: every condition given must hold. At least one of `tenant`,
/// `partition_key` and `identities` is required (a table alone would erase the table).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErasureSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<RecordIdentity>,
    /// Event times from (inclusive), in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Micros>,
    /// Event times to (exclusive), in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Micros>,
    /// The id of the fleet key (`store::fleet_key`) when `tenant`, `partition_key` and the
    /// identities' partition and sort keys are named by their digests under it, as a request
    /// taken from a shared target names them; `None`: named as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyed: Option<String>,
}

impl ErasureSelector {
    /// Why the selector cannot be a request, if it cannot.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.tenant.is_none() && self.partition_key.is_none() && self.identities.is_empty() {
            return Err("an erasure names a tenant, a partition key or record identities (a table or a time range \
                        alone would erase everything in it): give --tenant, --partition or --record"
                .into());
        }
        if self.identities.len() > ERASURE_IDENTITIES_MAX {
            return Err(format!(
                "an erasure names at most {ERASURE_IDENTITIES_MAX} record identities, not {}: erase by partition key \
                 or tenant, or split the request",
                self.identities.len()
            ));
        }
        if let (Some(from), Some(to)) = (self.from, self.to)
            && from >= to
        {
            return Err(format!("the time range is empty: from {from} is not before to {to}"));
        }
        if let Some(id) = &self.keyed
            && fleet_key::registered(id).is_none()
        {
            return Err(format!(
                "the request names its values by digests under fleet key {id}, which this engine was not given: start \
                 it with --share-erasures naming the fleet's key file"
            ));
        }
        Ok(())
    }

    /// This selector with its values named by digests under `key`, as a shared target carries
    /// it (`archive::fleet_erase`); one that is keyed already is returned as it is.
    pub fn keyed_by(&self, key: &FleetKey) -> ErasureSelector {
        if self.keyed.is_some() {
            return self.clone();
        }
        ErasureSelector {
            table: self.table.clone(),
            tenant: self.tenant.as_ref().map(|t| key.digest(TENANT, t.as_bytes())),
            partition_key: self.partition_key.as_ref().map(|p| key.digest(PARTITION_KEY, p.as_bytes())),
            identities: self
                .identities
                .iter()
                .map(|i| RecordIdentity {
                    partition_key: key.digest(PARTITION_KEY, i.partition_key.as_bytes()),
                    event_time: i.event_time,
                    sort_key: key.digest(SORT_KEY, i.sort_key.as_bytes()),
                })
                .collect(),
            from: self.from,
            to: self.to,
            keyed: Some(key.id().to_string()),
        }
    }

    /// The identity of one record as a selector keyed by `key` names it.
    pub fn keyed_identity(key: &FleetKey, record: &Record) -> RecordIdentity {
        RecordIdentity {
            partition_key: key.digest(PARTITION_KEY, &record.partition_key),
            event_time: record.event_time,
            sort_key: key.digest(SORT_KEY, &record.sort_key),
        }
    }

    /// Whether `named` (a value of this selector's field `field`) names `value`.
    fn names(&self, field: &str, named: &str, value: &[u8]) -> bool {
        match &self.keyed {
            None => named.as_bytes() == value,
            // Registered before any keyed request is placed or matched (module `fleet_key`).
            Some(id) => {
                fleet_key::registered(id)
                    .unwrap_or_else(|| panic!("fleet key {id} of an open erasure request is not registered"))
                    .digest(field, value)
                    == named
            }
        }
    }

    /// Whether bucket `meta` may hold a record the selector names.
    pub fn may_match(&self, meta: &BucketMeta) -> bool {
        let (start, end) = (meta.descriptor.start, meta.descriptor.end);
        let partition = meta.id.partition_key.as_slice();
        self.table.as_ref().is_none_or(|t| *t == meta.id.table)
            && self.from.is_none_or(|from| end > from)
            && self.to.is_none_or(|to| start < to)
            && self.partition_key.as_ref().is_none_or(|p| self.names(PARTITION_KEY, p, partition))
            && self.tenant.as_ref().is_none_or(|t| match &meta.tenant {
                Shared::One(one) => self.names(TENANT, t, one.as_bytes()),
                Shared::Mixed => true,
                Shared::Unset => false,
            })
            && (self.identities.is_empty()
                || self.identities.iter().any(|i| {
                    (start..end).contains(&i.event_time) && self.names(PARTITION_KEY, &i.partition_key, partition)
                }))
    }

    /// Whether the selector names this record (of `table`).
    pub fn matches(
        &self,
        table: &str,
        partition_key: &[u8],
        event_time: Micros,
        sort_key: &[u8],
        tenant: Option<&str>,
    ) -> bool {
        self.table.as_deref().is_none_or(|t| t == table)
            && self.from.is_none_or(|from| event_time >= from)
            && self.to.is_none_or(|to| event_time < to)
            && self.partition_key.as_ref().is_none_or(|p| self.names(PARTITION_KEY, p, partition_key))
            && self
                .tenant
                .as_deref()
                .is_none_or(|t| tenant.is_some_and(|tenant| self.names(TENANT, t, tenant.as_bytes())))
            && (self.identities.is_empty()
                || self.identities.iter().any(|i| {
                    i.event_time == event_time
                        && self.names(PARTITION_KEY, &i.partition_key, partition_key)
                        && self.names(SORT_KEY, &i.sort_key, sort_key)
                }))
    }

    pub fn matches_record(&self, table: &str, record: &Record) -> bool {
        self.matches(table, &record.partition_key, record.event_time, &record.sort_key, record.tenant.as_deref())
    }
}

/// What a bucket's next generation does about erasure (`Store::erasure_scope`).
#[derive(Debug, Clone, Default)]
pub struct ErasureScope {
    /// The selectors whose records it leaves out.
    pub selectors: Vec<ErasureSelector>,
    /// The requests it answers for, by id, sorted.
    pub answered: Vec<String>,
}

/// Where one matched bucket stands in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErasureProgress {
    /// Not erased yet: its hot rows wait for a pass, or its archive for its next generation.
    Pending,
    /// A hold covers the bucket (`blocked_by`): nothing of it is erased until it is lifted.
    Blocked,
    /// Erased: no record the request names is left in the bucket's hot rows or archive.
    Done,
}

/// One bucket of a request: what was erased there and the proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasureBucket {
    pub bucket: BucketId,
    /// The bucket's fencing generation when the request was placed: an archive published by a
    /// later claim was written with the request open, without the records it names.
    pub placed_generation: u64,
    pub progress: ErasureProgress,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_by: Vec<String>,
    pub hot_rows_erased: u64,
    pub archived_rows_erased: u64,
    /// The archive the bucket has now, written without the erased records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_key: Option<String>,
    /// The manifests of the generations it replaced (its lineage).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced_manifests: Vec<String>,
    /// Objects deleted (the replaced generations' manifests and segments).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_objects: Vec<String>,
    /// When a listing of the bucket's folders showed none of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proved_absent_at: Option<Micros>,
    /// Objects in the bucket's folders this data directory did not write (another copy's or
    /// installation's): not deleted here, named so the operator knows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_unproven: Vec<String>,
    /// Targets of the deleted objects that keep deleted objects as noncurrent versions (S3
    /// bucket versioning): the objects are gone from listings and reads, and their bytes stay
    /// readable by version id until the bucket's lifecycle rule removes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions_kept_on: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<Micros>,
}

/// One installation's receipt for a request, as a shared target carries it
/// (`archive::fleet_erase`): counts and times, never the selector or a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedReceipt {
    pub installation: String,
    pub request: String,
    pub finished_at: Micros,
    pub buckets: u64,
    pub hot_rows_erased: u64,
    pub archived_rows_erased: u64,
    pub objects_deleted: u64,
    /// Targets that keep deleted objects as noncurrent versions (policies/README.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions_kept_on: Vec<String>,
    /// The installation began after the request was placed, held none of its records and
    /// passed it over (all counts are 0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub began_after: bool,
    /// Left by another host for this installation, which was lost: the host adopted its
    /// archives and erased what the request named in them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_by: Option<String>,
}

/// What one shared target says of a request: which installations finished it, which have not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetProgress {
    pub target: String,
    pub finished: Vec<SharedReceipt>,
    /// Installations that archived to the target and left no receipt yet.
    pub behind: Vec<String>,
}

/// A durable erasure request and its receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasureRequest {
    pub id: String,
    pub selector: ErasureSelector,
    pub reason: String,
    pub requester: String,
    pub placed_at: Micros,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Micros>,
    pub buckets: Vec<ErasureBucket>,
    /// Every installation sharing a target with this one, and whether it has finished the
    /// request there: filled when one request is read (`ops::erasure::erasure`), never stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fleet: Vec<FleetProgress>,
    /// Set on a request a host placed for the archives it adopted from a lost installation
    /// that had not carried out a shared request (`archive::adopt`): it names those archives'
    /// records by exact identities, is never written to a target as a request of its own, and
    /// once finished leaves the shared request's receipt in the lost installation's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers_for: Option<AnswersFor>,
}

/// The shared request and the lost installation a request answers for (`ErasureRequest`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AnswersFor {
    pub request: String,
    pub installation: String,
}

impl ErasureRequest {
    pub fn is_open(&self) -> bool {
        self.finished_at.is_none()
    }

    fn counts(&self) -> serde_json::Value {
        let count = |p: ErasureProgress| self.buckets.iter().filter(|b| b.progress == p).count();
        serde_json::json!({
            "request": self.id,
            "buckets": self.buckets.len(),
            "done": count(ErasureProgress::Done),
            "blocked": count(ErasureProgress::Blocked),
            "hot_rows_erased": self.buckets.iter().map(|b| b.hot_rows_erased).sum::<u64>(),
            "archived_rows_erased": self.buckets.iter().map(|b| b.archived_rows_erased).sum::<u64>(),
            "objects_deleted": self.buckets.iter().map(|b| b.deleted_objects.len()).sum::<usize>(),
        })
    }

    /// Marks the request finished when every bucket is done.
    fn finish_if_done(&mut self, now: Micros) -> bool {
        if self.is_open() && self.buckets.iter().all(|b| b.progress == ErasureProgress::Done) {
            self.finished_at = Some(now);
            return true;
        }
        false
    }
}

/// The archived records a next generation left out for an erasure: rows, and their bodies'
/// bytes (what the bucket's counts hold).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchivedErased {
    pub rows: u64,
    pub body_bytes: u64,
}

/// Adds erased records of bucket `id` (`hot` rows deleted, `archived` records a published
/// generation left out) to every open request that matched the bucket and is not done with it.
pub(super) fn count_erased(
    txn: &redb::WriteTransaction,
    id: &BucketId,
    hot: u64,
    archived: ArchivedErased,
) -> Result<()> {
    if hot == 0 && archived.rows == 0 {
        return Ok(());
    }
    let open = open_requests(&txn.open_table(OPEN_ERASURES)?, &txn.open_table(ERASURES)?)?;
    for mut request in open {
        let mut touched = false;
        for b in request.buckets.iter_mut().filter(|b| b.bucket == *id && b.progress != ErasureProgress::Done) {
            b.hot_rows_erased += hot;
            b.archived_rows_erased += archived.rows;
            touched = true;
        }
        if touched {
            save_request(txn, &request)?;
        }
    }
    Ok(())
}

/// What a request would touch, counted without changing anything (`--dry-run`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasurePreview {
    /// Buckets that may hold a named record (not expired).
    pub buckets: u64,
    /// Hot rows the request names.
    pub hot_rows: u64,
    /// Buckets with an archive that may hold a named record: each gets a next generation.
    pub archived_buckets: u64,
    /// Objects of those archives (manifests and segments) that the next generations replace.
    pub objects: u64,
    /// Buckets a hold covers: left alone until the hold is lifted.
    pub held_buckets: u64,
}

/// The selectors of `requests`, by each bucket whose part of a request is not done.
pub fn selectors_by_bucket(requests: &[ErasureRequest]) -> std::collections::BTreeMap<BucketId, Vec<ErasureSelector>> {
    let mut by_bucket: std::collections::BTreeMap<BucketId, Vec<ErasureSelector>> = Default::default();
    for request in requests.iter().filter(|r| r.is_open()) {
        for entry in request.buckets.iter().filter(|b| b.progress != ErasureProgress::Done) {
            by_bucket.entry(entry.bucket.clone()).or_default().push(request.selector.clone());
        }
    }
    by_bucket
}

fn save_request(txn: &redb::WriteTransaction, request: &ErasureRequest) -> Result<()> {
    txn.open_table(ERASURES)?.insert(request.id.as_str(), encode_value(request)?.as_slice())?;
    let mut open = txn.open_table(OPEN_ERASURES)?;
    if request.is_open() {
        open.insert(request.id.as_str(), ())?;
    } else {
        open.remove(request.id.as_str())?;
    }
    Ok(())
}

/// The open requests, by the index of their ids, in id order.
fn open_requests(
    ids: &impl ReadableTable<&'static str, ()>,
    requests: &impl ReadableTable<&'static str, &'static [u8]>,
) -> Result<Vec<ErasureRequest>> {
    let mut out = Vec::new();
    for entry in ids.iter()? {
        let (id, _) = entry?;
        let request = requests
            .get(id.value())?
            .ok_or_else(|| Error::Corruption(format!("open erasure request `{}` is not recorded", id.value())))?;
        out.push(decode_value(request.value())?);
    }
    Ok(out)
}

/// Builds the index of open requests of a data directory written before it (once; store
/// start-up, in the schema's transaction).
pub(super) fn index_open_requests(txn: &redb::WriteTransaction) -> Result<()> {
    let mut meta = txn.open_table(META)?;
    if meta.get(META_OPEN_ERASURES_INDEXED)?.is_some() {
        return Ok(());
    }
    let requests = txn.open_table(ERASURES)?;
    let mut open = txn.open_table(OPEN_ERASURES)?;
    for entry in requests.iter()? {
        let request: ErasureRequest = decode_value(entry?.1.value())?;
        if request.is_open() {
            open.insert(request.id.as_str(), ())?;
        }
    }
    meta.insert(META_OPEN_ERASURES_INDEXED, [1u8].as_slice())?;
    Ok(())
}

fn matching_hot_rows(
    rows: &impl ReadableTable<&'static [u8], &'static [u8]>,
    id: &BucketId,
    selectors: &[ErasureSelector],
) -> Result<Vec<(Vec<u8>, u64)>> {
    let mut matched = Vec::new();
    for entry in rows.iter()? {
        let (key, value) = entry?;
        let (event_time, sort_key) = decode_row_key(key.value())?;
        let row: StoredRow = decode_value(value.value())?;
        if selectors
            .iter()
            .any(|s| s.matches(&id.table, &id.partition_key, event_time, &sort_key, row.tenant.as_deref()))
        {
            matched.push((key.value().to_vec(), row.body.len() as u64));
        }
    }
    Ok(matched)
}

impl Store {
    /// Records a request (its id, selector, reason and requester filled in) with every bucket
    /// that may hold a record it names, in one transaction. Nothing is erased yet: the pass
    /// carries it out (`archive::erase`).
    pub fn place_erasure(&self, mut request: ErasureRequest, now: Micros) -> Result<ErasureRequest> {
        request.selector.check().map_err(Error::InvalidInput)?;
        self.write(move |txn| {
            if txn.open_table(ERASURES)?.get(request.id.as_str())?.is_some() {
                return Err(Error::Conflict(format!("erasure request `{}` exists already", request.id)));
            }
            request.buckets.clear();
            for entry in txn.open_table(BUCKETS)?.iter()? {
                let meta: BucketMeta = decode_value(entry?.1.value())?;
                if meta.state != BucketState::Expired && request.selector.may_match(&meta) {
                    request.buckets.push(ErasureBucket {
                        bucket: meta.id.clone(),
                        placed_generation: meta.generation,
                        progress: ErasureProgress::Pending,
                        blocked_by: Vec::new(),
                        hot_rows_erased: 0,
                        archived_rows_erased: 0,
                        manifest_key: None,
                        replaced_manifests: Vec::new(),
                        deleted_objects: Vec::new(),
                        proved_absent_at: None,
                        kept_unproven: Vec::new(),
                        versions_kept_on: Vec::new(),
                        done_at: None,
                    });
                }
            }
            request.placed_at = now;
            request.finished_at = None;
            if request.finish_if_done(now) {
                txn.open_table(UNRECEIPTED_ERASURES)?.insert(request.id.as_str(), ())?;
            }
            save_request(txn, &request)?;
            // Events carry the request's id, reason and counts, never what it names.
            let mut details = request.counts();
            details["reason"] = serde_json::Value::String(request.reason.clone());
            details["requester"] = serde_json::Value::String(request.requester.clone());
            push_outbox(txn, "erasure_placed", None, now, details)?;
            Ok(request)
        })
    }

    /// What `selector` would touch now, counted from one snapshot.
    pub fn preview_erasure(&self, selector: &ErasureSelector) -> Result<ErasurePreview> {
        selector.check().map_err(Error::InvalidInput)?;
        let holds = self.holds()?;
        let snapshot = self.snapshot()?;
        let mut preview = ErasurePreview::default();
        let mut candidates = Vec::new();
        snapshot.visit_buckets(|meta| {
            if meta.state != BucketState::Expired && selector.may_match(&meta) {
                candidates.push(meta);
            }
            Ok(())
        })?;
        let txn = self.read()?;
        for meta in candidates {
            preview.buckets += 1;
            if holds.iter().any(|h| h.covers(&meta)) {
                preview.held_buckets += 1;
                continue;
            }
            if let Ok(rows) = txn.open_table(rows_table(&rows_table_name(&meta.id))) {
                preview.hot_rows += matching_hot_rows(&rows, &meta.id, std::slice::from_ref(selector))?.len() as u64;
            }
            if meta.manifest_key.is_some()
                && let Some(manifest) = snapshot.latest_manifest(&meta.id)?
            {
                preview.archived_buckets += 1;
                preview.objects += manifest.segments.len() as u64 + 1;
            }
        }
        Ok(preview)
    }

    pub fn erasures(&self) -> Result<Vec<ErasureRequest>> {
        let txn = self.read()?;
        let table = txn.open_table(ERASURES)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            out.push(decode_value(entry?.1.value())?);
        }
        Ok(out)
    }

    /// The requests not yet finished, without reading the finished ones.
    pub fn open_erasures(&self) -> Result<Vec<ErasureRequest>> {
        let txn = self.read()?;
        open_requests(&txn.open_table(OPEN_ERASURES)?, &txn.open_table(ERASURES)?)
    }

    /// Refuses an engine that holds an open request named by digests under a fleet key it was
    /// not given (`store::fleet_key`): without the key, nothing of it could be matched.
    pub fn check_fleet_keys(&self) -> Result<()> {
        for request in self.open_erasures()? {
            if let Some(id) = &request.selector.keyed
                && fleet_key::registered(id).is_none()
            {
                return Err(Error::InvalidInput(format!(
                    "erasure request `{}` is open and names its values by digests under fleet key {id}, which this \
                     engine was not given: start it with --share-erasures (ARCHIVER_SHARE_ERASURES) naming the \
                     fleet's key file, so the request can be carried out",
                    request.id
                )));
            }
        }
        Ok(())
    }

    pub fn erasure(&self, id: &str) -> Result<Option<ErasureRequest>> {
        let txn = self.read()?;
        txn.open_table(ERASURES)?.get(id)?.map(|v| decode_value(v.value())).transpose()
    }

    /// What the next generation of bucket `meta` does about erasure: the selectors of the open
    /// requests whose part of the bucket is not done (none while a hold covers it: a held
    /// bucket is erased only once its holds are lifted), whose records it leaves out; and the
    /// requests it answers for (`format::manifest::ErasuresAnswered`): those it leaves out, the
    /// open ones that may name a record of the bucket and whose part of it is done or that did
    /// not match it when placed, and the finished ones whose receipt is not yet on the shared
    /// targets.
    pub fn erasure_scope(&self, meta: &BucketMeta) -> Result<ErasureScope> {
        let txn = self.read()?;
        let open = open_requests(&txn.open_table(OPEN_ERASURES)?, &txn.open_table(ERASURES)?)?;
        let mut scope = ErasureScope::default();
        for entry in txn.open_table(UNRECEIPTED_ERASURES)?.iter()? {
            scope.answered.push(entry?.0.value().to_string());
        }
        if open.is_empty() {
            return Ok(scope);
        }
        let held = self.holds()?.iter().any(|h| h.covers(meta));
        for request in open {
            let pending = request.buckets.iter().any(|b| b.bucket == meta.id && b.progress != ErasureProgress::Done);
            if pending && !held {
                scope.selectors.push(request.selector);
                scope.answered.push(request.id);
            } else if !pending && request.selector.may_match(meta) {
                scope.answered.push(request.id);
            }
        }
        scope.answered.sort();
        scope.answered.dedup();
        Ok(scope)
    }

    /// The finished requests whose receipts now lie on every shared target: the manifests
    /// written from now on need not name them (`UNRECEIPTED_ERASURES`).
    pub fn erasure_receipts_left(&self, ids: Vec<String>) -> Result<()> {
        // Read first: called after every exchange, it commits (and syncs) only when a request
        // leaves the table.
        let txn = self.read()?;
        let unreceipted = txn.open_table(UNRECEIPTED_ERASURES)?;
        let mut ids = ids;
        ids.retain(|id| unreceipted.get(id.as_str()).is_ok_and(|found| found.is_some()));
        drop((unreceipted, txn));
        if ids.is_empty() {
            return Ok(());
        }
        self.write(move |txn| {
            let mut unreceipted = txn.open_table(UNRECEIPTED_ERASURES)?;
            for id in &ids {
                unreceipted.remove(id.as_str())?;
            }
            Ok(())
        })
    }

    /// Deletes the hot rows of bucket `id` that `selectors` name: under the lease of
    /// `(owner, generation)` (an archival about to snapshot the rows), or else only while the
    /// bucket is hot and nobody holds it (`Ok(None)` otherwise: try again later), and adds
    /// them to every open request that matched the bucket. The archived records the next
    /// generation leaves out are counted by its publication (`Store::publish`): until then the
    /// published archive still holds them, and an attempt cut off before it would count them
    /// again.
    pub fn erase_hot_rows(
        &self,
        id: &BucketId,
        selectors: Vec<ErasureSelector>,
        lease: Option<(String, u64)>,
        now: Micros,
    ) -> Result<Option<u64>> {
        let id = id.clone();
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            match &lease {
                Some((owner, generation)) => check_lease(&meta, owner, *generation, now)?,
                None if meta.state != BucketState::Hot || meta.lease_owner.is_some() && meta.lease_expires_at > now => {
                    return Ok(None);
                }
                None => {}
            }
            let name = rows_table_name(&id);
            let mut rows = txn.open_table(rows_table(&name))?;
            let matched = matching_hot_rows(&rows, &id, &selectors)?;
            for (key, bytes) in &matched {
                rows.remove(key.as_slice())?;
                meta.row_count = meta.row_count.saturating_sub(1);
                meta.byte_count = meta.byte_count.saturating_sub(*bytes);
            }
            drop(rows);
            save_meta(txn, &meta)?;
            let erased = matched.len() as u64;
            count_erased(txn, &id, erased, ArchivedErased::default())?;
            Ok(Some(erased))
        })
    }

    /// Sends cleaned archives (or ones waiting for their next generation) to their next
    /// generation at once (`Step::Erase`), in one transaction; a bucket no longer in such a
    /// state is left as it is.
    pub fn schedule_erasure(&self, ids: Vec<BucketId>, now: Micros) -> Result<()> {
        self.write(move |txn| {
            for id in &ids {
                let mut meta = load_meta(txn, id)?;
                if matches!(meta.state, BucketState::Archived { hot_deleted: true } | BucketState::ArchivedPending) {
                    record_step(txn, &mut meta, Step::Erase, now)?;
                    save_meta(txn, &meta)?;
                }
            }
            Ok(())
        })
    }

    /// Replaces buckets' entries of request `request_id`, in one transaction (counts only grow:
    /// an archival may have added to them since the entries were read); finishes the request
    /// when every bucket is done (an `erasure_finished` event with its counts).
    pub fn update_erasure_buckets(&self, request_id: &str, entries: Vec<ErasureBucket>, now: Micros) -> Result<()> {
        let request_id = request_id.to_string();
        self.write(move |txn| {
            let Some(mut request): Option<ErasureRequest> =
                txn.open_table(ERASURES)?.get(request_id.as_str())?.map(|v| decode_value(v.value())).transpose()?
            else {
                return Err(Error::NotFound(format!("erasure request `{request_id}`")));
            };
            for mut entry in entries {
                if let Some(slot) = request.buckets.iter_mut().find(|b| b.bucket == entry.bucket) {
                    entry.hot_rows_erased = entry.hot_rows_erased.max(slot.hot_rows_erased);
                    entry.archived_rows_erased = entry.archived_rows_erased.max(slot.archived_rows_erased);
                    *slot = entry;
                }
            }
            if request.finish_if_done(now) {
                push_outbox(txn, "erasure_finished", None, now, request.counts())?;
                txn.open_table(UNRECEIPTED_ERASURES)?.insert(request.id.as_str(), ())?;
            }
            save_request(txn, &request)
        })
    }

    /// The keys this data directory released under `folders` (a bucket's folders), to delete
    /// now rather than after the sweep's grace.
    pub fn released_under(&self, table: &str, folders: &[String]) -> Result<Vec<ReleasedKey>> {
        let txn = self.read()?;
        let released = txn.open_table(RELEASED)?;
        let mut out = Vec::new();
        for entry in released.iter()? {
            let key: ReleasedKey = decode_value(entry?.1.value())?;
            if key.table == table && folders.iter().any(|f| key.key.starts_with(f.as_str())) {
                out.push(key);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: &str, event_time: Micros, sort_key: &str, tenant: Option<&str>) -> Record {
        Record {
            partition_key: partition.as_bytes().to_vec(),
            event_time,
            sort_key: sort_key.as_bytes().to_vec(),
            tenant: tenant.map(str::to_string),
            kind: None,
            body: "{}".into(),
        }
    }

    #[test]
    fn a_keyed_selector_names_exactly_the_records_its_clear_form_names() {
        let key = FleetKey::from_material(b"a fleet key of at least thirty-two bytes").unwrap();
        fleet_key::register(&key);
        let records = [
            record("site-a/sensor 0%=é", 10, "k/1", Some("acme")),
            record("site-a/sensor 0%=é", 20, "k/2", Some("globex")),
            record("site-b", 10, "k/1", Some("acme")),
            record("site-b", 30, "k/3", None),
        ];
        let selectors = [
            ErasureSelector { tenant: Some("acme".into()), ..Default::default() },
            ErasureSelector { partition_key: Some("site-a/sensor 0%=é".into()), to: Some(15), ..Default::default() },
            ErasureSelector {
                identities: vec![RecordIdentity {
                    partition_key: "site-b".into(),
                    event_time: 30,
                    sort_key: "k/3".into(),
                }],
                ..Default::default()
            },
        ];
        for clear in selectors {
            let keyed = clear.keyed_by(&key);
            assert_eq!(keyed.keyed.as_deref(), Some(key.id()));
            let text = serde_json::to_string(&keyed).unwrap();
            assert!(!["acme", "site-", "k/3"].iter().any(|v| text.contains(v)), "clear values in {text}");
            assert_eq!(keyed.keyed_by(&key), keyed, "keying twice changes nothing");
            keyed.check().unwrap();
            for r in &records {
                assert_eq!(keyed.matches_record("t", r), clear.matches_record("t", r), "{clear:?} on {r:?}");
            }
            assert!(records.iter().any(|r| keyed.matches_record("t", r)), "{clear:?} names a record");
        }
    }

    #[test]
    fn a_selector_keyed_by_a_key_this_engine_lacks_is_refused_with_the_setting_to_give() {
        let selector = ErasureSelector {
            tenant: Some("ab".repeat(32)),
            keyed: Some("00ff00ff00ff00ff".into()),
            ..Default::default()
        };
        let why = selector.check().unwrap_err();
        assert!(why.contains("fleet key 00ff00ff00ff00ff") && why.contains("--share-erasures"), "{why}");
    }
}
