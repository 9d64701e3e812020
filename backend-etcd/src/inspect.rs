//! Reading a lock without touching it: the oldest key of the name's range (the holder, its
//! create revision the token) with the range's count, then the time-to-live of the holder's
//! session lease.

use std::time::Duration;

use distlock_api::{FencingToken, HolderStatus, LockName, LockStatus, Result};
use etcd_client::{GetOptions, SortOrder, SortTarget};

use crate::EtcdBackend;
use crate::keys::parse_attempt_key;

impl EtcdBackend {
    pub(crate) async fn inspect_range(&self, name: &LockName) -> Result<LockStatus> {
        let prefix = self.name_prefix(name);
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let got = self
            .call(&self.kv(), |mut c| {
                let (p, o) = (prefix.clone(), oldest.clone());
                async move { c.get(p, Some(o)).await }
            })
            .await?;
        let Some(head) = got.kvs().first() else {
            return Ok(LockStatus {
                holder: None,
                waiters: 0,
            });
        };
        let lease = std::str::from_utf8(head.key())
            .ok()
            .and_then(parse_attempt_key)
            .map(|(lease, _)| lease);
        let expires_in = match lease {
            Some(id) => {
                let ttl = self
                    .call(&self.lease_client(), |mut c| async move {
                        c.time_to_live(id, None).await
                    })
                    .await?
                    .ttl();
                u64::try_from(ttl).ok().map(Duration::from_secs)
            }
            None => None,
        };
        Ok(LockStatus {
            holder: Some(HolderStatus {
                token: Some(FencingToken(head.create_revision() as u64)),
                expires_in,
            }),
            waiters: (got.count() as usize).saturating_sub(1),
        })
    }
}
