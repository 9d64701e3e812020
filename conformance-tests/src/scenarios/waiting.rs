//! Waiting: prompt wake-up on release, waiters whose session dies, FIFO order, waiters that give
//! up mid-queue.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{AcquireOptions, LockClient, LockError, LockName};
use tokio::time::{Instant, sleep};

use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;

/// A waiter is granted right after the release (by notification), long before the holder's TTL
/// would have run out or any slow poll would come round.
pub async fn waiter_wakes_promptly_after_release(d: &dyn Deployment) {
    let name = unique("prompt");
    let ttl = d.ttl() * 10;
    let (a, b) = (client(d).await, client(d).await);
    let held = a
        .try_acquire(&name, &AcquireOptions::with_ttl(ttl))
        .await
        .expect("acquire");
    let n = name.clone();
    let waiter = tokio::spawn(async move {
        let l = b
            .acquire(&n, &AcquireOptions::with_ttl(ttl), ttl * 2)
            .await
            .expect("waiter");
        (Instant::now(), l)
    });
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(held.release().await.expect("release"));
    let (granted, lease) = waiter.await.expect("waiter task");
    let gap = granted - released;
    assert!(
        gap < ttl / 4,
        "hand-over took {gap:?}: the waiter polled or waited for the TTL"
    );
    assert!(lease.release().await.expect("release"));
}

/// A waiter that waited longer than the TTL (its session, where it has one, counted from its
/// enqueue long ago) gets a lease that is alive: not already lost, with most of a validity
/// window left, and renewable.
pub async fn a_waiter_that_waited_past_the_ttl_gets_a_live_lease(d: &dyn Deployment) {
    let name = unique("long-wait");
    let (a, b) = (client(d).await, client(d).await);
    let held = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let (n, o, ttl) = (name.clone(), opts(d), d.ttl());
    let waiter = tokio::spawn(async move { b.acquire(&n, &o, ttl * 6).await });
    sleep(ttl * 3 / 2).await;
    assert!(held.release().await.expect("release"));
    let lease = waiter.await.expect("waiter").expect("the waiter's acquire");
    assert_eq!(
        lease.lost_reason(),
        None,
        "granted a lease that was already lost"
    );
    let window = opts(d).window(lease.ttl());
    assert!(
        lease.remaining() >= window / 2,
        "granted with {:?} left of a {window:?} window",
        lease.remaining()
    );
    lease.renew(d.ttl()).await.expect("renew");
    assert!(lease.release().await.expect("release"));
}

/// A waiter whose own client/session dies while it waits (cut off past its TTL) never holds
/// through the dead session, and its dead entry goes away. It either fails, or rides the cut out
/// (etcd queues again on a new session once the server is reachable): then it is granted once
/// the holder lets go, within its deadline.
pub async fn a_waiter_whose_session_dies_holds_nothing_through_it(d: &dyn Deployment) {
    let name = unique("waiter-dies");
    let key = LockName::new(name.as_str()).expect("valid");
    let a = client(d).await;
    let held = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let (backend, cut) = d.cuttable_client().await;
    let b = LockClient::new(backend);
    let n = name.clone();
    let o = opts(d);
    let ttl = d.ttl();
    let waiter = tokio::spawn(async move { b.acquire(&n, &o, ttl * 20).await });
    sleep(Duration::from_millis(300)).await;
    cut.cut();
    sleep(ttl * 2 + d.expiry_slack()).await;
    assert!(
        eventually(ttl * 2 + d.expiry_slack(), || async {
            d.artifacts(&key).await == 1
        })
        .await,
        "the cut-off waiter's entry outlived its session: {} entries",
        d.artifacts(&key).await
    );
    let pending = if waiter.is_finished() {
        let outcome = waiter.await.expect("waiter task");
        assert!(
            outcome.is_err(),
            "a waiter with a dead session got the lock: {outcome:?}"
        );
        None
    } else {
        Some(waiter)
    };
    cut.reset();
    assert!(held.release().await.expect("release"));
    if let Some(waiter) = pending {
        let granted = tokio::time::timeout(ttl * 6 + d.expiry_slack(), waiter)
            .await
            .expect("the waiter that rode out the cut hung")
            .expect("waiter task")
            .expect("the waiter that rode out the cut is granted");
        assert!(granted.release().await.expect("release"));
    }
    assert!(
        eventually(ttl * 2 + d.expiry_slack(), || async {
            d.artifacts(&key).await == 0
        })
        .await,
        "the dead waiter left its queue entry"
    );
}

