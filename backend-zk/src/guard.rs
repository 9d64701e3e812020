//! Guarded writes for data kept in ZooKeeper: one multi-op that first checks our lock node still
//! exists, so a holder whose session died (its ephemeral node is gone) cannot write.

use distlock_api::{Lease, LockError, Result};
use zookeeper_client::CheckWriteError;

use crate::ZkBackend;

impl ZkBackend {
    /// Sets `data` on `path` (at `expected_version` if given) atomically with a check that
    /// `lease`'s lock node still exists. Returns `false` when the check failed (the lock is gone)
    /// and nothing was written.
    ///
    /// # Errors
    /// `Unsupported` for a lease of another backend; backend errors as they come; a failed write
    /// of `path` itself (it does not exist: create it first; a version mismatch) names `path`.
    pub async fn guarded_set_data(
        &self,
        lease: &Lease,
        path: &str,
        data: &[u8],
        expected_version: Option<i32>,
    ) -> Result<bool> {
        if lease.backend() != "zk" {
            return Err(LockError::Unsupported {
                backend: "zk",
                what: format!(
                    "a guarded write for a lease of the {} backend",
                    lease.backend()
                ),
            });
        }
        let client = self.client().await?;
        let mut writer = client
            .new_check_writer(lease.backend_key(), None)
            .map_err(|e| LockError::backend("zookeeper", false, e))?;
        writer
            .add_set_data(path, data, expected_version)
            .map_err(|e| LockError::backend("zookeeper", false, e))?;
        match writer.commit().await {
            Ok(_) => Ok(true),
            Err(CheckWriteError::CheckFailed { .. }) => Ok(false),
            // The write itself failed: say which node (a missing one must be created first).
            Err(CheckWriteError::OperationFailed { source, .. }) => Err(LockError::backend(
                "zookeeper",
                false,
                format!("the guarded write of {path} failed: {source}"),
            )),
            Err(e) => Err(LockError::backend("zookeeper", true, e)),
        }
    }
}
