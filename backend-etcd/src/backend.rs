//! [`EtcdBackend`]: the lock contract over an etcd cluster.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, Leader,
    LockBackend, LockError, LockName, LockStatus, Reconnect, Reentrancy, Renewal, Result, Wakeup,
};
use etcd_client::LeaseTimeToLiveOptions;
use futures_util::future::join_all;
use futures_util::stream::BoxStream;
use tokio::time::{Instant, timeout_at};

use crate::client::EtcdBackend;
use crate::keys::parse_attempt_key;
use crate::session::Session;

/// A session whose key list would pass this many bytes is renewed without it: etcd-client's
/// gRPC channel refuses an answer over 4 MB (tonic's default, which etcd-client 0.21 offers no way
/// to raise), so past about 60 000 keys of short names every renewal failed and every lease of
/// the session was lost; and the list costs the server a walk of every key at every tick.
const LISTED_BYTES: usize = 2 << 20;

/// What the etcd backend declares: correctness grade, cluster-wide monotonic fencing (create
/// revisions), FIFO by revision, client-side re-entrancy, whole-second TTLs (the session lease),
/// watch wake-ups.
pub const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Correctness,
    fencing: Fencing::ClusterWide,
    fifo: true,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_secs(1),
    min_ttl: Duration::from_secs(2),
    wakeup: Wakeup::Watch,
    policies: true,
    permits: true,
    listed_waiters: true,
};

#[async_trait]
impl LockBackend for EtcdBackend {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    /// Every lock of a client lives on its session lease: the session TTL, whatever is asked.
    fn lease_ttl(&self, _requested: Duration) -> Duration {
        Duration::from_secs(self.inner.options.session_ttl_secs() as u64)
    }

    async fn try_acquire(&self, name: &LockName, _ttl: Duration) -> Result<Grant> {
        self.acquire_inner(name, Admission::Exclusive, None).await
    }

