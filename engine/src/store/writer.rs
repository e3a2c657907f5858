//! The single writer: one thread owns redb's write transactions, fed by a channel. Appends
//! that arrive together commit in one transaction (group commit), each acknowledged after the
//! commit; a failed commit poisons the store until it is reopened.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, mpsc};

use redb::{Database, WriteTransaction};

use crate::error::{Error, Result};

use super::append::{AppendBatch, AppendOutcome, apply_batch};

/// Appends gathered into one transaction at most.
pub const GROUP_COMMIT_REQUESTS_MAX: usize = 256;

pub(super) type TxnFn = Box<dyn FnOnce(&WriteTransaction) -> Result<Box<dyn Any + Send>> + Send>;

pub(super) enum WriteRequest {
    Append {
        batch: AppendBatch,
        reply: mpsc::SyncSender<Result<AppendOutcome>>,
    },
    /// `durable: false` commits without an fsync (`Store::write_undoable`).
    Txn {
        f: TxnFn,
        durable: bool,
        reply: mpsc::SyncSender<Result<Box<dyn Any + Send>>>,
    },
}

pub(super) fn writer_loop(db: &Database, receiver: mpsc::Receiver<WriteRequest>, poisoned: &Poison) {
    while let Ok(first) = receiver.recv() {
        let mut group = vec![first];
        while group.len() < GROUP_COMMIT_REQUESTS_MAX {
            match receiver.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        let mut appends = Vec::new();
        for request in group {
            match request {
                WriteRequest::Append { batch, reply } => appends.push((batch, reply)),
                WriteRequest::Txn { f, durable, reply } => {
                    // Appends that arrived before this transaction commit first, in order.
                    commit_appends(db, std::mem::take(&mut appends), poisoned);
                    let _ = reply.send(run_txn(db, f, durable, poisoned));
                }
            }
        }
        commit_appends(db, appends, poisoned);
    }
}

/// Why the store refuses writes (after a failed commit), with the database's path for the
/// message.
pub(super) struct Poison {
    reason: Mutex<Option<String>>,
    path: PathBuf,
}

impl Poison {
    pub(super) fn new(path: &Path) -> Poison {
        Poison { reason: Mutex::new(None), path: path.to_path_buf() }
    }

    pub(super) fn reason(&self) -> Option<String> {
        self.reason.lock().expect("poison flag").clone()
    }

    /// Writes are refused from now on, for `reason`, until the store is reopened.
    pub(super) fn set(&self, reason: String) {
        *self.reason.lock().expect("poison flag") = Some(reason);
    }

    /// Writes are taken again (the store was reopened).
    pub(super) fn clear(&self) {
        *self.reason.lock().expect("poison flag") = None;
    }
}

pub(super) fn poison_check(poisoned: &Poison) -> Result<()> {
    match poisoned.reason() {
        Some(reason) => Err(Error::StorePoisoned(reason)),
        None => Ok(()),
    }
}

pub(super) fn commit(txn: WriteTransaction, poisoned: &Poison) -> Result<()> {
    txn.commit().map_err(|e| {
        let reason = format!(
            "a commit to {} failed: {e}; writes are refused until the store reopens itself, which it does once the \
             filesystem of {} takes writes again (free space there; no restart is needed)",
            poisoned.path.display(),
            poisoned.path.parent().unwrap_or(&poisoned.path).display()
        );
        tracing::error!(%reason, "the hot store refuses further writes until it is reopened");
        *poisoned.reason.lock().expect("poison flag") = Some(reason.clone());
        Error::StorePoisoned(reason)
    })
}

pub(super) fn run_txn(db: &Database, f: TxnFn, durable: bool, poisoned: &Poison) -> Result<Box<dyn Any + Send>> {
    poison_check(poisoned)?;
    let mut txn = db.begin_write()?;
    if !durable {
        txn.set_durability(redb::Durability::None)?;
    }
    match f(&txn) {
        Ok(value) => {
            commit(txn, poisoned)?;
            Ok(value)
        }
        Err(e) => {
            let _ = txn.abort();
            Err(e)
        }
    }
}

pub(super) type AppendReply = mpsc::SyncSender<Result<AppendOutcome>>;

pub(super) fn commit_appends(db: &Database, appends: Vec<(AppendBatch, AppendReply)>, poisoned: &Poison) {
    if appends.is_empty() {
        return;
    }
    let fail_all = |appends: Vec<(AppendBatch, AppendReply)>, error: &dyn Fn() -> Error| {
        for (_, reply) in appends {
            let _ = reply.send(Err(error()));
        }
    };
    if let Err(e) = poison_check(poisoned) {
        let message = e.to_string();
        return fail_all(appends, &|| Error::StorePoisoned(message.clone()));
    }
    let txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(e) => {
            let source = std::sync::Arc::new(redb::Error::from(e));
            return fail_all(appends, &|| Error::Database {
                context: "starting the group commit".into(),
                source: source.clone(),
            });
        }
    };
    let mut outcomes = Vec::with_capacity(appends.len());
    for (batch, _) in &appends {
        outcomes.push(apply_batch(&txn, batch));
    }
    // A database error while applying (or undoing) a batch leaves the transaction's contents
    // uncertain: nothing of the group is committed, and every append in it is refused.
    if let Some(Err(Error::Database { source, .. })) =
        outcomes.iter().find(|o| matches!(o, Err(Error::Database { .. })))
    {
        let source = source.clone();
        let _ = txn.abort();
        return fail_all(appends, &|| Error::Database {
            context: "an append in the same commit failed in the database; nothing was written".into(),
            source: source.clone(),
        });
    }
    match commit(txn, poisoned) {
        Ok(()) => {
            for ((_, reply), outcome) in appends.into_iter().zip(outcomes) {
                let _ = reply.send(outcome);
            }
        }
        Err(e) => {
            let message = e.to_string();
            fail_all(appends, &|| Error::StorePoisoned(message.clone()));
        }
    }
}
