//! The one module that builds object keys. Nothing else formats a key.
//!
//! Layout (Hive-style folders, so query engines can prune by table, bucket and partition):
//!
//! ```text
//! table=<table>/bucket=<bucket key>/partition=<partition key>/seg-<writer>-<seq>-<sha256[..16]>.<ext>
//! table=<table>/bucket=<bucket key>/partition=<partition key>/manifest-<writer>-g<generation>-<sha256[..16]>.json
//! ```
//!
//! Values are percent-encoded except `A-Z a-z 0-9 - _ . :` (an empty value is written as a
//! lone `%`, which no encoding of a non-empty value produces), so every table id, bucket key
//! and partition key maps to exactly one path segment. A value whose encoding is longer than
//! `KEY_VALUE_ENCODED_BYTES_MAX` is written as `~` and the SHA-256 of its raw bytes (`~` never
//! appears in an encoding), so no key exceeds the limits of a target (255 bytes per file name on
//! local disks, 1,024 bytes per key on S3): the real value is in the manifest.
//!
//! A table whose archive is also a Delta Lake table (Parquet, in builds with the `delta`
//! feature) is laid out below its Delta table root instead, where every `k=v` folder is one of
//! the Delta table's partition columns and the root itself has no `=` (readers such as polars
//! take partition values from the path):
//!
//! ```text
//! delta/<table>/_delta_log/...
//! delta/<table>/installation=<installation>/bucket=<bucket key>/partition=<partition key>/seg-....parquet
//! delta/<table>/_frostline/installation=<installation>/bucket=<bucket key>/partition=<partition key>/manifest-....json
//! ```
//!
//! The manifests sit in a mirror of the data folders under `_frostline/`, which every reader
//! of a Delta table or of Hive-partitioned Parquet skips (names starting with `_`), and which
//! Delta's `VACUUM` never deletes (a hidden folder at the table root).
//!
//! Values there are encoded as above, except that an empty value is Hive's
//! `__HIVE_DEFAULT_PARTITION__` (a null partition value to every Delta reader) and a value's
//! leading `_` is written `%5F`, so no other value encodes to that name. Archives written in
//! either layout stay readable through their manifests, which name every key in full.
//!
//! The `<writer>` in a file name is `<installation>-e<epoch>`: the data directory's
//! installation id and the epoch of the data directory's life that wrote the object (a random
//! id recorded in the store before its first key is made; every open of the data directory
//! starts a new one). Two installations that share a target never write the same key, nor do
//! two copies of one data directory (a restored backup, a clone) once either has been opened
//! again, and a copy that lists a key of its own installation with an epoch its database never
//! recorded knows that another copy wrote it. (Archives written before installation ids lack
//! both, those written before epochs lack the epoch; they are read through their manifests.)
//!
//! Two scratch folders sit beside the tables at the root of a target, and no manifest ever
//! names an object in them: `.tmp/<nonce>` (a large segment's multipart upload before its
//! conditional copy to the final key) and `.frostline-probe/<nonce>/` (the start-up probe).

use crate::error::{Error, Result};

/// Hex digits of the SHA-256 carried in every key.
pub const KEY_SHA_HEX_DIGITS: usize = 16;

/// Longest encoded value written as is; a longer one is written as its hash.
pub const KEY_VALUE_ENCODED_BYTES_MAX: usize = 128;

fn encode_value(value: &[u8]) -> String {
    let out = encode_value_in_full(value);
    if out.len() > KEY_VALUE_ENCODED_BYTES_MAX {
        use sha2::Digest as _;
        return format!("~{}", hex::encode(sha2::Sha256::digest(value)));
    }
    out
}

