//! Reading a lock without touching it: the name's queue nodes after a `sync` (so a follower's
//! stale view is never reported), and each holder's node data (who holds it) and czxid (its
//! token). How long the holder's session lives is its own client's business: not reported.

use distlock_api::{
    Admission, FencingToken, HolderInfo, HolderStatus, LockName, LockStatus, Result, admitted_count,
};
use zookeeper_client::Error as ZkError;

use crate::ZkBackend;
use crate::client::is_zk;
use crate::paths::{Layout, lock_dir};
use crate::session::Epoch;

impl ZkBackend {
    /// The nodes of `dir` in queue order (full paths), listed after a `sync` sent right ahead on
    /// the same connection, so a follower's stale view is never used; empty when there is none.
    ///
    /// A reader of the head reads the listed nodes in order and takes the first still there:
    /// nodes created after the listing sort after every listed one, so that node was the head
    /// when it was read. It lists again only when every listed node went, so it never answers
    /// "nobody" while a node exists.
    pub(crate) async fn synced_queue(
        &self,
        epoch: &Epoch,
        dir: &str,
        name: &LockName,
    ) -> Result<Vec<String>> {
        let (synced, listed) = tokio::join!(
            self.call(epoch.client.sync(dir)),
            self.call(epoch.client.list_children(dir))
        );
        let children = match synced.and(listed) {
            Ok(c) => c,
            Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let Some(reference) = children.first().cloned() else {
            return Ok(Vec::new());
        };
        Ok(self
            .layout()
            .in_order(children, &reference, name)?
            .into_iter()
            .map(|c| format!("{dir}/{c}"))
            .collect())
    }

    /// The holders (the queue's admitted prefix, by the limits in the node names, each with its
    /// czxid as token) and the waiters behind them. A node deleted between the listing and its
    /// read is passed for the ones after it; all gone, the queue is listed again.
    pub(crate) async fn inspect_queue(&self, name: &LockName) -> Result<LockStatus> {
        let dir = lock_dir(&self.options().root, name);
        let epoch = self.epoch().await?;
        'listing: loop {
            let queue = self.synced_queue(&epoch, &dir, name).await?;
            let limits: Vec<u32> = queue
                .iter()
                .map(|path| {
                    self.layout()
                        .node_limit(path.rsplit('/').next().unwrap_or(path))
                })
                .collect();
            let admitted = admitted_count(&limits);
            let mut holders = Vec::with_capacity(admitted);
            for (node, limit) in queue.iter().zip(&limits).take(admitted) {
                match self.call(epoch.client.get_data(node)).await {
                    Ok((data, stat)) => holders.push(HolderStatus {
                        token: Some(FencingToken(stat.czxid as u64)),
                        expires_in: None,
                        admission: Admission::of_limit(*limit),
                        holder: HolderInfo::in_entry(&data),
                    }),
                    // A holder left since the listing: the queue moved on, read it again.
                    Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => continue 'listing,
                    Err(e) => return Err(e),
                }
            }
            return Ok(LockStatus {
                holders,
                waiters: queue.len() - admitted,
            });
        }
    }
}

/// The lowest of a directory's queue nodes, in wrap-aware order (any node is a valid reference).
pub(crate) fn head_of(layout: Layout, children: Vec<String>) -> Option<String> {
    let reference = children.first()?.clone();
    layout
        .known_in_order(children, &reference)
        .into_iter()
        .next()
}
