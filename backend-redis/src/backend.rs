//! [`RedisBackend`]: the lock contract over one Redis server.

use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, Leader,
    LockBackend, LockError, LockName, LockStatus, Reconnect, Reentrancy, Renewal, Result, Wakeup,
};
use futures_util::stream::BoxStream;
use tokio::time::Instant;

use crate::client::RedisBackend;
use crate::conn::Conn;
use crate::keys::slot;
use crate::plain::no_plain_election;
use crate::release::Sent;
use crate::scripts::{self, Call};

/// What the Redis backend declares: efficiency grade, per-name fencing that holds while the
/// server keeps its data, FIFO among live waiters (a server-side queue; a crashed waiter holds
/// its place for at most 3 s), client-side re-entrancy, millisecond TTLs, pub/sub wake-ups
/// that wake only the waiter whose turn it is.
pub const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Efficiency,
    fencing: Fencing::PerNameWhileServerKeepsData,
    fifo: true,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(10),
    wakeup: Wakeup::PubSub,
    policies: true,
    permits: true,
    listed_waiters: true,
};

impl RedisBackend {
    async fn renew_group(
        &self,
        batch: &[(&GrantKey, Duration)],
        members: &[usize],
    ) -> Result<Vec<i64>> {
        let mut call = Call::new(&scripts::RENEW, members.len());
        for i in members {
            call.arg(&*batch[*i].0.resource);
        }
        for i in members {
            let (key, ttl) = batch[*i];
            call.arg(&key.secret.expose_hex_bytes()[..])
                .arg(ttl.as_millis().max(1) as u64);
        }
        let mut conn = self.conn.clone();
        self.run(&call, &mut conn).await
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> &Capabilities {
        self.layout_capabilities()
    }

    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Grant> {
        if self.plain() {
            return self
                .plain_acquire(name, Admission::Exclusive, ttl, None)
                .await;
        }
        self.queued(name, ttl, None, None).await
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        if self.plain() {
            return self
                .plain_acquire(name, Admission::Exclusive, ttl, Some(deadline))
                .await;
        }
        self.queued(name, ttl, Some(deadline), None).await
    }

    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        if self.plain() {
            return self.plain_acquire(name, admission, ttl, deadline).await;
        }
        self.queued(name, ttl, deadline, Some(admission)).await
    }

    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let deadline = Instant::now() + self.options.op_timeout;
        distlock_api::renew_as_batch(self, key, ttl, deadline).await
    }

    /// One script call for the whole batch on a single server or Sentinel master; one per hash
    /// slot (concurrently) on Cluster, where a script cannot span slots, each cut off at
    /// `deadline` on its own: a hung node costs only the leases it holds. `PEXPIRE` applies
    /// each TTL exactly.
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, (key, _)) in batch.iter().enumerate() {
            let group = match self.conn {
                Conn::Cluster(_) => slot(&key.resource),
                _ => 0,
            };
            match groups.iter_mut().find(|(s, _)| *s == group) {
                Some((_, members)) => members.push(i),
                None => groups.push((group, vec![i])),
            }
        }
        let calls = groups.iter().map(|(_, members)| async move {
            tokio::time::timeout_at(deadline, self.renew_group(batch, members))
                .await
                .unwrap_or_else(|_| {
                    Err(LockError::backend(
                        self.server.clone(),
                        true,
                        "no answer by the renewal deadline",
                    ))
                })
        });
        let answers = futures_util::future::join_all(calls).await;
        let mut out: Vec<Option<Result<Renewal>>> = (0..batch.len()).map(|_| None).collect();
        for ((_, members), answer) in groups.iter().zip(answers) {
            for (n, i) in members.iter().enumerate() {
                out[*i] = Some(match &answer {
                    Ok(flags) => Ok(match flags.get(n) {
                        Some(1) => Renewal::Renewed { ttl: batch[*i].1 },
                        _ => Renewal::NotHeld,
                    }),
                    Err(e) => Err(e.for_each_item()),
                });
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or(Ok(Renewal::NotHeld)))
            .collect()
    }

    async fn release(&self, key: &GrantKey) -> Result<bool> {
        let keys = self.keys(&key.name);
        if keys.is_shared(&key.resource) {
            return self.release_shared(&keys, &key.secret, Sent::Hash).await;
        }
        self.release_keys(&keys, &key.secret, Sent::Hash).await
    }

    async fn reconnect(&self) -> Result<std::sync::Arc<dyn LockBackend>> {
        Ok(std::sync::Arc::new(self.reconnected().await?))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        if self.plain() {
            return self.plain_inspect(name).await;
        }
        self.inspect_lock(name).await
    }

    async fn announce(&self, key: &GrantKey, token: FencingToken, value: &str) -> Result<bool> {
        if self.plain() {
            return Err(no_plain_election());
        }
        self.announce_lock(key, token, value).await
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        if self.plain() {
            return Err(no_plain_election());
        }
        self.lock_leader(name).await
    }

    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        if self.plain() {
            return Err(no_plain_election());
        }
        self.announcements(name).await
    }
}
