//! The one module that builds object keys. Nothing else formats a key.
//!
//! Layout (Hive-style folders, so query engines can prune by table, bucket and partition):
//!
//! ```text
//! table=<table>/bucket=<bucket key>/partition=<partition key>/seg-<seq>-<sha256[..16]>.<ext>
//! table=<table>/bucket=<bucket key>/partition=<partition key>/manifest-g<generation>-<sha256[..16]>.json
//! ```
//!
//! Values are percent-encoded except `A-Z a-z 0-9 - _ . :`, so any table id, bucket key or
//! partition key maps to one safe path segment and back.
//!
//! Two scratch folders sit beside the tables at the root of a target, and no manifest ever
//! names an object in them: `.tmp/<nonce>` (a large segment's multipart upload before its
//! conditional copy to the final key) and `.frostline-probe/<nonce>/` (the start-up probe).

use crate::error::{Error, Result};

/// Hex digits of the SHA-256 carried in every key.
pub const KEY_SHA_HEX_DIGITS: usize = 16;

fn encode_value(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    // `.` and `..` alone are not valid path segments.
    if out == "." || out == ".." || out.is_empty() {
        out = out.replace('.', "%2E");
        if out.is_empty() {
            out.push_str("%00EMPTY");
        }
    }
    out
}

/// The folder of one bucket of one partition.
pub fn bucket_prefix(table: &str, bucket_key: &str, partition_key: &[u8]) -> String {
    format!(
        "table={}/bucket={}/partition={}/",
        encode_value(table.as_bytes()),
        encode_value(bucket_key.as_bytes()),
        encode_value(partition_key)
    )
}

/// The folder of a whole table.
pub fn table_prefix(table: &str) -> String {
    format!("table={}/", encode_value(table.as_bytes()))
}

pub fn segment_key(bucket_prefix: &str, sequence: usize, sha256_hex: &str, extension: &str) -> String {
    format!("{bucket_prefix}seg-{sequence:05}-{}.{extension}", &sha256_hex[..KEY_SHA_HEX_DIGITS])
}

pub fn manifest_key(bucket_prefix: &str, generation: u64, sha256_hex: &str) -> String {
    format!("{bucket_prefix}manifest-g{generation:010}-{}.json", &sha256_hex[..KEY_SHA_HEX_DIGITS])
}

/// Where large segments are uploaded before their conditional copy to the final key.
pub const TEMPORARY_PREFIX: &str = ".tmp/";
/// Where the probe of a target writes its test objects.
pub const PROBE_PREFIX: &str = ".frostline-probe/";
/// The scratch folders the orphan sweep clears once their objects are older than its grace.
pub const SCRATCH_PREFIXES: [&str; 2] = [TEMPORARY_PREFIX, PROBE_PREFIX];

/// A temporary object for one staged upload.
pub fn temporary_key(nonce: u64) -> String {
    format!("{TEMPORARY_PREFIX}{nonce:016x}")
}

/// The folder of one probe run.
pub fn probe_prefix(nonce: u64) -> String {
    format!("{PROBE_PREFIX}{nonce:016x}/")
}

/// One object of a probe run.
pub fn probe_key(probe_prefix: &str, name: &str) -> String {
    format!("{probe_prefix}{name}")
}

/// The SHA-256 prefix a key carries (the part after the last `-`, before the extension).
pub fn sha_prefix(key: &str) -> Result<&str> {
    let name = key.rsplit('/').next().unwrap_or(key);
    let stem = name.split('.').next().unwrap_or(name);
    let sha = stem.rsplit('-').next().unwrap_or("");
    if sha.len() == KEY_SHA_HEX_DIGITS && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(sha)
    } else {
        Err(Error::Corruption(format!("object key `{key}` carries no content hash")))
    }
}

/// Checks that `bytes` hash to the prefix their key carries.
pub fn check_content_address(key: &str, sha256_hex: &str) -> Result<()> {
    let expected = sha_prefix(key)?;
    if !sha256_hex.starts_with(expected) {
        return Err(Error::Corruption(format!(
            "object `{key}` hashes to {sha256_hex}, which does not match the hash in its name"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hive_style_and_carry_their_hash() {
        let prefix = bucket_prefix("metrics", "year:2024", b"host/1 a");
        assert_eq!(prefix, "table=metrics/bucket=year:2024/partition=host%2F1%20a/");
        let sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let seg = segment_key(&prefix, 3, sha, "jsonl");
        assert!(seg.ends_with("seg-00003-0123456789abcdef.jsonl"));
        assert_eq!(sha_prefix(&seg).unwrap(), "0123456789abcdef");
        let manifest = manifest_key(&prefix, 7, sha);
        assert!(manifest.ends_with("manifest-g0000000007-0123456789abcdef.json"));
        assert!(check_content_address(&manifest, sha).is_ok());
        assert!(check_content_address(&manifest, &"f".repeat(64)).is_err());
        assert_eq!(bucket_prefix("..", "b", b""), "table=%2E%2E/bucket=b/partition=%00EMPTY/");
    }

    #[test]
    fn scratch_keys_never_collide_with_tables() {
        assert_eq!(temporary_key(0xab), ".tmp/00000000000000ab");
        let probe = probe_prefix(1);
        assert_eq!(probe_key(&probe, "create"), ".frostline-probe/0000000000000001/create");
        for scratch in SCRATCH_PREFIXES {
            assert!(!table_prefix(".tmp").starts_with(scratch));
            assert!(!table_prefix(".frostline-probe").starts_with(scratch));
        }
    }
}
