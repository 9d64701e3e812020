//! Liveness: dead holders free the lock, the watchdog keeps live ones, release stops it.

use std::time::Duration;

use distlock_api::{LockClient, LockError, LockName};
use tokio::time::{Instant, sleep};

use super::{Counting, client, eventually, opts, unique};
use crate::deployment::Deployment;

/// A holder that never renews (a killed process) frees the lock within TTL + the backend's slack.
pub async fn dead_holder_is_freed_after_ttl(d: &dyn Deployment) {
    let name = LockName::new(unique("dead-holder")).expect("valid");
    let (dead, cut) = d.cuttable_client().await;
    let start = Instant::now();
    let grant = dead.try_acquire(&name, d.ttl()).await.expect("acquire");
    // No watchdog, no release, no session keep-alive: as if the process died right here.
    cut.cut();
    let b = client(d).await;
    let limit = d.ttl() + d.expiry_slack() + Duration::from_secs(1);
    let lease = b
        .acquire(name.as_str(), &opts(d), limit * 2)
        .await
        .expect("acquire after death");
    let took = start.elapsed();
    assert!(took <= limit, "freed after {took:?}, limit {limit:?}");
    assert!(
        took >= d.ttl().mul_f64(0.9),
        "freed before the TTL: {took:?}"
    );
    assert!(lease.fencing_token() > grant.token || grant.token.is_none());
    assert!(lease.release().await.expect("release"));
    cut.restore();
}

/// The watchdog keeps a lease alive across 5 x TTL while a competitor keeps trying.
pub async fn watchdog_keeps_the_lease_alive(d: &dyn Deployment) {
    let name = unique("watchdog");
    let (a, b) = (client(d).await, client(d).await);
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let until = Instant::now() + d.ttl() * 5;
    while Instant::now() < until {
        match b.try_acquire(&name, &opts(d)).await {
            Err(LockError::Busy { .. }) => {}
            other => panic!("competitor got {other:?} while the watchdog ran"),
        }
        sleep(d.ttl() / 5).await;
    }
    assert!(
        lease.lost_reason().is_none(),
        "lost: {:?}",
        lease.lost_reason()
    );
    assert!(
        lease.release().await.expect("release"),
        "the lease was not held at the end"
    );
}

/// After release no renewal is sent, and the backend shows no key.
pub async fn renewal_stops_after_release(d: &dyn Deployment) {
    let name = unique("stop-renewing");
    let counting = Counting::wrap(d.client().await);
    let a = LockClient::new(counting.clone());
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    sleep(d.ttl()).await;
    assert!(
        counting.renewals() >= 2,
        "the watchdog did not renew: {}",
        counting.renewals()
    );
    assert!(lease.release().await.expect("release"));
    let after = counting.renewals();
    sleep(d.ttl() * 2).await;
    assert_eq!(counting.renewals(), after, "renewed after release");
    let key = LockName::new(name.as_str()).expect("valid");
    assert_eq!(
        d.artifacts(&key).await,
        0,
        "a key is still there after release"
    );
}

/// A lease dropped without release is freed in the background, well before its TTL.
pub async fn dropped_lease_is_freed_promptly(d: &dyn Deployment) {
    let name = unique("dropped");
    let (a, b) = (client(d).await, client(d).await);
    let ttl = d.ttl() * 10;
    let lease = a
        .try_acquire(&name, &distlock_api::AcquireOptions::with_ttl(ttl))
        .await
        .expect("acquire");
    drop(lease);
    let key = LockName::new(name.as_str()).expect("valid");
    assert!(
        eventually(ttl / 4, || async { d.artifacts(&key).await == 0 }).await,
        "not freed promptly"
    );
    let again = b
        .try_acquire(&name, &opts(d))
        .await
        .expect("free after drop");
    assert!(again.release().await.expect("release"));
}
