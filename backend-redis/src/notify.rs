//! Release notifications: one subscription per channel per client, shared by all its waiters,
//! carried as RESP3 pushes on the client's one connection (no extra subscriber connection).
//! A release message names the waiter whose turn it is (or nobody: anyone may try); each
//! waiter of the client sees every message and wakes only for its own name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::broadcast;

use crate::conn::Conn;

/// Messages kept for a waiter that is busy (re-trying) when they arrive; one that falls further
/// behind retries at once, which is always safe.
const BACKLOG: usize = 64;

struct Channel {
    releases: broadcast::Sender<Arc<str>>,
    waiters: usize,
}

/// Routes release messages to the waiters of each channel.
#[derive(Default)]
pub(crate) struct Notifier {
    channels: Mutex<HashMap<String, Channel>>,
}

impl Notifier {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called by the connection for every push; must not block.
    pub(crate) fn on_push(&self, push: PushInfo) {
        let channels = self.lock();
        match push.kind {
            PushKind::Message => {
                if let (Some(Value::BulkString(name)), Some(Value::BulkString(payload))) =
                    (push.data.first(), push.data.get(1))
                    && let Ok(name) = std::str::from_utf8(name)
                    && let Some(c) = channels.get(name)
                {
                    let turn: Arc<str> = String::from_utf8_lossy(payload).into();
                    let _ = c.releases.send(turn);
                }
            }
            // The connection dropped: a release may have been missed, so every waiter retries now
            // (the connection re-subscribes by itself when it comes back).
            PushKind::Disconnection => wake(&channels),
            _ => {}
        }
    }

    /// Every waiter retries now (the connection moved to another server).
    pub(crate) fn wake_all(&self) {
        wake(&self.lock());
    }

    /// The channels someone waits on.
    pub(crate) fn channels(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Joins the waiters of `channel`, subscribing the connection if it is the first one.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
        conn: &Conn,
    ) -> redis::RedisResult<Subscription> {
        let (releases, first) = {
            let mut channels = self.lock();
            let c = channels
                .entry(channel.to_string())
                .or_insert_with(|| Channel {
                    releases: broadcast::Sender::new(BACKLOG),
                    waiters: 0,
                });
            c.waiters += 1;
            (c.releases.subscribe(), c.waiters == 1)
        };
        let sub = Subscription {
            notifier: self.clone(),
            channel: channel.to_string(),
            conn: conn.clone(),
            releases,
        };
        if first {
            // On error, `sub` drops and leaves the channel again.
            conn.subscribe(channel).await?;
        }
        Ok(sub)
    }
}

/// "Anyone may try" to every waiter of every channel.
fn wake(channels: &HashMap<String, Channel>) {
    for c in channels.values() {
        let _ = c.releases.send(Arc::from(""));
    }
}

/// One waiter's membership of a channel; leaving the last one unsubscribes.
pub(crate) struct Subscription {
    notifier: Arc<Notifier>,
    channel: String,
    conn: Conn,
    releases: broadcast::Receiver<Arc<str>>,
}

impl Subscription {
    /// Resolves at the next release message (or connection drop), whoever it names.
    ///
    /// # Cancel safety
    /// Cancel safe: a message that arrives while nobody waits is kept for the next call.
    pub(crate) async fn released(&mut self) {
        if let Err(broadcast::error::RecvError::Closed) = self.releases.recv().await {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves at the next message that names `me`, or nobody in particular (a release with
    /// no queue, a connection drop), or when messages were missed (then retrying is the safe
    /// answer). Messages naming other waiters are skipped.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Subscription::released`].
    pub(crate) async fn turn_of(&mut self, me: &str) {
        loop {
            match self.releases.recv().await {
                Ok(turn) if turn.is_empty() || &*turn == me => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.notifier.lock();
            match channels.get_mut(&self.channel) {
                Some(c) if c.waiters <= 1 => {
                    channels.remove(&self.channel);
                    true
                }
                Some(c) => {
                    c.waiters -= 1;
                    false
                }
                None => false,
            }
        };
        if last && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (notifier, channel, conn) = (
                self.notifier.clone(),
                self.channel.clone(),
                self.conn.clone(),
            );
            rt.spawn(async move {
                // A new waiter may have joined meanwhile; then the subscription stays.
                if !notifier.lock().contains_key(&channel) {
                    let _ = conn.unsubscribe(&channel).await;
                }
            });
        }
    }
}