/// With FIFO declared, 50 waiters are granted in arrival order.
pub async fn waiters_are_granted_in_arrival_order(d: &dyn Deployment) {
    const WAITERS: usize = 50;
    let name = unique("fifo");
    let key = LockName::new(name.as_str()).expect("valid");
    let holder = client(d).await;
    let held = holder.try_acquire(&name, &opts(d)).await.expect("acquire");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let c = client(d).await;
        let (n, o, order) = (name.clone(), opts(d), order.clone());
        tasks.push(tokio::spawn(async move {
            let l = c
                .acquire(&n, &o, Duration::from_secs(120))
                .await
                .expect("waiter");
            order.lock().unwrap_or_else(|p| p.into_inner()).push(i);
            assert!(l.release().await.expect("release"));
        }));
        // The next waiter arrives only once this one is queued in the backend.
        let queued = eventually(Duration::from_secs(10), || async {
            d.artifacts(&key).await >= i + 2
        })
        .await;
        assert!(queued, "waiter {i} never showed up in the backend's queue");
    }
    assert!(held.release().await.expect("release"));
    for t in tasks {
        t.await.expect("waiter task");
    }
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "grants out of arrival order"
    );
}

/// Waiters that give up mid-queue (six of 24, by timeout, while the lock is held) do not hold
/// up the ones behind them: after the release every other waiter is granted, in arrival order
/// where FIFO is declared, long before any of them would time out. Three give up near the head
/// and three 20 back, the two right ahead of a waiter among them (a backend may follow only the
/// nearest keys of a long queue: etcd's waiters further back than 16).
pub async fn waiters_behind_ones_that_gave_up_are_granted(d: &dyn Deployment) {
    const WAITERS: usize = 24;
    const GIVE_UP: [usize; 6] = [1, 2, 4, 19, 20, 22];
    let name = unique("gave-up");
    let key = LockName::new(name.as_str()).expect("valid");
    let fifo = d.client().await.capabilities().fifo;
    let holder = client(d).await;
    let held = holder.try_acquire(&name, &opts(d)).await.expect("acquire");
    let order = Arc::new(Mutex::new(Vec::new()));
    let (mut quitters, mut stayers) = (Vec::new(), Vec::new());
    for i in 0..WAITERS {
        let c = client(d).await;
        let (n, o, order) = (name.clone(), opts(d), order.clone());
        let quits = GIVE_UP.contains(&i);
        let wait = Duration::from_secs(if quits { 3 } else { 60 });
        let task = tokio::spawn(async move {
            let lease = c.acquire(&n, &o, wait).await?;
            order.lock().unwrap_or_else(|p| p.into_inner()).push(i);
            lease.release().await.map(|_| ())
        });
        if quits {
            quitters.push(task);
        } else {
            stayers.push(task);
        }
        if fifo {
            // The next waiter arrives only once this one is queued in the backend.
            let queued = eventually(Duration::from_secs(10), || async {
                d.artifacts(&key).await >= i + 2
            })
            .await;
            assert!(queued, "waiter {i} never showed up in the backend's queue");
        } else {
            sleep(Duration::from_millis(100)).await;
        }
    }
    for t in quitters {
        let outcome = t.await.expect("waiter task");
        assert!(
            matches!(outcome, Err(LockError::Timeout { .. })),
            "a waiter meant to give up got {outcome:?}"
        );
    }
    assert!(held.release().await.expect("release"));
    let released = Instant::now();
    for t in stayers {
        t.await
            .expect("waiter task")
            .expect("waiter behind the quitters");
    }
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the waiters behind the quitters took {took:?} after the release"
    );
    let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut expected: Vec<usize> = (0..WAITERS).filter(|i| !GIVE_UP.contains(i)).collect();
    if !fifo {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, expected, "not every waiter was granted once");
        expected = order.clone();
    }
    assert_eq!(order, expected, "grants out of arrival order");
}
