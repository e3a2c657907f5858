//! `frostline adopt`: takes in the archives on a table's targets that the database does not
//! record, so that a data directory rebuilt from nothing, or restored from a backup while its
//! other copy went on archiving, reads, verifies and expires them again instead of leaving
//! them stranded (or, before the sweep's guard, deleting them as orphans).
//!
//! Every declared table's folder is listed on every target of the policy directory (a table's
//! archives may lie on a target it has since left). Of each bucket folder's manifests, over
//! every target together, the newest archive (the head of a chain of generations, the one
//! written last: `adoption_order`) is read back and verified whole, a segment at a time
//! (content address, every segment's hash and row checksum, the rows lie in the bucket and its
//! partition, the manifest's own target resolves to the one it was found on); if it fails, the
//! next one is tried; the archive's rows are never held together, so a bucket larger than the
//! host's memory is adopted as any other. `store::adopt` then records it in one transaction. A
//! folder holding manifests of two installations is a conflict (two writers of one table;
//! which one is the archive is for an operator to say) and is left alone, as is every bucket
//! whose database record the archive cannot stand in for. A dry run verifies and reports
//! without recording. Run it with the engine stopped: it is a local command on the data
//! directory.
//!
//! Archives of another installation, in any layout, are taken in only when the operator names
//! it (`--from-installation`: a lost host): on a shared target the others belong to live
//! peers, whose retention and holds answer for them. Taking in a named installation's archives
//! on a target first leaves a claim there (`_frostline-adoptions/<installation>/<adopter>.json`,
//! created only if absent), and adoption is refused while another installation's claim stands
//! that is not itself named as lost: two hosts never both answer for one installation's
//! archives (two that claim at once both see the other's claim, withdraw their own and stop).
//!
//! A lost installation's archives also owe the fleet's erasure requests it had not carried
//! out: for each shared request on the targets that it began before, whose receipt does not
//! answer for the archive (it answers only for archives written after the request finished:
//! `receipt_answers_for`), and whose manifest does not name among those its generation answers
//! for (`format::manifest::ErasuresAnswered`), the records the request names in the archive are
//! erased here, by a request for exactly their identities (`place_owed`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};

use super::{blocking, fleet_erase, read_manifest, read_segment};
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::model::BucketState;
use crate::model::rows::RowSummer;
use crate::storage::{ArchiveBackend, keys};
use crate::store::erasure::{AnswersFor, ERASURE_IDENTITIES_MAX, ErasureRequest, ErasureSelector, RecordIdentity};
use crate::store::schema::BucketId;
use crate::store::{Adoption, AdoptionScratch, ArchiveFacts, HotRowsHeld, KnownKey, ListedManifest, VerifiedArchive};

/// Objects adoption takes from a listing at a time.
const LISTING_PAGE_OBJECTS: usize = 1_000;
/// Manifests (whole folders of them) adoption weighs per read of the scratch database.
const FOLDER_PAGE_MANIFESTS: usize = 1_000;
/// Recorded archives checked against the listings per read of the store.
const PUBLISHED_PAGE_BUCKETS: usize = 1_000;

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct AdoptReport {
    pub dry_run: bool,
    /// Bucket folders holding at least one manifest, over every table and target.
    pub folders: u64,
    /// Archives recorded as their bucket's (in a dry run: that would be).
    pub adopted: u64,
    /// Rows those archives hold.
    pub rows: u64,
    /// Hot rows released because an adopted archive holds each of them.
    pub hot_rows_released: u64,
    /// Folders whose newest verified manifest the database already records.
    pub known: u64,
    /// Manifests of generations a recorded archive replaced (its lineage names them, and it
    /// holds their rows): neither adopted nor a conflict. The sweep deletes them once released.
    pub superseded: u64,
    /// Buckets left alone, and why.
    pub conflicts: Vec<String>,
    /// Manifests that failed verification, and why (an older one of the folder may have been
    /// adopted instead).
    pub failures: Vec<String>,
    /// Installations whose archives lie in a shared Delta table's folders and were left alone
    /// (another host of a fleet, alive or not): named with `--from-installation` to be taken in.
    pub other_installations: BTreeSet<String>,
    /// Archives the database records whose manifest is gone from the target they were
    /// published on (another copy of the data directory expired them, or they were deleted
    /// outside frostline): their buckets are recorded as expired (in a dry run: would be).
    pub gone: Vec<String>,
    /// Shared erasure requests that a lost installation had not carried out on the archives
    /// adopted from it, and the requests placed here to erase what they name in them (in a
    /// dry run: the records they would erase).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub erasures_owed: Vec<String>,
    /// Adopted archives that hold records a shared request names and whose writer (a version
    /// before manifests recorded it) left no word of whether it answered for them: nothing is
    /// erased, and the request should be placed again here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub erasures_unknown: Vec<String>,
}

/// The records of adopted archives that shared requests name and that their lost writers had
/// not erased, by (request, lost installation, table): who placed the request, and the
/// records' identities keyed by the fleet's key.
type Owed = BTreeMap<(String, String, String), (String, Vec<RecordIdentity>)>;

