//! The shared state of the in-memory "server": one per [`super::MemoryStore`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::admission::Admission;
use crate::error::Result;
use crate::holder::HolderInfo;
use crate::secret::OwnerSecret;

/// A grant as the store hands it to a waiter: the token and when the TTL started.
pub(super) type Handoff = (u64, Instant);

pub(super) struct Holder {
    pub(super) secret: OwnerSecret,
    pub(super) token: u64,
    pub(super) expires: Instant,
    /// What the holder announced as an election's leader.
    pub(super) value: Option<String>,
    /// Its entry's limit ([`Admission::limit`]).
    pub(super) limit: u32,
    /// Who holds it.
    pub(super) holder: HolderInfo,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) secret: OwnerSecret,
    pub(super) ttl: Duration,
    pub(super) admission: Admission,
    pub(super) holder: HolderInfo,
    pub(super) tx: oneshot::Sender<Handoff>,
}

/// One name's admission queue: the admitted entries (holders), then the waiting ones, each in
/// arrival order; [`Admission`] says how far the admitted prefix reaches.
#[derive(Default)]
pub(super) struct Entry {
    pub(super) holders: Vec<Holder>,
    /// Arrival order: admitted from the front (FIFO).
    pub(super) waiters: VecDeque<Waiter>,
}

impl Entry {
    /// The limits of every entry, holders first, in queue order.
    fn limits(&self) -> impl Iterator<Item = u32> + '_ {
        self.holders
            .iter()
            .map(|h| h.limit)
            .chain(self.waiters.iter().map(|w| w.admission.limit()))
    }

    /// The oldest holder (a lock's or an election's only one).
    pub(super) fn first(&self) -> Option<&Holder> {
        self.holders.first()
    }
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
    /// Drops expired holders, then admits waiters from the front of the queue while the policy
    /// admits them (a waiter no longer listening is skipped). Removes entries that hold nothing,
    /// so idle names cost no memory.
    pub(super) fn settle(&mut self, key: &str, now: Instant) {
        let Some(entry) = self.locks.get_mut(key) else {
            return;
        };
        entry.holders.retain(|h| h.expires > now);
        while let Some(w) = entry.waiters.front() {
            if !w.admission.admitted(entry.holders.iter().map(|h| h.limit)) {
                break;
            }
            let Some(w) = entry.waiters.pop_front() else {
                break;
            };
            self.last_token += 1;
            let token = self.last_token;
            if w.tx.send((token, now)).is_ok() {
                entry.holders.push(Holder {
                    secret: w.secret,
                    token,
                    expires: now + w.ttl,
                    value: None,
                    limit: w.admission.limit(),
                    holder: w.holder,
                });
            }
        }
        if entry.holders.is_empty() && entry.waiters.is_empty() {
            self.locks.remove(key);
        }
    }

    /// Admits a new entry at once if the policy admits it behind everyone queued (holders and
    /// waiters); `Ok(None)` when it would have to wait. A permit whose limit differs from a
    /// queued one is refused (`name` is the lock name, for the error).
    pub(super) fn grant_now(
        &mut self,
        key: &str,
        secret: &OwnerSecret,
        ttl: Duration,
        admission: Admission,
        holder: &HolderInfo,
        now: Instant,
    ) -> Result<Option<u64>> {
        self.settle(key, now);
        if let Some(e) = self.locks.get(key) {
            admission.check_ahead(key, e.limits())?;
            if !admission.admitted(e.limits()) {
                return Ok(None);
            }
        }
        self.last_token += 1;
        let token = self.last_token;
        self.locks
            .entry(key.to_string())
            .or_default()
            .holders
            .push(Holder {
                secret: secret.clone(),
                token,
                expires: now + ttl,
                value: None,
                limit: admission.limit(),
                holder: holder.clone(),
            });
        Ok(Some(token))
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
            .holders
            .iter_mut()
            .find(|h| h.secret == *secret && h.expires > now)
    }

    /// Releases `key` if `secret` holds it; returns whether it did.
    pub(super) fn release(&mut self, key: &str, secret: &OwnerSecret, now: Instant) -> bool {
        let held = self.held_by(key, secret, now).is_some();
        if held && let Some(e) = self.locks.get_mut(key) {
            e.holders.retain(|h| h.secret != *secret);
            self.changes.send_modify(|n| *n += 1);
        }
        self.settle(key, now);
        held
    }

    /// When the first of `key`'s holders expires, if any (a waiter's next re-check).
    pub(super) fn expiry(&self, key: &str) -> Option<Instant> {
        self.locks.get(key)?.holders.iter().map(|h| h.expires).min()
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
