//! The wait for admission: an exclusive node watches the two nodes ahead, any other the
//! queue's children, and each delete ahead is applied to the view without listing when it can.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use distlock_api::{Admission, LockError, LockName, Result};
use futures_util::future::OptionFuture;
use tokio::time::Instant;
use zookeeper_client::{EventType, WatchedEvent};

use crate::client::ZkBackend;
use crate::session::Epoch;

impl ZkBackend {
    /// Waits until the policy admits our node. An exclusive node (a lock's, a writer's) waits
    /// to be the lowest, watching the next lower node and the one below it, never more (no herd:
    /// a delete wakes at most two waiters; the first time, `listed` may already hold the queue,
    /// read by the create sent at `sent`). A watched node's delete that leaves at most one node
    /// ahead in our view goes on without listing ([`without`]); any other event lists again.
    /// The predecessor's watch is kept while the predecessor stays the same: dropped, the client
    /// would tell the server to remove it, then watch it again (two requests per hand-over for
    /// the waiter two back, whose far node goes first).
    /// Any other node counts the nodes ahead and their limits, so any delete ahead can
    /// admit it: it watches the directory's children and lists again at each change. Before
    /// success, checks our epoch is still alive (while it is, our ephemeral node is there).
    /// Returns the send time of the last request whose answer showed our session alive (a
    /// listing with our node, or the check on our predecessor).
    pub(crate) async fn wait_turn(
        &self,
        turn: Turn<'_>,
        mut listed: Option<Vec<String>>,
        sent: Instant,
        deadline: Option<Instant>,
    ) -> Result<Instant> {
        let Turn {
            epoch,
            dir,
            path,
            name,
            admission,
        } = turn;
        let ours = path.rsplit('/').next().unwrap_or_default().to_string();
        let lost = epoch.lost_signal();
        let mut confirmed = sent;
        let mut checked = false;
        // The node watched as our predecessor (or, for a shared entry, the directory) and its
        // watch's event.
        let mut watching: Option<(String, Watched)> = None;
        loop {
            let queue = match listed.take() {
                Some(q) => q,
                None => {
                    let asked = Instant::now();
                    let q = self.queue(&epoch.client, (dir, name), path).await?;
                    if q.contains(&ours) {
                        confirmed = asked;
                    }
                    q
                }
            };
            let Some(pos) = queue.iter().position(|c| *c == ours) else {
                return Err(LockError::backend(
                    self.label(),
                    true,
                    "our queue node vanished (session lost?)",
                ));
            };
            let ahead = || queue[..pos].iter().map(|n| self.layout().node_limit(n));
            if !std::mem::replace(&mut checked, true) {
                admission.check_ahead(name.as_str(), ahead())?;
            }
            if admission.admitted(ahead()) {
                if !epoch.is_live() {
                    return Err(LockError::backend(
                        self.label(),
                        true,
                        "the session epoch ended while waiting",
                    ));
                }
                return Ok(confirmed);
            }
            let Some(deadline) = deadline else {
                return Err(LockError::Busy {
                    name: String::new(),
                });
            };
            let asked = Instant::now();
            let far = if admission == Admission::Exclusive {
                // Two or more back, the node two ahead is watched too: in a queue served in
                // order it goes first, and its delete leaves us next in line, so our own turn
                // comes on our predecessor's delete event alone, with no listing in between.
                let far_at = pos.checked_sub(2);
                let near_node = &queue[pos - 1];
                let kept = watching.take().filter(|(node, _)| node == near_node);
                let asks = kept.is_none() || far_at.is_some();
                let watch = |i: usize| {
                    self.call(
                        epoch
                            .client
                            .check_and_watch_stat(&format!("{dir}/{}", queue[i])),
                    )
                };
                let (near, far) = tokio::join!(
                    OptionFuture::from(kept.is_none().then(|| watch(pos - 1))),
                    OptionFuture::from(far_at.map(watch))
                );
                let mut gone = Vec::new();
                match near.transpose()? {
                    Some((None, _)) => gone.push(pos - 1),
                    Some((Some(_), w)) => {
                        watching = Some((near_node.clone(), Box::pin(w.changed())));
                    }
                    None => watching = kept,
                }
                let far = match (far.transpose()?, far_at) {
                    (Some((None, _)), Some(i)) => {
                        gone.push(i);
                        None
                    }
                    (Some((Some(_), w)), _) => Some(w),
                    _ => None,
                };
                // With the watch kept and nothing two ahead, nothing was asked: no answer
                // dates our session.
                if asks {
                    confirmed = asked;
                }
                if !gone.is_empty() {
                    listed = without(&queue, pos, &gone);
                    continue;
                }
                far
            } else {
                let (children, watcher) =
                    self.call(epoch.client.list_and_watch_children(dir)).await?;
                let now = self.layout().in_order(children, path, name)?;
                if now.contains(&ours) {
                    confirmed = asked;
                }
                if now != queue {
                    listed = Some(now);
                    continue;
                }
                watching = Some((String::new(), Box::pin(watcher.changed())));
                confirmed = asked;
                None
            };
            let far_changed = async {
                match far {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            };
            let near_changed = async {
                match watching.as_mut() {
                    Some((_, changed)) => changed.as_mut().await,
                    None => std::future::pending().await,
                }
            };
            // A delete of a watched node ahead drops it from our view (see [`without`]); any
            // other event lists again.
            tokio::select! {
                event = far_changed => {
                    if event.event_type == EventType::NodeDeleted {
                        listed = without(&queue, pos, &[pos - 2]);
                    }
                }
                event = near_changed => {
                    watching = None;
                    if admission == Admission::Exclusive && event.event_type == EventType::NodeDeleted {
                        listed = without(&queue, pos, &[pos - 1]);
                    }
                }
                _ = lost.wait() => {
                    return Err(LockError::backend(self.label(), true, "the session epoch ended while waiting"));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(LockError::Timeout { name: String::new(), waited: Duration::ZERO });
                }
            }
        }
    }
}

/// Our view of the queue `queue` (we at `pos`) without the nodes at `gone`, seen deleted, if
/// that leaves at most one node ahead of us; else `None`, to list again. Our listing was read
/// after our create and sequence numbers only grow, so nobody can have joined ahead of us since:
/// the nodes ahead are always some of those the listing shows ahead, and a node seen gone can be
/// dropped. With nothing left ahead we head the queue, granted without listing again (a hand-over
/// to the next in line costs only the release's delete; Curator's recipe re-lists); with one
/// left, it is the one to watch. Deeper, the nodes ahead in our listing are likely gone by now,
/// and a fresh listing is cheaper than checking them one by one.
fn without(queue: &[String], pos: usize, gone: &[usize]) -> Option<Vec<String>> {
    (pos.saturating_sub(gone.len()) <= 1).then(|| {
        queue
            .iter()
            .enumerate()
            .filter(|(i, _)| !gone.contains(i))
            .map(|(_, n)| n.clone())
            .collect()
    })
}

/// A watch's event, awaited across turns of the wait.
type Watched = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// Whose turn [`ZkBackend::wait_turn`] waits for: our node `path` in `dir`, admitted by
/// `admission`, on `epoch`'s session.
pub(crate) struct Turn<'a> {
    pub(crate) epoch: &'a Epoch,
    pub(crate) dir: &'a str,
    pub(crate) path: &'a str,
    pub(crate) name: &'a LockName,
    pub(crate) admission: Admission,
}