/// Takes in the archives this data directory does not record. Archives of another
/// installation, in any layout, are taken in only when it is named in `from_installations` (a
/// lost host) and no live host holds a claim on them: adopting a live host's archives would make
/// two engines answer for them.
pub async fn adopt(ctx: &Arc<Context>, dry_run: bool, from_installations: &[String]) -> Result<AdoptReport> {
    let policies = ctx.policies.clone();
    // The manifest keys the database records, and those that are no candidates: a generation
    // a recorded archive replaced holds no row that archive lacks (but those an erasure took
    // out), and a key this directory released is its own leftover, even once the archive that
    // replaced it has expired and it names a segment the expiry deleted. They wait in a scratch
    // database with what the listings find, so adoption holds a page of folders at a time.
    let scratch = {
        let (store, data_dir) = (ctx.store.clone(), ctx.data_dir.clone());
        Arc::new(blocking(move || AdoptionScratch::create(&data_dir, &store)).await?)
    };
    let mut report = AdoptReport { dry_run, ..Default::default() };
    let mut changed_tables = BTreeSet::new();
    // The claim on each (target, installation) adopted from, made once per run.
    let mut claims: BTreeMap<(String, String), std::result::Result<(), String>> = BTreeMap::new();
    // The epochs of this installation found on the targets: another copy's, once adopted
    // from, are recorded (below).
    let mut own_epochs = BTreeSet::new();
    // The shared erasure requests on each target, read before anything is adopted from a lost
    // installation: whatever it had not carried out is carried out here on its archives.
    let shared = shared_requests(ctx, from_installations).await?;
    let mut owed = Owed::new();
    for (table_id, table) in &policies.tables {
        let mut backends: Vec<&Arc<dyn ArchiveBackend>> = vec![&table.backend];
        for backend in policies.targets.values() {
            if !backends.iter().any(|b| b.target() == backend.target()) {
                backends.push(backend);
            }
        }
        // The manifests listed on each target, to find recorded archives that are gone, and
        // each bucket folder's manifests over every target: a bucket's forks may lie on two
        // targets (the table moved between them), and only weighed together is the one
        // written last chosen. They wait in the scratch database, read back a page of folders
        // at a time.
        let scratch_now = scratch.clone();
        blocking(move || scratch_now.clear_listed()).await?;
        for (index, backend) in backends.iter().enumerate() {
            list_manifests(backend.as_ref(), index as u32, table_id, &ctx.installation_id, &mut own_epochs, &scratch)
                .await?;
        }
        let mut after: Option<String> = None;
        loop {
            let (scratch_now, from) = (scratch.clone(), after.take());
            let page = blocking(move || scratch_now.folders_after(from.as_deref(), FOLDER_PAGE_MANIFESTS)).await?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (folder, listed) in page {
                let on_targets: BTreeSet<u32> = listed.iter().map(|m| m.target).collect();
                report.folders += on_targets.len() as u64;
                let manifests: Vec<FoundManifest> =
                    listed.into_iter().filter_map(|m| FoundManifest::of(m, &backends)).collect();
                let writers: BTreeSet<&str> = manifests.iter().map(|m| m.writer.as_str()).collect();
                // An installation writes a bucket's next generation (late records) in the folder
                // of an archive it adopted: when every writer is this installation or a named one,
                // the folder holds one chain of generations, not two live writers.
                let one_chain = writers.iter().all(|w| {
                    !w.is_empty() && (*w == ctx.installation_id || from_installations.iter().any(|named| named == w))
                });
                if writers.len() > 1 && !one_chain {
                    let targets: BTreeSet<&str> = manifests.iter().map(|m| m.backend.target()).collect();
                    report.conflicts.push(format!(
                        "{} `{folder}` holds manifests of {} installations ({}): two writers of one table; left alone",
                        targets.into_iter().collect::<Vec<_>>().join(", "),
                        writers.len(),
                        writers.iter().map(|w| if w.is_empty() { "none" } else { w }).collect::<Vec<_>>().join(", ")
                    ));
                    continue;
                }
                let mut refused = false;
                for found in manifests.iter().filter(|m| !m.writer.is_empty() && m.writer != ctx.installation_id) {
                    if !from_installations.contains(&found.writer) {
                        report.other_installations.insert(found.writer.clone());
                        refused = true;
                        break;
                    }
                    let claim = (found.backend.target().to_string(), found.writer.clone());
                    if !claims.contains_key(&claim) {
                        let outcome =
                            claim_adoption(ctx, found.backend.as_ref(), &found.writer, from_installations, dry_run)
                                .await?;
                        claims.insert(claim.clone(), outcome);
                    }
                    if let Some(Err(why)) = claims.get(&claim) {
                        report.conflicts.push(format!("{} `{folder}`: {why}", found.backend.target()));
                        refused = true;
                        break;
                    }
                }
                if refused {
                    continue;
                }
                let (manifests, replaced) = adoption_order(manifests).await;
                // The manifest that stands for the bucket once this folder is done: the newest
                // known or adopted one.
                let mut chosen = None;
                for (i, found) in manifests.iter().enumerate() {
                    let (backend, key) = (&found.backend, &found.key);
                    if found.known == Some(KnownKey::Recorded) {
                        report.known += 1;
                        chosen = Some(i);
                        // An earlier run that recorded it may have stopped before it placed what
                        // the archive owes: placed again (under the same ids, so nothing twice).
                        if found.writer != ctx.installation_id && !found.writer.is_empty() {
                            let owes = owed_by_recorded(ctx, &shared, table_id, found, &folder, &mut report).await?;
                            add_owed(&mut owed, &found.writer, table_id, owes);
                        }
                        break;
                    }
                    if found.known == Some(KnownKey::Replaced) {
                        report.superseded += 1;
                        chosen = Some(i);
                        break;
                    }
                    // What a lost installation had not carried out of the fleet's erasures is
                    // owed by its archives; an installation's own archives owe nothing.
                    let owed_to: &[fleet_erase::SharedOnTarget] =
                        if found.writer != ctx.installation_id && !found.writer.is_empty() { &shared } else { &[] };
                    let verified =
                        match read_verified(ctx, table_id, backend, &folder, key, owed_to, &found.writer).await {
                            Ok(verified) => verified,
                            Err(e) => {
                                report.failures.push(format!("{}: `{key}`: {e}", backend.target()));
                                continue;
                            }
                        };
                    let Verified { mut archive, named } = verified;
                    let owes = owed_by(&found.writer, &archive, named, &mut report);
                    let rows = archive.facts.rows;
                    if dry_run {
                        add_owed(&mut owed, &found.writer, &archive.id.table, owes);
                        report.adopted += 1;
                        report.rows += rows;
                        chosen = Some(i);
                        break;
                    }
                    if let Err(e) = match_hot_rows(ctx, backend.as_ref(), &mut archive).await {
                        report.failures.push(format!("{}: `{key}`: {e}", backend.target()));
                        continue;
                    }
                    let (store, now, table) = (ctx.store.clone(), ctx.clock.now(), archive.id.table.clone());
                    match blocking(move || store.adopt(archive, now)).await? {
                        Adoption::Adopted => add_owed(&mut owed, &found.writer, &table, owes),
                        Adoption::Replaced { hot_rows } => {
                            report.hot_rows_released += hot_rows;
                            add_owed(&mut owed, &found.writer, &table, owes);
                        }
                        Adoption::Known => {
                            report.known += 1;
                            chosen = Some(i);
                            break;
                        }
                        Adoption::Superseded => {
                            report.superseded += 1;
                            chosen = Some(i);
                            break;
                        }
                        // A newer archive of another fork (a stale generation adopted and amended
                        // elsewhere) does not hide an older one that does follow what this database
                        // records.
                        Adoption::Conflict(why) => {
                            report.conflicts.push(why);
                            continue;
                        }
                    }
                    tracing::info!(key = %key, rows, "archive adopted");
                    report.adopted += 1;
                    report.rows += rows;
                    changed_tables.insert(table_id.clone());
                    chosen = Some(i);
                    break;
                }
                if let Some(i) = chosen {
                    let (chosen, others) = manifests[i..].split_first().expect("chosen lies in the folder");
                    report_forks(chosen, others, &replaced, &mut report).await;
                }
            }
        }
        if record_gone_archives(ctx, table_id, &backends, &scratch, dry_run, &mut report).await? {
            changed_tables.insert(table_id.clone());
        }
    }
    // Adopting resolves every other copy of this data directory whose keys lie on the targets
    // (a copy restored from a backup, or copied elsewhere): their epochs are recorded, so the
    // sweep no longer stops on them. It still deletes only keys this directory released, so
    // what the other copy left (an archive of a bucket this copy archived too, a segment of an
    // attempt it never finished) stays on the target.
    if !dry_run {
        for epoch in own_epochs {
            let (store, now) = (ctx.store.clone(), ctx.clock.now());
            blocking(move || store.record_epoch(epoch, now)).await?;
        }
    }
    if !dry_run {
        crate::failpoints::hit("before_owed_erasures")?;
    }
    place_owed(ctx, owed, dry_run, &mut report).await?;
    for table in changed_tables {
        if !policies.table(&table)?.delta_log() {
            super::catalog::write(ctx, &table).await?;
        }
    }
    Ok(report)
}

