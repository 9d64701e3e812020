//! Cancellation: an acquire future dropped at any point leaves nothing held, queued or renewing.

use std::time::Duration;

use distlock_api::{LockClient, LockError, LockName};
use rand::Rng;
use tokio::time::{Instant, sleep, timeout};

use super::{Counting, client, eventually, opts, unique};
use crate::deployment::Deployment;

/// 50 acquires aborted at random delays, half of them racing a release that hands them the lock.
pub async fn cancelled_acquires_leave_nothing(d: &dyn Deployment) {
    let name = unique("cancel");
    let key = LockName::new(name.as_str()).expect("valid");
    let holder = client(d).await;
    let counting = Counting::wrap(d.client().await);
    let waiter = LockClient::new(counting.clone());
    for i in 0..50 {
        // A put the cancelled waiter sent may land just after the check below saw nothing, and
        // is then removed in the background: the lock must come free again, not stay taken.
        let limit = Instant::now() + d.ttl() / 2;
        let held = loop {
            match holder.try_acquire(&name, &opts(d)).await {
                Ok(lease) => break lease,
                Err(LockError::Busy { .. }) if Instant::now() < limit => {
                    sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("round {i}: {e}"),
            }
        };
        let (w, n, o) = (waiter.clone(), name.clone(), opts(d));
        let task = tokio::spawn(async move { w.acquire(&n, &o, Duration::from_secs(30)).await });
        let (before, after) = {
            let mut rng = rand::rng();
            (rng.random_range(0..15u64), rng.random_range(0..5u64))
        };
        sleep(Duration::from_millis(before)).await;
        let release = (i % 2 == 0).then(|| tokio::spawn(held.release()));
        sleep(Duration::from_millis(after)).await;
        task.abort();
        // If the acquire won the race, its lease is dropped with the task and released.
        drop(task.await);
        if let Some(r) = release {
            r.await.expect("release task").expect("release");
        }
        // Promptly, not at a TTL: a cancelled attempt's clean-up runs at once in the background.
        let clean = eventually(d.ttl() / 2, || async { d.artifacts(&key).await == 0 }).await;
        assert!(clean, "round {i}: something was left held or queued");
    }
    let renewals = counting.renewals();
    sleep(d.ttl()).await;
    assert_eq!(
        counting.renewals(),
        renewals,
        "a cancelled acquire left a watchdog renewing"
    );
    let last = waiter
        .try_acquire(&name, &opts(d))
        .await
        .expect("free at the end");
    assert!(last.release().await.expect("release"));
}

/// Acquires whose future is dropped while they leave the queue (their wait ran out at the very
/// moment the caller gave up: `timeout(t, acquire(.., t))`) leave nothing queued: the waiter's
/// entry goes at once, not with its session or liveness.
pub async fn acquires_dropped_while_leaving_the_queue_leave_nothing(d: &dyn Deployment) {
    let name = unique("drop-leaving");
    let key = LockName::new(name.as_str()).expect("valid");
    let holder = client(d).await;
    let held = holder.try_acquire(&name, &opts(d)).await.expect("acquire");
    let waiter = client(d).await;
    for i in 0..12u32 {
        // The caller gives up at the wait's own end, or a little after: its drop lands in the
        // clean-up that the end of the wait starts.
        let wait = Duration::from_millis(300);
        let give_up = wait + Duration::from_micros(u64::from(i % 4) * 500);
        let outcome = tokio::time::timeout(give_up, waiter.acquire(&name, &opts(d), wait)).await;
        assert!(
            !matches!(outcome, Ok(Ok(_))),
            "granted while the lock was held"
        );
    }
    assert!(held.release().await.expect("release"));
    let clean = eventually(d.ttl() / 2, || async { d.artifacts(&key).await == 0 }).await;
    assert!(clean, "a waiter dropped while leaving left its queue entry");
    let last = waiter
        .try_acquire(&name, &opts(d))
        .await
        .expect("free at the end");
    assert!(last.release().await.expect("release"));
}

/// Waits deep in a long queue (20 entries ahead: a backend may follow only the nearest entries
/// there, as etcd's waiters further back than 16 do), timed out or dropped at random points,
/// leave nothing queued, are never granted while the lock is held, and hold up nobody: the
/// queue ahead is granted once the holder lets go.
pub async fn deep_waits_timed_out_or_dropped_leave_nothing(d: &dyn Deployment) {
    const AHEAD: usize = 20;
    let name = unique("deep-cancel");
    let key = LockName::new(name.as_str()).expect("valid");
    let holder = client(d).await;
    let held = holder.try_acquire(&name, &opts(d)).await.expect("acquire");
    let mut ahead = Vec::new();
    for _ in 1..AHEAD {
        let (c, n, o) = (client(d).await, name.clone(), opts(d));
        ahead.push(tokio::spawn(async move {
            let lease = c.acquire(&n, &o, Duration::from_secs(60)).await?;
            lease.release().await
        }));
    }
    sleep(Duration::from_millis(500)).await;
    let before = d.artifacts(&key).await;
    let waiter = client(d).await;
    for i in 0..8u64 {
        // Even rounds are dropped by the caller; odd ones may time out first.
        let wait = if i % 2 == 0 {
            Duration::from_secs(30)
        } else {
            Duration::from_millis(40 * i)
        };
        let (w, n, o) = (waiter.clone(), name.clone(), opts(d));
        let task = tokio::spawn(async move { w.acquire(&n, &o, wait).await });
        let at = rand::rng().random_range(0..300u64);
        sleep(Duration::from_millis(at)).await;
        task.abort();
        let outcome = task.await;
        assert!(
            !matches!(outcome, Ok(Ok(_))),
            "round {i}: a deep wait was granted while the lock was held"
        );
        let clean = eventually(d.ttl() / 2, || async { d.artifacts(&key).await == before }).await;
        assert!(
            clean,
            "round {i}: {} entries after the deep wait ended, {before} before it",
            d.artifacts(&key).await
        );
    }
    assert!(held.release().await.expect("release"));
    for t in ahead {
        let released = timeout(Duration::from_secs(30), t)
            .await
            .expect("the queue ahead was not granted")
            .expect("waiter task")
            .expect("a waiter ahead");
        assert!(released, "a waiter ahead released nothing");
    }
    let clean = eventually(d.ttl() / 2, || async { d.artifacts(&key).await == 0 }).await;
    assert!(clean, "entries were left after every wait ended");
}
