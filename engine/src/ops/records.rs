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

/// Parses one JSON line into a record, validated.
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

/// Appends a checked batch to `table` atomically: every record or none. Returns once the
/// commit is durable: an answer is an acknowledgement.
pub fn append(
    engine: &crate::engine::Engine,
    table: &str,
    records: crate::model::CheckedRecords,
) -> Result<super::wire::AppendCounts> {
    let outcome = engine.append_checked(table, records)?;
    Ok(super::wire::AppendCounts {
        appended: outcome.appended,
        duplicates: outcome.duplicates,
        already_archived: outcome.already_archived,
        column_misses: outcome.column_misses,
    })
}

/// `append` as a backfill batch (`frostline ingest`): first holds the table's backfill lease
/// (`store::backfill`) for `BACKFILL_LEASE_SECONDS` more, so no pass makes a generation of a
/// bucket the ingest may still add to.
pub fn append_backfill(
    engine: &crate::engine::Engine,
    table: &str,
    records: crate::model::CheckedRecords,
) -> Result<super::wire::AppendCounts> {
    engine.policies().table(table)?;
    let lease_us = crate::store::backfill::BACKFILL_LEASE_SECONDS as i64 * 1_000_000;
    engine.store().hold_backfill(table, engine.clock().now().saturating_add(lease_us))?;
    append(engine, table, records)
}

/// Ends the table's backfill lease: the ingest is over, its buckets may be archived at once.
pub fn end_backfill(engine: &crate::engine::Engine, table: &str) -> Result<()> {
    engine.policies().table(table)?;
    engine.store().end_backfill(table)
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
    fn a_malformed_line_names_its_problem() {
        assert!(parse_line("not json").is_err());
        let when = parse_line("{\"partition_key\":\"a\",\"event_time\":\"yesterday\",\"body\":1}").unwrap_err();
        assert!(when.to_string().contains("RFC 3339"), "{when}");
        let extra = parse_line("{\"partition_key\":\"a\",\"event_time\":1,\"body\":1,\"extra\":2}").unwrap_err();
        assert!(extra.to_string().contains("extra"), "{extra}");
        let ok =
            parse_line("{\"partition_key\":\"a\",\"event_time\":\"2024-01-01T00:00:00Z\",\"body\":{\"x\":1}}").unwrap();
        assert_eq!(ok.event_time, 1_704_067_200_000_000);
        assert_eq!(ok.body, "{\"x\":1}");
    }
}
