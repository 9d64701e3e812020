//! Notifications: the client LISTENs on its own channel (its admitted waiters are told there,
//! by secret) and on each leader channel an observer follows, on its one connection; the
//! connection's driver routes every message here. A waiter registers before its entry is
//! written, so no message can come before it listens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

/// Routes messages to waiters (by secret) and observers (by leader channel), and counts the
/// commits the server says it did not replicate.
#[derive(Default)]
pub(crate) struct Notifier {
    waiters: Mutex<HashMap<String, watch::Sender<u64>>>,
    observers: Mutex<HashMap<String, watch::Sender<u64>>>,
    local_only: AtomicU64,
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

    /// A notice from the server. A commit whose wait for a synchronous standby was cancelled
    /// (`pg_cancel_backend`, or the process told to exit) is kept on the primary alone, and a
    /// failover could lose it: counted, so the statement it ended is treated as failed. Matched
    /// by the server's routine, which a translated message keeps.
    pub(crate) fn notice(&self, notice: &tokio_postgres::error::DbError) {
        if notice.routine() == Some("SyncRepWaitForLSN")
            || notice.message().contains("synchronous replication")
        {
            tracing::warn!(
                message = notice.message(),
                "distlock postgres: a commit was not replicated to the synchronous standby"
            );
            self.local_only.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How many commits were cut from their synchronous replication so far. The driver counts
    /// a commit's notice before it passes on the reply that follows it, so a statement that
    /// reads this before and after knows whether its own commit was one.
    pub(crate) fn local_only_commits(&self) -> u64 {
        self.local_only.load(Ordering::SeqCst)
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

    /// Forgets `channel` when no observer follows it any more; whether it did (the connection
    /// then stops listening on it).
    pub(crate) fn unobserve(&self, channel: &str) -> bool {
        let mut observers = lock(&self.observers);
        let unfollowed = observers
            .get(channel)
            .is_some_and(|tx| tx.receiver_count() == 0);
        if unfollowed {
            observers.remove(channel);
        }
        unfollowed
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_is_forgotten_with_its_last_observer() {
        let notifier = Notifier::default();
        let (first, fresh) = notifier.observe("leader");
        assert!(fresh);
        let (second, fresh) = notifier.observe("leader");
        assert!(!fresh, "one LISTEN per channel");
        drop(first);
        assert!(!notifier.unobserve("leader"), "one observer is left");
        drop(second);
        assert!(notifier.unobserve("leader"));
        assert!(notifier.observed().is_empty());
        assert!(
            notifier.observe("leader").1,
            "a later observer LISTENs again"
        );
    }
}
