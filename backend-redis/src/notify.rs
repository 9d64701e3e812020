//! Release notifications: one subscription per channel per client, shared by all its waiters,
//! carried as RESP3 pushes on the client's one connection (no extra subscriber connection). A
//! queued waiter is told its grant (a Redlock arbiter's waiter its turn) on its client's turn
//! channel, subscribed once for the client's life; Redlock waiters whose arbiter is silent
//! listen for the other nodes' announcements on the name's channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::watch;

use crate::conn::{Conn, Pushes};

struct Channel {
    /// Bumped by every message: a waiter that was busy when it came still sees the change.
    releases: watch::Sender<u64>,
    waiters: usize,
    /// The server confirmed our SUBSCRIBE (and no UNSUBSCRIBE was sent since).
    subscribed: bool,
}

/// What a queued waiter heard on its client's turn channel.
#[derive(Default)]
struct Heard {
    /// Bumped by every wake-up ("your turn", a connection drop): the waiter re-checks.
    wakes: u64,
    /// The fencing token of the grant a release made to it ([`crate::scripts::RELEASE`]).
    grant: Option<u64>,
}

/// Routes release messages to the waiters of each channel.
#[derive(Default)]
pub(crate) struct Notifier {
    channels: Mutex<HashMap<String, Channel>>,
    /// The queued waiters of this client, by owner secret (hex): a message on the client's turn
    /// channel names the secret it is for.
    turns: Mutex<HashMap<String, watch::Sender<Heard>>>,
    /// Held while a SUBSCRIBE or UNSUBSCRIBE is decided and sent, so a late unsubscribe can
    /// never overtake the subscribe of a waiter that joined after the last one left.
    commands: tokio::sync::Mutex<()>,
}

impl Notifier {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn turns(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<Heard>>> {
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Listens for the turn (or grant) of the waiter `secret` (hex) on the client's turn
    /// channel, which the caller keeps subscribed. Local only: no request.
    pub(crate) fn turn(self: &Arc<Self>, secret: &str) -> Turn {
        let heard = watch::Sender::new(Heard::default());
        let rx = heard.subscribe();
        self.turns().insert(secret.to_string(), heard);
        Turn {
            notifier: self.clone(),
            secret: secret.to_string(),
            heard: rx,
        }
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
                    releases: watch::Sender::new(0),
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
        // `t:<secret>` "your turn", `g<token>:<secret>` a grant: to one of our queued waiters.
        if push.kind == PushKind::Message
            && let Some(Value::BulkString(m)) = push.data.get(1)
            && let Some((kind, secret)) =
                std::str::from_utf8(m).ok().and_then(|m| m.split_once(':'))
            && let Some(grant) = match kind {
                "t" => Some(None),
                _ => kind
                    .strip_prefix('g')
                    .and_then(|t| t.parse().ok())
                    .map(Some),
            }
        {
            if let Some(heard) = self.turns().get(secret) {
                heard.send_modify(|h| match grant {
                    Some(token) => h.grant = Some(token),
                    None => h.wakes += 1,
                });
            }
            return;
        }
        let channels = self.lock();
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(name)) = push.data.first()
                    && let Ok(name) = std::str::from_utf8(name)
                    && let Some(c) = channels.get(name)
                {
                    c.releases.send_modify(|n| *n += 1);
                }
            }
            // The connection dropped: a release may have been missed, so every waiter retries now
            // (the connection re-subscribes by itself when it comes back).
            PushKind::Disconnection => {
                wake(&channels);
                self.wake_turns();
            }
            _ => {}
        }
    }

    /// Every waiter retries now (the connection moved to another server).
    fn wake_all(&self) {
        wake(&self.lock());
        self.wake_turns();
    }

    /// The channels someone waits on.
    fn channels(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

impl Notifier {
    /// Every lock's waiter re-checks (a grant sent meanwhile may be lost).
    fn wake_turns(&self) {
        for heard in self.turns().values() {
            heard.send_modify(|h| h.wakes += 1);
        }
    }
}

/// Every waiter of every channel retries.
fn wake(channels: &HashMap<String, Channel>) {
    for c in channels.values() {
        c.releases.send_modify(|n| *n += 1);
    }
}

/// One waiter's membership of a channel; leaving the last one unsubscribes.
pub(crate) struct Subscription {
    notifier: Arc<Notifier>,
    channel: String,
    conn: Conn,
    releases: watch::Receiver<u64>,
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

/// A queued waiter listening for its turn or grant ([`Notifier::turn`]); dropping it stops
/// listening.
pub(crate) struct Turn {
    notifier: Arc<Notifier>,
    secret: String,
    heard: watch::Receiver<Heard>,
}

impl Turn {
    /// Resolves at the next message or wake-up after the last call.
    ///
    /// # Cancel safety
    /// Cancel safe: what arrives while nobody waits is kept for the next call.
    pub(crate) async fn released(&mut self) {
        if self.heard.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The fencing token of the grant a release made to us, if one was heard: the lock is ours.
    pub(crate) fn granted(&self) -> Option<u64> {
        self.heard.borrow().grant
    }

    /// Forgets the messages so far: the next [`Turn::released`] waits for a new one.
    pub(crate) fn mark_seen(&mut self) {
        self.heard.borrow_and_update();
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.notifier.turns().remove(&self.secret);
    }
}

/// The client's own turn channel ([`crate::keys::grants_channel`]), subscribed at its first
/// waiting acquire and for the rest of its life: a waiter then sends nothing to listen (no
/// SUBSCRIBE, no UNSUBSCRIBE, which measured a round trip on the releasing holder's path).
pub(crate) struct TurnChannel {
    pub(crate) name: String,
    pub(crate) subscribed: tokio::sync::OnceCell<Subscription>,
}
