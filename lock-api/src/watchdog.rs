//! The generic watchdog: one task per client (not per lease) renews every lease that is due in
//! one batched backend call ([`LockBackend::renew_batch`]) and fires lost signals at validity
//! deadlines.
//!
//! Rules:
//! * a lease is renewed every `renew_every` (TTL / 3 by default), measured from the last renewal
//!   *sent*; when one lease is due, every lease due within half its own period joins the same
//!   call, so leases taken close together settle on one call per tick;
//! * a renewal answered "not yours" fires that lease's lost signal at once;
//! * a renewal sets the validity to what the server applied (shorter too) and the next renewal
//!   one period after it was sent; a manual renewal reschedules the lease the same way;
//! * a failed renewal is retried (period / 4) until the validity deadline, where the signal
//!   fires and the lock is released in the background; the backend answers each item by the
//!   earliest deadline of its batch (one hung server of a cluster costs only its own leases),
//!   so a hung server cannot hold a release back;
//! * renewals run in their own task, so deadlines keep firing on time while a call hangs;
//! * release removes the lease before it touches the backend, and waits for a renewal already in
//!   flight (the lease's renew gate), so no renewal follows a release;
//! * the task runs on the runtime of the lease that started it; if that runtime shuts down while
//!   leases of other runtimes are watched, it moves to one of theirs (a batch cut off with it is
//!   due again at once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::{GrantKey, LockBackend, Renewal};
use crate::error::LockError;
use crate::lease::{LeaseShared, Renewer};
use crate::signal::LostSignal;

/// The shortest pause between two failed renewal attempts.
const MIN_RETRY: Duration = Duration::from_millis(10);
/// How long past its cutoff a renewal batch may run before the watchdog stops waiting for it
/// (a backend answers by the cutoff itself; this only bounds one that does not).
const CUTOFF_GRACE: Duration = Duration::from_millis(500);

/// The renewal and deadline scheduler of one [`crate::LockClient`] (shared by its clones).
pub(crate) struct Watchdog {
    backend: Arc<dyn LockBackend>,
    members: Mutex<Members>,
    /// Wakes the task when a lease needs it earlier than it planned, or when a batch ends.
    wake: Arc<Notify>,
    /// How many times the task planned (each a wake-up on some thread); shown by `Debug`.
    ticks: AtomicU64,
}

#[derive(Default)]
struct Members {
    next_id: u64,
    map: HashMap<u64, Member>,
    task: Option<JoinHandle<()>>,
    /// When the task will wake by itself (`None`: only when notified).
    sleeping_until: Option<Instant>,
    /// Backend sessions (etcd lease, ZooKeeper session) with a task waiting for their loss: one
    /// task per session, not per lease.
    sessions: Vec<LostSignal>,
}

struct Member {
    lease: Weak<LeaseShared>,
    /// The next renewal; `None` for a fixed lease.
    due: Option<Instant>,
    /// The deadline last seen; the lease's own state is the truth (a manual renewal moves it).
    deadline: Instant,
    in_flight: bool,
    /// The backend session the lease lives on, whose loss is the lease's loss.
    session: Option<LostSignal>,
}

impl Member {
    fn next_wake(&self) -> Instant {
        match self.due {
            Some(due) if !self.in_flight => due.min(self.deadline),
            _ => self.deadline,
        }
    }
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("leases", &self.members().map.len())
            .field("ticks", &self.ticks.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // The task holds only a weak reference: wake it so it sees the client is gone.
        self.wake.notify_one();
    }
}

