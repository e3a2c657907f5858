//! Erasure across a fleet: engines that share a target learn each other's erasure requests
//! from it and leave their receipts beside them, so a request placed on one engine reaches
//! every installation's archives while each deletes only its own objects (the ownership rule).
//!
//! An engine started with `--share-erasures` (`ARCHIVER_SHARE_ERASURES`); off by default, as
//! a request taken up erases what matches when it is taken up: a copy of a data directory
//! restored beside the one that went on would apply the other copy's requests to records
//! appended since. On each target of its tables, at the start of every pass, an engine lists
//! `_frostline-erasures/` (nothing is written there while no request exists) and
//! - writes every request of its own store that the target lacks
//!   (`_frostline-erasures/<id>/request.json`: the selector, its tenant, partition and sort
//!   keys as HMAC-SHA256 digests under the fleet's key (`store::fleet_key`), and when and where
//!   it was placed; never the reason or the requester, which may name the person too);
//! - places every request it finds there that its store lacks and that was placed after this
//!   installation began (`store::Store::installation_since`), which its passes then carry
//!   out on its own hot rows and archives like any other, matching records by digesting
//!   their values under the same key (a request under another key is named and skipped). A
//!   request placed before it began is passed over: the host had no record then, and would
//!   otherwise erase records appended since that nobody asked to erase (a host that joins the
//!   fleet, or whose data directory is rebuilt, after a request for a tenant that comes back),
//!   with a receipt that says so (`began_after`);
//! - leaves a receipt for each request its store has finished
//!   (`_frostline-erasures/<id>/receipt-<installation>.json`: counts and times, never the
//!   selector or a record), and, for the archives it adopted from a lost installation that
//!   had not carried a request out (`archive::adopt` places a request for exactly the records
//!   they still owe, `AnswersFor`), the receipt in that installation's name once those
//!   requests have finished (`left_by`).
//!
//! Which installations share a target is read from the archives there (the installation in
//! every manifest's name) when a request's progress is asked for, so an installation that has
//! archived to the target and left no receipt is named as behind, even one that was stopped
//! before the request was placed.
//!
//! Objects are created only if absent and never rewritten, so engines racing each other need
//! no coordination. A request stays on the target as long as the receipts beside it; it names
//! what was erased only by digests, which tell nothing without the fleet's key (ARCHITECTURE.md,
//! "Erasure", what stays). An engine that was stopped when a request was placed picks it up on
//! its first pass after it starts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::blocking;
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::model::Micros;
use crate::storage::{ArchiveBackend, PutOutcome};
use crate::store::erasure::{AnswersFor, ErasureProgress, ErasureRequest, ErasureSelector};
pub use crate::store::erasure::{FleetProgress, SharedReceipt};

/// Where requests, receipts and the installations that share a target live, below its root.
pub const SHARED_ERASURES_PREFIX: &str = "_frostline-erasures/";
/// The longest request id taken from a target (ids this engine makes are 14 characters).
pub const SHARED_ID_BYTES_MAX: usize = 64;

/// A request as the target carries it: its selector keyed by the fleet's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedRequest {
    pub id: String,
    pub selector: ErasureSelector,
    pub placed_at: Micros,
    /// The installation it was placed on.
    pub placed_by: String,
}

fn json(value: &impl Serialize) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::Internal(format!("cannot encode a shared erasure object: {e}")))
}

fn request_key(id: &str) -> String {
    format!("{SHARED_ERASURES_PREFIX}{id}/request.json")
}

fn receipt_key(id: &str, installation: &str) -> String {
    format!("{SHARED_ERASURES_PREFIX}{id}/receipt-{installation}.json")
}

/// A request id from a target is a folder name this engine made: letters, digits, `-`, `_`.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= SHARED_ID_BYTES_MAX
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Every distinct target of the policy set's tables.
fn targets(ctx: &Context) -> Vec<Arc<dyn ArchiveBackend>> {
    let mut seen = BTreeSet::new();
    ctx.policies.tables.values().map(|t| t.backend.clone()).filter(|b| seen.insert(b.target().to_string())).collect()
}