/// The shared erasure requests on every target of the policy set, when archives of lost
/// installations are to be taken in (none otherwise), each with the installations that left a
/// receipt for it on any target: a request reaches the archives on every target, though an
/// engine writes it to the targets its tables use at the time (a table's older archives may
/// lie on a target it has left). Refused, before anything is adopted, where a target holds
/// requests and the engine has no fleet key to match them.
async fn shared_requests(
    ctx: &Arc<Context>,
    from_installations: &[String],
) -> Result<Vec<fleet_erase::SharedOnTarget>> {
    let mut by_id: BTreeMap<String, fleet_erase::SharedOnTarget> = BTreeMap::new();
    if from_installations.is_empty() {
        return Ok(Vec::new());
    }
    let mut seen = BTreeSet::new();
    let tables = ctx.policies.tables.values().map(|t| &t.backend);
    for backend in tables.chain(ctx.policies.targets.values()) {
        if !seen.insert(backend.target().to_string()) {
            continue;
        }
        let requests = fleet_erase::requests_on(backend.as_ref(), from_installations).await?;
        if !requests.is_empty() && ctx.fleet_key().is_none() {
            return Err(Error::InvalidInput(format!(
                "target {} holds {} shared erasure request(s), which the archives of {} may still owe; adopting \
                 them needs the fleet's key to carry those out: run adopt with --share-erasures \
                 (ARCHIVER_SHARE_ERASURES) naming the fleet's key file",
                backend.target(),
                requests.len(),
                from_installations.join(", ")
            )));
        }
        for found in requests {
            match by_id.get_mut(&found.request.id) {
                Some(known) => known.merge(found),
                None => {
                    by_id.insert(found.request.id.clone(), found);
                }
            }
        }
    }
    Ok(by_id.into_values().collect())
}