impl Watchdog {
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Watchdog {
            backend,
            members: Mutex::new(Members::default()),
            wake: Arc::new(Notify::new()),
            ticks: AtomicU64::new(0),
        })
    }

    fn members(&self) -> MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh member id, taken before the lease exists so the lease can carry it.
    pub(crate) fn next_id(&self) -> u64 {
        let mut m = self.members();
        m.next_id += 1;
        m.next_id
    }

    /// Starts watching `lease`, granted `first` from `sent_at`: its first renewal is due one
    /// period after `sent_at`, or halfway through the first validity window when that is shorter
    /// (a grant given less than the lease's TTL, [`crate::Grant::first_ttl`]); the loss of
    /// `session` (if the lease lives on one) fires the lease's lost signal.
    pub(crate) fn join(
        self: &Arc<Self>,
        id: u64,
        lease: &Arc<LeaseShared>,
        (sent_at, first): (Instant, Duration),
        session: Option<LostSignal>,
    ) {
        let (deadline, ttl) = {
            let st = lease.state();
            (st.deadline, st.ttl)
        };
        let first_period = |p: Duration| {
            if first < ttl {
                p.min(lease.margins.window(first) / 2)
            } else {
                p
            }
        };
        let member = Member {
            lease: Arc::downgrade(lease),
            due: lease.renew_period(ttl).map(|p| sent_at + first_period(p)),
            deadline,
            in_flight: false,
            session: session.clone(),
        };
        let wake_at = member.next_wake();
        let mut m = self.members();
        let unwatched = session.filter(|s| !m.sessions.iter().any(|w| w.same_as(s)));
        if let Some(s) = &unwatched {
            m.sessions.push(s.clone());
            lease
                .runtime
                .spawn(watch_session(Arc::downgrade(self), s.clone()));
        }
        m.map.insert(id, member);
        // First lease, or the runtime that ran the task is gone: run it on this lease's.
        let start = m.task.as_ref().is_none_or(JoinHandle::is_finished);
        if m.sleeping_until.is_none_or(|t| wake_at < t) {
            m.sleeping_until = Some(wake_at);
            self.wake.notify_one();
        }
        drop(m);
        if start {
            let task = spawn_task(self, &lease.runtime, Vec::new());
            self.members().task = Some(task);
        }
    }

    /// Fires the deadlines that passed, starts the renewals that are due, and says when to wake
    /// next.
    fn tick(self: &Arc<Self>) -> Option<Instant> {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut lost = Vec::new();
        let mut batch = Vec::new();
        let mut any_due = false;
        let mut m = self.members();
        m.map.retain(|id, member| {
            let Some(lease) = member.lease.upgrade() else {
                return false;
            };
            // Fired elsewhere (a session, or a read past the deadline): handled once there.
            if lease.lost.fired().is_some() {
                lost.push(lease);
                return false;
            }
            if member.deadline <= now {
                member.deadline = lease.state().deadline;
                if member.deadline <= now {
                    lost.push(lease);
                    return false;
                }
            }
            if let Some(due) = member.due
                && !member.in_flight
            {
                let period = lease.renew_period(lease.state().ttl).unwrap_or_default();
                any_due |= due <= now;
                if due <= now + period / 2 {
                    batch.push((*id, lease));
                }
            }
            true
        });
        if !any_due {
            batch.clear();
        }
        for (id, _) in &batch {
            if let Some(member) = m.map.get_mut(id) {
                member.in_flight = true;
            }
        }
        // With no lease left, the wake-up planned for the last one stands (while still ahead)
        // rather than sleeping until notified: else a loop of short leases notifies this task
        // (on another thread) at every join that follows a tick, i.e. for many of its leases.
        let next = m
            .map
            .values()
            .map(Member::next_wake)
            .min()
            .or(m.sleeping_until.filter(|t| *t > now));
        m.sleeping_until = next;
        drop(m);
        for lease in lost {
            lease.lose(lease.deadline_reason());
        }
        if !batch.is_empty() {
            tokio::spawn(renew(self.clone(), batch));
        }
        next
    }

    /// Records the outcome of a batch for one member and lets the task plan again.
    fn settle(&self, outcomes: Vec<(u64, Option<Instant>, Instant)>) {
        let mut m = self.members();
        for (id, due, deadline) in outcomes {
            if let Some(member) = m.map.get_mut(&id) {
                member.in_flight = false;
                member.due = due;
                member.deadline = deadline;
            }
        }
        m.sleeping_until = None;
        drop(m);
        self.wake.notify_one();
    }
}

impl Renewer for Watchdog {
    /// Stops watching a lease (released): it is never renewed again.
    fn leave(&self, id: u64) {
        self.members().map.remove(&id);
    }

    /// A manual renewal moved a lease's next renewal and deadline (earlier, too): plan again.
    fn reschedule(&self, id: u64, due: Option<Instant>, deadline: Instant) {
        let mut m = self.members();
        let Some(member) = m.map.get_mut(&id) else {
            return;
        };
        member.due = due;
        member.deadline = deadline;
        let wake_at = member.next_wake();
        if m.sleeping_until.is_none_or(|t| wake_at < t) {
            m.sleeping_until = Some(wake_at);
            drop(m);
            self.wake.notify_one();
        }
    }
}

