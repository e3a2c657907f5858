//! The bucket listings: a table's buckets as they stand, and the retention report (why each
//! bucket is where it is in its lifecycle, which holds cover it, what happens next). Both are
//! ordered by bucket start, then partition, and cut to a page; times are RFC 3339.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::model::BucketState;
use crate::model::time::format_rfc3339;
use crate::store::schema::BucketMeta;

/// Which buckets of a table to list.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BucketsRequest {
    pub table: String,
    /// Only buckets in this state (`BucketState::name`).
    pub state: Option<String>,
    /// Only buckets of this partition.
    pub partition: Option<String>,
    /// At most this many (the rest is reported as `truncated`).
    pub limit: usize,
}

/// Which bucket, its time range and where it stands: the first fields of every listing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BucketPlace {
    pub partition_key: String,
    pub bucket_key: String,
    pub start: String,
    pub end: String,
    pub state: String,
    pub state_since: String,
}

impl BucketPlace {
    fn of(b: &BucketMeta) -> BucketPlace {
        BucketPlace {
            partition_key: String::from_utf8_lossy(&b.id.partition_key).into_owned(),
            bucket_key: b.id.bucket_key.clone(),
            start: format_rfc3339(b.descriptor.start),
            end: format_rfc3339(b.descriptor.end),
            state: b.state.name().to_string(),
            state_since: format_rfc3339(b.state_since),
        }
    }
}

/// One bucket as it stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BucketView {
    #[serde(flatten)]
    pub place: BucketPlace,
    pub generation: u64,
    pub rows: u64,
    pub bytes: u64,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<String>,
    pub attempts: u32,
    pub next_retry_at: Option<String>,
    pub last_error: Option<String>,
    pub due_at: Option<String>,
    pub manifest_key: Option<String>,
    pub archived_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BucketsPage {
    pub table: String,
    pub buckets: Vec<BucketView>,
    /// More buckets matched than `limit`.
    pub truncated: bool,
}

/// The state a listing asks for, by name; an unknown name says which exist.
fn parse_state(name: &str) -> Result<BucketState> {
    BucketState::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
        Error::InvalidInput(format!(
            "unknown state `{name}`; use one of {}",
            BucketState::ALL.map(|s| s.name()).join(", ")
        ))
    })
}

/// A table's (or one partition's) buckets in `state` (any when `None`), by start then
/// partition, cut to `limit`; whether more matched.
///
/// Each way reads about what it returns: one partition's page from the index by start (and one
/// more, to tell whether it is the last); one state's page from the tallies' index by state
/// and start; and otherwise the table's from the index by end, until no later bucket can start
/// before the page's last.
fn ordered_page(
    engine: &Engine,
    table: &str,
    partition: Option<&str>,
    state: Option<BucketState>,
    limit: usize,
) -> Result<(Vec<BucketMeta>, bool)> {
    let snapshot = engine.store().snapshot()?;
    let in_state = |b: &BucketMeta| state.is_none_or(|s| b.state == s);
    if let Some(partition) = partition {
        let mut metas =
            snapshot.partition_buckets_by_start(table, partition.as_bytes(), limit.saturating_add(1), in_state)?;
        let truncated = metas.len() > limit;
        metas.truncate(limit);
        return Ok((metas, truncated));
    }
    let Some(state) = state else {
        return snapshot.table_buckets_by_start(table, limit);
    };
    snapshot.buckets_in_state_by_start(table, state, limit)
}

/// Lists a table's buckets (reads the store: call it on a blocking thread).
pub fn list(engine: &Engine, request: BucketsRequest) -> Result<BucketsPage> {
    let wanted = request.state.as_deref().map(parse_state).transpose()?;
    let (metas, truncated) = ordered_page(engine, &request.table, request.partition.as_deref(), wanted, request.limit)?;
    let buckets = metas
        .into_iter()
        .map(|b| BucketView {
            place: BucketPlace::of(&b),
            generation: b.generation,
            rows: b.row_count,
            bytes: b.byte_count,
            lease_expires_at: b.lease_owner.as_ref().map(|_| format_rfc3339(b.lease_expires_at)),
            lease_owner: b.lease_owner,
            attempts: b.attempts,
            next_retry_at: b.next_retry_at.map(format_rfc3339),
            last_error: b.last_error,
            due_at: b.due_at.map(format_rfc3339),
            manifest_key: b.manifest_key,
            archived_at: b.archived_at.map(format_rfc3339),
        })
        .collect();
    Ok(BucketsPage { table: request.table, buckets, truncated })
}

/// Which buckets the retention report covers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RetentionRequest {
    pub table: String,
    pub partition: Option<String>,
    pub limit: usize,
}

/// Why a bucket is where it is in its lifecycle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetentionEntry {
    #[serde(flatten)]
    pub place: BucketPlace,
    /// The retention policy's plan (none until the bucket is planned).
    pub archive_at: Option<String>,
    pub expire_at: Option<String>,
    pub reason: Option<String>,
    /// Holds that stopped this bucket's expiry.
    pub held_by: Vec<String>,
    /// Every hold (placed or policy-declared) that covers the bucket now.
    pub holds: Vec<String>,
    pub archived_at: Option<String>,
    pub hot_deleted_at: Option<String>,
    /// From the expiry's tombstone.
    pub expired_at: Option<String>,
    pub expiry_reason: Option<String>,
    /// When the next action is due, and what it is (`model::lifecycle::next_step`).
    pub due_at: Option<String>,
    pub next: String,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetentionPage {
    pub table: String,
    pub buckets: Vec<RetentionEntry>,
    pub truncated: bool,
}

/// The retention report of a table (reads the store: call it on a blocking thread).
pub fn retention(engine: &Engine, request: RetentionRequest) -> Result<RetentionPage> {
    let (metas, truncated) = ordered_page(engine, &request.table, request.partition.as_deref(), None, request.limit)?;
    // The stored holds include the policy directory's (synced at every reload): adding the
    // policy's again would list each of them twice.
    let mut holds = engine.store().holds()?;
    holds.retain(|h| h.table == request.table);
    // The page's own tombstones, not every table's.
    let mut tombstones = HashMap::new();
    for meta in &metas {
        if let Some(tombstone) = engine.store().tombstone(&meta.id)? {
            tombstones.insert(meta.id.clone(), tombstone);
        }
    }
    let buckets = metas
        .into_iter()
        .map(|b| {
            let covering: Vec<String> = holds.iter().filter(|h| h.covers(&b)).map(|h| h.id.clone()).collect();
            let tombstone = tombstones.get(&b.id);
            let plan = b.plan.as_ref();
            let held = !covering.is_empty() || !b.held_by.is_empty();
            RetentionEntry {
                place: BucketPlace::of(&b),
                archive_at: plan.and_then(|p| p.archive_at).map(format_rfc3339),
                expire_at: plan.and_then(|p| p.expire_at).map(format_rfc3339),
                reason: plan.map(|p| p.reason.clone()),
                next: crate::model::lifecycle::next_step(b.state, plan, held).to_string(),
                held_by: b.held_by.clone(),
                holds: covering,
                archived_at: b.archived_at.map(format_rfc3339),
                hot_deleted_at: b.hot_deleted_at.map(format_rfc3339),
                expired_at: tombstone.map(|t| format_rfc3339(t.expired_at)),
                expiry_reason: tombstone.map(|t| t.reason.clone()),
                due_at: b.due_at.map(format_rfc3339),
                last_error: b.last_error.clone(),
            }
        })
        .collect();
    Ok(RetentionPage { table: request.table, buckets, truncated })
}
