//! The in-memory reference backend.
//!
//! A [`MemoryStore`] plays the server; each [`MemoryBackend`] from [`MemoryStore::client`] is an
//! independent client of it (a competitor in tests). It implements the whole contract: TTL
//! expiry, a store-wide fencing sequence, FIFO waiters woken by notification (a waiter sleeps
//! until a hand-over or the holder's expiry, never polls), client-side re-entrancy, the lost
//! signal, and cancellation safety. It uses tokio's clock, so code under `tokio::time::pause()`
//! tests lock expiry and renewal in simulated time.
//!
//! It gives `Correctness` within one process: the store is linearizable (one mutex) and its
//! tokens strictly increase. It is no use across processes.
//!
//! Fault hook: [`MemoryBackend::set_reachable`] makes a client's calls fail as if its network
//! were cut, while the store keeps running its TTLs.

mod store;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep_until};

use crate::admission::Admission;
use crate::backend::{Grant, GrantKey, HolderStatus, LockBackend, LockStatus, Renewal};
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::guarantee::{Capabilities, Fencing, Guarantee, Reentrancy, Wakeup};
use crate::holder::HolderInfo;
use crate::leader::Leader;
use crate::name::LockName;
use crate::secret::OwnerSecret;
use store::{Handoff, State, Waiter};

/// The shared lock state many [`MemoryBackend`] clients talk to. Clones share it.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("names", &self.lock().locks.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new, independent client of this store.
    pub fn client(&self) -> MemoryBackend {
        MemoryBackend {
            store: self.clone(),
            link: Arc::new(watch::Sender::new(true)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the store keeps for `name`: a live holder counts 1, each queued waiter 1. Zero means
    /// no artifact at all (tests use it to prove nothing was left behind).
    pub fn artifacts(&self, name: &LockName) -> usize {
        let now = Instant::now();
        let mut st = self.lock();
        st.settle(name.encoded(), now);
        st.locks
            .get(name.encoded())
            .map_or(0, |e| e.holders.len() + e.waiters.len())
    }

    /// Removes the (oldest) holder of `name`, as an operator deleting the lock by hand would (the
    /// next waiter gets it); the holder's next renewal finds it gone. Returns whether there was
    /// one.
    pub fn evict(&self, name: &LockName) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        st.settle(name.encoded(), now);
        let had = st
            .locks
            .get_mut(name.encoded())
            .filter(|e| !e.holders.is_empty())
            .map(|e| e.holders.remove(0))
            .is_some();
        st.settle(name.encoded(), now);
        had
    }

    /// How long the store keeps the live holder of `name` if nothing renews it, if any.
    pub fn holder_remaining(&self, name: &LockName) -> Option<Duration> {
        let now = Instant::now();
        let mut st = self.lock();
        st.settle(name.encoded(), now);
        st.expiry(name.encoded()).map(|e| e - now)
    }

    /// The fencing token of the live (oldest) holder of `name`, if any.
    pub fn holder_token(&self, name: &LockName) -> Option<FencingToken> {
        let now = Instant::now();
        let mut st = self.lock();
        st.settle(name.encoded(), now);
        st.locks
            .get(name.encoded())?
            .first()
            .map(|h| FencingToken(h.token))
    }
}

/// One client of a [`MemoryStore`]. `MemoryBackend::default()` brings its own store: the
/// embedded default that needs no server.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    store: MemoryStore,
    /// `true` while the client's "network" is up; waiters watch it to fail when it goes down.
    link: Arc<watch::Sender<bool>>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryStore::new().client()
    }
}

const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Correctness,
    fencing: Fencing::ClusterWide,
    fifo: true,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(1),
    wakeup: Wakeup::InProcess,
    policies: true,
    permits: true,
    listed_waiters: true,
};

impl MemoryBackend {
    /// The store this client talks to.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// Cuts (`false`) or restores (`true`) this client's "network": while cut, every call fails
    /// with a retryable backend error, its waiters give up with that error (as a waiter whose
    /// session died), and the store keeps expiring TTLs.
    pub fn set_reachable(&self, reachable: bool) {
        self.link.send_replace(reachable);
    }

    fn check_reachable(&self) -> Result<()> {
        if *self.link.borrow() {
            Ok(())
        } else {
            Err(cut_off())
        }
    }

    fn grant(
        name: &LockName,
        secret: OwnerSecret,
        holder: HolderInfo,
        ttl: Duration,
        (token, at): Handoff,
    ) -> Grant {
        Grant::own_ttl(
            name,
            name.encoded().to_string(),
            (secret, holder),
            Some(FencingToken(token)),
            ttl,
            at,
        )
    }
}

