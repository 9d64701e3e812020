//! Reading a lock without touching it: what `status` pages and the `distlock status` command show.

use std::time::Duration;

use distlock_api::{LockName, LockStatus};
use tokio::time::sleep;

use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;

/// Free, then held (with the holder's token, and a time to live no longer than the TTL where the
/// backend reports one), then held with one waiter, then handed to that waiter; reading changes
/// nothing (the waiter is still granted in order, nothing is left at the end).
pub async fn inspection_reports_the_holder_and_its_waiters(d: &dyn Deployment) {
    let name = unique("inspect");
    let lock = LockName::new(name.as_str()).expect("valid");
    let observer = d.client().await;
    let status = || async { observer.inspect(&lock).await.expect("inspect") };
    assert_eq!(
        status().await,
        LockStatus {
            holder: None,
            waiters: 0
        }
    );
    let a = client(d).await;
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let held = status().await;
    let holder = held.holder.expect("a holder after the grant");
    assert_eq!(holder.token, lease.fencing_token());
    if let Some(left) = holder.expires_in {
        assert!(
            left <= lease.ttl() + Duration::from_secs(1),
            "expires in {left:?}, TTL {:?}",
            lease.ttl()
        );
    }
    assert_eq!(held.waiters, 0);
    let b = client(d).await;
    let (n, o) = (name.clone(), opts(d));
    let waiting = tokio::spawn(async move { b.acquire(&n, &o, Duration::from_secs(30)).await });
    assert!(
        eventually(Duration::from_secs(10), || async {
            status().await.waiters == 1
        })
        .await,
        "the waiter never showed: {:?}",
        status().await
    );
    assert_eq!(
        status().await.holder.and_then(|h| h.token),
        lease.fencing_token()
    );
    sleep(Duration::from_millis(50)).await;
    assert!(lease.release().await.expect("release"));
    let next = waiting.await.expect("task").expect("the waiter is granted");
    let now = status().await;
    assert_eq!(now.holder.and_then(|h| h.token), next.fencing_token());
    assert_eq!(now.waiters, 0);
    assert!(next.release().await.expect("release"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            status().await.holder.is_none()
        })
        .await
    );
}
