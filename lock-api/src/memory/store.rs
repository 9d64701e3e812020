//! The shared state of the in-memory "server": one per [`super::MemoryStore`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::owner::OwnerSecret;

/// A grant as the store hands it to a waiter: the token and when the TTL started.
pub(super) type Handoff = (u64, Instant);

pub(super) struct Holder {
    pub(super) secret: OwnerSecret,
    pub(super) token: u64,
    pub(super) expires: Instant,
    /// What the holder announced as an election's leader.
    pub(super) value: Option<String>,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) secret: OwnerSecret,
    pub(super) ttl: Duration,
    pub(super) tx: oneshot::Sender<Handoff>,
}

#[derive(Default)]
pub(super) struct Entry {
    pub(super) holder: Option<Holder>,
    /// Arrival order: the head is granted next (FIFO).
    pub(super) waiters: VecDeque<Waiter>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) locks: HashMap<String, Entry>,
    /// One store-wide sequence: strictly increasing per name, and no per-name key to leak.
    pub(super) last_token: u64,
    pub(super) last_waiter: u64,
    /// Bumped at every announcement and release: observers' change hints.
    pub(super) changes: watch::Sender<u64>,
}

impl State {
    /// Drops an expired holder, then hands a free lock to the first waiter still listening.
    /// Removes entries that hold nothing, so idle names cost no memory.
    pub(super) fn settle(&mut self, key: &str, now: Instant) {
        let Some(entry) = self.locks.get_mut(key) else {
            return;
        };
        if entry.holder.as_ref().is_some_and(|h| h.expires <= now) {
            entry.holder = None;
        }
        while entry.holder.is_none() {
            let Some(w) = entry.waiters.pop_front() else {
                break;
            };
            self.last_token += 1;
            let token = self.last_token;
            if w.tx.send((token, now)).is_ok() {
                entry.holder = Some(Holder {
                    secret: w.secret,
                    token,
                    expires: now + w.ttl,
                    value: None,
                });
            }
        }
        if entry.holder.is_none() && entry.waiters.is_empty() {
            self.locks.remove(key);
        }
    }

    /// Grants the lock if it is free and nobody queued before us.
    pub(super) fn grant_now(
        &mut self,
        key: &str,
        secret: &OwnerSecret,
        ttl: Duration,
        now: Instant,
    ) -> Option<u64> {
        self.settle(key, now);
        if self
            .locks
            .get(key)
            .is_some_and(|e| e.holder.is_some() || !e.waiters.is_empty())
        {
            return None;
        }
        self.last_token += 1;
        let token = self.last_token;
        self.locks.entry(key.to_string()).or_default().holder = Some(Holder {
            secret: secret.clone(),
            token,
            expires: now + ttl,
            value: None,
        });
        Some(token)
    }

    /// The live holder of `key` if it is `secret`'s.
    pub(super) fn held_by(
        &mut self,
        key: &str,
        secret: &OwnerSecret,
        now: Instant,
    ) -> Option<&mut Holder> {
        self.locks
            .get_mut(key)?
            .holder
            .as_mut()
            .filter(|h| h.secret == *secret && h.expires > now)
    }

    /// Releases `key` if `secret` holds it; returns whether it did.
    pub(super) fn release(&mut self, key: &str, secret: &OwnerSecret, now: Instant) -> bool {
        let held = self.held_by(key, secret, now).is_some();
        if held && let Some(e) = self.locks.get_mut(key) {
            e.holder = None;
            self.changes.send_modify(|n| *n += 1);
        }
        self.settle(key, now);
        held
    }

    /// When the current holder of `key` expires, if any.
    pub(super) fn expiry(&self, key: &str) -> Option<Instant> {
        self.locks.get(key)?.holder.as_ref().map(|h| h.expires)
    }

    /// Removes a waiter that gave up. If the store had already handed it the lock (a grant it
    /// never saw), the caller releases that grant with the waiter's secret.
    pub(super) fn forget_waiter(&mut self, key: &str, id: u64, now: Instant) {
        if let Some(e) = self.locks.get_mut(key) {
            e.waiters.retain(|w| w.id != id);
        }
        self.settle(key, now);
    }
}