/// `value` percent-encoded, however long.
fn encode_value_in_full(value: &[u8]) -> String {
    if value.is_empty() {
        return "%".to_string();
    }
    let mut out = String::with_capacity(value.len());
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The value `encoded` (a folder name's value) was written from, when it was written in full
/// (not as its hash): `None` for anything no encoding produces, so one value has one name.
fn decode_value(encoded: &str, delta: bool) -> Option<Vec<u8>> {
    if delta && encoded == DELTA_NULL_PARTITION_VALUE || !delta && encoded == "%" {
        return Some(Vec::new());
    }
    let value: Vec<u8> = percent_encoding::percent_decode_str(encoded).collect();
    let again = encode_value_in_full(&value);
    let again = match again.strip_prefix('_') {
        Some(rest) if delta => format!("%5F{rest}"),
        _ => again,
    };
    (!value.is_empty() && again == encoded).then_some(value)
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

/// Where a table's new archives go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `table=<table>/bucket=<bucket key>/partition=<partition key>/`.
    Hive,
    /// Below the Delta table root `delta/<table>/`:
    /// `installation=<installation>/bucket=<bucket key>/partition=<partition key>/`.
    Delta,
}

/// The folder above every Delta table root.
pub const DELTA_PREFIX: &str = "delta/";

/// The root of a table's Delta Lake table (its `_delta_log/` sits right below).
pub fn delta_table_root(table: &str) -> String {
    format!("{DELTA_PREFIX}{}/", encode_value(table.as_bytes()))
}

/// Hive's name for a null partition value, which Delta readers understand.
pub const DELTA_NULL_PARTITION_VALUE: &str = "__HIVE_DEFAULT_PARTITION__";

/// A value as a folder name below a Delta table root (see the module documentation).
pub fn delta_partition_value(value: &[u8]) -> String {
    if value.is_empty() {
        return DELTA_NULL_PARTITION_VALUE.to_string();
    }
    let encoded = encode_value(value);
    match encoded.strip_prefix('_') {
        Some(rest) => format!("%5F{rest}"),
        None => encoded,
    }
}

/// The folder of one bucket of one partition written by `installation` in `layout`.
pub fn bucket_folder(
    layout: Layout,
    table: &str,
    installation: &str,
    bucket_key: &str,
    partition_key: &[u8],
) -> String {
    match layout {
        Layout::Hive => bucket_prefix(table, bucket_key, partition_key),
        Layout::Delta => format!(
            "{}installation={}/bucket={}/partition={}/",
            delta_table_root(table),
            delta_partition_value(installation.as_bytes()),
            delta_partition_value(bucket_key.as_bytes()),
            delta_partition_value(partition_key)
        ),
    }
}

/// The folder below a Delta table root that holds the manifests.
pub const DELTA_MANIFESTS_FOLDER: &str = "_frostline/";

/// The folder of one bucket's manifests: the bucket's folder in the Hive layout; in the Delta
/// layout its mirror below `_frostline/`.
pub fn manifest_folder(
    layout: Layout,
    table: &str,
    installation: &str,
    bucket_key: &str,
    partition_key: &[u8],
) -> String {
    let folder = bucket_folder(layout, table, installation, bucket_key, partition_key);
    match layout {
        Layout::Hive => folder,
        Layout::Delta => {
            let root = delta_table_root(table);
            format!("{root}{DELTA_MANIFESTS_FOLDER}{}", &folder[root.len()..])
        }
    }
}

/// Every folder a table's archives may lie in, whatever layout wrote them: what listings of a
/// whole table (the orphan sweep, adoption) cover.
pub fn table_folders(table: &str) -> [String; 2] {
    [table_prefix(table), delta_table_root(table)]
}

/// Which bucket a bucket folder holds, as its name writes it (values encoded, perhaps as their
/// hash), whichever installation wrote it and whether it holds data or manifests: the data
/// folder and the manifest folder of one bucket, and the folders of two installations in the
/// Delta layout, have the same address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FolderAddress {
    layout: Layout,
    table: String,
    bucket_key: String,
    partition_key: String,
}

/// The address of `folder` (ending in `/`), when it is the data or manifest folder of a bucket
/// in either layout; `None` for any other folder.
pub fn folder_address(folder: &str) -> Option<FolderAddress> {
    let path = folder.strip_suffix('/')?;
    let (layout, table, rest) = match path.strip_prefix("table=") {
        Some(rest) => {
            let (table, rest) = rest.split_once('/')?;
            (Layout::Hive, table, rest)
        }
        None => {
            let (table, rest) = path.strip_prefix(DELTA_PREFIX)?.split_once('/')?;
            let rest = rest.strip_prefix(DELTA_MANIFESTS_FOLDER).unwrap_or(rest);
            let (installation, rest) = rest.split_once('/')?;
            installation.strip_prefix("installation=")?;
            (Layout::Delta, table, rest)
        }
    };
    let (bucket_key, partition_key) = rest.split_once('/')?;
    Some(FolderAddress {
        layout,
        table: table.to_string(),
        bucket_key: bucket_key.strip_prefix("bucket=")?.to_string(),
        partition_key: partition_key.strip_prefix("partition=")?.to_string(),
    })
}

impl FolderAddress {
    /// The address of the folders of one bucket in `layout`.
    pub fn of(layout: Layout, table: &str, bucket_key: &str, partition_key: &[u8]) -> FolderAddress {
        folder_address(&bucket_folder(layout, table, "", bucket_key, partition_key)).expect("a bucket folder")
    }

    /// The bucket's table, bucket key and partition key, when the folder writes each in full;
    /// `None` when one is written as its hash (then only the bucket's record says which it is).
    pub fn decode(&self) -> Option<(String, String, Vec<u8>)> {
        let delta = self.layout == Layout::Delta;
        Some((
            String::from_utf8(decode_value(&self.table, false)?).ok()?,
            String::from_utf8(decode_value(&self.bucket_key, delta)?).ok()?,
            decode_value(&self.partition_key, delta)?,
        ))
    }
}

/// Whether `key` belongs to a Delta log (`.../_delta_log/...`): written by delta-rs, named by
/// no manifest, never a segment.
pub fn in_delta_log(key: &str) -> bool {
    key.starts_with(DELTA_PREFIX) && key.contains("/_delta_log/")
}

/// The writer part of a file name: an installation id and the epoch of the data directory's
/// life that wrote it (see the module documentation).
pub fn writer(installation: &str, epoch: &str) -> String {
    format!("{installation}-e{epoch}")
}

/// Hex digits of an epoch.
pub const EPOCH_HEX_DIGITS: usize = 16;

pub fn segment_key(bucket_prefix: &str, writer: &str, sequence: usize, sha256_hex: &str, extension: &str) -> String {
    format!("{bucket_prefix}seg-{writer}-{sequence:05}-{}.{extension}", &sha256_hex[..KEY_SHA_HEX_DIGITS])
}

pub fn manifest_key(bucket_prefix: &str, writer: &str, generation: u64, sha256_hex: &str) -> String {
    format!("{bucket_prefix}manifest-{writer}-g{generation:010}-{}.json", &sha256_hex[..KEY_SHA_HEX_DIGITS])
}

/// Who wrote a segment or a manifest, read from its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The installation id; empty for archives written before ids.
    pub installation: &'a str,
    /// The epoch of the data directory's life; `None` for archives written before epochs.
    pub epoch: Option<&'a str>,
    /// A manifest's generation; `None` for a segment.
    pub generation: Option<u64>,
}

