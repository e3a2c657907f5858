//! MessagePack segments (rmp-serde): one array of rows per segment, fields by name.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{Micros, Record};

#[derive(Serialize, Deserialize)]
struct Row {
    partition_key: String,
    event_time: Micros,
    sort_key: String,
    tenant: Option<String>,
    kind: Option<String>,
    /// The body as JSON text, byte for byte.
    body: String,
}

pub fn encode(records: &[Record]) -> Result<Vec<u8>> {
    let rows: Vec<Row> = records
        .iter()
        .map(|r| Row {
            partition_key: String::from_utf8_lossy(&r.partition_key).into_owned(),
            event_time: r.event_time,
            sort_key: String::from_utf8_lossy(&r.sort_key).into_owned(),
            tenant: r.tenant.clone(),
            kind: r.kind.clone(),
            body: r.body.clone(),
        })
        .collect();
    rmp_serde::to_vec_named(&rows).map_err(|e| Error::Internal(format!("encoding a MessagePack segment: {e}")))
}

pub fn decode(bytes: &[u8]) -> Result<Vec<Record>> {
    let rows: Vec<Row> = rmp_serde::from_slice(bytes)
        .map_err(|e| Error::Corruption(format!("MessagePack segment does not parse: {e}")))?;
    rows.into_iter()
        .map(|row| {
            serde_json::from_str::<&serde_json::value::RawValue>(&row.body)
                .map_err(|e| Error::Corruption(format!("a MessagePack row's body is not JSON: {e}")))?;
            Ok(Record {
                partition_key: row.partition_key.into_bytes(),
                event_time: row.event_time,
                sort_key: row.sort_key.into_bytes(),
                tenant: row.tenant,
                kind: row.kind,
                body: row.body,
            })
        })
        .collect()
}
