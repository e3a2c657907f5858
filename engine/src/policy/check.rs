//! `frostline policy check`: a policy directory validated exactly as a reload would validate it
//! (parsed, plugins compiled, initialised and checked, targets probed, then checked against the
//! store: strategies unchanged, no target dropped that still holds archives), and, against a
//! data directory, the re-plan it would cause: which buckets would archive or expire earlier or
//! later, by how much, and which are protected by holds. Nothing is written to the store.
//!
//! The checks against the store are the ones `reload` runs before it swaps a set in, so a
//! directory that passes here passes there (unless the store changes in between).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{PolicySet, TablePolicy};
use crate::error::{Error, Result};
use crate::model::{BucketState, Micros, RetentionPlan};
use crate::store::Store;
use crate::store::schema::{BucketMeta, Hold};

/// Changed buckets listed in a preview at most (the counts cover them all).
pub const PREVIEW_CHANGES_LISTED_MAX: usize = 1_000;
/// Buckets asked of a retention policy per call.
const PREVIEW_BATCH_BUCKETS: usize = 1_000;

/// What a policy set would do to the store's buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplanPreview {
    pub tables: Vec<TablePreview>,
    /// The buckets whose plan would change (at most `PREVIEW_CHANGES_LISTED_MAX`).
    pub changes: Vec<PlanChange>,
    /// More changes than were listed.
    pub changes_truncated: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TablePreview {
    pub table: String,
    /// Buckets whose next step the plan decides (hot, or archived and cleaned).
    pub buckets_checked: u64,
    pub unchanged: u64,
    pub archive_earlier: u64,
    pub archive_later: u64,
    pub expire_earlier: u64,
    pub expire_later: u64,
    /// Buckets whose changed expiry a hold would stop.
    pub held: u64,
    /// Buckets the new policy refuses to plan (they would wait, planned as now).
    pub refused: u64,
}

/// One bucket whose plan would change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanChange {
    pub bucket: String,
    pub state: String,
    pub archive_at: (Option<Micros>, Option<Micros>),
    pub expire_at: (Option<Micros>, Option<Micros>),
    /// New minus old archive time in seconds (none when either side is "never").
    pub archive_shift_seconds: Option<i64>,
    pub expire_shift_seconds: Option<i64>,
    /// Holds that would cover the bucket: its archive is kept whatever the plan says.
    pub held_by: Vec<String>,
    pub reason: String,
}

/// The checks `reload` makes of a new set against the store: a table's strategy never
/// changes, and no target that still holds archives of a table may disappear.
pub fn check_against_store(set: &PolicySet, store: &Store) -> Result<()> {
    for (id, table) in &set.tables {
        if let Some(state) = store.table_state(id)? {
            let identity = table.strategy.identity();
            if !state.strategy.same_as(identity) {
                return Err(Error::InvalidInput(format!(
                    "{}: table `{id}` changes its strategy from {} (sha256 {}, config {:?}) to {} (sha256 {}, config {:?}), \
                     but its buckets were made by the first; a strategy never changes: declare a new table id and migrate",
                    table.file.display(),
                    state.strategy.name,
                    &state.strategy.plugin_hash[..12],
                    state.strategy.config,
                    identity.name,
                    &identity.plugin_hash[..12],
                    identity.config
                )));
            }
            // Columns are only added: the archive's older files must agree with the new ones.
            if let Some(recorded) = &state.declaration {
                crate::model::columns::check_evolution(&recorded.columns, table.columns())
                    .map_err(|e| Error::InvalidInput(format!("{}: table `{id}`: {e}", table.file.display())))?;
            }
        }
    }
    // Archives stay where they were written: a set may move a table to another target, but not
    // drop a target that still holds archives (they could no longer be read, verified or
    // expired).
    for ((table_id, target), buckets) in store.snapshot()?.archive_targets()? {
        let Some(table) = set.tables.get(&table_id) else { continue };
        if let Err(e) = set.archive_backend(table, &target) {
            let shown: Vec<&str> = buckets.iter().take(5).map(String::as_str).collect();
            return Err(Error::InvalidInput(format!(
                "{e}; {} bucket(s) of table `{table_id}` have archives there (for instance {}): keep the target \
                 declared while they exist",
                buckets.len(),
                shown.join(", ")
            )));
        }
    }
    Ok(())
}

