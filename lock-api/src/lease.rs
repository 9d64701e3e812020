//! The lease guard handed out by an acquire.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::backend::{GrantKey, LockBackend, Renewal};
use crate::error::{LockError, LostReason, Result};
use crate::fencing::FencingToken;
use crate::guarantee::Guarantee;
use crate::last_chance::LastChance;
use crate::margins::{LeaseMode, Margins};
use crate::name::LockName;
use crate::owner::{HoldKey, Owner};
use crate::signal::{LostSignal, LostTrigger};

/// The first pause before a failed release is tried again; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// A failed release is retried for at least this long (and one renewal period, if longer)
/// before the backend gives up what keeps the lock alive.
const RETRY_WINDOW: Duration = Duration::from_secs(1);

/// What a lease asks of the watchdog that renews it (`watchdog.rs`), which implements it: this
/// file names no watchdog type, so the two do not import each other.
pub(crate) trait Renewer: Send + Sync {
    /// Stops watching a lease (released): it is never renewed again.
    fn leave(&self, id: u64);
    /// A manual renewal moved a lease's next renewal and deadline (earlier, too): plan again.
    fn reschedule(&self, id: u64, due: Option<Instant>, deadline: Instant);
}

/// State shared by every guard of one grant (re-entrant acquires share it) and its watchdog.
pub(crate) struct LeaseShared {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) key: GrantKey,
    pub(crate) token: Option<FencingToken>,
    pub(crate) guarantee: Guarantee,
    pub(crate) mode: LeaseMode,
    pub(crate) margins: Margins,
    pub(crate) lost: LostTrigger,
    /// Held while a renewal is in flight; release takes it so no renewal overlaps a release.
    pub(crate) renew_gate: tokio::sync::Mutex<()>,
    /// The runtime the lease was acquired on: Drop spawns its background release there.
    pub(crate) runtime: Handle,
    /// Boxed: most leases have no owner, and the pair would add 64 bytes to every lease.
    pub(crate) owner: Option<Box<(Owner, HoldKey)>>,
    /// The client's watchdog, and this lease's id in it.
    pub(crate) watchdog: Arc<dyn Renewer>,
    pub(crate) member: u64,
    pub(crate) state: Mutex<LeaseState>,
    /// The loss was logged and its background release started (once, whoever saw it first).
    pub(crate) loss_handled: AtomicBool,
    /// When the grant came, for the held-time metric.
    pub(crate) granted: Instant,
    /// The lease's metrics were closed (released or lost; once).
    pub(crate) ended: AtomicBool,
}

pub(crate) struct LeaseState {
    /// The TTL the server applied last, which renewals ask for again.
    pub(crate) ttl: Duration,
    pub(crate) deadline: Instant,
    /// By then the server's own expiry has come, whatever happened meanwhile: the TTL it applied
    /// last, counted from when its answer came back, plus the drift allowance.
    pub(crate) expires: Instant,
    pub(crate) holds: usize,
    pub(crate) released: bool,
}

impl LeaseShared {
    pub(crate) fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The end of the validity window of a TTL the server applied at `sent`.
    pub(crate) fn validity(&self, sent: Instant, ttl: Duration) -> Instant {
        sent + self.margins.window(ttl)
    }

    /// What the lost signal says when the deadline passes without a renewal.
    pub(crate) fn deadline_reason(&self) -> LostReason {
        match self.mode {
            LeaseMode::Watchdog { .. } => LostReason::RenewalFailed,
            LeaseMode::Fixed => LostReason::Expired,
        }
    }

    /// Records what the server applied to a grant or renewal sent at `sent`, called as its answer
    /// arrives: the deadline moves there, earlier as well as later (the server applies a shorter
    /// TTL exactly), and the lost signal follows. Returns the new deadline. A released lease keeps
    /// no deadline.
    pub(crate) fn extend(&self, sent: Instant, ttl: Duration) -> Instant {
        let deadline = self.validity(sent, ttl);
        let expires = Instant::now() + ttl + self.margins.drift(ttl);
        let mut st = self.state();
        st.ttl = ttl;
        st.deadline = deadline;
        st.expires = expires;
        if !st.released {
            self.lost
                .set_deadline(Some((deadline, self.deadline_reason())));
        }
        deadline
    }

