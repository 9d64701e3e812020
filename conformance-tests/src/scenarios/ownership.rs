//! Ownership: only the holder's secret renews or releases, and a stale holder touches nothing.

use distlock_api::{GrantKey, LockError, LockName, OwnerSecret, Renewal};
use std::time::Duration;

use tokio::time::Instant;

use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;

/// A release or renewal with the right address but another owner's secret is refused and the
/// owner's lock stays.
pub async fn release_by_non_owner_is_refused(d: &dyn Deployment) {
    let name = LockName::new(unique("non-owner")).expect("valid");
    let (a, b) = (d.client().await, d.client().await);
    let grant = a.try_acquire(&name, d.ttl()).await.expect("acquire");
    let forged = GrantKey {
        name: name.clone(),
        resource: grant.key.resource.clone(),
        secret: OwnerSecret::random().expect("rng"),
        holder: grant.key.holder.clone(),
    };
    assert!(
        !b.release(&forged).await.expect("release call"),
        "a non-owner released the lock"
    );
    assert_eq!(
        b.renew(&forged, d.ttl()).await.expect("renew call"),
        Renewal::NotHeld
    );
    assert_eq!(d.artifacts(&name).await, 1, "the owner's lock was touched");
    assert!(a.release(&grant.key).await.expect("owner release"));
    assert_eq!(d.artifacts(&name).await, 0);
}

/// A holder cut off until its lease expired and another client took the lock: once back, its
/// release reports "not held" and touches nothing of the new holder's.
pub async fn release_after_expiry_spares_the_new_holder(d: &dyn Deployment) {
    let name = LockName::new(unique("stale-release")).expect("valid");
    let (stale, cut) = d.cuttable_client().await;
    let (b, c) = (client(d).await, client(d).await);
    let old = stale.try_acquire(&name, d.ttl()).await.expect("acquire");
    cut.cut();
    let new = b
        .acquire(name.as_str(), &opts(d), d.ttl() * 3 + d.expiry_slack())
        .await
        .expect("acquire after expiry");
    cut.restore();
    let released = retry_while_retryable(|| stale.release(&old.key)).await;
    assert!(!released, "stale release claimed to hold");
    assert!(
        matches!(
            c.try_acquire(name.as_str(), &opts(d)).await,
            Err(LockError::Busy { .. })
        ),
        "the stale release freed the new holder's lock"
    );
    assert!(new.release().await.expect("release"));
}

/// A holder cut off until its lock expired: once back, renewing reports "not held" and never
/// re-creates the lock.
pub async fn renew_after_loss_reports_loss(d: &dyn Deployment) {
    let name = LockName::new(unique("renew-lost")).expect("valid");
    let (backend, cut) = d.cuttable_client().await;
    let grant = backend.try_acquire(&name, d.ttl()).await.expect("acquire");
    cut.cut();
    let freed = eventually(d.ttl() * 3 + d.expiry_slack(), || async {
        d.artifacts(&name).await == 0
    })
    .await;
    assert!(freed, "the cut holder's lock never expired");
    cut.restore();
    let renewal = retry_while_retryable(|| backend.renew(&grant.key, d.ttl())).await;
    assert_eq!(renewal, Renewal::NotHeld);
    assert_eq!(d.artifacts(&name).await, 0, "renewal re-created the lock");
    let released = retry_while_retryable(|| backend.release(&grant.key)).await;
    assert!(!released, "released a lock that had expired");
    let again = client(d)
        .await
        .try_acquire(name.as_str(), &opts(d))
        .await
        .expect("free");
    assert!(again.release().await.expect("release"));
}

/// Calls `f` until it gives something other than a retryable error (a client that was cut off
/// may need a moment to reconnect), for 15 s at most.
pub(crate) async fn retry_while_retryable<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = distlock_api::Result<T>>,
{
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("still failing after reconnect: {e}"),
        }
    }
}

/// Releasing twice is a no-op the second time (false), never a panic or a deletion.
pub async fn double_release_is_harmless(d: &dyn Deployment) {
    let name = LockName::new(unique("double-release")).expect("valid");
    let a = d.client().await;
    let grant = a.try_acquire(&name, d.ttl()).await.expect("acquire");
    assert!(a.release(&grant.key).await.expect("first release"));
    assert!(!a.release(&grant.key).await.expect("second release"));
    let b = d.client().await;
    let next = b.try_acquire(&name, d.ttl()).await.expect("acquire again");
    assert!(!a.release(&grant.key).await.expect("third release"));
    assert_eq!(
        d.artifacts(&name).await,
        1,
        "an old release removed the next grant"
    );
    assert!(b.release(&next.key).await.expect("release"));
}
