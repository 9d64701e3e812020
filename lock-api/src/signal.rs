//! The lost signal: a one-shot broadcast a holder can select on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::LostReason;

/// Fires once, with the reason, as soon as a lease (or a backend session that carries leases) is
/// known or presumed lost. Clones observe the same signal; it can be moved into other tasks.
///
/// Guarantee: for a lease, the signal fires no later than the lease's local validity deadline,
/// which is itself before the server-side expiry: every read ([`LostSignal::get`], and
/// [`crate::Lease::lost_reason`]) checks that deadline itself, so a process resumed after a
/// pause sees the loss before its next action, whether or not the watchdog has run since. It
/// never fires after a release.
#[derive(Debug, Clone)]
pub struct LostSignal {
    shared: Arc<Shared>,
}

/// The firing side of a [`LostSignal`], held by the watchdog or by a backend session.
#[derive(Debug)]
pub struct LostTrigger {
    shared: Arc<Shared>,
}

/// One allocation per lease, and a drop that wakes one `Notify` (a `watch` channel, used before,
/// measured ~1 000 client instructions per lease, most of them in waking its 8 notifier shards).
#[derive(Debug, Default)]
struct Shared {
    reason: OnceLock<LostReason>,
    /// The trigger is gone: nothing can fire any more.
    closed: AtomicBool,
    changed: Notify,
    /// The lease's validity deadline, and the reason to fire with once it passed (`None` for a
    /// backend session's signal, or once released).
    deadline: Mutex<Option<(Instant, LostReason)>>,
}

impl Shared {
    fn deadline(&self) -> Option<(Instant, LostReason)> {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reason, if fired, or if the deadline passed (then fired now).
    fn get(&self) -> Option<LostReason> {
        if let Some(r) = self.reason.get() {
            return Some(*r);
        }
        let (at, reason) = self.deadline()?;
        if Instant::now() < at || self.closed.load(Ordering::Acquire) {
            return None;
        }
        self.fire(reason);
        self.reason.get().copied()
    }

    fn fire(&self, reason: LostReason) -> bool {
        let fired = self.reason.set(reason).is_ok();
        if fired {
            self.changed.notify_waiters();
        }
        fired
    }
}

/// A new signal pair that has not fired.
pub fn lost_signal() -> (LostTrigger, LostSignal) {
    let shared = Arc::new(Shared::default());
    (
        LostTrigger {
            shared: shared.clone(),
        },
        LostSignal { shared },
    )
}

impl LostTrigger {
    /// Fires the signal. Only the first reason is kept; returns whether this call fired it.
    pub fn fire(&self, reason: LostReason) -> bool {
        self.shared.fire(reason)
    }

    /// The reason, if fired (or if the deadline set by [`LostTrigger::set_deadline`] passed).
    pub fn fired(&self) -> Option<LostReason> {
        self.shared.get()
    }

    /// From now on the signal counts as fired with `reason` once `at` has passed, on every read
    /// and for every waiter, even if nobody fires it. A later call moves the deadline (earlier
    /// or later); `None` removes it (a released lease is never reported lost).
    pub fn set_deadline(&self, deadline: Option<(Instant, LostReason)>) {
        *self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = deadline;
        // Waiters sleeping until the old deadline plan again.
        self.shared.changed.notify_waiters();
    }

    /// Another receiver of this signal.
    pub fn subscribe(&self) -> LostSignal {
        LostSignal {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for LostTrigger {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.changed.notify_waiters();
    }
}

impl LostSignal {
    /// Whether `other` observes the same signal (one backend session shared by many leases).
    pub(crate) fn same_as(&self, other: &LostSignal) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Resolves with the reason when the signal fires, or with `None` once its trigger is gone
    /// without firing (nothing can fire it any more).
    pub(crate) async fn fired_or_closed(&self) -> Option<LostReason> {
        loop {
            // Registered before looking, so a fire, a drop or a new deadline in between still
            // wakes it.
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(reason) = self.get() {
                return Some(reason);
            }
            if self.shared.closed.load(Ordering::Acquire) {
                // A fire happens before the drop: look once more.
                return self.shared.reason.get().copied();
            }
            match self.shared.deadline() {
                Some((at, _)) => {
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// The reason, if the signal has fired or its lease's validity deadline has passed.
    pub fn get(&self) -> Option<LostReason> {
        self.shared.get()
    }

    /// Resolves when the signal fires. Pending forever if the trigger is dropped without firing
    /// (the lease was released).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call again to keep waiting.
    pub async fn wait(&self) -> LostReason {
        match self.fired_or_closed().await {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, timeout};

    use super::*;

    #[tokio::test]
    async fn a_fire_wakes_every_waiter_with_the_first_reason() {
        let (trigger, signal) = lost_signal();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let s = trigger.subscribe();
                tokio::spawn(async move { s.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(trigger.fire(LostReason::Expired));
        assert!(!trigger.fire(LostReason::SessionLost), "fires once");
        for w in waiters {
            assert_eq!(w.await.expect("waiter"), LostReason::Expired);
        }
        assert_eq!(signal.get(), Some(LostReason::Expired));
        assert_eq!(trigger.fired(), Some(LostReason::Expired));
        assert!(signal.same_as(&trigger.subscribe()));
        assert!(!signal.same_as(&lost_signal().1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_passed_deadline_counts_as_fired_on_every_read_and_wakes_waiters() {
        let (trigger, signal) = lost_signal();
        let start = Instant::now();
        trigger.set_deadline(Some((start + Duration::from_secs(2), LostReason::Expired)));
        let waiter = tokio::spawn({
            let s = signal.clone();
            async move { (s.wait().await, Instant::now()) }
        });
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(signal.get(), None);
        // A renewal moves it earlier: waiters follow.
        trigger.set_deadline(Some((
            start + Duration::from_millis(1_500),
            LostReason::RenewalFailed,
        )));
        // Nothing fired it, yet a read after the deadline sees it (a process resumed from a
        // pause, before its watchdog ran).
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(signal.get(), Some(LostReason::RenewalFailed));
        let (reason, at) = waiter.await.expect("waiter");
        assert_eq!(reason, LostReason::RenewalFailed);
        assert!(at >= start + Duration::from_millis(1_500));
        // A released lease clears its deadline: never reported lost.
        let (trigger, signal) = lost_signal();
        trigger.set_deadline(Some((Instant::now(), LostReason::Expired)));
        trigger.set_deadline(None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(signal.get(), None);
    }

    #[tokio::test]
    async fn a_trigger_dropped_unfired_closes_the_signal_but_never_fires_it() {
        let (trigger, signal) = lost_signal();
        let closed = tokio::spawn({
            let s = signal.clone();
            async move { s.fired_or_closed().await }
        });
        tokio::task::yield_now().await;
        drop(trigger);
        assert_eq!(closed.await.expect("task"), None);
        assert_eq!(signal.get(), None);
        assert!(
            timeout(Duration::from_millis(50), signal.wait())
                .await
                .is_err(),
            "a released lease is never reported lost"
        );
    }
}
