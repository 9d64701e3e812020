//! Reading a name without touching it: the name's range in creation order (each key's value
//! records its limit, so the same admission rule that grants picks the holders, each with its
//! create revision as token), then the time-to-live of each holder's session lease.

use std::time::Duration;

use distlock_api::{
    Admission, FencingToken, HolderInfo, HolderStatus, LockName, LockStatus, Result,
    admitted_count, entry_limit,
};
use etcd_client::{GetOptions, SortOrder, SortTarget};

use crate::EtcdBackend;
use crate::keys::parse_attempt_key;

impl EtcdBackend {
    pub(crate) async fn inspect_range(&self, name: &LockName) -> Result<LockStatus> {
        let prefix = self.name_prefix(name);
        let in_order = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let got = self
            .call(&self.kv(), |mut c| {
                let (p, o) = (prefix.clone(), in_order.clone());
                async move { c.get(p, Some(o)).await }
            })
            .await?;
        let limits: Vec<u32> = got.kvs().iter().map(|kv| entry_limit(kv.value())).collect();
        let admitted = admitted_count(&limits);
        let mut holders = Vec::with_capacity(admitted);
        let mut ttls: Vec<(i64, Option<Duration>)> = Vec::new();
        for (kv, limit) in got.kvs().iter().zip(&limits).take(admitted) {
            let lease = std::str::from_utf8(kv.key())
                .ok()
                .and_then(parse_attempt_key)
                .map(|(lease, _)| lease);
            let expires_in = match lease {
                // Holders on one session share its time to live: asked once.
                Some(id) => match ttls.iter().find(|(l, _)| *l == id) {
                    Some((_, ttl)) => *ttl,
                    None => {
                        let ttl = self
                            .call(&self.lease_client(), |mut c| async move {
                                c.time_to_live(id, None).await
                            })
                            .await?
                            .ttl();
                        let ttl = u64::try_from(ttl).ok().map(Duration::from_secs);
                        ttls.push((id, ttl));
                        ttl
                    }
                },
                None => None,
            };
            holders.push(HolderStatus {
                token: Some(FencingToken(kv.create_revision() as u64)),
                expires_in,
                admission: Admission::of_limit(*limit),
                holder: HolderInfo::in_entry(kv.value()),
            });
        }
        Ok(LockStatus {
            holders,
            waiters: limits.len() - admitted,
        })
    }
}
