//! The lost signal fires before anybody else can hold the lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{LockClient, LockError, LostReason};
use tokio::time::{Instant, sleep};

use super::{client, opts, unique};
use crate::deployment::Deployment;

/// Keeps both cores busy until dropped: timers run late on a loaded machine, and the lost
/// signal's lead must survive that.
struct Load(Arc<AtomicBool>);

impl Load {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..2 {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        Load(stop)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The holder is cut off from the servers, on a machine kept busy: its lost signal fires before
/// a competitor acquires, by at least half the lead the options promise (10 % of the TTL), so
/// the application has real time to stop.
pub async fn lost_signal_fires_before_a_competitor_acquires(d: &dyn Deployment) {
    let name = unique("lost-signal");
    let (backend, cut) = d.cuttable_client().await;
    let a = LockClient::new(backend);
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let lead = opts(d).lead_for(lease.ttl());
    let _load = Load::start();
    let fired = Arc::new(Mutex::new(None));
    let signal = lease.lost_signal();
    let f = fired.clone();
    let watcher = tokio::spawn(async move {
        let reason = signal.wait().await;
        *f.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        reason
    });
    cut.cut();
    let b = client(d).await;
    let give_up = Instant::now() + d.ttl() * 4 + d.expiry_slack();
    let won = loop {
        match b.try_acquire(&name, &opts(d)).await {
            Ok(l) => break l,
            Err(LockError::Busy { .. }) if Instant::now() < give_up => {
                sleep(Duration::from_millis(10)).await
            }
            other => panic!("competitor: {other:?}"),
        }
    };
    let won_at = Instant::now();
    let fired_at = fired
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .expect("the lost signal had not fired when the competitor acquired");
    assert!(
        fired_at + lead / 2 <= won_at,
        "lost signal {:?} before the competitor's grant, lead {lead:?}",
        won_at.saturating_duration_since(fired_at)
    );
    watcher.await.expect("watcher");
    assert!(lease.remaining().is_zero());
    cut.restore();
    assert!(won.release().await.expect("release"));
}

/// The lock is deleted on the server behind the holder's back (an operator, a flush): the next
/// watchdog renewal finds it gone and fires the lost signal as "refused", well before the
/// lease's own deadline would have.
pub async fn lock_deleted_behind_the_holder_is_reported_lost(d: &dyn Deployment) {
    let name = unique("deleted");
    let a = client(d).await;
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let deadline = lease.valid_until();
    d.delete_lock(&distlock_api::LockName::new(name.as_str()).expect("valid"))
        .await;
    let reason = tokio::time::timeout(d.ttl(), lease.lost())
        .await
        .expect("the lost signal fired");
    assert_eq!(reason, LostReason::RenewalRefused);
    assert!(
        Instant::now() < deadline,
        "found at a renewal, not at the deadline"
    );
    // Release of a lost lease reports it was not held, and touches nothing.
    assert!(!lease.release().await.expect("release"));
}

/// The holder's link is cut until its lost signal fires, then healed at once (connections reset,
/// so a request sent from then on goes through), while the holder goes on working and keeps its
/// lease: a competitor already waiting on another connection is not granted before the TTL the
/// server applied last has run out. The lead is the holder's time to stop; the library never
/// hands the lock on behind its back by releasing a lost lease the holder still has. The lock
/// still comes free without the holder (its TTL, or its session's).
pub async fn a_lost_lease_is_not_handed_on_behind_its_holder(d: &dyn Deployment) {
    let name = unique("lost-kept");
    let (backend, cut) = d.cuttable_client().await;
    let a = LockClient::new(backend);
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let lead = opts(d).lead_for(lease.ttl());
    let b = client(d).await;
    let (n, o) = (name.clone(), opts(d));
    let wait = d.ttl() * 6 + d.expiry_slack();
    let waiter = tokio::spawn(async move {
        let got = b.acquire(&n, &o, wait).await;
        (Instant::now(), got)
    });
    sleep(Duration::from_millis(100)).await;
    cut.cut();
    // No renewal answered from here on: the server's expiry is at least the lead (and the drift
    // allowance) after this validity deadline.
    sleep(Duration::from_millis(50)).await;
    let valid_until = lease.valid_until();
    tokio::time::timeout(d.ttl() * 2, lease.lost())
        .await
        .expect("the lost signal fired");
    cut.reset();
    let (granted_at, won) = waiter.await.expect("waiter task");
    let won = won.expect("the competitor is granted once the TTL ran out");
    assert!(
        granted_at >= valid_until + lead * 3 / 4,
        "the competitor was granted {:?} after the holder's deadline, inside the lead {lead:?}: \
         the lost lease was handed on while its holder still had it",
        granted_at.saturating_duration_since(valid_until)
    );
    assert!(lease.lost_reason().is_some());
    // The holder lets go late: nothing of the new holder's is touched.
    assert!(!lease.release().await.expect("release"));
    assert!(won.release().await.expect("release"));
}
