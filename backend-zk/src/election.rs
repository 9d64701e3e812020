//! Leader election on the lock queue: the leader's value is written into its own node's data
//! ([`distlock_api::announced_entry`]), so the lowest node of the name's directory is the leader
//! and its value, and the value goes with the node (release, session expiry).

use distlock_api::{
    FencingToken, GrantKey, Leader, LockName, Result, announced_entry, leader_value,
};
use futures_util::StreamExt;
use futures_util::future::select_all;
use futures_util::stream::BoxStream;
use zookeeper_client::{Error as ZkError, OneshotWatcher};

use crate::ZkBackend;
use crate::client::is_zk;
use crate::inspect::head_of;
use crate::paths::lock_dir;

/// What observers' hints compare: the head node and its data version.
type HeadState = Option<(String, i32)>;

impl ZkBackend {
    /// Sets `<secret><holder>:<value>` on our node; `false` when the node is gone (released, or its
    /// session expired). The path is unique to this grant (sequential), so no other check is
    /// needed.
    pub(crate) async fn announce_node(&self, key: &GrantKey, value: &str) -> Result<bool> {
        if !self.layout().owned_by(&key.resource, &key.secret) {
            return Ok(false);
        }
        let epoch = self.epoch().await?;
        let data = announced_entry(&key.secret.expose_hex(), &key.holder, value);
        match self
            .call(epoch.client.set_data(&key.resource, data.as_bytes(), None))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The lowest node of the name's directory and its announced value (another recipe's node:
    /// its data, [`distlock_api::leader_value`]), read after a `sync`
    /// ([`ZkBackend::synced_queue`]), so a follower's stale view is never reported, and a head
    /// deleted between the listing and the read gives the next one, never "nobody".
    pub(crate) async fn head_node(&self, name: &LockName) -> Result<Option<Leader>> {
        let dir = lock_dir(&self.options().root, name);
        let epoch = self.epoch().await?;
        loop {
            let queue = self.synced_queue(&epoch, &dir, name).await?;
            if queue.is_empty() {
                return Ok(None);
            }
            for node in &queue {
                match self.call(epoch.client.get_data(node)).await {
                    Ok((data, stat)) => {
                        return Ok(leader_value(&data).map(|value| Leader {
                            term: FencingToken(stat.czxid as u64),
                            value,
                        }));
                    }
                    Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// Hints for observers. ZooKeeper watches fire once, so each hint re-arms them: a child
    /// watch on the directory (or an existence watch while it is missing) and a data watch on
    /// the head. A change between a hint and the re-arm shows as a different head or data
    /// version when re-armed, and is hinted at once.
    pub(crate) async fn head_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        let dir = lock_dir(&self.options().root, name);
        let (seen, watchers) = self.arm(&dir).await?;
        let state = (self.clone(), dir, seen, watchers);
        Ok(
            futures_util::stream::unfold(state, |(zk, dir, mut seen, mut watchers)| async move {
                loop {
                    let fired = !watchers.is_empty();
                    if fired {
                        let waits = watchers.into_iter().map(|w| Box::pin(w.changed()));
                        select_all(waits).await;
                    }
                    let (now, armed) = zk.arm(&dir).await.ok()?;
                    watchers = armed;
                    if fired || now != seen {
                        seen = now;
                        return Some(((), (zk, dir, seen, watchers)));
                    }
                }
            })
            .boxed(),
        )
    }

    async fn arm(&self, dir: &str) -> Result<(HeadState, Vec<OneshotWatcher>)> {
        let epoch = self.epoch().await?;
        loop {
            let (children, on_children) =
                match self.call(epoch.client.list_and_watch_children(dir)).await {
                    Ok(listed) => listed,
                    Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => {
                        let (stat, on_dir) =
                            self.call(epoch.client.check_and_watch_stat(dir)).await?;
                        if stat.is_some() {
                            continue;
                        }
                        return Ok((None, vec![on_dir]));
                    }
                    Err(e) => return Err(e),
                };
            let Some(head) = head_of(self.layout(), children) else {
                return Ok((None, vec![on_children]));
            };
            let path = format!("{dir}/{head}");
            return match self.call(epoch.client.get_and_watch_data(&path)).await {
                Ok((_, stat, on_head)) => {
                    Ok((Some((head, stat.version)), vec![on_children, on_head]))
                }
                // Deleted since the listing: the child watch fires for it.
                Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => {
                    Ok((Some((head, -1)), vec![on_children]))
                }
                Err(e) => Err(e),
            };
        }
    }
}
