//! [`ZkBackend`]: the lock contract over a ZooKeeper ensemble.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, Leader,
    LockBackend, LockError, LockName, LockStatus, Reconnect, Reentrancy, Renewal, Result, Wakeup,
};
use futures_util::stream::BoxStream;
use tokio::time::{Instant, timeout_at};
use zookeeper_client::Error as ZkError;

use crate::client::{ZkBackend, is_zk};
use crate::paths::Layout;

/// What the ZooKeeper backend declares: correctness grade, cluster-wide monotonic fencing
/// (czxid), FIFO by sequence, client-side re-entrancy, watch wake-ups. The TTL is the session
/// timeout of the client (1 ms granularity as negotiated by the server).
pub const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Correctness,
    fencing: Fencing::ClusterWide,
    fifo: true,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(1),
    wakeup: Wakeup::Watch,
    policies: true,
    permits: true,
    listed_waiters: true,
};

/// The same on the kazoo layout (`layout=kazoo`, [`crate::Layout::Kazoo`]): no semaphores, as
/// kazoo's node names have no room for a limit.
pub const KAZOO_CAPABILITIES: Capabilities = Capabilities {
    permits: false,
    ..CAPABILITIES
};

#[async_trait]
impl LockBackend for ZkBackend {
    fn kind(&self) -> &'static str {
        "zk"
    }

    fn capabilities(&self) -> &Capabilities {
        match self.layout() {
            Layout::Curator => &CAPABILITIES,
            Layout::Kazoo => &KAZOO_CAPABILITIES,
        }
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

    /// The session heartbeat is the renewal; this proves the session alive through the leader
    /// and our node still there.
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let deadline = Instant::now() + self.inner.options.op_timeout;
        distlock_api::renew_as_batch(self, key, ttl, deadline).await
    }

    /// Every lease lives on the session: its negotiated timeout, whatever is asked.
    fn lease_ttl(&self, _requested: Duration) -> Duration {
        Duration::from_millis(self.inner.negotiated_ms.load(Ordering::Relaxed))
    }

    /// Session level: the session heartbeat keeps every node alive, so a renewal only confirms
    /// that each node is still an ephemeral of this session, in one round trip whatever the
    /// number of leases: a `sync`, then `getEphemerals` under the root sent right behind it. The
    /// `sync` goes through the leader: a server answers reads from its own copy, so a follower
    /// cut off from the leader (whose clients' pings it still answers) would keep confirming
    /// nodes the leader already deleted with the expired session, for up to `syncLimit x
    /// tickTime`; it cannot complete a `sync`, and the leader refuses one for an expired
    /// session. The validity is the negotiated session timeout from this renewal's send time.
    /// A node's path carries a digest of its secret and our session created it, so listed means
    /// ours; a node deleted by anyone else is "not held".
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        let root = &self.inner.options.root;
        let listed = match self.epoch().await {
            Ok(epoch) => {
                let both = async {
                    let (synced, listed) = tokio::join!(
                        self.call(epoch.client.sync(root)),
                        self.call(epoch.client.list_ephemerals(root))
                    );
                    synced.and(listed)
                };
                match timeout_at(deadline, both).await {
                    Ok(r) => r.map(|l| (l, epoch.client.session_timeout())),
                    Err(_) => Err(LockError::backend(
                        self.label(),
                        true,
                        "no answer by the renewal deadline",
                    )),
                }
            }
            Err(e) => Err(e),
        };
        let (ours, ttl): (HashSet<&str>, Duration) = match &listed {
            Ok((paths, ttl)) => (paths.iter().map(String::as_str).collect(), *ttl),
            Err(e) => return batch.iter().map(|_| Err(e.for_each_item())).collect(),
        };
        batch
            .iter()
            .map(|(key, _)| {
                Ok(
                    if self.layout().owned_by(&key.resource, &key.secret)
                        && ours.contains(&*key.resource)
                    {
                        Renewal::Renewed { ttl }
                    } else {
                        Renewal::NotHeld
                    },
                )
            })
            .collect()
    }

    /// Deletes our node. A secret that does not match the path is refused without a server call.
    /// While the connection is down, waits up to `op_timeout` for it: a session found expired
    /// took our ephemeral node with it, so that is "not held", not an error.
    async fn release(&self, key: &GrantKey) -> Result<bool> {
        if !self.layout().owned_by(&key.resource, &key.secret) {
            return Ok(false);
        }
        let Some(epoch) = self.epoch_settled().await? else {
            self.forget(&key.resource);
            return Ok(false);
        };
        let held = match self.call(epoch.client.delete(&key.resource, None)).await {
            Ok(()) => {
                self.inner.repeat.released(&key.resource);
                true
            }
            Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => false,
            Err(e) => return Err(e),
        };
        self.forget(&key.resource);
        Ok(held)
    }

    /// Closes the session `key`'s node lives on, if it is still the current one: the epoch ends
    /// (every lease on it is told) and the client is dropped, which closes the session (the
    /// server deletes its nodes at once) or, unreachable, lets it expire after its timeout.
    async fn abandon(&self, key: &GrantKey) {
        let Some(session) = self.forget(&key.resource) else {
            return;
        };
        let mut current = self.inner.epoch.lock().await;
        if let Some(epoch) = current.as_ref()
            && epoch.session_id() == session
        {
            epoch.end(distlock_api::LostReason::SessionLost);
            *current = None;
        }
    }

    async fn reconnect(&self) -> Result<Arc<dyn LockBackend>> {
        Ok(Arc::new(self.reconnected().await?))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        self.inspect_queue(name).await
    }

    async fn announce(&self, key: &GrantKey, _token: FencingToken, value: &str) -> Result<bool> {
        self.announce_node(key, value).await
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.head_node(name).await
    }

    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        self.head_changes(name).await
    }
}
