//! Re-entrancy through an owner handle.

use distlock_api::{LockError, Owner};

use super::{client, opts, unique};
use crate::deployment::Deployment;

/// The same owner re-acquires without blocking and keeps the token; the lock is freed after the
/// matching number of releases, not before.
pub async fn reentrant_owner_counts_holds(d: &dyn Deployment) {
    let name = unique("reentrant");
    let (a, b) = (client(d).await, client(d).await);
    let owner = Owner::new();
    let o = opts(d).owner(&owner);
    let outer = a.try_acquire(&name, &o).await.expect("outer");
    let inner = a
        .try_acquire(&name, &o)
        .await
        .expect("re-entry must not block");
    let innermost = a
        .acquire(&name, &o, std::time::Duration::ZERO)
        .await
        .expect("re-entry");
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert_eq!(outer.fencing_token(), innermost.fencing_token());
    assert_eq!(outer.hold_count(), 3);
    assert!(innermost.release().await.expect("release"));
    assert!(inner.release().await.expect("release"));
    assert!(
        matches!(
            b.try_acquire(&name, &opts(d)).await,
            Err(LockError::Busy { .. })
        ),
        "freed too early"
    );
    assert!(outer.release().await.expect("release"));
    let next = b
        .try_acquire(&name, &opts(d))
        .await
        .expect("freed after the last release");
    assert!(next.release().await.expect("release"));
}
