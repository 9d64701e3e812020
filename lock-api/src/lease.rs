//! The lease guard handed out by an acquire.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::backend::{GrantKey, LockBackend, Renewal};
use crate::error::{LockError, LostReason, Result};
use crate::fencing::FencingToken;
use crate::guarantee::Guarantee;
use crate::name::LockName;
use crate::options::LeaseMode;
use crate::owner::Owner;
use crate::signal::{LostSignal, LostTrigger};
use crate::watchdog::Watchdog;

/// State shared by every guard of one grant (re-entrant acquires share it) and its watchdog.
pub(crate) struct LeaseShared {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) key: GrantKey,
    pub(crate) token: Option<FencingToken>,
    pub(crate) guarantee: Guarantee,
    pub(crate) mode: LeaseMode,
    pub(crate) drift_factor: f64,
    pub(crate) drift_floor: Duration,
    pub(crate) lost: LostTrigger,
    /// Held while a renewal is in flight; release takes it so no renewal overlaps a release.
    pub(crate) renew_gate: tokio::sync::Mutex<()>,
    /// The runtime the lease was acquired on: Drop spawns its background release there.
    pub(crate) runtime: Handle,
    pub(crate) owner: Option<(Owner, (usize, LockName))>,
    /// The client's watchdog, and this lease's id in it.
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) member: u64,
    pub(crate) state: Mutex<LeaseState>,
}

pub(crate) struct LeaseState {
    pub(crate) ttl: Duration,
    pub(crate) deadline: Instant,
    pub(crate) holds: usize,
    pub(crate) released: bool,
}

impl LeaseShared {
    pub(crate) fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn validity(&self, sent: Instant, ttl: Duration) -> Instant {
        let drift = ttl.mul_f64(self.drift_factor) + self.drift_floor;
        sent + ttl.saturating_sub(drift)
    }

    /// Records a successful renewal sent at `sent`.
    pub(crate) fn extend(&self, sent: Instant, ttl: Duration) {
        let deadline = self.validity(sent, ttl);
        let mut st = self.state();
        st.ttl = ttl;
        st.deadline = st.deadline.max(deadline);
    }

    pub(crate) fn renew_period(&self, ttl: Duration) -> Option<Duration> {
        match self.mode {
            LeaseMode::Watchdog { renew_every } => Some(renew_every.unwrap_or(ttl / 3)),
            LeaseMode::Fixed => None,
        }
    }

    pub(crate) fn mark_lost(&self, reason: LostReason) {
        if self.lost.fire(reason) {
            tracing::warn!(
                lock = %self.key.name,
                backend = self.backend.kind(),
                token = ?self.token,
                %reason,
                "distlock lease lost"
            );
        }
    }

    fn lost_error(&self, reason: LostReason) -> LockError {
        LockError::Lost {
            name: self.key.name.to_string(),
            reason,
        }
    }

    /// Drops one hold; on the last one marks the lease released and stops the watchdog before
    /// returning, so no renewal starts after release began. Returns whether it was the last.
    fn drop_hold(&self) -> bool {
        let mut st = self.state();
        st.holds = st.holds.saturating_sub(1);
        if st.holds > 0 || st.released {
            return false;
        }
        st.released = true;
        drop(st);
        self.watchdog.leave(self.member);
        if let Some((owner, key)) = &self.owner {
            owner.forget(key, self);
        }
        true
    }

    /// Waits for a renewal already in flight (so the release is the last word), then releases.
    async fn release_now(&self) -> Result<bool> {
        let _gate = self.renew_gate.lock().await;
        let held = self.backend.release(&self.key).await;
        tracing::debug!(lock = %self.key.name, backend = self.backend.kind(), token = ?self.token, ?held, "distlock released");
        held
    }

    /// Releases in a task of the lease's runtime: for `Drop`, and for a `release` whose caller
    /// was cancelled, so nobody can cut it short.
    fn spawn_release(self: Arc<Self>) {
        let rt = self.runtime.clone();
        rt.spawn(async move {
            let _ = self.release_now().await;
        });
    }
}

/// Armed while `Lease::release` runs inline: dropped armed (the caller was cancelled), it hands
/// the release to a background task. Compare-and-delete makes a repeated release harmless.
struct ReleaseGuard(Option<Arc<LeaseShared>>);

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.spawn_release();
        }
    }
}

