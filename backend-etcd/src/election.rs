//! Leader election on the lock queue: the leader's value is written into its own attempt key
//! ([`distlock_api::announced_entry`]), so the head of the name's range is the leader and its value,
//! read together, and the value goes with the key.

use distlock_api::{
    FencingToken, GrantKey, Leader, LockName, Result, announced_entry, leader_value,
};
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use crate::EtcdBackend;
use crate::keys::parse_attempt_key;

impl EtcdBackend {
    /// Puts `<secret><holder>:<value>` into our key if it still exists with create revision `token`
    /// (the grant's; a key re-created on the same path has another), on the same session lease.
    pub(crate) async fn announce_entry(
        &self,
        key: &GrantKey,
        token: FencingToken,
        value: &str,
    ) -> Result<bool> {
        let Some((lease, slot)) = parse_attempt_key(&key.resource) else {
            return Ok(false);
        };
        let entry = announced_entry(&key.secret.expose_hex(), &key.holder, value);
        let txn = Txn::new()
            .when([Compare::create_revision(
                &*key.resource,
                CompareOp::Equal,
                token.get() as i64,
            )])
            .and_then([TxnOp::put(
                &*key.resource,
                entry.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let written = self.txn(txn).await?.succeeded();
        // The release compares the value: the slot keeps the current one.
        if written && let Some(session) = self.session_of(lease) {
            session.set_slot_entry(&self.name_prefix(&key.name), slot, &entry);
        }
        Ok(written)
    }

    /// The oldest key of the name's range (the holder), with its value (another recipe's key, an
    /// `etcdctl elect` candidate's: its proposal, [`distlock_api::leader_value`]): one
    /// linearizable read.
    pub(crate) async fn head_entry(&self, name: &LockName) -> Result<Option<Leader>> {
        let prefix = self.name_prefix(name);
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let got = self
            .call(&self.kv(), |mut c| {
                let (p, o) = (prefix.clone(), oldest.clone());
                async move { c.get(p, Some(o)).await }
            })
            .await?;
        Ok(got.kvs().first().and_then(|kv| {
            Some(Leader {
                term: FencingToken(kv.create_revision() as u64),
                value: leader_value(kv.value())?,
            })
        }))
    }

    /// Every event of the name's range, as a hint; the stream ends with the watch.
    pub(crate) async fn range_events(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        let prefix = self.name_prefix(name);
        let watch = self
            .call(&self.watch_client(), |mut c| {
                let p = prefix.clone();
                async move { c.watch(p, Some(WatchOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(futures_util::stream::unfold(watch, |mut w| async move {
            match w.message().await {
                Ok(Some(m)) if !m.canceled() => Some(((), w)),
                _ => None,
            }
        })
        .boxed())
    }
}
