//! The pure core: the domain model, the bucket state machine and the named invariants.
//!
//! Imports nothing from tokio, redb, wasmtime or object_store, so it can be reasoned about and
//! tested on its own. Every adapter depends on it; it depends on nobody.

pub mod columns;
pub mod invariants;
pub mod lifecycle;
pub mod rows;
pub mod time;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use self::time::Micros;

/// Bounds on identifiers, in bytes.
pub const TABLE_ID_BYTES_MAX: usize = 128;
pub const PARTITION_KEY_BYTES_MAX: usize = 1024;
pub const SORT_KEY_BYTES_MAX: usize = 1024;
pub const TENANT_BYTES_MAX: usize = 128;
pub const KIND_BYTES_MAX: usize = 128;
pub const BUCKET_KEY_BYTES_MAX: usize = 128;
/// A record body larger than this is refused at append.
pub const RECORD_BODY_BYTES_MAX: usize = 1024 * 1024;
/// The earliest event time a record may carry: 0001-01-01T00:00:00Z. Delta's statistics,
/// RFC 3339 and the built-in strategies all express years 1 to 9999, and nothing outside.
pub const EVENT_TIME_MIN: Micros = -62_135_596_800_000_000;
/// The latest event time a record may carry: 9999-12-31T23:59:59.999999Z.
pub const EVENT_TIME_MAX: Micros = 253_402_300_799_999_999;

/// True when `s` is 1 to `max` bytes of visible ASCII (0x21..=0x7E).
pub fn is_visible_ascii(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// A JSON text on one line: line breaks can only be whitespace outside strings (inside strings
/// JSON escapes them), so removing whitespace outside strings is enough. Bodies are embedded
/// in JSON-lines segments, so a multi-line body (a pretty-printed one, through the library or
/// a JSON array) is stored in this form; every other body is stored byte for byte.
pub fn one_line_json(raw: &str) -> std::borrow::Cow<'_, str> {
    if !raw.bytes().any(|b| b == b'\n' || b == b'\r') {
        return std::borrow::Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in raw.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Checks a table id: 1 to 128 bytes of visible ASCII.
pub fn validate_table_id(id: &str) -> Result<()> {
    if is_visible_ascii(id, TABLE_ID_BYTES_MAX) {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "table id `{}` must be 1 to {TABLE_ID_BYTES_MAX} bytes of visible ASCII (no spaces)",
            id.escape_debug()
        )))
    }
}

/// One time bucket `[start, end)` named by its strategy's canonical key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BucketDescriptor {
    pub key: String,
    pub start: Micros,
    pub end: Micros,
}

impl BucketDescriptor {
    pub fn contains(&self, t: Micros) -> bool {
        self.start <= t && t < self.end
    }
}

/// A record as an application appends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(with = "serde_bytes_string")]
    pub partition_key: Vec<u8>,
    pub event_time: Micros,
    #[serde(with = "serde_bytes_string")]
    pub sort_key: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The body as canonical JSON text (serde_json's compact form of the parsed value).
    pub body: String,
}

/// Records that passed every check an append makes (`CheckedRecords::check`): bounds, UTF-8
/// keys, a body that is JSON, on one line. The wire parser (`ops::records::parse_line`)
/// makes them as it parses, so a record that comes over HTTP or through `ingest` is validated
/// and its body parsed once.
#[derive(Debug, Clone, Default)]
pub struct CheckedRecords(Vec<Record>);

impl CheckedRecords {
    /// Checks each record (the error names it by its 1-based position) and stores a
    /// multi-line body in its one-line form.
    pub fn check(mut records: Vec<Record>) -> Result<CheckedRecords> {
        for (i, record) in records.iter_mut().enumerate() {
            let context = |e: Error| Error::InvalidInput(format!("record {}: {}", i + 1, reason(&e)));
            record.validate().map_err(context)?;
            for (field, bytes) in [("partition_key", &record.partition_key), ("sort_key", &record.sort_key)] {
                if std::str::from_utf8(bytes).is_err() {
                    return Err(context(Error::InvalidInput(format!("{field} must be UTF-8"))));
                }
            }
            serde_json::from_str::<&serde_json::value::RawValue>(&record.body)
                .map_err(|e| context(Error::InvalidInput(format!("body is not JSON: {e}"))))?;
            record.normalize_body();
        }
        Ok(CheckedRecords(records))
    }

