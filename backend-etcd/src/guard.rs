//! Guarded writes for resources stored in etcd: the write happens only while our lock key still
//! exists with our create revision (the fencing token). This is Jepsen's safe `lock-etcd-set`
//! pattern: even a holder paused past its session TTL cannot write, because its key is gone.

use distlock_api::{Lease, LockError, Result};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::EtcdBackend;

impl EtcdBackend {
    /// Runs `ops` atomically if and only if `lease`'s key still exists with the lease's fencing
    /// token as its create revision. Returns whether the ops ran.
    ///
    /// # Errors
    /// `Unsupported` if `lease` did not come from an etcd backend (it has no etcd key or token);
    /// backend errors as they come.
    pub async fn guarded_txn(&self, lease: &Lease, ops: Vec<TxnOp>) -> Result<bool> {
        let token = match (lease.backend(), lease.fencing_token()) {
            ("etcd", Some(t)) => t,
            (backend, _) => {
                return Err(LockError::Unsupported {
                    backend: "etcd",
                    what: format!("a guarded txn for a lease of the {backend} backend"),
                });
            }
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                lease.backend_key(),
                CompareOp::Equal,
                token.get() as i64,
            )])
            .and_then(ops);
        let resp = self
            .client()
            .txn(txn)
            .await
            .map_err(|e| LockError::backend("etcd", true, e))?;
        Ok(resp.succeeded())
    }
}
