//! A try puts its key only where the policy admits it: one txn compares the name's keys against
//! the view that admitted it (none created since), so a try that is not admitted writes
//! nothing. (Queued, then taken back, a writer's refused try stood in the queue for a round trip
//! or two and turned other callers' tries away.) A free name costs one txn, as an enqueue does.

use distlock_api::{Admission, LockError, Result, entry_limit};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::client::EtcdBackend;

/// How many views a try reads when keys keep coming between its read and its put; past that
/// the name is too busy to take at once.
const VIEWS: u32 = 8;

/// What a try came to.
pub(crate) enum Tried {
    /// Our key was put, admitted, at this revision (its fencing token).
    Put(i64),
    /// Nothing was put, for this reason (`Busy`, `LimitMismatch`).
    Refused(LockError),
}

impl EtcdBackend {
    /// Puts `key` (with `entry`, on `lease`) under `prefix` if `admission` admits it behind the
    /// keys there; the name's other keys are read only when some exist. Safe to repeat: a
    /// request applied whose answer was lost finds our key in the next view.
    pub(crate) async fn try_enqueue(
        &self,
        name: &str,
        prefix: &str,
        key: &str,
        lease: i64,
        entry: &str,
        admission: Admission,
    ) -> Result<Tried> {
        let busy = || {
            Tried::Refused(LockError::Busy {
                name: name.to_string(),
            })
        };
        // The revision the view that admits us is true at: at first, a view of no keys.
        let mut seen = 0;
        for _ in 0..VIEWS {
            let mut otherwise = vec![TxnOp::get(key, None)];
            // An exclusive entry is admitted only alone: any key refuses it, unread.
            if admission != Admission::Exclusive {
                otherwise.push(TxnOp::get(prefix, Some(GetOptions::new().with_prefix())));
            }
            let txn = Txn::new()
                .when([Compare::create_revision(prefix, CompareOp::Less, seen + 1).with_prefix()])
                .and_then([TxnOp::put(
                    key,
                    entry,
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else(otherwise);
            let resp = self.txn(txn).await?;
            let at = resp.header().map(|h| h.revision()).unwrap_or_default();
            if resp.succeeded() {
                return Ok(Tried::Put(at));
            }
            let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            });
            let Some(ours) = gets.next() else {
                return Err(self.err_text("a try's txn answered without its read"));
            };
            if let Some(kv) = ours.kvs().first()
                && kv.value() == entry.as_bytes()
            {
                return Ok(Tried::Put(kv.create_revision()));
            }
            let Some(keys) = gets.next() else {
                return Ok(busy());
            };
            let limits: Vec<u32> = keys
                .kvs()
                .iter()
                .map(|kv| entry_limit(kv.value()))
                .collect();
            if let Err(e) = admission.check_ahead(name, limits.iter().copied()) {
                return Ok(Tried::Refused(e));
            }
            if !admission.admitted(limits) {
                return Ok(busy());
            }
            seen = at;
        }
        Ok(busy())
    }
}