    /// Records the caller has validated with `Record::validate`, whose keys are UTF-8 and
    /// whose bodies it has parsed as JSON (the wire parser); bodies are put on one line here.
    pub(crate) fn parsed(mut records: Vec<Record>) -> CheckedRecords {
        records.iter_mut().for_each(Record::normalize_body);
        CheckedRecords(records)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Record> {
        self.0.iter()
    }

    pub fn into_inner(self) -> Vec<Record> {
        self.0
    }
}

/// An error's message without the kind prefix its `Display` carries.
fn reason(error: &Error) -> String {
    match error {
        Error::InvalidInput(message) => message.clone(),
        other => other.to_string(),
    }
}

impl Record {
    /// The bytes of what the record stores (keys, tenant, kind, body): what a page of a query
    /// is bounded by.
    pub fn stored_bytes(&self) -> usize {
        self.partition_key.len()
            + self.sort_key.len()
            + self.tenant.as_ref().map_or(0, String::len)
            + self.kind.as_ref().map_or(0, String::len)
            + self.body.len()
    }

    /// A multi-line body in its one-line form (`one_line_json`).
    fn normalize_body(&mut self) {
        if let std::borrow::Cow::Owned(one_line) = one_line_json(&self.body) {
            self.body = one_line;
        }
    }

    /// Checks the bounds of every field; the message names the field and the limit.
    pub fn validate(&self) -> Result<()> {
        if !(EVENT_TIME_MIN..=EVENT_TIME_MAX).contains(&self.event_time) {
            return Err(Error::InvalidInput(format!(
                "event_time {} µs since the Unix epoch lies outside 0001-01-01T00:00:00Z ..= \
                 9999-12-31T23:59:59.999999Z, the years every archive format and reader can express",
                self.event_time
            )));
        }
        if self.partition_key.len() > PARTITION_KEY_BYTES_MAX {
            return Err(Error::InvalidInput(format!(
                "partition_key is {} bytes; the limit is {PARTITION_KEY_BYTES_MAX}",
                self.partition_key.len()
            )));
        }
        if self.sort_key.len() > SORT_KEY_BYTES_MAX {
            return Err(Error::InvalidInput(format!(
                "sort_key is {} bytes; the limit is {SORT_KEY_BYTES_MAX}",
                self.sort_key.len()
            )));
        }
        if let Some(tenant) = &self.tenant
            && !is_visible_ascii(tenant, TENANT_BYTES_MAX)
        {
            return Err(Error::InvalidInput(format!(
                "tenant `{}` must be 1 to {TENANT_BYTES_MAX} bytes of visible ASCII",
                tenant.escape_debug()
            )));
        }
        if let Some(kind) = &self.kind
            && !is_visible_ascii(kind, KIND_BYTES_MAX)
        {
            return Err(Error::InvalidInput(format!(
                "kind `{}` must be 1 to {KIND_BYTES_MAX} bytes of visible ASCII",
                kind.escape_debug()
            )));
        }
        if self.body.len() > RECORD_BODY_BYTES_MAX {
            return Err(Error::InvalidInput(format!(
                "body is {} bytes; the limit is {RECORD_BODY_BYTES_MAX}",
                self.body.len()
            )));
        }
        Ok(())
    }
}

/// Partition and sort keys are opaque bytes; in JSON they travel as UTF-8 strings, which
/// covers what applications send. (Non-UTF-8 keys are accepted by the library API.)
pub mod serde_bytes_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from_utf8_lossy(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Ok(String::deserialize(d)?.into_bytes())
    }
}

