//! Records in their wire form: JSON lines as `ingest` and `POST /v1/tables/{table}/records`
//! read them, and as queries write them (the body byte for byte).

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::model::Record;
use crate::model::time::parse_rfc3339;

/// Malformed lines reported at most (the count of the rest is given).
pub const REPORTED_BAD_LINES_MAX: usize = 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    partition_key: String,
    event_time: serde_json::Value,
    #[serde(default)]
    sort_key: String,
    tenant: Option<String>,
    kind: Option<String>,
    body: Box<serde_json::value::RawValue>,
}

/// Parses JSON lines; blank lines are skipped. Errors carry 1-based line numbers.
pub fn parse_lines(text: &str) -> std::result::Result<Vec<Record>, Vec<String>> {
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        match parse_line(raw) {
            Ok(r) => records.push(r),
            Err(e) => errors.push(format!("line {}: {e}", n + 1)),
        }
    }
    if errors.is_empty() { Ok(records) } else { Err(errors) }
}

pub fn parse_line(raw: &str) -> Result<Record> {
    let line: Line = serde_json::from_str(raw).map_err(|e| Error::InvalidInput(e.to_string()))?;
    let event_time = match &line.event_time {
        serde_json::Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| Error::InvalidInput(format!("event_time {n} is not an integer count of microseconds")))?,
        serde_json::Value::String(s) => parse_rfc3339(s)?,
        other => {
            return Err(Error::InvalidInput(format!(
                "event_time must be RFC 3339 text or integer microseconds, not {other}"
            )));
        }
    };
    let record = Record {
        partition_key: line.partition_key.into_bytes(),
        event_time,
        sort_key: line.sort_key.into_bytes(),
        tenant: line.tenant,
        kind: line.kind,
        body: line.body.get().to_string(),
    };
    record.validate()?;
    Ok(record)
}

/// A record as one JSON line, the same shape `ingest` reads, with the body byte for byte.
pub fn record_json(r: &crate::model::Record) -> String {
    let mut line = Vec::new();
    match crate::format::jsonl::encode_line(r, &mut line) {
        Ok(()) => String::from_utf8_lossy(line.trim_ascii_end()).into_owned(),
        Err(e) => format!("{{\"error\":{:?}}}", e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_all_reported_with_numbers() {
        let text = "{\"partition_key\":\"a\",\"event_time\":5,\"body\":{}}\n\nnot json\n{\"partition_key\":\"a\",\"event_time\":\"yesterday\",\"body\":1}\n{\"partition_key\":\"a\",\"event_time\":1,\"body\":1,\"extra\":2}\n";
        let errors = parse_lines(text).unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("line 3:"));
        assert!(errors[1].starts_with("line 4:") && errors[1].contains("RFC 3339"));
        assert!(errors[2].starts_with("line 5:") && errors[2].contains("extra"));
        let ok = parse_lines("{\"partition_key\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\",\"body\":{\"x\":1}}")
            .unwrap();
        assert_eq!(ok[0].event_time, 1_704_067_200_000_000);
        assert_eq!(ok[0].body, "{\"x\":1}");
    }
}
