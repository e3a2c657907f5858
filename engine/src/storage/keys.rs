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
}