/// Where a bucket is in its life.
///
/// ```text
/// Hot --claim--> Archiving --publish--> Archived{hot_deleted:false} --cleanup--> Archived{hot_deleted:true}
///                   |  (failure before publish: stays fenced, retried later)            |
///                   +-- lease expires: another worker takes over (Archiving again)       +--expire--> Expired
///                                                                                               |
///                      a hold placed before the expiry's first delete call, calls it off:  <----+
///                      Expired --> Archived{hot_deleted:true} (held)
///
/// Hot, Archiving --adopt--> Archived{hot_deleted:true}   (`frostline adopt`: a verified archive
///                      another copy of the data directory published holds every hot row)
///
/// Archived{hot_deleted:true} --late record--> ArchivedPending --claim--> Archiving (the next
///                      generation: the published archive and the pending rows, merged)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BucketState {
    Hot,
    Archiving,
    Archived {
        hot_deleted: bool,
    },
    /// Archived, with rows appended after its archive was published (late records, a
    /// backfill) waiting in the hot store: reads merge the two, and the next archival publishes
    /// a generation that holds both.
    ArchivedPending,
    Expired,
}

impl BucketState {
    /// Every state, in the order of the diagram.
    pub const ALL: [BucketState; 6] = [
        BucketState::Hot,
        BucketState::Archiving,
        BucketState::Archived { hot_deleted: false },
        BucketState::Archived { hot_deleted: true },
        BucketState::ArchivedPending,
        BucketState::Expired,
    ];

    /// The one place that says which transitions exist.
    pub fn can_transition_to(self, next: BucketState) -> bool {
        use BucketState::*;
        match (self, next) {
            (Hot, Archiving) => true,
            // A takeover or a retry claims again under a new generation.
            (Archiving, Archiving) => true,
            (Archiving, Archived { hot_deleted: false }) => true,
            (Archived { hot_deleted: false }, Archived { hot_deleted: true }) => true,
            (Archived { hot_deleted: true }, Expired) => true,
            // A hold placed after the tombstone but before the first delete call.
            (Expired, Archived { hot_deleted: true }) => true,
            // Adoption of an archive another copy of the data directory published, once every
            // hot row is proven to be in it (`store::adopt`).
            (Hot | Archiving, Archived { hot_deleted: true }) => true,
            // A record appended after the archive was published, and the archival of the
            // generation that takes it in.
            (Archived { hot_deleted: true }, ArchivedPending) => true,
            (ArchivedPending, Archiving) => true,
            // Adoption of the next generation another copy published, holding the pending rows.
            (ArchivedPending, Archived { hot_deleted: true }) => true,
            // Its archive is gone (another copy of the data directory expired it): the rows
            // appended beside it go with it, and so do its own rows whose cleanup this copy had
            // not finished when it was backed up.
            (ArchivedPending | Archiving | Archived { hot_deleted: false }, Expired) => true,
            _ => false,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            BucketState::Hot => "hot",
            BucketState::Archiving => "archiving",
            BucketState::Archived { hot_deleted: false } => "archived_cleanup_pending",
            BucketState::Archived { hot_deleted: true } => "archived",
            BucketState::ArchivedPending => "archived_pending_rows",
            BucketState::Expired => "expired",
        }
    }

    /// Appends are accepted while a bucket is hot, and by an archived bucket whose hot rows are
    /// gone (a late record: it waits beside the archive for the next generation). A bucket
    /// being archived or cleaned up is fenced for the moment; an expired one is closed.
    pub fn accepts_appends(self) -> bool {
        matches!(self, BucketState::Hot | BucketState::Archived { hot_deleted: true } | BucketState::ArchivedPending)
    }

    /// Whether the bucket has a published archive that reads must include (beside any hot rows
    /// waiting for the next generation).
    pub fn has_archive(self) -> bool {
        matches!(self, BucketState::Archived { .. } | BucketState::ArchivedPending)
    }
}

impl std::fmt::Display for BucketState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A retention decision for one bucket, as checked by the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionPlan {
    pub archive_at: Option<Micros>,
    pub expire_at: Option<Micros>,
    pub reason: String,
}

/// Where an archive lives: the target's name in the policy directory and its URL. Archives
/// written before targets were named in manifests carry an empty name (matched by URL).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ArchiveTarget {
    pub name: String,
    pub url: String,
}

