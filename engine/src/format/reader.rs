//! Reads and verifies published archives from a backend: a manifest at its content address,
//! and each segment against its manifest entry (hash, row count, row checksum, every row
//! parses). Archival's read-back, queries, `verify` and a re-run ingest all read through it.

use super::Format;
use super::manifest::{Manifest, SegmentInfo, sha256_hex};
use crate::error::{Error, Result};
use crate::model::rows::summarize;
use crate::model::{Micros, Record};
use crate::storage::{ArchiveBackend, keys};

/// Reads and verifies a published archive: the manifest (content address and parse) and
/// every segment overlapping `[from, to)`.
pub async fn read_archive(
    backend: &dyn ArchiveBackend,
    manifest_key: &str,
    from: Option<Micros>,
    to: Option<Micros>,
) -> Result<Vec<Record>> {
    read_archive_until(backend, manifest_key, from, to, |_| true, Want::ALL).await
}

/// Reads and verifies a published archive's segments overlapping `[from, to)` one at a time,
/// in clustering order, keeping the rows `keep` accepts, and stops after the segment that
/// brings the kept rows to `want`: a page of a query holds one segment's rows at a time
/// beyond its own, whatever the size of the bucket.
pub async fn read_archive_until(
    backend: &dyn ArchiveBackend,
    manifest_key: &str,
    from: Option<Micros>,
    to: Option<Micros>,
    keep: impl Fn(&Record) -> bool,
    want: Want,
) -> Result<Vec<Record>> {
    let manifest = read_manifest(backend, manifest_key).await?;
    read_segments_until(backend, manifest_key, &manifest, from, to, |_| true, keep, want).await
}

/// `read_archive_until` from a manifest already at hand (a query's, from the store's copy of
/// the published one, which is the object at `manifest_key`: a manifest is written once):
/// the same segments, verified the same, without reading the manifest again.
/// A segment `may_hold` rules out (by its statistics: `model::columns::Condition`) is not read.
#[allow(clippy::too_many_arguments)]
pub async fn read_segments_until(
    backend: &dyn ArchiveBackend,
    manifest_key: &str,
    manifest: &Manifest,
    from: Option<Micros>,
    to: Option<Micros>,
    may_hold: impl Fn(&SegmentInfo) -> bool,
    keep: impl Fn(&Record) -> bool,
    want: Want,
) -> Result<Vec<Record>> {
    let mut rows = Vec::new();
    let mut kept_bytes = 0usize;
    for segment in &manifest.segments {
        if rows.len() >= want.rows || kept_bytes >= want.bytes {
            break;
        }
        if from.is_some_and(|f| segment.max_event_time < f)
            || to.is_some_and(|t| segment.min_event_time >= t)
            || !may_hold(segment)
        {
            continue;
        }
        for row in read_segment(backend, manifest_key, manifest.format, segment).await?.into_iter().filter(|r| keep(r))
        {
            if rows.len() >= want.rows || kept_bytes >= want.bytes {
                break;
            }
            kept_bytes += row.stored_bytes();
            rows.push(row);
        }
    }
    Ok(rows)
}

/// How much a read keeps: at most `rows` records, and no record once `bytes` of them
/// (`Record::stored_bytes`) are kept (the record that crosses the bound is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub rows: usize,
    pub bytes: usize,
}

impl Want {
    pub const ALL: Want = Want { rows: usize::MAX, bytes: usize::MAX };
}

/// Reads one segment of the archive `manifest_key` and verifies it against its manifest entry:
/// one segment's rows in memory, whatever the size of the archive.
pub async fn read_segment(
    backend: &dyn ArchiveBackend,
    manifest_key: &str,
    format: Format,
    segment: &SegmentInfo,
) -> Result<Vec<Record>> {
    let bytes = backend
        .get(&segment.key)
        .await?
        .ok_or_else(|| Error::Corruption(format!("segment `{}` named by `{manifest_key}` is missing", segment.key)))?;
    verify_segment(format, segment, &bytes)
}

pub async fn read_manifest(backend: &dyn ArchiveBackend, manifest_key: &str) -> Result<Manifest> {
    let bytes = backend
        .get(manifest_key)
        .await?
        .ok_or_else(|| Error::Corruption(format!("published manifest `{manifest_key}` is missing")))?;
    manifest_from_bytes(manifest_key, &bytes)
}

/// The manifest stored at `manifest_key`, from its bytes: checked against its content address,
/// parsed, and consistent.
pub fn manifest_from_bytes(manifest_key: &str, bytes: &[u8]) -> Result<Manifest> {
    keys::check_content_address(manifest_key, &sha256_hex(bytes))?;
    let manifest = Manifest::from_bytes(bytes)?;
    manifest.check_consistent()?;
    Ok(manifest)
}

/// Verifies a segment's bytes against its manifest entry: hash, row count, row checksum,
/// and every row parses.
pub fn verify_segment(format: Format, info: &SegmentInfo, bytes: &[u8]) -> Result<Vec<Record>> {
    let sha = sha256_hex(bytes);
    if sha != info.sha256 || bytes.len() as u64 != info.bytes {
        return Err(Error::Corruption(format!(
            "segment `{}`: expected {} bytes sha256 {}, got {} bytes sha256 {sha}",
            info.key,
            info.bytes,
            info.sha256,
            bytes.len()
        )));
    }
    keys::check_content_address(&info.key, &sha)?;
    verify_segment_rows(format, info, bytes)
}

/// Verifies that a segment's bytes parse, row by row, to the rows its manifest entry
/// describes (count and row checksum), without keeping them: the check after an upload (the
/// bytes' hash is checked by the caller).
pub fn check_segment_rows(format: Format, info: &SegmentInfo, bytes: &[u8]) -> Result<()> {
    let summary = format.summarize(bytes)?;
    if summary != info.summary || summary.rows != info.rows {
        return Err(Error::Corruption(format!(
            "segment `{}`: rows or row checksum differ from the manifest (rows {} vs {})",
            info.key, summary.rows, info.rows
        )));
    }
    Ok(())
}

/// Verifies that a segment's bytes decode to the rows its manifest entry describes: row
/// count and row checksum (the bytes' hash is checked by the caller).
pub fn verify_segment_rows(format: Format, info: &SegmentInfo, bytes: &[u8]) -> Result<Vec<Record>> {
    let rows = format.decode(bytes)?;
    let summary = summarize(&rows);
    if summary != info.summary || rows.len() as u64 != info.rows {
        return Err(Error::Corruption(format!(
            "segment `{}`: rows or row checksum differ from the manifest (rows {} vs {})",
            info.key,
            rows.len(),
            info.rows
        )));
    }
    Ok(rows)
}