/// Asks each table's retention policy of `set` for a plan for every bucket whose next step a
/// plan decides, and compares it with the bucket's plan now. Holds are those the store holds,
/// with the policy directory's own replaced by `set`'s.
pub fn preview(set: &PolicySet, store: &Store, now: Micros) -> Result<ReplanPreview> {
    let mut holds: Vec<Hold> = store.holds()?.into_iter().filter(|h| !h.source.starts_with("policy:")).collect();
    holds.extend(set.holds.iter().cloned());
    let mut out = ReplanPreview::default();
    // One read transaction, streamed a batch at a time: a table of millions of buckets is
    // previewed in the memory of one batch.
    let snapshot = store.snapshot()?;
    for (id, table) in &set.tables {
        let mut summary = TablePreview { table: id.clone(), ..Default::default() };
        let mut batch: Vec<BucketMeta> = Vec::with_capacity(PREVIEW_BATCH_BUCKETS);
        snapshot.visit_table_buckets(id, |meta| {
            if matches!(meta.state, BucketState::Hot | BucketState::Archived { hot_deleted: true }) {
                batch.push(meta);
            }
            if batch.len() == PREVIEW_BATCH_BUCKETS {
                compare_batch(table, &batch, &holds, now, &mut summary, &mut out)?;
                batch.clear();
            }
            Ok(())
        })?;
        if !batch.is_empty() {
            compare_batch(table, &batch, &holds, now, &mut summary, &mut out)?;
        }
        out.tables.push(summary);
    }
    Ok(out)
}

fn compare_batch(
    table: &TablePolicy,
    batch: &[BucketMeta],
    holds: &[Hold],
    now: Micros,
    summary: &mut TablePreview,
    out: &mut ReplanPreview,
) -> Result<()> {
    let facts: Vec<_> = batch.iter().map(BucketMeta::facts).collect();
    let plans = table.retention.plan(now, &facts)?;
    if plans.len() != batch.len() {
        return Err(Error::InvalidInput(format!(
            "table `{}`: the retention policy answered {} plans for {} buckets",
            table.id,
            plans.len(),
            batch.len()
        )));
    }
    for (meta, plan) in batch.iter().zip(plans) {
        summary.buckets_checked += 1;
        let Ok(new) = plan else {
            summary.refused += 1;
            continue;
        };
        let old =
            meta.plan.clone().unwrap_or(RetentionPlan { archive_at: None, expire_at: None, reason: String::new() });
        let archive_matters = meta.state == BucketState::Hot;
        let archive_changed = archive_matters && old.archive_at != new.archive_at;
        let expire_changed = old.expire_at != new.expire_at;
        if !archive_changed && !expire_changed {
            summary.unchanged += 1;
            continue;
        }
        let earlier = |old: Option<Micros>, new: Option<Micros>| match (old, new) {
            (Some(o), Some(n)) => n < o,
            (None, Some(_)) => true,
            _ => false,
        };
        if archive_changed {
            if earlier(old.archive_at, new.archive_at) {
                summary.archive_earlier += 1
            } else {
                summary.archive_later += 1
            }
        }
        if expire_changed {
            if earlier(old.expire_at, new.expire_at) { summary.expire_earlier += 1 } else { summary.expire_later += 1 }
        }
        let held_by: Vec<String> = holds.iter().filter(|h| h.covers(meta)).map(|h| h.id.clone()).collect();
        if expire_changed && !held_by.is_empty() {
            summary.held += 1;
        }
        if out.changes.len() >= super::check::PREVIEW_CHANGES_LISTED_MAX {
            out.changes_truncated = true;
            continue;
        }
        let shift = |old: Option<Micros>, new: Option<Micros>| Some((new? - old?) / 1_000_000);
        out.changes.push(PlanChange {
            bucket: meta.id.display(),
            state: meta.state.to_string(),
            archive_at: (old.archive_at, new.archive_at),
            expire_at: (old.expire_at, new.expire_at),
            archive_shift_seconds: if archive_changed { shift(old.archive_at, new.archive_at) } else { None },
            expire_shift_seconds: if expire_changed { shift(old.expire_at, new.expire_at) } else { None },
            held_by,
            reason: new.reason,
        });
    }
    Ok(())
}

