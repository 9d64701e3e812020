//! Reading a lock without touching it: the name's queue nodes after a `sync` (so a follower's
//! stale view is never reported), and the lowest one's czxid (the holder's token). How long the
//! holder's session lives is its own client's business: not reported.

use distlock_api::{FencingToken, HolderStatus, LockName, LockStatus, Result};
use zookeeper_client::Error as ZkError;

use crate::ZkBackend;
use crate::backend::{in_order, is_zk};
use crate::paths::lock_dir;
use crate::session::Epoch;

impl ZkBackend {
    /// The nodes of `dir` in queue order (full paths), listed after a `sync` sent right ahead on
    /// the same connection, so a follower's stale view is never used; empty when there is none.
    ///
    /// A reader of the head reads the listed nodes in order and takes the first still there:
    /// nodes created after the listing sort after every listed one, so that node was the head
    /// when it was read. It lists again only when every listed node went, so it never answers
    /// "nobody" while a node exists.
    pub(crate) async fn synced_queue(&self, epoch: &Epoch, dir: &str) -> Result<Vec<String>> {
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
        Ok(in_order(children, &reference)
            .into_iter()
            .map(|c| format!("{dir}/{c}"))
            .collect())
    }

    pub(crate) async fn inspect_queue(&self, name: &LockName) -> Result<LockStatus> {
        let dir = lock_dir(&self.options().root, name);
        let epoch = self.epoch().await?;
        loop {
            let queue = self.synced_queue(&epoch, &dir).await?;
            if queue.is_empty() {
                return Ok(LockStatus {
                    holder: None,
                    waiters: 0,
                });
            }
            for (i, node) in queue.iter().enumerate() {
                if let Some(stat) = self.call(epoch.client.check_stat(node)).await? {
                    return Ok(LockStatus {
                        holder: Some(HolderStatus {
                            token: Some(FencingToken(stat.czxid as u64)),
                            expires_in: None,
                        }),
                        waiters: queue.len() - i - 1,
                    });
                }
            }
        }
    }
}

/// The lowest of a directory's queue nodes, in wrap-aware order (any node is a valid reference).
pub(crate) fn head_of(children: Vec<String>) -> Option<String> {
    let reference = children.first()?.clone();
    in_order(children, &reference).into_iter().next()
}