    /// Closes the lease's metrics, once: at its release or its loss, whichever comes first.
    pub(crate) fn end(&self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            crate::metrics::lease_ended(
                self.backend.kind(),
                self.guarantee,
                self.granted.elapsed(),
            );
        }
    }

    pub(crate) fn renew_period(&self, ttl: Duration) -> Option<Duration> {
        self.mode.period(ttl)
    }

    /// Marks the lease lost (the first reason stays, also one a read found at the deadline) and
    /// logs it once. The lock is not released behind its holder's back: the lead exists so the
    /// holder can stop before anyone else holds, and a release that got through (a healed link)
    /// would hand the lock on at once. It comes free when the holder lets go (release, drop),
    /// or when the TTL the server applied last has run out ([`LeaseState::expires`]): then the
    /// library deletes it, for a backend whose session outlived the lease (etcd, ZooKeeper), as
    /// the server's own expiry would have. Nothing is deleted when the server said it is not
    /// ours.
    pub(crate) fn lose(self: &Arc<Self>, reason: LostReason) {
        self.lost.fire(reason);
        if self.loss_handled.swap(true, Ordering::AcqRel) {
            return;
        }
        let reason = self.lost.fired().unwrap_or(reason);
        crate::metrics::lost(self.backend.kind(), reason);
        self.end();
        tracing::warn!(
            lock = %self.key.name,
            backend = self.backend.kind(),
            token = ?self.token,
            %reason,
            "distlock lease lost"
        );
        if reason == LostReason::RenewalRefused {
            return;
        }
        let expires = {
            let st = self.state();
            if st.released {
                return;
            }
            st.expires
        };
        let shared = self.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep_until(expires).await;
            // A holder that let go meanwhile released it on its own path.
            if !shared.state().released {
                shared.spawn_release();
            }
        });
    }

    fn lost_error(&self, reason: LostReason) -> LockError {
        LockError::Lost {
            name: self.key.name.to_string(),
            reason,
        }
    }

    /// Drops one hold; on the last one marks the lease released (its lost signal can no longer
    /// fire) and stops the watchdog before returning, so no renewal starts after release began.
    /// Returns whether it was the last.
    fn drop_hold(&self) -> bool {
        let mut st = self.state();
        st.holds = st.holds.saturating_sub(1);
        if st.holds > 0 || st.released {
            return false;
        }
        st.released = true;
        drop(st);
        self.end();
        self.lost.set_deadline(None);
        self.watchdog.leave(self.member);
        if let Some((owner, key)) = self.owner.as_deref() {
            owner.forget(key, self);
        }
        true
    }

    /// Waits for a renewal already in flight (so the release is the last word), then releases
    /// once.
    async fn release_once(&self) -> Result<bool> {
        let _gate = self.renew_gate.lock().await;
        let held = self.backend.release(&self.key).await;
        tracing::debug!(lock = %self.key.name, backend = self.backend.kind(), token = ?self.token, ?held, "distlock released");
        held
    }

    /// After a failed release: tries again with back-off (the connection may come back within
    /// a reconnect) for one renewal period, at least [`RETRY_WINDOW`]; then has the backend give
    /// up what keeps the lock alive ([`LockBackend::abandon`]), so the server frees it within its
    /// TTL or session timeout whatever stays unreachable.
    async fn release_retrying(&self) {
        let ttl = self.state().ttl;
        let window = self.renew_period(ttl).unwrap_or(ttl / 3).max(RETRY_WINDOW);
        let give_up = Instant::now() + window;
        let mut pause = RETRY_FIRST;
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_MAX);
            match self.release_once().await {
                Ok(_) => return,
                Err(e) if Instant::now() < give_up => {
                    tracing::debug!(lock = %self.key.name, error = %e, "distlock release failed, retrying");
                }
                Err(e) => {
                    tracing::warn!(lock = %self.key.name, backend = self.backend.kind(), error = %e, "distlock release kept failing; giving up what keeps the lock alive");
                    self.backend.abandon(&self.key).await;
                    return;
                }
            }
        }
    }

    /// Releases in a task of the lease's runtime, retrying as long as it fails: for `Drop`, a
    /// lost lease, and a `release` whose caller was cancelled, so nobody can cut it short.
    /// A runtime that shuts down first drops the task unfinished (even unpolled: the guard is
    /// made outside it); the release then runs elsewhere (`last_chance.rs`).
    fn spawn_release(self: Arc<Self>) {
        let rt = self.runtime.clone();
        let last = LastChance::release(self.backend.clone(), self.key.clone());
        rt.spawn(async move {
            if self.release_once().await.is_err() {
                self.release_retrying().await;
            }
            last.disarm();
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
///   (or last renewing) request was sent, for the TTL the server applied, minus the drift
///   allowance and the lost signal's lead, so it never overstates the server's view;
/// * the [`LostSignal`] fires as soon as the lease is known or presumed lost, and no later than
///   the validity deadline (every read checks the deadline itself); after that the holder must
///   stop acting as the owner;
/// * a released or dropped lease comes free on the server: the release is retried in the
///   background while it fails, and if it keeps failing, the backend gives up what keeps the
///   lock alive (its session), so the server frees it within its TTL or session timeout;
/// * a lost lease is freed by its TTL or by its holder, never behind its holder's back: the
///   library deletes it only once the holder lets go (release, drop) or the TTL the server
///   applied last has run out, so nobody else is granted during the lead.
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
    pub(crate) fn shared(&self) -> &Arc<LeaseShared> {
        &self.shared
    }

    pub(crate) fn key(&self) -> &GrantKey {
        &self.shared.key
    }

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

    /// The local validity deadline (monotonic clock): the lost signal fires there at the latest.
    pub fn valid_until(&self) -> Instant {
        self.shared.state().deadline
    }

    /// The TTL the server applied at the grant or the last renewal.
    pub fn ttl(&self) -> Duration {
        self.shared.state().ttl
    }

    /// The lost signal's lead for the TTL the server applied last: the least time between the
    /// lost signal and the moment the server could grant the lock to anyone else. A holder that
    /// stops within it (writes stopped, a child process killed) is gone before any successor.
    pub fn lead(&self) -> Duration {
        self.shared.margins.lead(self.ttl())
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

    /// Why the lease was lost, if it was; a passed validity deadline counts, whether or not the
    /// watchdog has run since (a process resumed from a pause sees it at once).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost.fired()
    }

    /// A signal to select on (or move into another task) that fires when the lease is lost.
    pub fn lost_signal(&self) -> LostSignal {
        self.shared.lost.subscribe()
    }

    /// Resolves when the lease is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call again to keep waiting.
    ///
    /// # Examples
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use distlock_api::{AcquireOptions, LockClient, memory::MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
    /// let locks = LockClient::new(Arc::new(MemoryBackend::default()));
    /// let lease = locks.try_acquire("job", &AcquireOptions::with_ttl(Duration::from_secs(10))).await?;
    /// tokio::select! {
    ///     reason = lease.lost() => eprintln!("stop acting as the holder: {reason}"),
    ///     _ = tokio::time::sleep(Duration::from_millis(10)) => { /* the work */ }
    /// }
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) -> LostReason {
        self.lost_signal().wait().await
    }

    /// Resets the lease to `ttl` (rounded up to the backend's granularity; etcd and ZooKeeper
    /// leases get their session's TTL whatever is asked) from the moment the renewal is sent.
    /// The validity becomes what the server applied, shorter than before too, and the watchdog
    /// renews on that TTL's schedule from now on.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lease is already lost, the backend says it is no longer ours
    /// (the lost signal fires; nothing is re-created), or it was found lost while renewing;
    /// [`LockError::NotHeld`] after release; [`LockError::InvalidConfig`] for a zero TTL or one
    /// whose validity window the renewal period does not fit in (before any I/O); backend errors
    /// as they come (the lease stays valid until its deadline, and the watchdog keeps trying).
    ///
    /// # Examples
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use distlock_api::{AcquireOptions, LockClient, memory::MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
    /// let locks = LockClient::new(Arc::new(MemoryBackend::default()));
    /// let opts = AcquireOptions::with_ttl(Duration::from_secs(30)).fixed();
    /// let lease = locks.try_acquire("batch", &opts).await?;
    /// lease.renew(Duration::from_secs(5)).await?; // shorter: the lease now ends sooner
    /// assert!(lease.remaining() <= Duration::from_secs(5));
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn renew(&self, ttl: Duration) -> Result<()> {
        crate::options::check_ttl(ttl)?;
        let ttl = self.shared.backend.lease_ttl(ttl);
        self.shared.margins.check(self.shared.mode, ttl)?;
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
        let renewed = self.shared.backend.renew(&self.shared.key, ttl).await;
        let outcome = match &renewed {
            Ok(Renewal::Renewed { .. }) => "renewed",
            Ok(Renewal::NotHeld) => "refused",
            Err(_) => "failed",
        };
        crate::metrics::renewal(self.shared.backend.kind(), outcome);
        match renewed? {
            Renewal::Renewed { ttl } => {
                // The validity can only be granted while the lease was not lost meanwhile.
                if let Some(reason) = self.lost_reason() {
                    return Err(self.shared.lost_error(reason));
                }
                let deadline = self.shared.extend(sent, ttl);
                let due = self.shared.renew_period(ttl).map(|p| sent + p);
                self.shared
                    .watchdog
                    .reschedule(self.shared.member, due, deadline);
                tracing::debug!(lock = %self.name(), backend = self.backend(), ?ttl, "distlock renewed");
                Ok(())
            }
            Renewal::NotHeld => {
                self.shared.lose(LostReason::RenewalRefused);
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
    /// # Errors
    /// The backend's error when the release could not be confirmed. The lock still comes free:
    /// the release goes on in the background (retried with back-off; if it keeps failing, the
    /// backend gives up the session that keeps the lock alive, so the server frees it within
    /// its TTL or session timeout).
    ///
    /// # Cancel safety
    /// Dropping this future does not stop the release: it goes on in a background task.
    ///
    /// # Examples
    /// See [`crate::LockClient::acquire`]; dropping the lease instead releases it in the
    /// background.
    pub async fn release(mut self) -> Result<bool> {
        self.done = true;
        if !self.shared.drop_hold() {
            return Ok(self.lost_reason().is_none());
        }
        // Inline (no task hop on the hot path); a cancelled caller leaves it to a task.
        let mut guard = ReleaseGuard(Some(self.shared.clone()));
        // A lost lease that was still on the server is not ours to report as held.
        let held = (self.shared.release_once().await).map(|h| h && self.lost_reason().is_none());
        guard.0 = None;
        if held.is_err() {
            let shared = self.shared.clone();
            self.shared.runtime.spawn(async move {
                shared.release_retrying().await;
            });
        }
        held
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.done && self.shared.drop_hold() {
            // Detached on purpose: Drop cannot wait; the task retries a release that fails.
            self.shared.clone().spawn_release();
        }
    }
}
