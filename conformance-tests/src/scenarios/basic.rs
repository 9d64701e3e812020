//! Basic contract: exclusion, busy, timeout, independence of names, the naming rule.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use distlock_api::{LockError, LockName, MAX_NAME_BYTES};
use tokio::time::Instant;

use super::{client, opts, unique};
use crate::deployment::Deployment;

/// 32 tasks x 200 cycles (fewer where the deployment says why), each task its own client,
/// running a non-atomic read-modify-write under the lock:
/// the final value is exact and no two tasks were ever inside at once.
pub async fn mutual_exclusion_under_contention(d: &dyn Deployment) {
    let (tasks_n, cycles) = d.contention();
    let name = unique("mutex");
    let value = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..tasks_n {
        let locks = client(d).await;
        let (value, inside, name, o) = (value.clone(), inside.clone(), name.clone(), opts(d));
        tasks.push(tokio::spawn(async move {
            // A retryable failure (a 3-node ZooKeeper on 2 busy cores may drop a connection,
            // which ends the waiter's session epoch) is no grant, so mutual exclusion is not at
            // stake: try again, as a caller would, a few times at most per task.
            let mut retries_left = 3;
            for _ in 0..cycles {
                let lease = loop {
                    match locks.acquire(&name, &o, Duration::from_secs(120)).await {
                        Ok(lease) => break lease,
                        Err(e) if e.is_retryable() && retries_left > 0 => retries_left -= 1,
                        Err(e) => panic!("acquire under contention: {e}"),
                    }
                };
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                let v = value.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                value.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(
                    lease.release().await.expect("release"),
                    "lost the lock mid-cycle"
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(value.load(Ordering::SeqCst), tasks_n * cycles);
}

/// A try-acquire on a held lock fails with `Busy` and leaves no artifact in the backend.
pub async fn try_acquire_on_held_lock_is_busy(d: &dyn Deployment) {
    let name = unique("busy");
    let (a, b) = (client(d).await, client(d).await);
    let lease = a.try_acquire(&name, &opts(d)).await.expect("first acquire");
    match b.try_acquire(&name, &opts(d)).await {
        Err(LockError::Busy { name: n }) => assert_eq!(n, name),
        other => panic!("expected Busy, got {other:?}"),
    }
    let key = LockName::new(name.as_str()).expect("valid");
    assert_eq!(
        d.artifacts(&key).await,
        1,
        "the busy attempt left something behind"
    );
    assert!(lease.release().await.expect("release"));
    assert_eq!(d.artifacts(&key).await, 0);
}

/// A client that took and released a lock twice (so etcd and ZooKeeper would send its next
/// enqueue without the queue read) finds it busy when another client took it right after its
/// release (the very next write), and is granted after that holder's release, with a larger
/// token where tokens are monotonic. Three rounds, so a repeat guess that missed is followed by
/// one that carries the read again.
pub async fn repeat_acquire_waits_for_a_holder_in_between(d: &dyn Deployment) {
    let name = unique("repeat");
    let (a, b) = (client(d).await, client(d).await);
    for round in 0..3 {
        for _ in 0..2 {
            let lease = a.try_acquire(&name, &opts(d)).await.expect("a acquires");
            assert!(lease.release().await.expect("release"));
        }
        let held = b.try_acquire(&name, &opts(d)).await.expect("b acquires");
        match a.try_acquire(&name, &opts(d)).await {
            Err(LockError::Busy { .. }) => {}
            other => panic!("round {round}: `a` must find the lock busy, got {other:?}"),
        }
        let b_token = held.fencing_token();
        assert!(held.release().await.expect("release"));
        let lease = a.try_acquire(&name, &opts(d)).await.expect("a acquires");
        if d.capabilities().fencing.is_monotonic() {
            assert!(
                lease.fencing_token() > b_token,
                "round {round}: token {:?} after {b_token:?}",
                lease.fencing_token()
            );
        }
        assert!(lease.release().await.expect("release"));
    }
}

/// An acquire that cannot get the lock fails with `Timeout` within deadline + margin and leaves
/// nothing queued.
pub async fn acquire_times_out_and_leaves_nothing(d: &dyn Deployment) {
    let name = unique("timeout");
    let (a, b) = (client(d).await, client(d).await);
    let _lease = a.try_acquire(&name, &opts(d)).await.expect("first acquire");
    let wait = Duration::from_millis(500);
    let start = Instant::now();
    match b.acquire(&name, &opts(d), wait).await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(took >= wait, "gave up early: {took:?}");
    assert!(
        took < wait + Duration::from_secs(3),
        "gave up late: {took:?}"
    );
    let key = LockName::new(name.as_str()).expect("valid");
    assert_eq!(
        d.artifacts(&key).await,
        1,
        "the timed-out waiter left something queued"
    );
}

/// Holding one name does not block another.
pub async fn distinct_names_do_not_interfere(d: &dyn Deployment) {
    let (n1, n2) = (unique("distinct-1"), unique("distinct-2"));
    let (a, b) = (client(d).await, client(d).await);
    let l1 = a.try_acquire(&n1, &opts(d)).await.expect("n1");
    let l2 = b
        .try_acquire(&n2, &opts(d))
        .await
        .expect("n2 while n1 is held");
    assert!(l1.release().await.expect("release"));
    assert!(l2.release().await.expect("release"));
}

/// Names with `/`, spaces, unicode and the maximum length behave like any other.
pub async fn unusual_names_work(d: &dyn Deployment) {
    let base = unique("names");
    let long = format!("{base}/{}", "é".repeat(MAX_NAME_BYTES));
    let long: String = long
        .char_indices()
        .take_while(|(i, c)| i + c.len_utf8() <= MAX_NAME_BYTES)
        .map(|(_, c)| c)
        .collect();
    let names = [
        format!("{base}/a/b/c"),
        format!("{base}/with space"),
        format!("{base}/ünïcødé/日本語"),
        format!("{base}/../.."),
        long,
    ];
    let (a, b) = (client(d).await, client(d).await);
    for name in &names {
        let lease = a
            .try_acquire(name, &opts(d))
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        assert!(
            matches!(
                b.try_acquire(name, &opts(d)).await,
                Err(LockError::Busy { .. })
            ),
            "{name:?}"
        );
        // The parent-looking prefix is a different lock.
        let other = b
            .try_acquire(&format!("{name}x"), &opts(d))
            .await
            .expect("sibling name");
        assert!(other.release().await.expect("release"));
        assert!(lease.release().await.expect("release"));
        let again = b.try_acquire(name, &opts(d)).await.expect("free again");
        assert!(again.release().await.expect("release"));
    }
}

/// An invalid name is rejected with a typed error before any I/O (the client is cut off, so
/// reaching the backend would give a backend error instead).
pub async fn invalid_name_is_rejected_before_io(d: &dyn Deployment) {
    let (backend, cut) = d.cuttable_client().await;
    let locks = distlock_api::LockClient::new(backend);
    cut.cut();
    let too_long = "n".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", "nul\0byte", "line\nbreak", too_long.as_str()] {
        match locks.try_acquire(bad, &opts(d)).await {
            Err(LockError::InvalidName { name, .. }) => assert_eq!(name, bad),
            other => panic!("{bad:?}: expected InvalidName, got {other:?}"),
        }
    }
    cut.restore();
}