/// The task: ticks while the client lives.
/// Starts the watchdog task on `runtime`. If that runtime shuts down while leases of other
/// runtimes are still watched, the task moves to one of theirs ([`Rescue`]): else those leases
/// would go unrenewed (and be lost at their deadline) until the next acquire. `dead`: the
/// runtimes already seen shutting down. Call it without holding the members' lock: a spawn on a
/// runtime that is shutting down drops the task at once, and its rescue takes that lock.
fn spawn_task(
    watchdog: &Arc<Watchdog>,
    runtime: &Handle,
    dead: Vec<tokio::runtime::Id>,
) -> JoinHandle<()> {
    let rescue = Rescue {
        watchdog: Arc::downgrade(watchdog),
        runtime: runtime.id(),
        dead,
        done: false,
    };
    runtime.spawn(run(Arc::downgrade(watchdog), watchdog.wake.clone(), rescue))
}

/// Owned by the running task: dropped before the task returned (its runtime shut down, or it
/// was aborted), it restarts the task on the runtime of a lease still watched.
struct Rescue {
    watchdog: Weak<Watchdog>,
    runtime: tokio::runtime::Id,
    dead: Vec<tokio::runtime::Id>,
    done: bool,
}

impl Drop for Rescue {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let Some(w) = self.watchdog.upgrade() else {
            return;
        };
        let mut dead = std::mem::take(&mut self.dead);
        dead.push(self.runtime);
        let target = w
            .members()
            .map
            .values()
            .filter_map(|member| member.lease.upgrade())
            .map(|lease| lease.runtime.clone())
            .find(|rt| !dead.contains(&rt.id()));
        let Some(rt) = target else {
            return;
        };
        let task = spawn_task(&w, &rt, dead);
        w.members().task = Some(task);
        w.wake.notify_one();
    }
}

