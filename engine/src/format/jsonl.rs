//! JSON-lines segments: one record per line, in clustering order. The body is embedded as raw
//! JSON, so a reader needs nothing but a JSON parser.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::rows::{RowFields, RowSummary, RowSummer};
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

/// Appends one record as a JSON line (with its newline) to `out`: the bytes serde_json writes
/// for a `Line`, with the body copied as it is stored rather than parsed again. It was checked
/// to be one JSON value, on one line, when it was appended, and every segment is read back and
/// parsed line by line before it counts, so a body damaged in the store is caught there.
pub fn encode_line(record: &Record, out: &mut Vec<u8>) -> Result<()> {
    fn string(out: &mut Vec<u8>, name: &[u8], value: &str) -> Result<()> {
        out.extend_from_slice(name);
        serde_json::to_writer(&mut *out, value).map_err(|e| Error::Internal(format!("encoding a row: {e}")))
    }
    string(out, b"{\"partition_key\":", &String::from_utf8_lossy(&record.partition_key))?;
    out.extend_from_slice(b",\"event_time\":");
    out.extend_from_slice(record.event_time.to_string().as_bytes());
    string(out, b",\"sort_key\":", &String::from_utf8_lossy(&record.sort_key))?;
    if let Some(tenant) = &record.tenant {
        string(out, b",\"tenant\":", tenant)?;
    }
    if let Some(kind) = &record.kind {
        string(out, b",\"kind\":", kind)?;
    }
    out.extend_from_slice(b",\"body\":");
    out.extend_from_slice(record.body.trim_ascii().as_bytes());
    out.extend_from_slice(b"}\n");
    Ok(())
}

/// Each line of a segment, parsed, borrowing from the bytes.
fn parse_lines(bytes: &[u8]) -> Result<impl Iterator<Item = Result<Line<'_>>>> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error::Corruption(format!("segment is not UTF-8: {e}")))?;
    Ok(text.lines().enumerate().map(|(n, raw)| {
        serde_json::from_str(raw).map_err(|e| Error::Corruption(format!("segment line {} does not parse: {e}", n + 1)))
    }))
}

/// The row summary of a segment's lines, summed from the bytes without building records:
/// what a read-back verification compares with the manifest.
pub fn summarize_segment(bytes: &[u8]) -> Result<RowSummary> {
    let mut summer = RowSummer::default();
    for line in parse_lines(bytes)? {
        let line = line?;
        summer.push_fields(RowFields {
            partition_key: line.partition_key.as_bytes(),
            event_time: line.event_time,
            sort_key: line.sort_key.as_bytes(),
            tenant: line.tenant.as_deref(),
            kind: line.kind.as_deref(),
            body: line.body.get(),
        });
    }
    Ok(summer.finish())
}

/// Parses every line of a segment back into records.
pub fn decode_segment(bytes: &[u8]) -> Result<Vec<Record>> {
    parse_lines(bytes)?
        .map(|line| {
            let line = line?;
            Ok(Record {
                partition_key: line.partition_key.into_owned().into_bytes(),
                event_time: line.event_time,
                sort_key: line.sort_key.into_owned().into_bytes(),
                tenant: line.tenant.map(|c| c.into_owned()),
                kind: line.kind.map(|c| c.into_owned()),
                body: line.body.get().to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Serialized<'a> {
        partition_key: &'a str,
        event_time: Micros,
        sort_key: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        tenant: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<&'a str>,
        body: &'a serde_json::value::RawValue,
    }

    #[test]
    fn a_line_is_the_bytes_serde_json_writes_and_sums_as_its_record() {
        let records = [
            Record {
                partition_key: "pé/\"1\"\n".as_bytes().to_vec(),
                event_time: -5,
                sort_key: b"a\0b\\".to_vec(),
                tenant: Some("t\u{1}".into()),
                kind: None,
                body: " {\"x\": [1, \"\\u00e9\"]} ".into(),
            },
            Record {
                partition_key: b"p".to_vec(),
                event_time: i64::MAX,
                sort_key: Vec::new(),
                tenant: None,
                kind: Some("k".into()),
                body: "null".into(),
            },
        ];
        let mut segment = Vec::new();
        for r in &records {
            let mut line = Vec::new();
            encode_line(r, &mut line).unwrap();
            let body: &serde_json::value::RawValue = serde_json::from_str(&r.body).unwrap();
            let expected = serde_json::to_string(&Serialized {
                partition_key: std::str::from_utf8(&r.partition_key).unwrap(),
                event_time: r.event_time,
                sort_key: std::str::from_utf8(&r.sort_key).unwrap(),
                tenant: r.tenant.as_deref(),
                kind: r.kind.as_deref(),
                body,
            })
            .unwrap();
            assert_eq!(String::from_utf8(line.clone()).unwrap(), expected + "\n");
            segment.extend(line);
        }
        let decoded = decode_segment(&segment).unwrap();
        assert_eq!(summarize_segment(&segment).unwrap(), crate::model::rows::summarize(&decoded));
        let trimmed: Vec<Record> = records
            .iter()
            .cloned()
            .map(|mut r| {
                r.body = r.body.trim().to_string();
                r
            })
            .collect();
        assert_eq!(decoded, trimmed);
        assert!(summarize_segment(b"{\"partition_key\":1}\n").is_err());
    }
}
