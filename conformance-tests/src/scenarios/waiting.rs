//! Waiting: prompt wake-up on release, waiters whose session dies, FIFO order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{AcquireOptions, LockClient, LockName};
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

/// A waiter whose own client/session dies while it waits gets an error, not the lock, and its
/// queue entry goes away.
pub async fn waiter_whose_session_dies_gets_an_error(d: &dyn Deployment) {
    let name = unique("waiter-dies");
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
    let outcome = tokio::time::timeout(ttl * 4 + d.expiry_slack() * 2, waiter)
        .await
        .expect("the waiter hung after its session died")
        .expect("waiter task");
    assert!(
        outcome.is_err(),
        "a waiter with a dead session got the lock: {outcome:?}"
    );
    cut.restore();
    assert!(held.release().await.expect("release"));
    let key = LockName::new(name.as_str()).expect("valid");
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