/// Splits a writer (`<installation>` or `<installation>-e<epoch>`) into its parts.
fn split_writer(writer: &str) -> (&str, Option<&str>) {
    match writer.rsplit_once("-e") {
        Some((installation, epoch))
            if epoch.len() == EPOCH_HEX_DIGITS && epoch.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            (installation, Some(epoch))
        }
        _ => (writer, None),
    }
}

/// Who wrote `key`, when it is a segment or a manifest (`None` for any other key).
pub fn origin(key: &str) -> Option<Origin<'_>> {
    let name = key.rsplit('/').next().unwrap_or(key);
    if let Some(rest) = name.strip_prefix("manifest-") {
        let (rest, _sha) = rest.strip_suffix(".json")?.rsplit_once('-')?;
        let (writer, generation) = match rest.rsplit_once("-g") {
            Some((writer, generation)) => (writer, generation),
            None => ("", rest.strip_prefix('g')?),
        };
        if generation.is_empty() || !generation.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (installation, epoch) = split_writer(writer);
        return Some(Origin { installation, epoch, generation: Some(generation.parse().ok()?) });
    }
    let rest = name.strip_prefix("seg-")?;
    let stem = rest.split_once('.').map_or(rest, |(stem, _)| stem);
    let (rest, _sha) = stem.rsplit_once('-')?;
    let (writer, sequence) = rest.rsplit_once('-').unwrap_or(("", rest));
    if sequence.is_empty() || !sequence.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (installation, epoch) = split_writer(writer);
    Some(Origin { installation, epoch, generation: None })
}