/// The answer of a policy check: whether the directory would be accepted, and what it would
/// re-plan (when checked against a data directory).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    pub dir: String,
    pub accepted: bool,
    /// Why it would be refused (file, field and reason).
    pub error: Option<String>,
    pub tables: Vec<String>,
    pub preview: Option<ReplanPreview>,
    /// The policy holds the reload would release (their `[[hold]]` gone from the directory),
    /// when checked against a data directory.
    #[serde(default)]
    pub released_holds: Vec<Hold>,
}

impl CheckReport {
    pub fn refused(dir: &std::path::Path, error: &Error) -> CheckReport {
        CheckReport {
            dir: dir.display().to_string(),
            accepted: false,
            error: Some(error.to_string()),
            tables: Vec::new(),
            preview: None,
            released_holds: Vec::new(),
        }
    }

    /// Text for a terminal.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut text = String::new();
        let format = |t: Option<Micros>| t.map_or("never".to_string(), crate::model::time::format_rfc3339);
        if !self.accepted {
            let _ = writeln!(text, "REFUSED {}: {}", self.dir, self.error.as_deref().unwrap_or_default());
            return text;
        }
        let _ = writeln!(text, "OK {}: tables {}", self.dir, self.tables.join(", "));
        for hold in &self.released_holds {
            let _ = writeln!(
                text,
                "RELEASES policy hold {} on table `{}` (reason {:?}, from {}): its [[hold]] left the directory",
                hold.id, hold.table, hold.reason, hold.source
            );
        }
        let Some(preview) = &self.preview else {
            let _ = writeln!(text, "(no data directory given: pass --data to see the re-plan it would cause)");
            return text;
        };
        for t in &preview.tables {
            let _ = writeln!(
                text,
                "table {}: {} buckets checked, {} unchanged; archive earlier {} later {}; expire earlier {} later {}; \
                 held {}; refused {}",
                t.table,
                t.buckets_checked,
                t.unchanged,
                t.archive_earlier,
                t.archive_later,
                t.expire_earlier,
                t.expire_later,
                t.held,
                t.refused
            );
        }
        let mut by_bucket: BTreeMap<&str, &PlanChange> = BTreeMap::new();
        for change in &preview.changes {
            by_bucket.insert(&change.bucket, change);
        }
        for change in by_bucket.values() {
            let _ = write!(text, "  {} ({})", change.bucket, change.state);
            if change.archive_at.0 != change.archive_at.1 && change.state == "hot" {
                let _ = write!(text, " archive {} -> {}", format(change.archive_at.0), format(change.archive_at.1));
            }
            if change.expire_at.0 != change.expire_at.1 {
                let _ = write!(text, " expire {} -> {}", format(change.expire_at.0), format(change.expire_at.1));
            }
            if !change.held_by.is_empty() {
                let _ = write!(text, " [held by {}]", change.held_by.join(", "));
            }
            text.push('\n');
        }
        if preview.changes_truncated {
            let _ = writeln!(text, "  ... (more changes than {PREVIEW_CHANGES_LISTED_MAX}; --json lists the first)");
        }
        text
    }
}

/// Loads `dir` as a reload would and checks it against `store` when given, with the re-plan
/// preview. A refusal is an answer (`accepted: false`), not an error.
pub fn check_dir(
    dir: &std::path::Path,
    data_dir: &std::path::Path,
    host: &crate::plugin::PluginHost,
    settings: &crate::settings::Settings,
    store: Option<&Store>,
    now: Micros,
) -> CheckReport {
    let outcome = (|| {
        let mut set = super::load(dir, data_dir, host, settings)?;
        let (preview, released_holds) = match store {
            Some(store) => {
                super::retired::restore(&mut set, &store.table_states()?, host, data_dir);
                check_against_store(&set, store)?;
                (Some(preview(&set, store, now)?), super::released_holds(store.holds()?, &set))
            }
            None => (None, Vec::new()),
        };
        Ok::<_, Error>((set.tables.keys().cloned().collect(), preview, released_holds))
    })();
    match outcome {
        Ok((tables, preview, released_holds)) => {
            CheckReport { dir: dir.display().to_string(), accepted: true, error: None, tables, preview, released_holds }
        }
        Err(e) => CheckReport::refused(dir, &e),
    }
}