    async fn acquire(&self, name: &LockName, _ttl: Duration, deadline: Instant) -> Result<Grant> {
        self.acquire_inner(name, Admission::Exclusive, Some(deadline))
            .await
    }

    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        _ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        self.acquire_inner(name, admission, deadline).await
    }

    /// A keep-alive of the session lease, then a check that our key is still there: the lease
    /// TTL counts from this renewal's send time; a missing key or lease is "not held".
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let deadline = Instant::now() + self.inner.options.op_timeout;
        distlock_api::renew_as_batch(self, key, ttl, deadline).await
    }

    /// Session level: per session (a client has one), a keep-alive and a `LeaseTimeToLive` that
    /// lists the keys attached to the lease, sent together: one round trip per tick whatever the
    /// number of leases. A lease is renewed when its session answered the keep-alive and its key
    /// is still attached and its slot is held with the grant's secret (the path names our lease
    /// and that slot, so attached means ours; a key deleted by anyone else is "not held").
    /// A session whose list would pass 2 MB (`LISTED_BYTES`) sends the keep-alive alone: its keys
    /// live as long as the lease, but one deleted by someone else is then not seen here.
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        let mut sessions: Vec<(i64, Option<Arc<Session>>)> = Vec::new();
        for (key, _) in batch {
            if let Some(lease) = parse_attempt_key(&key.resource).map(|(l, _)| l)
                && !sessions.iter().any(|(l, _)| *l == lease)
            {
                sessions.push((lease, self.session_of(lease).filter(|s| !s.is_lost())));
            }
        }
        let deadline = deadline.min(Instant::now() + self.inner.options.op_timeout);
        let checks = join_all(sessions.iter().map(|(lease, session)| async move {
            let Some(session) = session else {
                return Ok(None);
            };
            let listed = session.listed_bytes() <= LISTED_BYTES;
            let keys = async {
                if !listed {
                    return Ok(None);
                }
                self.call(&self.inner.lease, |mut c| async move {
                    c.time_to_live(*lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
                        .await
                })
                .await
                .map(|r| (r.ttl() > 0).then(|| r.keys().to_vec()))
                .map(Some)
            };
            let (alive, keys) = tokio::join!(
                timeout_at(deadline, session.refresh()),
                timeout_at(deadline, keys)
            );
            let late = || {
                LockError::backend(
                    self.inner.endpoints.clone(),
                    true,
                    "no answer by the renewal deadline",
                )
            };
            let alive = alive.map_err(|_| late())?.map_err(|e| self.err(e))?;
            let keys = keys.map_err(|_| late())??;
            // `Some(None)`: the lease is gone; `None`: not listed, the keep-alive says.
            Ok::<_, LockError>((alive && keys != Some(None)).then(|| (keys.flatten(), session.ttl)))
        }))
        .await;
        batch
            .iter()
            .map(|(key, _)| {
                // Ours only if the slot is held with this secret (a forged key is not).
                let at = parse_attempt_key(&key.resource).and_then(|(lease, slot)| {
                    let i = sessions.iter().position(|(l, _)| *l == lease)?;
                    let prefix = self.name_prefix(&key.name);
                    sessions[i]
                        .1
                        .as_ref()
                        .is_some_and(|s| s.holds_slot(&prefix, slot, &key.secret.expose_hex()))
                        .then_some(i)
                });
                match at.map(|i| &checks[i]) {
                    None | Some(Ok(None)) => Ok(Renewal::NotHeld),
                    Some(Err(e)) => Err(e.for_each_item()),
                    Some(Ok(Some((attached, ttl)))) => {
                        let ours =
                            |keys: &Vec<Vec<u8>>| keys.iter().any(|k| k == key.resource.as_bytes());
                        Ok(if attached.as_ref().is_none_or(ours) {
                            // The session's TTL, from the keep-alive sent with this renewal.
                            Renewal::Renewed { ttl: *ttl }
                        } else {
                            Renewal::NotHeld
                        })
                    }
                }
            })
            .collect()
    }

    /// Deletes our attempt key. On a session of this client (the usual case) the secret is
    /// checked against the slot's holder without a server call first; either way the delete is
    /// a compare-value txn (`delete_ours`: a delete that arrived late must not
    /// remove the path's next grant), and the slot is given back once it went through.
    async fn release(&self, key: &GrantKey) -> Result<bool> {
        let path = &*key.resource;
        let secret = key.secret.expose_hex();
        let Some((lease, slot)) = parse_attempt_key(path) else {
            return Ok(false);
        };
        let Some(session) = self.session_of(lease) else {
            return self.delete_ours(path, &secret).await;
        };
        let prefix = self.name_prefix(&key.name);
        let entry = match session.slot_entry(&prefix, slot, &secret) {
            Some(entry) if path.starts_with(&prefix) => entry,
            _ => return Ok(false),
        };
        let deleted = self.delete_ours(path, &entry).await?;
        // Recorded before the slot is given back: once it is, the next acquire of the name may
        // reuse the path, and a release recorded after that grant would mark it released
        // instead (and let a later acquire skip its queue read beside it). No test can force
        // a second acquire between these two lines, so the order is the guarantee.
        if deleted {
            self.inner.repeat.released(path);
        }
        session.free_slot(&prefix, slot);
        Ok(deleted)
    }

    /// Gives up the session `key`'s lock lives on: it is marked lost (every lease on it fires
    /// its lost signal), no keep-alive is sent for it any more, and a revoke is tried, so etcd
    /// frees its keys within the session TTL at the latest. Later acquires start a new session.
    async fn abandon(&self, key: &GrantKey) {
        if let Some(session) =
            parse_attempt_key(&key.resource).and_then(|(l, _)| self.session_of(l))
        {
            session.abandon();
        }
    }

    /// A new client of the same endpoints with the same options.
    async fn reconnect(&self) -> Result<Arc<dyn LockBackend>> {
        Ok(Arc::new(self.reconnected().await?))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        self.inspect_range(name).await
    }

    async fn announce(&self, key: &GrantKey, token: FencingToken, value: &str) -> Result<bool> {
        self.announce_entry(key, token, value).await
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.head_entry(name).await
    }

    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        self.range_events(name).await
    }
}
