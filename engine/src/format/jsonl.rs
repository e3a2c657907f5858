//! JSON-lines segments: one record per line, in clustering order. The body is embedded as raw
//! JSON, so a reader needs nothing but a JSON parser.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{Micros, Record};

#[derive(Serialize, Deserialize)]
struct Line<'a> {
    partition_key: std::borrow::Cow<'a, str>,
    event_time: Micros,
    sort_key: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    body: &'a serde_json::value::RawValue,
}

/// Appends one record as a JSON line (with its newline) to `out`.
pub fn encode_line(record: &Record, out: &mut Vec<u8>) -> Result<()> {
    let body: &serde_json::value::RawValue =
        serde_json::from_str(&record.body).map_err(|e| Error::Corruption(format!("a stored body is not JSON: {e}")))?;
    let line = Line {
        partition_key: String::from_utf8_lossy(&record.partition_key),
        event_time: record.event_time,
        sort_key: String::from_utf8_lossy(&record.sort_key),
        tenant: record.tenant.as_deref().map(Into::into),
        kind: record.kind.as_deref().map(Into::into),
        body,
    };
    serde_json::to_writer(&mut *out, &line).map_err(|e| Error::Internal(format!("encoding a row: {e}")))?;
    out.push(b'\n');
    Ok(())
}

/// Parses every line of a segment back into records.
pub fn decode_segment(bytes: &[u8]) -> Result<Vec<Record>> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error::Corruption(format!("segment is not UTF-8: {e}")))?;
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line: Line<'_> = serde_json::from_str(raw)
            .map_err(|e| Error::Corruption(format!("segment line {} does not parse: {e}", n + 1)))?;
        out.push(Record {
            partition_key: line.partition_key.into_owned().into_bytes(),
            event_time: line.event_time,
            sort_key: line.sort_key.into_owned().into_bytes(),
            tenant: line.tenant.map(|c| c.into_owned()),
            kind: line.kind.map(|c| c.into_owned()),
            body: line.body.get().to_string(),
        });
    }
    Ok(out)
}
