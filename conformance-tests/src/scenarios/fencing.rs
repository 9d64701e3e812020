//! Fencing: tokens strictly increase, and a stale holder's fenced write is refused.

use distlock_api::{Fence, LockClient, LockName};
use tokio::time::sleep;

use super::{client, opts, unique};
use crate::deployment::Deployment;

/// 200 hand-overs between several clients, with idle periods and holder expiries in between:
/// every grant's token is above the previous one.
pub async fn fencing_tokens_strictly_increase(d: &dyn Deployment) {
    let name = unique("tokens");
    let key = LockName::new(name.as_str()).expect("valid");
    let clients = [client(d).await, client(d).await, client(d).await];
    let mut last = None;
    for i in 0..200 {
        let c = &clients[i % clients.len()];
        let token = if i == 70 || i == 140 {
            // A holder that dies (cut off: it never renews, keeps alive or releases); the next
            // acquire waits out its TTL.
            let (dying, cut) = d.cuttable_client().await;
            let raw = dying.try_acquire(&key, d.ttl()).await.expect("raw acquire");
            cut.cut();
            raw.token
        } else {
            let lease = c
                .acquire(&name, &opts(d), d.ttl() * 3 + d.expiry_slack())
                .await
                .unwrap_or_else(|e| panic!("hand-over {i}: {e}"));
            let t = lease.fencing_token();
            assert!(lease.release().await.expect("release"));
            t
        };
        let token = token.expect("a fenced backend returned no token");
        if let Some(prev) = last {
            assert!(token > prev, "hand-over {i}: token {token} after {prev}");
        }
        last = Some(token);
        if i % 50 == 25 {
            sleep(d.ttl() / 2).await; // idle period
        }
    }
}

/// A holder paused past its TTL (cut off: no renewal, no keep-alive reaches the servers) comes
/// back and writes through the fence: refused, while the new holder's write is accepted.
pub async fn paused_holder_write_is_fenced_off(d: &dyn Deployment) {
    let name = unique("paused-holder");
    let (backend, cut) = d.cuttable_client().await;
    let a = LockClient::new(backend);
    let b = client(d).await;
    let fence = Fence::new();
    let paused = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let old = paused.fencing_token().expect("token");
    cut.cut();
    let fresh = b
        .acquire(&name, &opts(d), d.ttl() * 3 + d.expiry_slack())
        .await
        .expect("acquire after the pause");
    cut.restore();
    let new = fresh.fencing_token().expect("token");
    fence
        .check(new)
        .expect("the new holder's write is accepted");
    let err = fence
        .check(old)
        .expect_err("the paused holder's write must be refused");
    assert_eq!(err.highest, new);
    assert!(
        paused.lost_reason().is_some(),
        "the paused holder was never told"
    );
    assert!(fresh.release().await.expect("release"));
}