/// A held lock. Obtained from [`crate::LockClient`]; one guard per (re-entrant) acquire.
///
/// Guarantees:
/// * [`Lease::remaining`] is computed locally on the monotonic clock from the moment the granting
///   request was sent, minus a drift margin, so it never overstates the server's view;
/// * the [`LostSignal`] fires as soon as the lease is known or presumed lost, and no later than
///   the validity deadline; after that the holder must stop acting as the owner;
/// * dropping the guard releases the lock in the background on the runtime that acquired it
///   (no blocking, no panic); if that fails, the TTL frees the lock.
pub struct Lease {
    shared: Arc<LeaseShared>,
    done: bool,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.shared.key.name)
            .field("backend", &self.shared.backend.kind())
            .field("token", &self.shared.token)
            .field("remaining", &self.remaining())
            .field("lost", &self.lost_reason())
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(shared: Arc<LeaseShared>) -> Self {
        Lease {
            shared,
            done: false,
        }
    }

    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.shared.key.name
    }

    /// The backend's own address of this grant (Redis key, etcd key, znode path), for guarded
    /// writes that check the lock still exists. Not a secret.
    pub fn backend_key(&self) -> &str {
        &self.shared.key.resource
    }

    /// The backend kind that granted it.
    pub fn backend(&self) -> &'static str {
        self.shared.backend.kind()
    }

    /// The fencing token: always `Some` for a `Correctness` lease and on every backend with
    /// monotonic fencing; `None` on Redlock, which has no ordered token.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.shared.token
    }

    /// The grade the call site asked for (and the backend confirmed it can give).
    pub fn guarantee(&self) -> Guarantee {
        self.shared.guarantee
    }

    /// The local validity deadline (monotonic clock).
    pub fn valid_until(&self) -> Instant {
        self.shared.state().deadline
    }

    /// Time left before the validity deadline; zero once lost. No network call.
    pub fn remaining(&self) -> Duration {
        if self.lost_reason().is_some() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// How many guards of this owner hold the lock (1 unless re-entered).
    pub fn hold_count(&self) -> usize {
        self.shared.state().holds
    }

    /// Why the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost.fired()
    }

    /// A signal to select on (or move into another task) that fires when the lease is lost.
    pub fn lost_signal(&self) -> LostSignal {
        self.shared.lost.subscribe()
    }

    /// Resolves when the lease is lost. Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.lost_signal().wait().await
    }

    /// Resets the lease to `ttl` (rounded up to the backend's granularity) from now.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lease is already lost or the backend says it is no longer
    /// ours (the lost signal fires; nothing is re-created); [`LockError::NotHeld`] after release;
    /// [`LockError::InvalidConfig`] for a zero TTL; backend errors as they come (the lease stays
    /// valid until its deadline, and the watchdog keeps trying).
    pub async fn renew(&self, ttl: Duration) -> Result<()> {
        if ttl.is_zero() {
            return Err(LockError::invalid_config("ttl", ttl, "must be above zero"));
        }
        let ttl = self.shared.backend.capabilities().effective_ttl(ttl);
        if let Some(reason) = self.lost_reason() {
            return Err(self.shared.lost_error(reason));
        }
        let _gate = self.shared.renew_gate.lock().await;
        if self.shared.state().released {
            return Err(LockError::NotHeld {
                name: self.name().to_string(),
            });
        }
        let sent = Instant::now();
        match self.shared.backend.renew(&self.shared.key, ttl).await? {
            Renewal::Renewed => {
                self.shared.extend(sent, ttl);
                tracing::debug!(lock = %self.name(), backend = self.backend(), ?ttl, "distlock renewed");
                Ok(())
            }
            Renewal::NotHeld => {
                self.shared.mark_lost(LostReason::RenewalRefused);
                Err(self.shared.lost_error(LostReason::RenewalRefused))
            }
        }
    }

    /// Releases this guard. For the last guard of an owner, the watchdog stops before anything
    /// else happens, then the backend deletes the lock if it is still ours.
    ///
    /// Returns whether we still held the lock (false after expiry or loss: in that case nothing
    /// of the next holder's was touched). For an inner re-entrant guard, returns whether the
    /// lease is still valid, and the lock stays held by the outer guards.
    ///
    /// # Cancel safety
    /// Dropping this future does not stop the release: it goes on in a background task.
    pub async fn release(mut self) -> Result<bool> {
        self.done = true;
        if !self.shared.drop_hold() {
            return Ok(self.lost_reason().is_none());
        }
        // Inline (no task hop on the hot path); a cancelled caller leaves it to a task.
        let mut guard = ReleaseGuard(Some(self.shared.clone()));
        let held = self.shared.release_now().await;
        guard.0 = None;
        held
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.done && self.shared.drop_hold() {
            // Detached on purpose: Drop cannot wait. The TTL is the fallback if this fails.
            self.shared.clone().spawn_release();
        }
    }
}
