//! Releases cut by connection faults: whatever fails, a released or dropped lease comes free,
//! within one reconnect or at worst the backend's TTL or session timeout.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Lease, LockBackend, LockClient, LockError};
use tokio::time::{Instant, sleep};

use super::{client, opts, unique};
use crate::deployment::{Cut, Deployment};

/// Gives the lease up the way `drop_it` says: `release()` (whatever it answers) or a drop.
fn give_up(lease: Lease, drop_it: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if drop_it {
            drop(lease);
        } else {
            // Ok or Err: the promise holds either way.
            let _ = lease.release().await;
        }
    })
}

/// Competitor `b` waits for `name` up to `bound` after `since`; returns how long it took.
async fn competitor_gets(
    d: &dyn Deployment,
    b: &LockClient,
    name: &str,
    since: Instant,
    bound: Duration,
) -> Duration {
    let until = since + bound + Duration::from_secs(2);
    // Retryable failures (a leader election in progress) are tried again, as a caller would.
    let won = loop {
        match b.acquire_until(name, &opts(d), until).await {
            Ok(l) => break l,
            Err(e) if e.is_retryable() && Instant::now() < until => {
                sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the lock never came free: {e}"),
        }
    };
    let took = since.elapsed();
    assert!(won.release().await.expect("release"));
    took
}

/// A cuttable client holding `name`.
async fn holder(d: &dyn Deployment, name: &str) -> (Lease, Box<dyn Cut>, Arc<dyn LockBackend>) {
    let (backend, cut) = d.cuttable_client().await;
    let lease = LockClient::new(backend.clone())
        .try_acquire(name, &opts(d))
        .await
        .expect("acquire");
    (lease, cut, backend)
}

/// The holder's connections are blackholed, the lease is released (or dropped), and 300 ms
/// later every connection is reset and traffic flows again: the lock is free soon after the
/// reconnect, not held for as long as the holder's client lives (its session is kept alive).
pub async fn a_release_cut_by_a_reset_comes_free_after_the_reconnect(d: &dyn Deployment) {
    for drop_it in [false, true] {
        let name = unique("release-reset");
        let (lease, cut, _client) = holder(d, &name).await;
        let b = client(d).await;
        cut.cut();
        let since = Instant::now();
        let gone = give_up(lease, drop_it);
        sleep(Duration::from_millis(300)).await;
        cut.reset();
        let bound = d.ttl() + d.expiry_slack();
        let took = competitor_gets(d, &b, &name, since, bound).await;
        assert!(
            took <= bound,
            "drop: {drop_it}; free after {took:?}, bound {bound:?}"
        );
        gone.await.expect("release task");
    }
}

/// The holder's connections are blackholed for good while the lease is released (or
/// dropped): the lock is free within the TTL (the client can neither delete it nor keep it
/// alive).
pub async fn a_release_cut_by_a_blackhole_comes_free_within_the_ttl(d: &dyn Deployment) {
    for drop_it in [false, true] {
        let name = unique("release-blackhole");
        let (lease, cut, _client) = holder(d, &name).await;
        let b = client(d).await;
        cut.cut();
        let since = Instant::now();
        let gone = give_up(lease, drop_it);
        let bound = d.ttl() + d.expiry_slack() + Duration::from_secs(1);
        let took = competitor_gets(d, &b, &name, since, bound).await;
        assert!(
            took <= bound,
            "drop: {drop_it}; free after {took:?}, bound {bound:?}"
        );
        cut.restore();
        gone.await.expect("release task");
    }
}

/// A server of the deployment is killed (etcd's and ZooKeeper's leader) right before the lease
/// is released (or dropped): the lock is free within the TTL plus an election, not held.
pub async fn a_release_cut_by_a_member_kill_comes_free(d: &dyn Deployment) {
    let servers = d.servers().expect("gated on server faults");
    let victim = servers.leader().unwrap_or(0);
    for drop_it in [false, true] {
        let name = unique("release-kill");
        // Both clients connect before the kill (Redlock connects to every node at start).
        let (a, b) = (client(d).await, client(d).await);
        let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
        servers.processes()[victim].kill();
        let since = Instant::now();
        let gone = give_up(lease, drop_it);
        let bound = d.ttl() * 2 + d.expiry_slack() + Duration::from_secs(3);
        let took = competitor_gets(d, &b, &name, since, bound).await;
        assert!(
            took <= bound,
            "drop: {drop_it}; free after {took:?}, bound {bound:?}"
        );
        gone.await.expect("release task");
        let p = servers.processes()[victim];
        tokio::task::block_in_place(|| p.restart()).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A holder cut off for longer than its TTL (its session expired meanwhile, as after a long
/// process pause), then reconnected: its release answers "not held", not an error.
pub async fn a_release_after_a_cut_longer_than_the_ttl_reports_not_held(d: &dyn Deployment) {
    let name = unique("release-late");
    let (lease, cut, _client) = holder(d, &name).await;
    let b = client(d).await;
    cut.cut();
    lease.lost().await;
    // The server freed it: someone else took it and let it go again.
    let bound = d.ttl() * 2 + d.expiry_slack();
    competitor_gets(d, &b, &name, Instant::now(), bound).await;
    cut.reset();
    match lease.release().await {
        Ok(held) => assert!(!held, "released a lock the server had freed"),
        Err(e @ LockError::Backend { .. }) => panic!("an expired lease's release failed: {e}"),
        Err(e) => panic!("{e}"),
    }
}
