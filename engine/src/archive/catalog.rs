//! The catalogs: one object per table and installation,
//! `table=<table>/_catalogs/<installation>/_catalog.json`, listing every manifest that
//! installation published with its bounds and segments, so a reader (DuckDB, Spark, a script)
//! finds every segment without listing every bucket: on a target several installations share,
//! the table's archive is the union of their catalogs (`table=<table>/_catalogs/*/_catalog.json`).
//! Each installation rewrites only its own, so none hides another's archives. A table whose
//! archive is a Delta table has none: its Delta log lists its files, those of every
//! installation sharing the target (`super::delta`).
//!
//! It is derived data, never the only copy of anything: it is rebuilt from the recorded
//! manifests after every pass that published or expired something, and after an adoption.
//! Backends are create-only, so a rebuild deletes the old catalog and creates the new one; a
//! reader that finds none in between can retry or list the manifests. The one catalog per table
//! that earlier builds wrote (`table=<table>/_catalog.json`, whichever installation wrote last)
//! is deleted when an installation writes its own.

use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use super::blocking;
use crate::engine::Context;
use crate::error::Result;
use crate::model::Micros;
use crate::storage::PutOutcome;

pub const CATALOG_FILE: &str = "_catalog.json";
pub const CATALOG_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize)]
pub struct CatalogEntry {
    pub manifest_key: String,
    pub partition_key: String,
    pub bucket_key: String,
    pub start: Micros,
    pub end: Micros,
    pub rows: u64,
    pub bytes: u64,
    pub format: crate::format::Format,
    pub segments: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Catalog {
    pub version: u32,
    pub table: String,
    pub generated_at: Micros,
    pub manifests: Vec<CatalogEntry>,
}

/// The folder below a table's folder that holds the installations' catalogs.
pub const CATALOGS_FOLDER: &str = "_catalogs/";

/// The catalog of `installation`'s archives of `table`.
pub fn catalog_key(table: &str, installation: &str) -> String {
    format!("{}{CATALOGS_FOLDER}{installation}/{CATALOG_FILE}", crate::storage::keys::table_prefix(table))
}

/// The one catalog per table of earlier builds.
fn legacy_catalog_key(table: &str) -> String {
    format!("{}{CATALOG_FILE}", crate::storage::keys::table_prefix(table))
}

/// Builds a table's catalog from its published buckets' recorded manifests.
pub async fn build(ctx: &Arc<Context>, table: &str) -> Result<Catalog> {
    let (store, id) = (ctx.store.clone(), table.to_string());
    let now = ctx.clock.now();
    blocking(move || {
        let mut manifests = Vec::new();
        for (meta, manifest) in store.published(&id)? {
            let Some(key) = meta.manifest_key.clone() else { continue };
            manifests.push(CatalogEntry {
                manifest_key: key,
                partition_key: manifest.partition_key.clone(),
                bucket_key: meta.id.bucket_key.clone(),
                start: manifest.bucket.start,
                end: manifest.bucket.end,
                rows: manifest.summary.rows,
                bytes: manifest.bytes,
                format: manifest.format,
                segments: manifest.segments.iter().map(|s| s.key.clone()).collect(),
            });
        }
        manifests.sort_by(|a, b| (a.start, &a.partition_key).cmp(&(b.start, &b.partition_key)));
        Ok(Catalog { version: CATALOG_VERSION, table: id, generated_at: now, manifests })
    })
    .await
}

/// Rebuilds and writes a table's catalog; returns how many manifests it lists.
pub async fn write(ctx: &Arc<Context>, table: &str) -> Result<usize> {
    let catalog = build(ctx, table).await?;
    let backend = ctx.policies.clone().table(table)?.backend.clone();
    let key = catalog_key(table, &ctx.installation_id);
    let bytes = Bytes::from(serde_json::to_vec_pretty(&catalog).expect("a catalog serializes"));
    backend.delete(&legacy_catalog_key(table)).await?;
    backend.delete(&key).await?;
    match backend.put_create(&key, bytes).await? {
        PutOutcome::Created => {}
        // Another pass of this installation rebuilt it at the same moment, from the same state.
        PutOutcome::AlreadyExists => {}
    }
    Ok(catalog.manifests.len())
}
