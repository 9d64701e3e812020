//! Server faults and the grade check.

use std::time::Duration;

use distlock_api::{Guarantee, LockError};
use tokio::time::{Instant, timeout};

use super::{client, opts, unique};
use crate::deployment::Deployment;

/// Every server killed while a client holds a lock: calls return a typed, retryable error within
/// their timeout (no hang, no panic), and the client works again once the servers are back.
pub async fn server_kill_gives_retryable_errors_then_recovers(d: &dyn Deployment) {
    let servers = d.servers().expect("gated on server faults");
    let name = unique("server-kill");
    let a = client(d).await;
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    servers.kill_all();
    let bound = Duration::from_secs(15);
    let renew = timeout(bound, lease.renew(d.ttl()))
        .await
        .expect("renew hung on a dead server");
    match renew {
        Err(e) => assert!(
            e.is_retryable() || matches!(e, LockError::Lost { .. }),
            "{e}"
        ),
        Ok(()) => panic!("renewed on a dead server"),
    }
    let other = unique("server-kill-other");
    match timeout(bound, a.try_acquire(&other, &opts(d)))
        .await
        .expect("acquire hung on a dead server")
    {
        Err(e) => assert!(e.is_retryable(), "not retryable: {e}"),
        Ok(_) => panic!("acquired on a dead server"),
    }
    servers.restart_all();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match a.try_acquire(&other, &opts(d)).await {
            Ok(l) => {
                assert!(l.release().await.expect("release"));
                break;
            }
            Err(e) if e.is_retryable() && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("no recovery after restart: {e}"),
        }
    }
    drop(lease);
}

/// `Correctness` is refused with the typed error where the backend cannot give it, and always
/// carries a fencing token where it can.
pub async fn correctness_is_granted_only_where_declared(d: &dyn Deployment) {
    let name = unique("grade");
    let a = client(d).await;
    let o = opts(d).guarantee(Guarantee::Correctness);
    match (
        d.capabilities().refusal(Guarantee::Correctness),
        a.try_acquire(&name, &o).await,
    ) {
        (Some(_), Err(LockError::Unsupported { backend, .. })) => {
            assert_eq!(backend, a.backend().kind())
        }
        (None, Ok(lease)) => {
            assert!(
                lease.fencing_token().is_some(),
                "a correctness lease without a token"
            );
            assert_eq!(lease.guarantee(), Guarantee::Correctness);
            assert!(lease.release().await.expect("release"));
        }
        (refusal, got) => panic!("declared refusal {refusal:?}, got {got:?}"),
    }
}