/// Whether `key` is a segment or manifest written by `installation` (in any epoch).
pub fn written_by(key: &str, installation: &str) -> bool {
    origin(key).is_some_and(|origin| !installation.is_empty() && origin.installation == installation)
}

/// The generation of a manifest `installation` wrote, from its key (`None` for any other key).
pub fn manifest_generation(key: &str, installation: &str) -> Option<u64> {
    manifest_origin(key).filter(|(writer, _)| *writer == installation).map(|(_, generation)| generation)
}

/// Who wrote a manifest and under which generation, from its key: the installation id (empty
/// for archives written before ids) and the generation. `None` when `key` is not a manifest.
pub fn manifest_origin(key: &str) -> Option<(&str, u64)> {
    origin(key).and_then(|origin| Some((origin.installation, origin.generation?)))
}

/// The folder an object key sits in (with its trailing `/`), for listing an archive's
/// objects where they were written, whatever today's layout would say.
pub fn folder_of(key: &str) -> &str {
    key.rfind('/').map_or("", |i| &key[..=i])
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

    /// Every bucket folder names its bucket: decoded back exactly in both layouts, for the data
    /// and the manifest folder alike, unless a value is written as its hash.
    #[test]
    fn a_bucket_folder_decodes_to_its_bucket_unless_a_value_is_hashed() {
        let partitions: [&[u8]; 7] = [
            b"",
            b"host/1 a%=b",
            "s\u{e9}ance \u{fc}/x".as_bytes(),
            b"_x",
            b"%",
            b"__HIVE_DEFAULT_PARTITION__",
            &[0xff, 0x00],
        ];
        for table in ["t", "a=b", "_t"] {
            for bucket in ["day:2024-03-01", "", "year 2024/\u{e9}"] {
                for partition in partitions {
                    for layout in [Layout::Hive, Layout::Delta] {
                        let want = Some((table.to_string(), bucket.to_string(), partition.to_vec()));
                        for folder in [
                            bucket_folder(layout, table, "00aa", bucket, partition),
                            manifest_folder(layout, table, "00bb", bucket, partition),
                        ] {
                            let address = folder_address(&folder).expect(&folder);
                            assert_eq!(address.decode(), want, "{folder}");
                            assert_eq!(address, FolderAddress::of(layout, table, bucket, partition), "{folder}");
                        }
                    }
                }
            }
        }
        let long = "p".repeat(KEY_VALUE_ENCODED_BYTES_MAX + 1);
        let hashed = folder_address(&bucket_folder(Layout::Delta, "t", "00aa", "b", long.as_bytes())).unwrap();
        assert_eq!(hashed.decode(), None);
        assert_eq!(hashed, FolderAddress::of(Layout::Delta, "t", "b", long.as_bytes()));
        // Names no encoding writes are no bucket's.
        for folder in
            ["table=t/bucket=b/partition=%2f/", "table=t/bucket=b/partition=%41/", "table=t/x/", "delta/t/_delta_log/"]
        {
            assert_eq!(folder_address(folder).and_then(|a| a.decode()), None, "{folder}");
        }
    }

    #[test]
    fn keys_are_hive_style_and_carry_their_hash() {
        let prefix = bucket_prefix("metrics", "year:2024", b"host/1 a");
        assert_eq!(prefix, "table=metrics/bucket=year:2024/partition=host%2F1%20a/");
        let sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let seg = segment_key(&prefix, "00aa", 3, sha, "jsonl");
        assert!(seg.ends_with("seg-00aa-00003-0123456789abcdef.jsonl"));
        assert_eq!(sha_prefix(&seg).unwrap(), "0123456789abcdef");
        let manifest = manifest_key(&prefix, "00aa", 7, sha);
        assert!(manifest.ends_with("manifest-00aa-g0000000007-0123456789abcdef.json"));
        assert!(check_content_address(&manifest, sha).is_ok());
        assert!(check_content_address(&manifest, &"f".repeat(64)).is_err());
        assert_eq!(bucket_prefix("..", "b", b""), "table=../bucket=b/partition=%/");
        assert_eq!(folder_of(&seg), prefix);
    }

    #[test]
    fn delta_folders_are_partition_columns_below_a_root_without_equals_signs() {
        let folder = bucket_folder(Layout::Delta, "a=b", "00aa", "day:2024-03-01", b"host/1");
        assert_eq!(folder, "delta/a%3Db/installation=00aa/bucket=day:2024-03-01/partition=host%2F1/");
        assert!(!delta_table_root("a=b").contains('='));
        // Empty is Hive's null; a literal value of that name, or any leading `_`, is escaped.
        assert_eq!(delta_partition_value(b""), DELTA_NULL_PARTITION_VALUE);
        assert_eq!(delta_partition_value(DELTA_NULL_PARTITION_VALUE.as_bytes()), "%5F_HIVE_DEFAULT_PARTITION__");
        assert_eq!(delta_partition_value(b"_x"), "%5Fx");
        assert_eq!(bucket_folder(Layout::Hive, "t", "00aa", "b", b"p"), bucket_prefix("t", "b", b"p"));
        assert!(in_delta_log("delta/t/_delta_log/00000000000000000000.json"));
        assert!(!in_delta_log("table=t/_delta_log/x") && !in_delta_log(&folder));
        assert_eq!(table_folders("t"), ["table=t/".to_string(), "delta/t/".to_string()]);
        assert_eq!(
            manifest_folder(Layout::Delta, "t", "00aa", "b", b"p"),
            "delta/t/_frostline/installation=00aa/bucket=b/partition=p/"
        );
        assert_eq!(manifest_folder(Layout::Hive, "t", "00aa", "b", b"p"), bucket_prefix("t", "b", b"p"));
    }

    #[test]
    fn the_encoding_is_injective() {
        // Regression: "" and "\0EMPTY" were both written as `%00EMPTY`.
        let values: [&[u8]; 7] = [b"", b"\0EMPTY", b"%", b"%00EMPTY", b".", b"~", b"a"];
        let encoded: std::collections::HashSet<String> = values.iter().map(|v| encode_value(v)).collect();
        assert_eq!(encoded.len(), values.len(), "{encoded:?}");
        let long_a = vec![b'a'; 1024];
        let mut long_b = long_a.clone();
        long_b[1023] = b'b';
        assert_ne!(encode_value(&long_a), encode_value(&long_b));
    }

    #[test]
    fn keys_fit_every_target_at_the_longest_values() {
        // Limit obeyed: a value at the limit is written as is.
        let at_limit = vec![b'a'; KEY_VALUE_ENCODED_BYTES_MAX];
        assert_eq!(encode_value(&at_limit), "a".repeat(KEY_VALUE_ENCODED_BYTES_MAX));
        // Limit enforced: the longest table id, bucket key and partition key (all escaped),
        // still give file names under 255 bytes and keys under 1,024.
        let table = "%".repeat(crate::model::TABLE_ID_BYTES_MAX);
        let bucket = "%".repeat(crate::model::BUCKET_KEY_BYTES_MAX);
        let partition = vec![0xffu8; crate::model::PARTITION_KEY_BYTES_MAX];
        let prefix = bucket_prefix(&table, &bucket, &partition);
        let key = manifest_key(&prefix, "0123456789abcdef", u64::MAX, &"f".repeat(64));
        assert!(key.len() < 1024, "{} bytes", key.len());
        assert!(key.split('/').all(|segment| segment.len() <= 255), "{key}");
        assert!(prefix.contains("partition=~"), "{prefix}");
    }

    #[test]
    fn only_an_installations_own_keys_are_its_own() {
        let prefix = bucket_prefix("t", "b", b"p");
        let sha = &"0".repeat(64);
        assert!(written_by(&segment_key(&prefix, "aa11", 0, sha, "jsonl"), "aa11"));
        assert!(written_by(&manifest_key(&prefix, "aa11", 1, sha), "aa11"));
        assert!(!written_by(&segment_key(&prefix, "aa112", 0, sha, "jsonl"), "aa11"));
        assert!(!written_by(&segment_key(&prefix, "bb22", 0, sha, "jsonl"), "aa11"));
        // Keys of earlier versions carry no installation: nobody can prove they own them.
        assert!(!written_by(&format!("{prefix}seg-00000-{}.jsonl", &sha[..16]), "aa11"));
        assert!(!written_by(&format!("{prefix}_catalog.json"), "aa11"));
    }

    #[test]
    fn a_manifests_generation_is_read_back_from_its_key() {
        let prefix = bucket_prefix("t", "b", b"p");
        let sha = &"0".repeat(64);
        assert_eq!(manifest_generation(&manifest_key(&prefix, "aa11", 42, sha), "aa11"), Some(42));
        assert_eq!(manifest_generation(&manifest_key(&prefix, "aa11", 42, sha), "aa1"), None);
        assert_eq!(manifest_generation(&manifest_key(&prefix, "bb22", 42, sha), "aa11"), None);
        assert_eq!(manifest_generation(&segment_key(&prefix, "aa11", 0, sha, "jsonl"), "aa11"), None);
        // Installation ids may carry dashes; archives written before ids carry none.
        assert_eq!(manifest_origin(&manifest_key(&prefix, "a-b-c", 7, sha)), Some(("a-b-c", 7)));
        assert_eq!(manifest_origin(&format!("{prefix}manifest-g0000000003-0123456789abcdef.json")), Some(("", 3)));
        assert_eq!(manifest_origin(&format!("{prefix}manifest-aa11-gx-0123456789abcdef.json")), None);
        assert_eq!(manifest_origin(&format!("{prefix}{}", PROBE_PREFIX)), None);
    }

    #[test]
    fn a_key_names_the_installation_and_the_epoch_that_wrote_it() {
        let prefix = bucket_prefix("t", "b", b"p");
        let sha = &"0".repeat(64);
        let writer = writer("aa11", "0123456789abcdef");
        let manifest = manifest_key(&prefix, &writer, 42, sha);
        assert!(manifest.ends_with("manifest-aa11-e0123456789abcdef-g0000000042-0000000000000000.json"));
        let expected = Origin { installation: "aa11", epoch: Some("0123456789abcdef"), generation: Some(42) };
        assert_eq!(origin(&manifest), Some(expected));
        let segment = segment_key(&prefix, &writer, 3, sha, "parquet");
        assert_eq!(origin(&segment), Some(Origin { generation: None, ..expected }));
        assert!(written_by(&segment, "aa11") && written_by(&manifest, "aa11"));
        assert_eq!(manifest_generation(&manifest, "aa11"), Some(42));
        // Keys written before epochs, and before installation ids.
        let legacy = segment_key(&prefix, "aa11", 3, sha, "jsonl");
        assert_eq!(origin(&legacy), Some(Origin { installation: "aa11", epoch: None, generation: None }));
        let before_ids = format!("{prefix}seg-00003-{}.jsonl", &sha[..16]);
        assert_eq!(origin(&before_ids), Some(Origin { installation: "", epoch: None, generation: None }));
        // An epoch is exactly 16 hex digits; anything else is part of the installation id.
        let odd = segment_key(&prefix, "aa11-eff", 0, sha, "jsonl");
        assert_eq!(origin(&odd).map(|o| (o.installation, o.epoch)), Some(("aa11-eff", None)));
        assert_eq!(origin(&format!("{prefix}_catalog.json")), None);
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