impl std::fmt::Display for ArchiveTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name.is_empty() { write!(f, "{}", self.url) } else { write!(f, "`{}` ({})", self.name, self.url) }
    }
}

/// What a retention policy sees of a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketFacts {
    pub table: String,
    pub partition_key: Vec<u8>,
    pub tenant: Option<String>,
    pub kind: Option<String>,
    pub bucket: BucketDescriptor,
    pub row_count: u64,
    pub byte_count: u64,
    pub state: BucketState,
    pub archived_at: Option<Micros>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue: event times beyond year 9999 were accepted, and Delta's statistics
    /// overflowed or were written as empty strings for them).
    #[test]
    fn event_times_are_bounded_to_the_years_every_format_expresses() {
        let at = |event_time| Record {
            partition_key: b"p".to_vec(),
            event_time,
            sort_key: Vec::new(),
            tenant: None,
            kind: None,
            body: "{}".into(),
        };
        // Obeyed: both ends, which are the first and last microseconds of years 1 and 9999.
        assert_eq!(time::format_rfc3339(EVENT_TIME_MIN), "0001-01-01T00:00:00Z");
        assert_eq!(time::format_rfc3339(EVENT_TIME_MAX), "9999-12-31T23:59:59.999999Z");
        assert!(at(EVENT_TIME_MIN).validate().is_ok() && at(EVENT_TIME_MAX).validate().is_ok());
        // Enforced: one microsecond outside either end, and the extremes of i64.
        for outside in [EVENT_TIME_MIN - 1, EVENT_TIME_MAX + 1, i64::MIN, i64::MAX] {
            let err = at(outside).validate().unwrap_err().to_string();
            assert!(err.contains("event_time") && err.contains("9999-12-31T23:59:59.999999Z"), "{err}");
        }
    }

    #[test]
    fn state_machine_allows_only_the_protocol_edges() {
        use BucketState::*;
        let all =
            [Hot, Archiving, Archived { hot_deleted: false }, Archived { hot_deleted: true }, ArchivedPending, Expired];
        let allowed: Vec<(BucketState, BucketState)> = all
            .iter()
            .flat_map(|a| all.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| a.can_transition_to(*b))
            .collect();
        assert_eq!(
            allowed,
            vec![
                (Hot, Archiving),
                (Hot, Archived { hot_deleted: true }),
                (Archiving, Archiving),
                (Archiving, Archived { hot_deleted: false }),
                (Archiving, Archived { hot_deleted: true }),
                (Archiving, Expired),
                (Archived { hot_deleted: false }, Archived { hot_deleted: true }),
                (Archived { hot_deleted: false }, Expired),
                (Archived { hot_deleted: true }, ArchivedPending),
                (Archived { hot_deleted: true }, Expired),
                (ArchivedPending, Archiving),
                (ArchivedPending, Archived { hot_deleted: true }),
                (ArchivedPending, Expired),
                (Expired, Archived { hot_deleted: true }),
            ]
        );
    }

    #[test]
    fn multi_line_bodies_become_one_line_and_others_stay_byte_for_byte() {
        assert_eq!(one_line_json(r#"{"a": 1}"#), r#"{"a": 1}"#);
        assert_eq!(one_line_json("{\n  \"a\": \"x y\\n\",\r\n  \"b\": [1, 2]\n}"), r#"{"a":"x y\n","b":[1,2]}"#);
    }

    #[test]
    fn a_strategy_is_the_same_wherever_its_file_lies_and_whatever_a_builtins_build() {
        let id = |name: &str, hash: &str, config: &str| StrategyIdentity {
            name: name.into(),
            plugin_hash: hash.into(),
            config: config.into(),
        };
        let file = id("/etc/frostline/policies/week.wasm", "aa", "{}");
        assert!(file.same_as(&id("/srv/frostline/data/plugins/aa.wasm", "aa", "{}")));
        assert!(!file.same_as(&id("/etc/frostline/policies/week.wasm", "bb", "{}")));
        assert!(!file.same_as(&id("/etc/frostline/policies/week.wasm", "aa", r#"{"x":1}"#)));
        let builtin = id("builtin:calendar-day-utc", "aa", r#"{"unit":"day"}"#);
        assert!(builtin.same_as(&id("builtin:calendar-day-utc", "cc", r#"{"unit":"day"}"#)));
        assert!(!builtin.same_as(&id("builtin:calendar-year-utc", "aa", r#"{"unit":"day"}"#)));
        assert!(!builtin.same_as(&id("/policies/calendar.wasm", "aa", r#"{"unit":"day"}"#)));
    }

    #[test]
    fn table_ids_are_bounded_visible_ascii() {
        assert!(validate_table_id("metrics.v1").is_ok());
        assert!(validate_table_id(&"a".repeat(TABLE_ID_BYTES_MAX)).is_ok());
        assert!(validate_table_id(&"a".repeat(TABLE_ID_BYTES_MAX + 1)).is_err());
        assert!(validate_table_id("").is_err());
        assert!(validate_table_id("has space").is_err());
        assert!(validate_table_id("é").is_err());
    }
}

/// Identifies a strategy exactly: the plugin's content hash and its effective configuration.
/// A table's strategy identity never changes (ARCHITECTURE.md, "Policy sets and hot reload").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StrategyIdentity {
    /// The name the strategy was loaded under (`builtin:calendar-year-utc` or a path).
    pub name: String,
    /// SHA-256 of the component, hex.
    pub plugin_hash: String,
    /// The configuration passed to `init`.
    pub config: String,
}

/// How built-in plugins are named (`builtin:NAME`).
pub const BUILTIN_PREFIX: &str = "builtin:";

impl StrategyIdentity {
    /// Whether `other` makes the same buckets as `self`: a built-in by its name and
    /// configuration (its bytes change with the engine's build), a file plugin by its content
    /// hash and configuration, wherever the file lies (a moved policy directory, or the copy
    /// kept in the data directory for a retired table).
    pub fn same_as(&self, other: &StrategyIdentity) -> bool {
        let builtin = |i: &StrategyIdentity| i.name.starts_with(BUILTIN_PREFIX);
        let same_plugin = if builtin(self) || builtin(other) {
            self.name == other.name
        } else {
            self.plugin_hash == other.plugin_hash
        };
        same_plugin && self.config == other.config
    }

    /// A short stable fingerprint for manifests and metadata.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        hasher.update(self.plugin_hash.as_bytes());
        hasher.update([0]);
        hasher.update(self.config.as_bytes());
        hex::encode(&hasher.finalize()[..8])
    }
}

/// Maps event times to buckets. WASM and native implementations sit behind it.
pub trait BucketStrategy: Send + Sync {
    fn identity(&self) -> &StrategyIdentity;

    /// One descriptor per time, in order; each contains its time.
    fn buckets_for(&self, times: &[Micros]) -> Result<Vec<BucketDescriptor>>;

    fn bucket_for(&self, time: Micros) -> Result<BucketDescriptor> {
        Ok(self.buckets_for(&[time])?.pop().expect("one descriptor per time"))
    }

    /// Calls into the implementation and how many failed, when it counts them (plugins do).
    fn call_counts(&self) -> Option<CallCounts> {
        None
    }
}

/// Decides when buckets are archived and expire.
pub trait RetentionPolicy: Send + Sync {
    fn name(&self) -> &str;

    /// One plan (or the policy's reason for refusing) per bucket, in order. An outer error
    /// means the policy could not be asked at all (a fault): every bucket is deferred.
    fn plan(&self, now: Micros, buckets: &[BucketFacts]) -> Result<Vec<std::result::Result<RetentionPlan, String>>>;

    /// Calls into the implementation and how many failed, when it counts them (plugins do).
    fn call_counts(&self) -> Option<CallCounts> {
        None
    }
}

/// Calls made into a plugin since it was instantiated for its policy set, for status and
/// metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCounts {
    pub calls: u64,
    /// Traps, timeouts, out-of-memory and refused instantiations.
    pub faults: u64,
    /// Answers the host refused.
    pub invalid_answers: u64,
}