/// The shared requests that the lost installation `writer` may not have carried out on its
/// archive `manifest`: keyed with this fleet's key, and its receipt does not answer for the
/// archive (`receipt_answers_for`). The archive's rows say which records each names.
fn owed_candidates<'a>(
    ctx: &Context,
    requests: &'a [fleet_erase::SharedOnTarget],
    writer: &str,
    manifest: &Manifest,
) -> Vec<&'a fleet_erase::SharedOnTarget> {
    let Some(key) = ctx.fleet_key() else { return Vec::new() };
    requests
        .iter()
        .filter(|shared| {
            !receipt_answers_for(shared, writer, manifest) && shared.request.selector.keyed.as_deref() == Some(key.id())
        })
        .collect()
}

/// The records of an archive, written by the lost installation `writer`, that a shared request
/// names and that the writer had not erased: of the requests `owed_candidates` found, those it
/// began before and its manifest does not name among those it answers for
/// (`format::manifest::ErasuresAnswered`). By request id, with who placed it, keyed identities.
fn owed_by(
    writer: &str,
    archive: &VerifiedArchive,
    named: Vec<(&fleet_erase::SharedOnTarget, Vec<RecordIdentity>)>,
    report: &mut AdoptReport,
) -> Vec<(String, String, Vec<RecordIdentity>)> {
    let mut out = Vec::new();
    for (shared, named) in named {
        let request = &shared.request;
        if named.is_empty() {
            continue;
        }
        match &archive.manifest.erasures {
            Some(answered)
                if request.placed_at < answered.installation_since || answered.requests.contains(&request.id) => {}
            Some(_) => out.push((request.id.clone(), request.placed_by.clone(), named)),
            None => report.erasures_unknown.push(format!(
                "`{}` holds {} record(s) that shared request `{}` names, and installation {writer} left no receipt \
                 for it that answers for this archive; its manifest does not say whether it answers for them \
                 (written by an earlier version): nothing of it is erased here, place the request again on this \
                 host (docs/FLEET.md)",
                archive.manifest_key,
                named.len(),
                request.id
            )),
        }
    }
    out
}

/// Whether `writer`'s receipt for the shared request answers for its archive `manifest`. A
/// writer's manifests stop naming a request once its receipt is on every target, so the receipt
/// answers for those written since it finished (the earliest time any of its receipts gives:
/// `SharedOnTarget::merge`). One written before speaks for itself, by what its manifest
/// answers for and the rows it holds: the writer rewrote every archive it recorded that held a
/// named record, so an earlier generation that still holds one is an archive it never erased:
/// another copy of its data directory wrote it (left on the target as a conflict when a copy
/// restored from a backup archived the bucket itself), or it is a generation the writer
/// replaced, adopted because the newer one failed verification. A manifest of a version that
/// did not say what it answers for is then named in `erasures_unknown`. A receipt whose time
/// cannot be read answers for every archive, as before receipts were read. The times are the
/// writer's clock and (for `left_by` receipts) the adopter's: a clock stepped back by more than
/// the time between a request's finish and its receipt can misjudge an archive written then.
fn receipt_answers_for(shared: &fleet_erase::SharedOnTarget, writer: &str, manifest: &Manifest) -> bool {
    match shared.receipts.get(writer) {
        None => false,
        Some(None) => true,
        Some(Some(finished_at)) => manifest.created_at >= *finished_at,
    }
}

/// What an archive of a lost installation that this database already records still owes
/// (`owed_by`); its rows are read only when its manifest leaves a request unanswered.
async fn owed_by_recorded(
    ctx: &Arc<Context>,
    requests: &[fleet_erase::SharedOnTarget],
    table: &str,
    found: &FoundManifest,
    folder: &str,
    report: &mut AdoptReport,
) -> Result<Vec<(String, String, Vec<RecordIdentity>)>> {
    let Some(key) = ctx.fleet_key() else { return Ok(Vec::new()) };
    let manifest = read_manifest(found.backend.as_ref(), &found.key).await?;
    let unanswered = requests.iter().any(|shared| {
        let request = &shared.request;
        !receipt_answers_for(shared, &found.writer, &manifest)
            && request.selector.keyed.as_deref() == Some(key.id())
            && manifest.erasures.as_ref().is_none_or(|answered| {
                request.placed_at >= answered.installation_since && !answered.requests.contains(&request.id)
            })
    });
    if !unanswered {
        return Ok(Vec::new());
    }
    let Verified { archive, named } =
        read_verified(ctx, table, &found.backend, folder, &found.key, requests, &found.writer).await?;
    Ok(owed_by(&found.writer, &archive, named, report))
}