/// Creates `key` with `bytes` unless it exists (then it is left as it is), once per life of
/// this engine per target and key.
async fn create_once(ctx: &Context, backend: &dyn ArchiveBackend, key: &str, bytes: Vec<u8>) -> Result<()> {
    let remembered = format!("{}\n{key}", backend.target());
    if ctx.memory().shared_erasure_keys.lock().expect("shared erasure keys").contains(&remembered) {
        return Ok(());
    }
    match backend.put_create(key, bytes.into()).await? {
        PutOutcome::Created | PutOutcome::AlreadyExists => {}
    }
    ctx.memory().shared_erasure_keys.lock().expect("shared erasure keys").insert(remembered);
    Ok(())
}

/// One exchange with every target (module documentation); returns the requests placed here
/// from a target. A target that cannot be reached is skipped with its error, the others go on.
/// Once every target has the receipts of the requests this store has finished, the manifests
/// written from then on no longer name those requests (`store::schema::UNRECEIPTED_ERASURES`).
pub async fn exchange(ctx: &Arc<Context>) -> (u64, Vec<String>) {
    let store = ctx.store.clone();
    let mine: Vec<ErasureRequest> = match blocking(move || store.erasures()).await {
        Ok(mine) => mine,
        Err(e) => return (0, vec![format!("shared erasures: {e}")]),
    };
    let mut placed = 0;
    let mut errors = Vec::new();
    for backend in targets(ctx) {
        match exchange_with(ctx, backend.as_ref(), &mine).await {
            Ok(n) => placed += n,
            Err(e) => errors.push(format!("shared erasures on {}: {e}", backend.target())),
        }
    }
    if errors.is_empty() {
        let finished = mine.iter().filter(|r| !r.is_open()).map(|r| r.id.clone()).collect();
        let store = ctx.store.clone();
        if let Err(e) = blocking(move || store.erasure_receipts_left(finished)).await {
            errors.push(format!("shared erasures: {e}"));
        }
    }
    (placed, errors)
}

