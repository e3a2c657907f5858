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

    /// Records, in one transaction, that `sink` has delivered each of `sequences`.
    pub fn record_deliveries(&self, sink: String, sequences: Vec<u64>, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let mut t = txn.open_table(DELIVERIES)?;
            for sequence in sequences {
                t.insert(delivery_key(&sink, sequence).as_slice(), now)?;
            }
            Ok(())
        })
    }

    /// Which of `sequences` `sink` has delivered, read at one instant.
    pub fn delivered_among(&self, sink: &str, sequences: &[u64]) -> Result<std::collections::HashSet<u64>> {
        let txn = self.read()?;
        let t = txn.open_table(DELIVERIES)?;
        let mut out = std::collections::HashSet::new();
        for &sequence in sequences {
            if t.get(delivery_key(sink, sequence).as_slice())?.is_some() {
                out.insert(sequence);
            }
        }
        Ok(out)
    }

    /// Removes delivered outbox events and their delivery records (those of sinks since
    /// removed from the policy too), in one transaction: a seek per sink recorded and event,
    /// never a walk of every record (a backlog's are many while a sink is down).
    pub fn ack_outbox(&self, sequences: Vec<u64>) -> Result<()> {
        self.write(move |txn| {
            let mut t = txn.open_table(OUTBOX)?;
            let mut deliveries = txn.open_table(DELIVERIES)?;
            for s in &sequences {
                t.remove(s.to_be_bytes().as_slice())?;
            }
            // Each sink's records are one range of keys (its name, then the sequence): from
            // the first key of a sink, its prefix, then on past the end of that prefix.
            let mut from: Vec<u8> = Vec::new();
            loop {
                let prefix = match deliveries.range::<&[u8]>(from.as_slice()..)?.next() {
                    Some(entry) => {
                        let key = entry?.0.value().to_vec();
                        let at = key.len().checked_sub(8).ok_or_else(|| {
                            Error::Corruption(format!("a delivery record's key is too short: {}", hex::encode(&key)))
                        })?;
                        key[..at].to_vec()
                    }
                    None => break,
                };
                for s in &sequences {
                    let mut key = prefix.clone();
                    encoding::put_u64(&mut key, *s);
                    deliveries.remove(key.as_slice())?;
                }
                from = encoding::prefix_end(&prefix);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Deliveries are recorded and read a batch at a time, and an acknowledgement removes the
    /// events and every sink's record of them (a sink since removed from the policy too),
    /// nothing else.
    #[test]
    fn deliveries_are_recorded_in_batches_and_an_acknowledgement_removes_every_record_of_its_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        for n in 0..5 {
            store.write(move |txn| push_outbox(txn, "test", None, n, serde_json::json!({ "n": n }))).unwrap();
        }
        let sequences: Vec<u64> = store.outbox(10).unwrap().iter().map(|e| e.sequence).collect();
        assert_eq!(sequences.len(), 5);
        store.record_deliveries("audit".into(), sequences[..3].to_vec(), 1).unwrap();
        store.record_deliveries("removed sink".into(), sequences.clone(), 1).unwrap();
        // A name that begins with another's: each sink's records are a range of their own.
        store.record_deliveries("audit/2 %=é".into(), sequences.clone(), 1).unwrap();
        let audit = store.delivered_among("audit", &sequences).unwrap();
        assert_eq!(audit, sequences[..3].iter().copied().collect());
        assert_eq!(store.delivered_among("removed sink", &sequences).unwrap().len(), 5);

        store.ack_outbox(sequences[..3].to_vec()).unwrap();
        assert_eq!(store.outbox(10).unwrap().iter().map(|e| e.sequence).collect::<Vec<_>>(), sequences[3..]);
        assert!(store.delivered_among("audit", &sequences).unwrap().is_empty());
        let left = store.delivered_among("removed sink", &sequences).unwrap();
        assert_eq!(left, sequences[3..].iter().copied().collect(), "only the acknowledged events' records go");
        assert_eq!(store.delivered_among("audit/2 %=é", &sequences).unwrap(), left);
    }
}
