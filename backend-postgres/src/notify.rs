//! Notifications: the client LISTENs on its own channel (its admitted waiters are told there,
//! by secret) and on each leader channel an observer follows, on its one connection; the
//! connection's driver routes every message here. A waiter registers before its entry is
//! written, so no message can come before it listens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

/// Routes messages to waiters (by secret) and observers (by leader channel).
#[derive(Default)]
pub(crate) struct Notifier {
    waiters: Mutex<HashMap<String, watch::Sender<u64>>>,
    observers: Mutex<HashMap<String, watch::Sender<u64>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|n| *n = n.wrapping_add(1));
}

impl Notifier {
    /// A message on `channel`: the client's own (`payload` = a waiter's secret) or a leader
    /// channel.
    pub(crate) fn deliver(&self, own: &str, channel: &str, payload: &str) {
        if channel == own {
            if let Some(tx) = lock(&self.waiters).get(payload) {
                bump(tx);
            }
        } else if let Some(tx) = lock(&self.observers).get(channel) {
            bump(tx);
        }
    }

    /// Wakes every waiter and observer: after a reconnect (messages sent meanwhile are lost)
    /// or when the connection ends.
    pub(crate) fn wake_all(&self) {
        lock(&self.waiters).values().for_each(bump);
        lock(&self.observers).values().for_each(bump);
    }

    /// Registers the waiter whose entry carries `secret_hex`; it unregisters when dropped.
    pub(crate) fn turn(self: &Arc<Self>, secret_hex: String) -> Turn {
        let rx = lock(&self.waiters)
            .entry(secret_hex.clone())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        Turn {
            notifier: self.clone(),
            secret_hex,
            rx,
        }
    }

    /// Whether the connection must LISTEN on `channel` for an observer: the first one.
    pub(crate) fn observe(&self, channel: &str) -> (watch::Receiver<u64>, bool) {
        let mut observers = lock(&self.observers);
        let fresh = !observers.contains_key(channel);
        let rx = observers
            .entry(channel.to_string())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        (rx, fresh)
    }

    /// The leader channels observers follow (a new connection LISTENs on them all).
    pub(crate) fn observed(&self) -> Vec<String> {
        lock(&self.observers).keys().cloned().collect()
    }
}

/// One waiter's wake-ups.
pub(crate) struct Turn {
    notifier: Arc<Notifier>,
    secret_hex: String,
    rx: watch::Receiver<u64>,
}

impl Turn {
    /// Returns at the next message for this waiter (or a reconnect) since the last call.
    pub(crate) async fn told(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        lock(&self.notifier.waiters).remove(&self.secret_hex);
    }
}
