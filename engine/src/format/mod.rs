//! Archive formats: how a bucket's rows become segments and how a manifest describes them.
//! Pure encoding and verification; no I/O.

pub mod jsonl;
pub mod manifest;

/// A segment holds at most this many rows...
pub const SEGMENT_ROWS_MAX: usize = 10_000;
/// ...and at most this many bytes (a single larger row gets a segment of its own).
pub const SEGMENT_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The format of a table's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Jsonl,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
        }
    }
}