fn add_owed(owed: &mut Owed, writer: &str, table: &str, owes: Vec<(String, String, Vec<RecordIdentity>)>) {
    for (request, placed_by, identities) in owes {
        owed.entry((request, writer.to_string(), table.to_string()))
            .or_insert_with(|| (placed_by, Vec::new()))
            .1
            .extend(identities);
    }
}

/// Places a request here for each (shared request, lost installation) that adopted archives
/// owe, by the exact identities of the records named (at most `ERASURE_IDENTITIES_MAX` each:
/// more make several requests). The passes carry them out like any other, and once they have
/// finished the receipt is left in the lost installation's name (`archive::fleet_erase`).
/// Records appended here since keep their identities apart from these, so nothing appended
/// since is erased (but a record appended here under an identity named, before the request is
/// finished, which names that identity).
async fn place_owed(ctx: &Arc<Context>, owed: Owed, dry_run: bool, report: &mut AdoptReport) -> Result<()> {
    // Requests placed for each (shared request, lost installation), to number them.
    let mut placed: BTreeMap<(String, String), usize> = BTreeMap::new();
    for ((request, writer, table), (placed_by, identities)) in owed {
        if dry_run {
            report.erasures_owed.push(format!(
                "shared request `{request}`: {} record(s) in the archives of installation {writer} would be erased",
                identities.len()
            ));
            continue;
        }
        let key = ctx.fleet_key().ok_or_else(|| Error::Internal("owed erasures without a fleet key".into()))?;
        for chunk in identities.chunks(ERASURE_IDENTITIES_MAX) {
            let n = placed.entry((request.clone(), writer.clone())).or_default();
            *n += 1;
            let local = ErasureRequest {
                id: format!("{request}-{writer}-{n}"),
                selector: ErasureSelector {
                    table: Some(table.clone()),
                    identities: chunk.to_vec(),
                    keyed: Some(key.id().to_string()),
                    ..Default::default()
                },
                reason: format!(
                    "shared request `{request}`, for the archives adopted from installation {writer}, which had not \
                     carried it out"
                ),
                requester: format!("installation {placed_by}"),
                placed_at: 0,
                finished_at: None,
                buckets: Vec::new(),
                fleet: Vec::new(),
                answers_for: Some(AnswersFor { request: request.clone(), installation: writer.clone() }),
            };
            let (store, now, id) = (ctx.store.clone(), ctx.clock.now(), local.id.clone());
            match blocking(move || store.place_erasure(local, now)).await {
                Ok(_) | Err(Error::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
            tracing::info!(request = %request, installation = %writer, local = %id, "erasure owed by adopted archives placed");
            report.erasures_owed.push(format!(
                "shared request `{request}`: {} record(s) in the archives of installation {writer}, erased by request `{id}`",
                chunk.len()
            ));
        }
    }
    Ok(())
}

/// Two copies of one data directory (one restored from a backup while the other went on) can
/// each archive a bucket, with other rows. The archive adoption stands behind is the newest;
/// an older manifest in the folder that holds other rows is another copy's archive: it stays on
/// the target, and is named as a conflict so that nothing is dropped silently. (Older manifests
/// of one copy, left by attempts that failed before publishing, hold the same rows.)
async fn report_forks(
    chosen: &FoundManifest,
    others: &[FoundManifest],
    replaced: &HashSet<String>,
    report: &mut AdoptReport,
) {
    if others.is_empty() {
        return;
    }
    let Ok(standing) = read_manifest(chosen.backend.as_ref(), &chosen.key).await else { return };
    for other in others {
        let (backend, key) = (other.backend.as_ref(), &other.key);
        // A generation the standing archive replaced: its rows are in it.
        if standing.descends_from(key) {
            report.superseded += 1;
            continue;
        }
        // A generation another fork's later one replaced: that one is named (or was tried).
        if replaced.contains(key) {
            continue;
        }
        // An older manifest that cannot be read is left as the sweep and expiry leave it.
        let Ok(other) = read_manifest(backend, key).await else { continue };
        if other.summary != standing.summary {
            let id = format!("{}/{}/{}", standing.table, standing.partition_key, standing.bucket.key);
            report.conflicts.push(format!(
                "bucket {id} on {}: `{key}` is an archive of it by another copy of this data directory, with other \
                 rows ({} against {} in `{}` on {}); it stays on the target, not adopted",
                backend.target(),
                other.summary.rows,
                standing.summary.rows,
                chosen.key,
                chosen.backend.target()
            ));
        }
    }
}

/// A restored data directory records archives its other copy may have expired since the
/// backup: queries of them would fail on a missing manifest. Each recorded archive whose
/// manifest the listing of its target did not find is recorded as expired (a completed
/// tombstone that says why), so queries report the range as expired; one whose hot rows are
/// not yet deleted is a conflict left alone. An expiry it had begun whose manifest is gone is
/// recorded as deleting, so no hold can bring that archive back. True when a bucket changed.
async fn record_gone_archives(
    ctx: &Arc<Context>,
    table_id: &str,
    listed_on: &[&Arc<dyn ArchiveBackend>],
    scratch: &Arc<AdoptionScratch>,
    dry_run: bool,
    report: &mut AdoptReport,
) -> Result<bool> {
    let policies = ctx.policies.clone();
    let table = policies.table(table_id)?;
    let mut changed = false;
    let mut after = None;
    loop {
        let (store, table_name, from) = (ctx.store.clone(), table_id.to_string(), after.take());
        let published =
            blocking(move || store.published_after(&table_name, from.as_ref(), PUBLISHED_PAGE_BUCKETS)).await?;
        let Some((last, _)) = published.last() else { break };
        after = Some(last.id.clone());
        // Where each archive lies, and whether its target's listing found it, for the page at once.
        let mut lying = Vec::with_capacity(published.len());
        for (meta, manifest) in &published {
            let target = manifest.archive_target();
            // An archive on a target the policy directory no longer declares cannot be listed.
            let on = policies.archive_backend(table, &target).ok().and_then(|backend| {
                let index = listed_on.iter().position(|listed| listed.target() == backend.target())?;
                Some((index as u32, meta.manifest_key.clone()?))
            });
            lying.push(on);
        }
        let (scratch_now, asked) = (scratch.clone(), lying.clone());
        let found = blocking(move || scratch_now.are_listed(&asked)).await?;
        for (((meta, manifest), on), found) in published.into_iter().zip(lying).zip(found) {
            let (Some((index, key)), false) = (on, found) else { continue };
            let target = manifest.archive_target();
            let backend = listed_on[index as usize];
            // Replaced, not expired: a later generation in the folder names it in its lineage (one
            // this copy could not adopt, named among the conflicts). Recording the bucket as
            // expired would hide records no retention expired.
            let (scratch_now, folder) = (scratch.clone(), keys::folder_of(&key).to_string());
            let in_folder = blocking(move || scratch_now.listed_in(&folder, index)).await?;
            if let Some(successor) = successor_on_target(backend.as_ref(), in_folder, &key).await {
                report.conflicts.push(format!(
                "bucket {}: its archive `{key}` is gone from {target}, replaced by `{successor}`, which could not be \
                 adopted; left as it is",
                meta.id
            ));
                continue;
            }
            // Rows beside the gone archive, waiting for its next generation (or being archived
            // into it, which cannot finish without it), go with it (`Store::record_archive_gone`);
            // so do the rows of the archive itself whose cleanup this copy had not finished when it
            // was backed up (the other copy cleaned up and expired it). Not while a worker's lease
            // on the bucket runs.
            let pending = meta.state == BucketState::ArchivedPending
                || (matches!(meta.state, BucketState::Archiving | BucketState::Archived { hot_deleted: false })
                    && meta.lease_expires_at <= ctx.clock.now());
            if meta.state != (BucketState::Archived { hot_deleted: true }) && !pending {
                report.conflicts.push(format!(
                "bucket {}: its archive `{key}` is gone from {target}, but a worker's lease on the bucket runs until \
                 {}; left as it is: run adopt again once it lapses",
                meta.id,
                crate::model::time::format_rfc3339(meta.lease_expires_at)
            ));
                continue;
            }
            report.gone.push(format!("{}: `{key}` on {target}", meta.id));
            if dry_run {
                continue;
            }
            let (store, now) = (ctx.store.clone(), ctx.clock.now());
            let purge_at = now.saturating_add(ctx.settings.tombstone_retention_us);
            changed |= blocking(move || store.record_archive_gone(meta.id, key, target, now, purge_at)).await?;
        }
    }
    // An expiry this copy had begun (its tombstone written) but not started deleting when it
    // was backed up, which the copy that went on finished: a hold placed now would bring back
    // an archive that is gone. Its deletes are recorded as started (a hold is too late); the
    // expiry's next step completes it.
    let store = ctx.store.clone();
    let pending: Vec<_> = blocking(move || store.tombstones())
        .await?
        .into_iter()
        .filter(|t| t.bucket.table == table_id && t.completed_at.is_none() && t.deletes_started_at.is_none())
        .collect();
    for tombstone in pending {
        let Ok(backend) = policies.archive_backend(table, &tombstone.target) else { continue };
        let Some(index) = listed_on.iter().position(|listed| listed.target() == backend.target()) else { continue };
        let (scratch_now, key) = (scratch.clone(), tombstone.manifest_key.clone());
        if blocking(move || scratch_now.is_listed(index as u32, &key)).await? {
            continue;
        }
        report.gone.push(format!(
            "{}: `{}` on {} (its expiry was finished by another copy)",
            tombstone.bucket, tombstone.manifest_key, tombstone.target
        ));
        if dry_run {
            continue;
        }
        let (store, now) = (ctx.store.clone(), ctx.clock.now());
        let (id, key) = (tombstone.bucket, tombstone.manifest_key);
        changed |= blocking(move || store.record_expiry_deleting_elsewhere(id, key, now)).await?;
    }
    Ok(changed)
}

/// Where the claims on an installation's archives lie on a target.
pub const ADOPTIONS_PREFIX: &str = "_frostline-adoptions/";

/// One adopter's claim on another installation's archives on a target.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct AdoptionClaim {
    installation: String,
    adopted_by: String,
    at: crate::model::Micros,
}

/// Makes this installation the one that answers for `installation`'s archives on `backend`:
/// `Ok(Err(why))` when another installation, not itself named as lost, holds a claim. A dry
/// run only reads the claims.
async fn claim_adoption(
    ctx: &Arc<Context>,
    backend: &dyn ArchiveBackend,
    installation: &str,
    lost: &[String],
    dry_run: bool,
) -> Result<std::result::Result<(), String>> {
    let folder = format!("{ADOPTIONS_PREFIX}{installation}/");
    let own = format!("{folder}{}.json", ctx.installation_id);
    if !dry_run {
        let claim = AdoptionClaim {
            installation: installation.to_string(),
            adopted_by: ctx.installation_id.clone(),
            at: ctx.clock.now(),
        };
        let bytes = serde_json::to_vec(&claim).expect("a claim serializes");
        backend.put_create(&own, bytes.into()).await?;
    }
    let rivals: Vec<String> = backend
        .list(&folder)
        .await?
        .into_iter()
        .filter_map(|o| o.key.strip_prefix(&folder)?.strip_suffix(".json").map(str::to_string))
        .filter(|adopter| *adopter != ctx.installation_id && !lost.contains(adopter))
        .collect();
    if rivals.is_empty() {
        return Ok(Ok(()));
    }
    if !dry_run {
        backend.delete(&own).await?;
    }
    Ok(Err(format!(
        "installation {installation}'s archives are claimed by installation {} (`{folder}`): one installation \
         answers for them. If that host is lost too, name it with --from-installation; if it is alive, leave them \
         to it",
        rivals.join(", ")
    )))
}

/// A manifest found on a target: the target, the installation that wrote it, its generation
/// and when it was written, and its key.
#[derive(Clone)]
struct FoundManifest {
    backend: Arc<dyn ArchiveBackend>,
    writer: String,
    generation: u64,
    written: crate::model::Micros,
    key: String,
    /// What the database knows of the key.
    known: Option<KnownKey>,
}

impl FoundManifest {
    /// A manifest the scratch database lists, on the target of its index in `backends`.
    fn of(listed: ListedManifest, backends: &[&Arc<dyn ArchiveBackend>]) -> Option<FoundManifest> {
        let (writer, generation) = keys::manifest_origin(&listed.key)?;
        Some(FoundManifest {
            backend: Arc::clone(backends.get(listed.target as usize)?),
            writer: writer.to_string(),
            generation,
            written: listed.written,
            known: listed.known,
            key: listed.key,
        })
    }
}

/// The order adoption tries a bucket folder's manifests in (over every target), and the keys a
/// later generation in the folder replaced (its lineage names them).
///
/// First the heads of the folder's chains (manifests no other one replaces), the one written
/// last first; then the replaced generations, newest first. Generation numbers do not order
/// forks: two copies of one data directory (one restored from a backup while the other went on)
/// count generations on separate branches, and the copy that ran longer before it was replaced
/// reaches the higher number. The copy that wrote last is the one that ran last, the one whose
/// records the lost database acknowledged; the other fork's head is then named as a conflict
/// and stays on the target. Within one chain the lineage orders generations whatever the
/// clocks say (objects copied to a new store carry the copy's times), and a chain may run
/// across targets (a table that moved writes its next generation on its new target). A
/// manifest that cannot be read counts as a head; its verification fails when it is tried.
/// A manifest listed in the folder of `key` (`listed_in_folder`) whose lineage names `key`.
async fn successor_on_target(backend: &dyn ArchiveBackend, listed_in_folder: Vec<String>, key: &str) -> Option<String> {
    for candidate in listed_in_folder {
        if let Ok(manifest) = read_manifest(backend, &candidate).await
            && manifest.descends_from(key)
        {
            return Some(candidate);
        }
    }
    None
}

async fn adoption_order(manifests: Vec<FoundManifest>) -> (Vec<FoundManifest>, HashSet<String>) {
    let mut replaced = HashSet::new();
    if manifests.len() > 1 {
        for found in &manifests {
            if let Ok(manifest) = read_manifest(found.backend.as_ref(), &found.key).await
                && let Some(amends) = manifest.amends
            {
                replaced.insert(amends.manifest_key);
                replaced.extend(amends.lineage);
            }
        }
    }
    let (mut heads, mut older): (Vec<_>, Vec<_>) = manifests.into_iter().partition(|m| !replaced.contains(&m.key));
    heads.sort_by_key(|m| std::cmp::Reverse((m.written, m.generation)));
    older.sort_by_key(|m| std::cmp::Reverse((m.generation, m.written)));
    heads.extend(older);
    (heads, replaced)
}

/// Lists a table's manifests on the target of index `target` (`backend`) into the scratch
/// database, a page of the listing at a time; the epochs of `installation` that wrote any of
/// its segments or manifests are added to `epochs`.
async fn list_manifests(
    backend: &dyn ArchiveBackend,
    target: u32,
    table: &str,
    installation: &str,
    epochs: &mut BTreeSet<String>,
    scratch: &Arc<AdoptionScratch>,
) -> Result<()> {
    for prefix in keys::table_folders(table) {
        let mut listing = backend.list_stream(&prefix).try_chunks(LISTING_PAGE_OBJECTS);
        while let Some(page) = listing.next().await {
            let page = page.map_err(|e| e.1)?;
            let mut manifests = Vec::new();
            for object in page {
                if let Some(keys::Origin { installation: writer, epoch: Some(epoch), .. }) = keys::origin(&object.key)
                    && writer == installation
                {
                    epochs.insert(epoch.to_string());
                }
                if keys::manifest_origin(&object.key).is_some() {
                    manifests.push((object.key, object.last_modified));
                }
            }
            if !manifests.is_empty() {
                let scratch = scratch.clone();
                blocking(move || scratch.add_listed(target, &manifests)).await?;
            }
        }
    }
    Ok(())
}

/// An archive read back and verified, and the records in it that shared requests name.
struct Verified<'a> {
    archive: VerifiedArchive,
    /// For each shared request its writer may not have carried out on it (`owed_candidates`),
    /// the keyed identities of the records the request names in it.
    named: Vec<(&'a fleet_erase::SharedOnTarget, Vec<RecordIdentity>)>,
}

/// Reads a manifest and every row of its segments back, a segment at a time, verifying each,
/// and checks that the archive belongs where it was found. What adoption needs of the rows is
/// gathered on the way (`ArchiveFacts`, and the records `requests` name), so the archive's size
/// never sets the memory it takes.
async fn read_verified<'a>(
    ctx: &Arc<Context>,
    table: &str,
    backend: &Arc<dyn ArchiveBackend>,
    folder: &str,
    key: &str,
    requests: &'a [fleet_erase::SharedOnTarget],
    writer: &str,
) -> Result<Verified<'a>> {
    let manifest = read_manifest(backend.as_ref(), key).await?;
    if manifest.table != table {
        return Err(Error::Corruption(format!("the manifest names table `{}`", manifest.table)));
    }
    let policies = ctx.policies.clone();
    let recorded = policies.archive_backend(policies.table(table)?, &manifest.archive_target())?;
    // Compared by URL: a retired table keeps the backend of the policy set it was declared in,
    // another object for the same target than the current set's.
    if recorded.target() != backend.target() {
        return Err(Error::Conflict(format!(
            "the manifest records target {}, which the policy directory resolves to {}, not the target it lies on; \
             declare the target it records",
            manifest.archive_target(),
            recorded.target()
        )));
    }
    let fleet_key = ctx.fleet_key();
    let mut named: Vec<_> =
        owed_candidates(ctx, requests, writer, &manifest).into_iter().map(|shared| (shared, Vec::new())).collect();
    let mut summer = RowSummer::default();
    let mut facts = ArchiveFacts::default();
    // The partition every row must share, the first row's (an archive without rows, every
    // record of its bucket erased, names its partition only in the manifest).
    let mut partition_key: Option<Vec<u8>> = None;
    for segment in &manifest.segments {
        for row in read_segment(backend.as_ref(), key, manifest.format, segment).await? {
            let partition = partition_key.get_or_insert_with(|| row.partition_key.clone());
            if row.partition_key != *partition || !manifest.bucket.contains(row.event_time) {
                return Err(Error::Corruption(format!(
                    "row at {} of partition `{}` lies outside the bucket [{}, {}) of partition `{}`",
                    row.event_time,
                    String::from_utf8_lossy(&row.partition_key),
                    manifest.bucket.start,
                    manifest.bucket.end,
                    String::from_utf8_lossy(partition)
                )));
            }
            summer.push(&row);
            facts.observe(&row);
            if let Some(fleet_key) = fleet_key {
                for (shared, identities) in &mut named {
                    if shared.request.selector.matches_record(table, &row) {
                        identities.push(ErasureSelector::keyed_identity(fleet_key, &row));
                    }
                }
            }
        }
    }
    if summer.finish() != manifest.summary {
        return Err(Error::Corruption("the row checksum of the segments differs from the manifest".into()));
    }
    let partition_key = partition_key.unwrap_or_else(|| manifest.partition_key.as_bytes().to_vec());
    let id = BucketId { table: table.to_string(), bucket_key: manifest.bucket.key.clone(), partition_key };
    let layouts = [keys::Layout::Hive, keys::Layout::Delta];
    if !layouts
        .iter()
        .any(|l| keys::manifest_folder(*l, &id.table, writer, &id.bucket_key, &id.partition_key) == folder)
    {
        return Err(Error::Corruption(format!(
            "the manifest describes bucket {id}, which does not live in `{folder}`"
        )));
    }
    let archive = VerifiedArchive { id, manifest_key: key.to_string(), manifest, facts, hot: HotRowsHeld::default() };
    Ok(Verified { archive, named })
}

/// Reads again, from the segments that can hold them, how the archive holds the rows its bucket
/// holds hot (`HotRowsHeld`), for `Store::adopt` to release those it holds and keep the rest.
/// Nothing is read when the bucket has no hot row (a data directory rebuilt from nothing).
async fn match_hot_rows(ctx: &Arc<Context>, backend: &dyn ArchiveBackend, archive: &mut VerifiedArchive) -> Result<()> {
    let (store, id) = (ctx.store.clone(), archive.id.clone());
    let mut hot = blocking(move || store.hot_rows_to_match(&id)).await?;
    if hot.is_empty() {
        return Ok(());
    }
    for segment in &archive.manifest.segments {
        if hot.overlaps(segment.min_event_time, segment.max_event_time) {
            for row in read_segment(backend, &archive.manifest_key, archive.manifest.format, segment).await? {
                hot.observe(&row);
            }
        }
    }
    archive.hot = hot;
    Ok(())
}
