//! Release notifications: one subscription per channel per client, shared by all its waiters,
//! carried as RESP3 pushes on the client's one connection (no extra subscriber connection). A
//! queued waiter listens on its own turn channel; Redlock waiters on the name's channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::watch;

use crate::conn::{Conn, Pushes};

/// What a channel's listeners heard.
#[derive(Default)]
struct Heard {
    /// Bumped by every message: a waiter that was busy when it came still sees the change.
    messages: u64,
    /// The fencing token of a grant a release made to this turn channel's waiter (a `g<token>`
    /// message, [`crate::scripts::RELEASE`]).
    grant: Option<u64>,
}

struct Channel {
    releases: watch::Sender<Heard>,
    waiters: usize,
    /// The server confirmed our SUBSCRIBE (and no UNSUBSCRIBE was sent since).
    subscribed: bool,
}

/// Routes release messages to the waiters of each channel.
#[derive(Default)]
pub(crate) struct Notifier {
    channels: Mutex<HashMap<String, Channel>>,
    /// Held while a SUBSCRIBE or UNSUBSCRIBE is decided and sent, so a late unsubscribe can
    /// never overtake the subscribe of a waiter that joined after the last one left.
    commands: tokio::sync::Mutex<()>,
}

impl Notifier {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the waiters of `channel`, and returns once the connection is subscribed to it:
    /// every waiter, not only the first, waits for the server's confirmation (a second waiter
    /// that did not could miss a message sent before the SUBSCRIBE landed, or be left on a
    /// channel whose SUBSCRIBE failed); a failed SUBSCRIBE is sent again by the next waiter.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
        conn: &Conn,
    ) -> redis::RedisResult<Subscription> {
        let releases = {
            let mut channels = self.lock();
            let c = channels
                .entry(channel.to_string())
                .or_insert_with(|| Channel {
                    releases: watch::Sender::new(Heard::default()),
                    waiters: 0,
                    subscribed: false,
                });
            c.waiters += 1;
            c.releases.subscribe()
        };
        // On error, `sub` drops and leaves the channel again.
        let sub = Subscription {
            notifier: self.clone(),
            channel: channel.to_string(),
            conn: conn.clone(),
            releases,
        };
        let subscribed = |n: &Self| n.lock().get(channel).is_some_and(|c| c.subscribed);
        if !subscribed(self) {
            let _order = self.commands.lock().await;
            if !subscribed(self) {
                conn.subscribe(channel).await?;
                if let Some(c) = self.lock().get_mut(channel) {
                    c.subscribed = true;
                }
            }
        }
        Ok(sub)
    }
}

impl Pushes for Notifier {
    /// Called by the connection for every push; must not block.
    fn on_push(&self, push: PushInfo) {
        let channels = self.lock();
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(name)) = push.data.first()
                    && let Ok(name) = std::str::from_utf8(name)
                    && let Some(c) = channels.get(name)
                {
                    let grant = match push.data.get(1) {
                        Some(Value::BulkString(m)) => m
                            .strip_prefix(b"g")
                            .and_then(|t| std::str::from_utf8(t).ok()?.parse().ok()),
                        _ => None,
                    };
                    c.releases.send_modify(|h| {
                        h.messages += 1;
                        h.grant = grant.or(h.grant);
                    });
                }
            }
            // The connection dropped: a release may have been missed, so every waiter retries now
            // (the connection re-subscribes by itself when it comes back).
            PushKind::Disconnection => wake(&channels),
            _ => {}
        }
    }

    /// Every waiter retries now (the connection moved to another server).
    fn wake_all(&self) {
        wake(&self.lock());
    }

    /// The channels someone waits on.
    fn channels(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

/// Every waiter of every channel retries.
fn wake(channels: &HashMap<String, Channel>) {
    for c in channels.values() {
        c.releases.send_modify(|h| h.messages += 1);
    }
}

/// One waiter's membership of a channel; leaving the last one unsubscribes.
pub(crate) struct Subscription {
    notifier: Arc<Notifier>,
    channel: String,
    conn: Conn,
    releases: watch::Receiver<Heard>,
}

impl Subscription {
    /// Resolves at the next message (or connection drop) after the last call.
    ///
    /// # Cancel safety
    /// Cancel safe: a message that arrives while nobody waits is kept for the next call.
    pub(crate) async fn released(&mut self) {
        if self.releases.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The fencing token of the grant a release made to us, if one was heard: the lock is ours
    /// ([`crate::scripts::RELEASE`]).
    pub(crate) fn granted(&self) -> Option<u64> {
        self.releases.borrow().grant
    }

    /// Forgets the messages so far: the next [`Subscription::released`] waits for a new one.
    pub(crate) fn mark_seen(&mut self) {
        self.releases.borrow_and_update();
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
                let _order = notifier.commands.lock().await;
                // A new waiter may have joined meanwhile; then the subscription stays.
                if !notifier.lock().contains_key(&channel) {
                    let _ = conn.unsubscribe(&channel).await;
                }
            });
        }
    }
}