async fn exchange_with(ctx: &Arc<Context>, backend: &dyn ArchiveBackend, mine: &[ErasureRequest]) -> Result<u64> {
    let me = ctx.installation_id.clone();
    let fleet_key = ctx.fleet_key().ok_or_else(|| Error::Internal("shared erasures without a fleet key".into()))?;
    let listed: BTreeSet<String> =
        backend.list(SHARED_ERASURES_PREFIX).await?.into_iter().map(|object| object.key).collect();
    let known: BTreeSet<&str> = mine.iter().map(|r| r.id.as_str()).collect();
    let store = ctx.store.clone();
    let since = blocking(move || store.installation_since()).await?;
    // Requests on the target that this store lacks.
    let mut placed = 0;
    for listed_key in &listed {
        let Some(id) =
            listed_key.strip_prefix(SHARED_ERASURES_PREFIX).and_then(|rest| rest.strip_suffix("/request.json"))
        else {
            continue;
        };
        let passed_over = format!("{}\n{listed_key}", backend.target());
        if known.contains(id)
            || !valid_id(id)
            || ctx.memory().shared_erasure_keys.lock().expect("shared erasure keys").contains(&passed_over)
        {
            continue;
        }
        let Some(shared) = read_request(backend, listed_key, id).await? else { continue };
        if shared.selector.keyed.as_deref() != Some(fleet_key.id()) {
            tracing::warn!(
                key = %listed_key, request_key = ?shared.selector.keyed, fleet_key = fleet_key.id(),
                "a shared erasure request is keyed by another fleet key than this engine's; skipped: give every \
                 host of the fleet the same key file"
            );
            continue;
        }
        if shared.placed_at < since {
            // Placed before this installation began (a host that joined the fleet later, a
            // data directory rebuilt since): none of its records were there to be erased, and
            // taking the request up now would erase records appended since, which nobody asked
            // for. Passed over for the rest of this life, said once, and receipted as such (the
            // archives this host adopted from a lost installation answer for themselves:
            // `archive::adopt`).
            tracing::info!(
                request = %shared.id, placed_by = %shared.placed_by, placed_at = shared.placed_at, since,
                "a shared erasure request placed before this installation began is not taken up"
            );
            if !listed.contains(&receipt_key(&shared.id, &me)) {
                let receipt = SharedReceipt {
                    installation: me.clone(),
                    request: shared.id.clone(),
                    finished_at: ctx.clock.now(),
                    buckets: 0,
                    hot_rows_erased: 0,
                    archived_rows_erased: 0,
                    objects_deleted: 0,
                    versions_kept_on: Vec::new(),
                    began_after: true,
                    left_by: None,
                };
                create_once(ctx, backend, &receipt_key(&shared.id, &me), json(&receipt)?).await?;
            }
            ctx.memory().shared_erasure_keys.lock().expect("shared erasure keys").insert(passed_over);
            continue;
        }
        let request = ErasureRequest {
            id: shared.id,
            selector: shared.selector,
            reason: format!("shared on {} by installation {}", backend.target(), shared.placed_by),
            requester: format!("installation {}", shared.placed_by),
            placed_at: 0,
            finished_at: None,
            buckets: Vec::new(),
            fleet: Vec::new(),
            answers_for: None,
        };
        let (store, now) = (ctx.store.clone(), ctx.clock.now());
        let request = blocking(move || store.place_erasure(request, now)).await?;
        tracing::info!(
            request = %request.id, placed_by = %shared.placed_by, buckets = request.buckets.len(),
            "erasure request placed from the shared target"
        );
        placed += 1;
    }
    // This store's requests the target lacks, and receipts for those it finished.
    let mut answering: BTreeMap<&AnswersFor, Vec<&ErasureRequest>> = BTreeMap::new();
    for request in mine {
        if let Some(answers_for) = &request.answers_for {
            answering.entry(answers_for).or_default().push(request);
            continue;
        }
        let key = request_key(&request.id);
        if !listed.contains(&key) {
            let shared = SharedRequest {
                id: request.id.clone(),
                selector: request.selector.keyed_by(fleet_key),
                placed_at: request.placed_at,
                placed_by: me.clone(),
            };
            create_once(ctx, backend, &key, json(&shared)?).await?;
        }
        let Some(finished_at) = request.finished_at else { continue };
        let key = receipt_key(&request.id, &me);
        if !listed.contains(&key) {
            let receipt = receipt_of(&[request], &me, finished_at);
            create_once(ctx, backend, &key, json(&receipt)?).await?;
        }
    }
    // The receipt of a lost installation whose adopted archives this host erased: once every
    // request answering for it has finished, on the target that carries the shared request.
    for (answers_for, requests) in answering {
        let key = receipt_key(&answers_for.request, &answers_for.installation);
        let Some(finished_at) = requests.iter().map(|r| r.finished_at).collect::<Option<Vec<_>>>() else { continue };
        if listed.contains(&key) || !listed.contains(&request_key(&answers_for.request)) {
            continue;
        }
        let mut receipt =
            receipt_of(&requests, &answers_for.installation, finished_at.into_iter().max().unwrap_or_default());
        receipt.request = answers_for.request.clone();
        receipt.left_by = Some(me.clone());
        create_once(ctx, backend, &key, json(&receipt)?).await?;
    }
    Ok(placed)
}

