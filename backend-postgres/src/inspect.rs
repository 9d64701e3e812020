//! Every holder and the waiters of a name, read without writing (expired entries are skipped,
//! not deleted).

use std::time::Duration;

use distlock_api::{
    Admission, FencingToken, HolderInfo, HolderStatus, LockName, LockStatus, Result, admitted_count,
};
use tokio_postgres::types::Type;

use crate::client::PostgresBackend;

/// One live entry as [`crate::sql::ENTRIES`] reads it.
pub(crate) struct Entry {
    pub(crate) seq: u64,
    pub(crate) limit: u32,
    pub(crate) granted: bool,
    pub(crate) holder: String,
    pub(crate) expires_in: Duration,
    pub(crate) value: Option<String>,
}

impl PostgresBackend {
    /// The live entries of `name`, in queue order.
    pub(crate) async fn entries(&self, name: &LockName) -> Result<Vec<Entry>> {
        let rows = self
            .query(&self.inner.sql.entries, &[(&name.as_str(), Type::TEXT)])
            .await?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.try_get(0)?;
                let limit: i64 = r.try_get(1)?;
                let ms: i64 = r.try_get(4)?;
                Ok(Entry {
                    seq: u64::try_from(seq).unwrap_or(0),
                    limit: u32::try_from(limit).unwrap_or(u32::MAX),
                    granted: r.try_get(2)?,
                    holder: r.try_get(3)?,
                    expires_in: Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
                    value: r.try_get(5)?,
                })
            })
            .collect::<std::result::Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(&e))
    }

    pub(crate) async fn inspect_queue(&self, name: &LockName) -> Result<LockStatus> {
        let entries = self.entries(name).await?;
        let limits: Vec<u32> = entries.iter().map(|e| e.limit).collect();
        let admitted = admitted_count(&limits);
        let mut status = LockStatus::default();
        for (i, e) in entries.iter().enumerate() {
            // An admitted entry its waiter has not taken yet still waits.
            if i < admitted && e.granted {
                status.holders.push(HolderStatus {
                    token: Some(FencingToken(e.seq)),
                    expires_in: Some(e.expires_in),
                    admission: Admission::of_limit(e.limit),
                    holder: HolderInfo::in_head(e.holder.as_bytes()),
                });
            } else {
                status.waiters += 1;
            }
        }
        Ok(status)
    }
}