async fn run(watchdog: Weak<Watchdog>, wake: Arc<Notify>, mut rescue: Rescue) {
    loop {
        let next = match watchdog.upgrade() {
            Some(w) => w.tick(),
            None => {
                rescue.done = true;
                return;
            }
        };
        match next {
            Some(at) => {
                tokio::select! {
                    _ = sleep_until(at) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Marks a batch's leases in flight until it settles; dropped unsettled (its runtime shut down
/// mid-call), it makes them due again at once, so the task (moved to a live runtime) renews them.
struct InFlight {
    watchdog: Arc<Watchdog>,
    ids: Vec<u64>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut m = self.watchdog.members();
        for id in &self.ids {
            if let Some(member) = m.map.get_mut(id) {
                member.in_flight = false;
                member.due = member.due.map(|_| now);
            }
        }
        m.sleeping_until = None;
        drop(m);
        self.watchdog.wake.notify_one();
    }
}

/// Renews one batch in one backend call.
async fn renew(watchdog: Arc<Watchdog>, batch: Vec<(u64, Arc<LeaseShared>)>) {
    let mut flight = InFlight {
        watchdog: watchdog.clone(),
        ids: batch.iter().map(|(id, _)| *id).collect(),
    };
    // Leases being released or renewed by hand are skipped; their gate is busy.
    let mut gates = Vec::with_capacity(batch.len());
    let mut live = Vec::with_capacity(batch.len());
    let mut outcomes = Vec::with_capacity(batch.len());
    for (id, lease) in &batch {
        // Gate first, then look: a release that finished before the gate was taken is seen.
        let gate = lease.renew_gate.try_lock();
        let st = lease.state();
        let (ttl, deadline, released) = (st.ttl, st.deadline, st.released);
        drop(st);
        match gate {
            Ok(gate) if !released => {
                gates.push(gate);
                live.push((*id, lease, ttl, deadline));
            }
            _ => outcomes.push((*id, Some(Instant::now() + MIN_RETRY), deadline)),
        }
    }
    if !live.is_empty() {
        let items: Vec<(&GrantKey, Duration)> =
            live.iter().map(|(_, l, ttl, _)| (&l.key, *ttl)).collect();
        let cutoff = live
            .iter()
            .map(|(.., d)| *d)
            .min()
            .unwrap_or_else(Instant::now);
        let sent = Instant::now();
        // The backend answers each item by the cutoff itself (keeping what other servers
        // answered); the outer limit only bounds one that does not.
        let results = timeout_at(
            cutoff + CUTOFF_GRACE,
            watchdog.backend.renew_batch(&items, cutoff),
        )
        .await
        .unwrap_or_else(|_| Vec::new());
        let mut failed: Vec<&str> = Vec::new();
        let mut first_error: Option<LockError> = None;
        let mut results = results.into_iter();
        for (id, lease, ttl, deadline) in live {
            let period = lease.renew_period(ttl).unwrap_or(ttl / 3);
            let result = results.next();
            let outcome = match &result {
                Some(Ok(Renewal::Renewed { .. })) => "renewed",
                Some(Ok(Renewal::NotHeld)) => "refused",
                _ => "failed",
            };
            crate::metrics::renewal(lease.backend.kind(), outcome);
            match result {
                Some(Ok(Renewal::Renewed { ttl })) => {
                    let deadline = lease.extend(sent, ttl);
                    let period = lease.renew_period(ttl).unwrap_or(ttl / 3);
                    outcomes.push((id, Some(sent + period), deadline));
                }
                Some(Ok(Renewal::NotHeld)) => {
                    lease.lose(crate::LostReason::RenewalRefused);
                    outcomes.push((id, None, deadline));
                }
                other => {
                    failed.push(lease.key.name.as_str());
                    if let Some(Err(e)) = other {
                        first_error.get_or_insert(e);
                    }
                    let retry = Instant::now() + (period / 4).max(MIN_RETRY);
                    outcomes.push((id, Some(retry), deadline));
                }
            }
        }
        if !failed.is_empty() {
            let error =
                first_error.map_or_else(|| "no answer in time".to_string(), |e| e.to_string());
            // The locks it was about, the first few by name.
            let mut locks = failed
                .iter()
                .take(4)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            if failed.len() > 4 {
                locks.push_str(&format!(" and {} more", failed.len() - 4));
            }
            tracing::warn!(backend = watchdog.backend.kind(), failed = failed.len(), %locks, %error, "distlock renewal failed, retrying");
        }
    }
    drop(gates);
    flight.ids.clear();
    watchdog.settle(outcomes);
}

/// Waits for one backend session's loss, then fires the lost signal of every lease still on it.
/// Ends when the session can no longer fire or the client is gone.
async fn watch_session(watchdog: Weak<Watchdog>, session: LostSignal) {
    let reason = session.fired_or_closed().await;
    let Some(w) = watchdog.upgrade() else { return };
    let mut m = w.members();
    m.sessions.retain(|s| !s.same_as(&session));
    let Some(reason) = reason else { return };
    let hit: Vec<Arc<LeaseShared>> = m
        .map
        .values()
        .filter(|member| member.session.as_ref().is_some_and(|s| s.same_as(&session)))
        .filter_map(|member| member.lease.upgrade())
        .collect();
    drop(m);
    for lease in hit {
        lease.lose(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use crate::{AcquireOptions, LockClient};

    #[tokio::test]
    async fn a_loop_of_short_leases_does_not_wake_the_task_for_each() {
        let client = LockClient::new(Arc::new(MemoryStore::new().client()));
        let opts = AcquireOptions::with_ttl(Duration::from_secs(30));
        for _ in 0..50 {
            let lease = client.try_acquire("loop", &opts).await.expect("acquire");
            assert!(lease.release().await.expect("release"));
            // The task runs between two leases, as it does on another thread.
            tokio::task::yield_now().await;
        }
        // Its first run, and the wake-up the first lease asked for: then it sleeps until that
        // lease's renewal time, which every later lease's is after. (Sleeping until notified
        // once the map was empty ticked once per lease: 51.)
        let ticks = client.watchdog().ticks.load(Ordering::Relaxed);
        assert!(ticks <= 3, "{ticks} ticks for 50 leases");
    }

    /// One client used from two runtimes: the task starts on the first lease's runtime; when
    /// that runtime shuts down, the lease of the other one is still renewed (it moved there).
    /// Without the move it went unrenewed and was lost at its deadline.
    #[test]
    fn the_task_moves_when_its_runtime_shuts_down() {
        let runtime = || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime")
        };
        let (first, second) = (runtime(), runtime());
        let store = MemoryStore::new();
        let client = LockClient::new(Arc::new(store.client()));
        let opts = AcquireOptions::with_ttl(Duration::from_millis(300));
        let on_first = first
            .block_on(client.try_acquire("first", &opts))
            .expect("acquire on the first runtime");
        let on_second = second
            .block_on(client.try_acquire("second", &opts))
            .expect("acquire on the second runtime");
        std::mem::forget(on_first);
        first.shutdown_timeout(Duration::from_secs(1));
        second.block_on(async {
            // Five TTLs: only renewals keep the lease.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            assert_eq!(
                on_second.lost_reason(),
                None,
                "the second runtime's lease was lost"
            );
            let name = crate::LockName::new("second").expect("name");
            assert!(store.holder_remaining(&name).is_some());
            assert!(on_second.release().await.expect("release"));
        });
    }
}
