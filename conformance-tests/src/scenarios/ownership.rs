//! Ownership: only the holder's secret renews or releases, and a stale holder touches nothing.

use distlock_api::{GrantKey, LockError, LockName, OwnerSecret, Renewal};
use tokio::time::Instant;

use super::{client, opts, unique};
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

/// A holder whose lease expired and whose lock was taken by another client releases nothing of
/// the new holder's.
pub async fn release_after_expiry_spares_the_new_holder(d: &dyn Deployment) {
    let name = unique("stale-release");
    let (a, b, c) = (client(d).await, client(d).await, client(d).await);
    let old = a
        .try_acquire(&name, &opts(d).fixed())
        .await
        .expect("acquire");
    let new = b
        .acquire(&name, &opts(d), d.ttl() * 3 + d.expiry_slack())
        .await
        .expect("acquire after expiry");
    assert!(
        !old.release().await.expect("stale release"),
        "stale release claimed to hold"
    );
    assert!(
        matches!(
            c.try_acquire(&name, &opts(d)).await,
            Err(LockError::Busy { .. })
        ),
        "the stale release freed the new holder's lock"
    );
    assert!(new.release().await.expect("release"));
}

/// Renewing a lease that expired reports the loss and never re-creates the lock.
pub async fn renew_after_loss_reports_loss(d: &dyn Deployment) {
    let name = unique("renew-lost");
    let a = client(d).await;
    let lease = a
        .try_acquire(&name, &opts(d).fixed())
        .await
        .expect("acquire");
    tokio::time::sleep_until(Instant::now() + d.ttl() + d.expiry_slack()).await;
    match lease.renew(d.ttl()).await {
        Err(LockError::Lost { .. }) => {}
        other => panic!("expected Lost, got {other:?}"),
    }
    let key = LockName::new(name.as_str()).expect("valid");
    assert_eq!(d.artifacts(&key).await, 0, "renewal re-created the lock");
    let again = client(d)
        .await
        .try_acquire(&name, &opts(d))
        .await
        .expect("free");
    assert!(again.release().await.expect("release"));
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
