//! Reading a lock without touching it: the name's queue nodes after a `sync` (so a follower's
//! stale view is never reported), and the lowest one's czxid (the holder's token). How long the
//! holder's session lives is its own client's business: not reported.

use distlock_api::{FencingToken, HolderStatus, LockName, LockStatus, Result};
use zookeeper_client::Error as ZkError;

use crate::ZkBackend;
use crate::backend::{in_order, is_zk};
use crate::paths::lock_dir;
use crate::session::Epoch;

/// How many times a read retries when the head it listed was deleted before it was read.
pub(crate) const HEAD_TRIES: usize = 3;

impl ZkBackend {
    /// The lowest node of `dir` (the holder) and how many nodes it has, listed after a `sync`
    /// sent right ahead on the same connection; `None` when there is none.
    pub(crate) async fn synced_head(
        &self,
        epoch: &Epoch,
        dir: &str,
    ) -> Result<Option<(String, usize)>> {
        let (synced, listed) = tokio::join!(
            self.call(epoch.client.sync(dir)),
            self.call(epoch.client.list_children(dir))
        );
        let children = match synced.and(listed) {
            Ok(c) => c,
            Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let count = children.len();
        Ok(head_of(children).map(|head| (format!("{dir}/{head}"), count)))
    }

    pub(crate) async fn inspect_queue(&self, name: &LockName) -> Result<LockStatus> {
        let dir = lock_dir(&self.options().root, name);
        let epoch = self.epoch().await?;
        for _ in 0..HEAD_TRIES {
            let Some((head, count)) = self.synced_head(&epoch, &dir).await? else {
                break;
            };
            if let Some(stat) = self.call(epoch.client.check_stat(&head)).await? {
                return Ok(LockStatus {
                    holder: Some(HolderStatus {
                        token: Some(FencingToken(stat.czxid as u64)),
                        expires_in: None,
                    }),
                    waiters: count - 1,
                });
            }
        }
        Ok(LockStatus {
            holder: None,
            waiters: 0,
        })
    }
}

/// The lowest of a directory's queue nodes, in wrap-aware order (any node is a valid reference).
pub(crate) fn head_of(children: Vec<String>) -> Option<String> {
    let reference = children.first()?.clone();
    in_order(children, &reference).into_iter().next()
}
