//! The outbox: lifecycle events written in the transaction that makes them true, read and
//! acknowledged by the delivery to sinks, and each sink's delivery record.

use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::Micros;

use super::schema::{
    BucketId, BucketMeta, DELIVERIES, META, META_OUTBOX_SEQUENCE, OUTBOX, OutboxEvent, decode_value, encode_value,
};
use super::{Store, encoding};

impl Store {
    pub fn outbox(&self, limit: usize) -> Result<Vec<OutboxEvent>> {
        let txn = self.read()?;
        let t = txn.open_table(OUTBOX)?;
        let mut out = Vec::new();
        for entry in t.iter()?.take(limit) {
            let (_, v) = entry?;
            out.push(decode_value(v.value())?);
        }
        Ok(out)
    }

    pub fn outbox_len(&self) -> Result<u64> {
        let txn = self.read()?;
        Ok(txn.open_table(OUTBOX)?.len()?)
    }

    /// Records, for audits, that the orphan sweep deleted an object.
    pub fn note_orphan_deleted(&self, key: String, target: String, now: Micros) -> Result<()> {
        self.write(move |txn| {
            push_outbox(txn, "orphan_deleted", None, now, serde_json::json!({"key": key, "target": target}))
        })
    }

    /// Records that `sink` has delivered event `sequence`.
    pub fn record_delivery(&self, sink: String, sequence: u64, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let key = delivery_key(&sink, sequence);
            txn.open_table(DELIVERIES)?.insert(key.as_slice(), now)?;
            Ok(())
        })
    }

    pub fn delivered(&self, sink: &str, sequence: u64) -> Result<bool> {
        let txn = self.read()?;
        let t = txn.open_table(DELIVERIES)?;
        Ok(t.get(delivery_key(sink, sequence).as_slice())?.is_some())
    }

    /// Removes delivered outbox events and their delivery records.
    pub fn ack_outbox(&self, sequences: Vec<u64>) -> Result<()> {
        self.write(move |txn| {
            let mut t = txn.open_table(OUTBOX)?;
            let mut deliveries = txn.open_table(DELIVERIES)?;
            for s in sequences {
                t.remove(s.to_be_bytes().as_slice())?;
                let mut stale: Vec<Vec<u8>> = Vec::new();
                for entry in deliveries.iter()? {
                    let key = entry?.0.value().to_vec();
                    if key.ends_with(&s.to_be_bytes()) {
                        stale.push(key);
                    }
                }
                for k in stale {
                    deliveries.remove(k.as_slice())?;
                }
            }
            Ok(())
        })
    }
}

pub(super) fn delivery_key(sink: &str, sequence: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encoding::put_bytes(&mut out, sink.as_bytes());
    encoding::put_u64(&mut out, sequence);
    out
}

pub(super) fn push_outbox(
    txn: &WriteTransaction,
    kind: &str,
    meta: Option<&BucketMeta>,
    now: Micros,
    detail: serde_json::Value,
) -> Result<()> {
    let mut m = txn.open_table(META)?;
    let sequence = match m.get(META_OUTBOX_SEQUENCE)? {
        Some(v) => {
            u64::from_be_bytes(v.value().try_into().map_err(|_| Error::Corruption("outbox sequence".into()))?) + 1
        }
        None => 1,
    };
    m.insert(META_OUTBOX_SEQUENCE, sequence.to_be_bytes().as_slice())?;
    let event = OutboxEvent {
        sequence,
        kind: kind.to_string(),
        bucket: meta.map(|m| m.id.clone()),
        generation: meta.map_or(0, |m| m.generation),
        at: now,
        detail,
    };
    txn.open_table(OUTBOX)?.insert(sequence.to_be_bytes().as_slice(), encode_value(&event)?.as_slice())?;
    Ok(())
}

/// Whether an event telling of the bucket's expiry still waits in the outbox for a sink.
pub(super) fn expiry_events_pending(txn: &WriteTransaction, id: &BucketId) -> Result<bool> {
    let t = txn.open_table(OUTBOX)?;
    for entry in t.iter()? {
        let event: OutboxEvent = decode_value(entry?.1.value())?;
        if event.bucket.as_ref() == Some(id) && matches!(event.kind.as_str(), "archive_expiring" | "archive_expired") {
            return Ok(true);
        }
    }
    Ok(false)
}