impl MemoryBackend {
    /// The one queue: admitted at once, else (with a deadline) queued until the policy admits
    /// it; without one, `Busy`.
    async fn admit(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        self.check_reachable()?;
        let secret = OwnerSecret::random()?;
        let key = name.encoded();
        let holder = HolderInfo::now();
        let started = Instant::now();
        let (tx, rx) = oneshot::channel();
        let (id, deadline) = {
            let mut st = self.store.lock();
            if let Some(t) = st.grant_now(key, &secret, ttl, admission, &holder, started)? {
                return Ok(Self::grant(name, secret, holder, ttl, (t, started)));
            }
            let Some(deadline) = deadline else {
                return Err(LockError::Busy {
                    name: name.to_string(),
                });
            };
            st.last_waiter += 1;
            let id = st.last_waiter;
            let entry = st.locks.entry(key.to_string()).or_default();
            entry.waiters.push_back(Waiter {
                id,
                secret: secret.clone(),
                ttl,
                admission,
                holder: holder.clone(),
                tx,
            });
            (id, deadline)
        };
        let mut waiter = QueuedWaiter {
            store: &self.store,
            key,
            id,
            secret: secret.clone(),
            rx,
            done: false,
        };
        let mut link = self.link.subscribe();
        loop {
            // Sleep until the hand-over, the holder's expiry (then settle hands it on), or the
            // deadline; a missed notification cannot hang us past the holder's TTL.
            let wake = self
                .store
                .lock()
                .expiry(key)
                .map_or(deadline, |e| e.min(deadline));
            tokio::select! {
                handoff = &mut waiter.rx => {
                    waiter.done = true;
                    let handoff = handoff.map_err(|_| LockError::backend("memory", true, "store dropped a waiter"))?;
                    return Ok(Self::grant(name, secret, holder, ttl, handoff));
                }
                _ = link.wait_for(|up| !up) => return Err(cut_off()),
                _ = sleep_until(wake) => {
                    let now = Instant::now();
                    self.store.lock().settle(key, now);
                    if now >= deadline && waiter.rx.is_empty() {
                        return Err(LockError::Timeout {
                            name: name.to_string(),
                            waited: now - started,
                        });
                    }
                }
            }
        }
    }
}

fn cut_off() -> LockError {
    LockError::backend("memory", true, "client cut off from the store (fault hook)")
}

/// Leaves the queue when the waiting future ends or is dropped; releases a hand-over that
/// arrived but was never seen.
struct QueuedWaiter<'a> {
    store: &'a MemoryStore,
    key: &'a str,
    id: u64,
    secret: OwnerSecret,
    rx: oneshot::Receiver<Handoff>,
    done: bool,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let now = Instant::now();
        let mut st = self.store.lock();
        st.forget_waiter(self.key, self.id, now);
        if self.rx.try_recv().is_ok() {
            st.release(self.key, &self.secret, now);
        }
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Grant> {
        self.admit(name, Admission::Exclusive, ttl, None).await
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        self.admit(name, Admission::Exclusive, ttl, Some(deadline))
            .await
    }

    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        self.admit(name, admission, ttl, deadline).await
    }

    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        self.check_reachable()?;
        let now = Instant::now();
        let mut st = self.store.lock();
        Ok(match st.held_by(&key.resource, &key.secret, now) {
            Some(h) => {
                h.expires = now + ttl;
                Renewal::Renewed { ttl }
            }
            None => Renewal::NotHeld,
        })
    }

    async fn release(&self, key: &GrantKey) -> Result<bool> {
        self.check_reachable()?;
        Ok(self
            .store
            .lock()
            .release(&key.resource, &key.secret, Instant::now()))
    }

    /// Another client of the same store (the store lives in this process, on no runtime).
    async fn reconnect(&self) -> Result<Arc<dyn LockBackend>> {
        Ok(Arc::new(self.clone()))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        self.check_reachable()?;
        let now = Instant::now();
        let mut st = self.store.lock();
        st.settle(name.encoded(), now);
        let Some(e) = st.locks.get(name.encoded()) else {
            return Ok(LockStatus::default());
        };
        Ok(LockStatus {
            holders: e
                .holders
                .iter()
                .map(|h| HolderStatus {
                    token: Some(FencingToken(h.token)),
                    expires_in: Some(h.expires - now),
                    admission: Admission::of_limit(h.limit),
                    holder: Some(h.holder.clone()),
                })
                .collect(),
            waiters: e.waiters.iter().filter(|w| !w.tx.is_closed()).count(),
        })
    }

    async fn announce(&self, key: &GrantKey, token: FencingToken, value: &str) -> Result<bool> {
        self.check_reachable()?;
        let mut st = self.store.lock();
        let Some(h) = st
            .held_by(&key.resource, &key.secret, Instant::now())
            .filter(|h| h.token == token.0)
        else {
            return Ok(false);
        };
        h.value = Some(value.to_string());
        st.changes.send_modify(|n| *n += 1);
        Ok(true)
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.check_reachable()?;
        let now = Instant::now();
        let mut st = self.store.lock();
        st.settle(name.encoded(), now);
        Ok(st
            .locks
            .get(name.encoded())
            .and_then(|e| e.first())
            .and_then(|h| {
                Some(Leader {
                    term: FencingToken(h.token),
                    value: h.value.clone()?,
                })
            }))
    }

    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        let _ = name;
        self.check_reachable()?;
        let mut rx = self.store.lock().changes.subscribe();
        rx.mark_unchanged();
        Ok(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
        .boxed())
    }
}
