//! [`CAPABILITIES`] and the [`LockBackend`] impl: dispatch, batched renewal, release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, Leader,
    LockBackend, LockError, LockName, LockStatus, Reconnect, Reentrancy, Renewal, Result, Wakeup,
};
use futures_util::stream::BoxStream;
use tokio::time::Instant;
use tokio_postgres::types::Type;

use crate::client::PostgresBackend;

/// What the PostgreSQL backend declares on a server that keeps grants durably (checked at
/// connect: [`PostgresBackend::downgrade_reason`]): correctness grade, tokens from one
/// sequence (strictly increasing across restarts: committed grants are durable), FIFO on one
/// queue per name, client-side re-entrancy, millisecond TTLs on the server's clock, LISTEN /
/// NOTIFY wake-ups that wake only the admitted.
pub const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Correctness,
    fencing: Fencing::ClusterWide,
    fifo: true,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(10),
    wakeup: Wakeup::PubSub,
    policies: true,
    permits: true,
    listed_waiters: true,
};

/// [`CAPABILITIES`] on a server that can lose committed grants (no fsync, no full-page writes,
/// an asynchronous standby): efficiency grade, whose tokens hold while the server keeps its
/// data.
pub const EFFICIENCY_CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Efficiency,
    fencing: Fencing::PerNameWhileServerKeepsData,
    ..CAPABILITIES
};

#[async_trait]
impl LockBackend for PostgresBackend {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> &Capabilities {
        self.declared()
    }

    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Grant> {
        self.queued(name, Admission::Exclusive, ttl, None).await
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        self.queued(name, Admission::Exclusive, ttl, Some(deadline))
            .await
    }

    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        self.queued(name, admission, ttl, deadline).await
    }

    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let deadline = Instant::now() + self.inner.options.op_timeout;
        distlock_api::renew_as_batch(self, key, ttl, deadline).await
    }

    /// One statement for the whole batch: each live grant's expiry moved to its own TTL on the
    /// server's clock. The secrets go out from one buffer and the answer is one array, so a tick
    /// allocates a few vectors, not a few per lease.
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        let hex: Vec<u8> = batch
            .iter()
            .flat_map(|(k, _)| k.secret.expose_hex_bytes())
            .collect();
        // Hex digits are ASCII, so every 32-byte chunk is a `str` (one position per item either
        // way: an empty secret matches no entry).
        let secrets: Vec<&str> = hex
            .chunks(32)
            .map(|c| std::str::from_utf8(c).unwrap_or_default())
            .collect();
        let ttls: Vec<i64> = batch
            .iter()
            .map(|(_, t)| i64::try_from(t.as_millis()).unwrap_or(i64::MAX).max(1))
            .collect();
        let answer = self
            .query_until(
                deadline,
                &self.inner.sql.renew,
                &[(&secrets, Type::TEXT_ARRAY), (&ttls, Type::INT8_ARRAY)],
            )
            .await
            .and_then(|rows| match rows.first() {
                Some(row) => row.try_get::<_, Vec<i64>>(0).map_err(|e| self.error(&e)),
                None => Ok(Vec::new()),
            });
        match answer {
            Ok(positions) => {
                let mut renewed = vec![false; batch.len()];
                for at in positions {
                    // 1-based, as `WITH ORDINALITY` counts.
                    if let Some(r) = usize::try_from(at)
                        .ok()
                        .and_then(|at| at.checked_sub(1))
                        .and_then(|i| renewed.get_mut(i))
                    {
                        *r = true;
                    }
                }
                batch
                    .iter()
                    .zip(renewed)
                    .map(|((_, ttl), renewed)| {
                        Ok(if renewed {
                            Renewal::Renewed { ttl: *ttl }
                        } else {
                            Renewal::NotHeld
                        })
                    })
                    .collect()
            }
            Err(e) => batch.iter().map(|_| Err(e.for_each_item())).collect(),
        }
    }

    async fn release(&self, key: &GrantKey) -> Result<bool> {
        self.release_entry(&key.name, &key.secret).await
    }

    async fn reconnect(&self) -> Result<Arc<dyn LockBackend>> {
        Ok(Arc::new(self.reconnected().await?))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        self.inspect_queue(name).await
    }

    async fn announce(&self, key: &GrantKey, token: FencingToken, value: &str) -> Result<bool> {
        self.announce_value(key, token, value).await
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.head_leader(name).await
    }

    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        self.announcements(name).await
    }
}

/// Tokens are `bigint` on the server.
pub(crate) fn token_param(token: FencingToken) -> Result<i64> {
    i64::try_from(token.0).map_err(|_| LockError::NotHeld {
        name: format!("token {}", token.0),
    })
}