/// Request `id` as `key` on a target holds it; `None` (said in a warning) when it cannot be
/// read or names another id: one unreadable request must not stop the others.
async fn read_request(backend: &dyn ArchiveBackend, key: &str, id: &str) -> Result<Option<SharedRequest>> {
    let Some(bytes) = backend.get(key).await? else { return Ok(None) };
    match serde_json::from_slice::<SharedRequest>(&bytes) {
        Ok(shared) if shared.id == id => Ok(Some(shared)),
        Ok(shared) => {
            tracing::warn!(key = %key, named = %shared.id, "a shared erasure request names another id; skipped");
            Ok(None)
        }
        Err(e) => {
            tracing::warn!(
                key = %key, error = %e,
                "a shared erasure request cannot be read (one written before requests were keyed names its \
                 values in clear: place it again on an engine of this build); skipped"
            );
            Ok(None)
        }
    }
}

/// A request on a shared target and the installations that left a receipt for it, each with
/// when it finished the request where its receipt was read (`requests_on`).
#[derive(Debug, Clone)]
pub struct SharedOnTarget {
    pub request: SharedRequest,
    pub receipts: BTreeMap<String, Option<Micros>>,
}

impl SharedOnTarget {
    /// Takes in what another target says of the same request. Of two receipts of one
    /// installation (its own on one target, another host's `left_by` on another), the earlier
    /// time is kept: a receipt answers for the archives written after it, and the later one
    /// would leave out archives the installation wrote lawfully after it had finished.
    pub fn merge(&mut self, other: SharedOnTarget) {
        for (installation, finished_at) in other.receipts {
            let known = self.receipts.entry(installation).or_insert(finished_at);
            *known = match (*known, finished_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
}

/// Every readable request on `backend`, with the installations that finished it; the receipts
/// of `read_receipts_of` are read for when they finished (`None` where one cannot be read, said
/// in a warning).
pub async fn requests_on(backend: &dyn ArchiveBackend, read_receipts_of: &[String]) -> Result<Vec<SharedOnTarget>> {
    let listed: Vec<String> = backend.list(SHARED_ERASURES_PREFIX).await?.into_iter().map(|o| o.key).collect();
    let mut out = Vec::new();
    for key in &listed {
        let Some(id) = key.strip_prefix(SHARED_ERASURES_PREFIX).and_then(|rest| rest.strip_suffix("/request.json"))
        else {
            continue;
        };
        if !valid_id(id) {
            continue;
        }
        let Some(request) = read_request(backend, key, id).await? else { continue };
        let folder = format!("{SHARED_ERASURES_PREFIX}{id}/receipt-");
        let mut receipts = BTreeMap::new();
        for (receipt_key, installation) in
            listed.iter().filter_map(|k| Some((k, k.strip_prefix(folder.as_str())?.strip_suffix(".json")?)))
        {
            let finished_at = if read_receipts_of.iter().any(|named| named == installation) {
                read_receipt(backend, receipt_key).await?.map(|r| r.finished_at)
            } else {
                None
            };
            receipts.insert(installation.to_string(), finished_at);
        }
        out.push(SharedOnTarget { request, receipts });
    }
    Ok(out)
}

/// The receipt at `key`; `None` (said in a warning) when it is gone or cannot be read.
async fn read_receipt(backend: &dyn ArchiveBackend, key: &str) -> Result<Option<SharedReceipt>> {
    let Some(bytes) = backend.get(key).await? else { return Ok(None) };
    match serde_json::from_slice::<SharedReceipt>(&bytes) {
        Ok(receipt) => Ok(Some(receipt)),
        Err(e) => {
            tracing::warn!(key = %key, error = %e, "a shared erasure receipt cannot be read; its time is not known");
            Ok(None)
        }
    }
}

/// The receipt of `requests` (one request, or those answering for one lost installation).
fn receipt_of(requests: &[&ErasureRequest], installation: &str, finished_at: Micros) -> SharedReceipt {
    let buckets = || requests.iter().flat_map(|r| r.buckets.iter());
    let mut versions_kept_on: Vec<String> = buckets().flat_map(|b| b.versions_kept_on.iter().cloned()).collect();
    versions_kept_on.sort();
    versions_kept_on.dedup();
    SharedReceipt {
        installation: installation.to_string(),
        request: requests.first().map(|r| r.id.clone()).unwrap_or_default(),
        finished_at,
        buckets: buckets().filter(|b| b.progress == ErasureProgress::Done).count() as u64,
        hot_rows_erased: buckets().map(|b| b.hot_rows_erased).sum(),
        archived_rows_erased: buckets().map(|b| b.archived_rows_erased).sum(),
        objects_deleted: buckets().map(|b| b.deleted_objects.len() as u64).sum(),
        versions_kept_on,
        began_after: false,
        left_by: None,
    }
}

/// The installations whose manifests lie in the folders of this policy set's tables on
/// `backend` (a listing of every table's archive: what a status read costs).
async fn installations_archiving(ctx: &Context, backend: &dyn ArchiveBackend) -> Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    for table in ctx.policies.tables.keys() {
        for folder in crate::storage::keys::table_folders(table) {
            for object in backend.list(&folder).await? {
                if let Some(origin) = crate::storage::keys::origin(&object.key)
                    && origin.generation.is_some()
                    && !origin.installation.is_empty()
                {
                    found.insert(origin.installation.to_string());
                }
            }
        }
    }
    Ok(found)
}

/// What every target of the policy set says of request `id`: the installations that left a
/// receipt, and those that archived there and have not.
pub async fn progress(ctx: &Arc<Context>, id: &str) -> Result<Vec<FleetProgress>> {
    let mut out = Vec::new();
    for backend in targets(ctx) {
        let folder = format!("{SHARED_ERASURES_PREFIX}{id}/");
        if !valid_id(id) || backend.get(&request_key(id)).await?.is_none() {
            continue;
        }
        let mut finished = Vec::new();
        for object in backend.list(&folder).await? {
            if object.key.rsplit('/').next().is_some_and(|name| name.starts_with("receipt-"))
                && let Some(bytes) = backend.get(&object.key).await?
            {
                finished.push(serde_json::from_slice::<SharedReceipt>(&bytes).map_err(|e| {
                    Error::Corruption(format!("shared erasure receipt `{}` cannot be read: {e}", object.key))
                })?);
            }
        }
        let done: BTreeSet<&str> = finished.iter().map(|r| r.installation.as_str()).collect();
        let behind = installations_archiving(ctx, backend.as_ref())
            .await?
            .into_iter()
            .filter(|installation| !done.contains(installation.as_str()))
            .collect();
        out.push(FleetProgress { target: backend.target().to_string(), finished, behind });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_target(receipts: &[(&str, Option<Micros>)]) -> SharedOnTarget {
        let request = SharedRequest {
            id: "e-1".into(),
            selector: ErasureSelector::default(),
            placed_at: 0,
            placed_by: "placer".into(),
        };
        SharedOnTarget { request, receipts: receipts.iter().map(|(i, t)| (i.to_string(), *t)).collect() }
    }

    /// An installation's own receipt on one target and another host's `left_by` receipt in its
    /// name on another: the earlier time answers, whichever target is read first, so archives
    /// the installation wrote lawfully after finishing are never taken for ones it left.
    #[test]
    fn merging_two_targets_keeps_each_installations_earliest_receipt() {
        for (first, second) in [(Some(10), Some(50)), (Some(50), Some(10)), (None, Some(10)), (Some(10), None)] {
            let mut merged = on_target(&[("lost", first), ("other", Some(7))]);
            merged.merge(on_target(&[("lost", second), ("third", None)]));
            assert_eq!(merged.receipts["lost"], Some(10), "{first:?} then {second:?}");
            assert_eq!(merged.receipts["other"], Some(7));
            assert_eq!(merged.receipts["third"], None);
        }
    }
}
