//! Idle clients: a client that sent nothing for longer than the server's own idle limits
//! (connection timeouts, HTTP/2 ping policy, session pings) works at once, with no error, and a
//! lease held across that time is not lost.

use distlock_api::LockClient;
use tokio::time::sleep;

use super::{opts, unique};
use crate::deployment::Deployment;

/// One client idles past the server's limits while another, on the same kind of connection,
/// holds a lease through them; then the idle one acquires, renews and releases with no error.
pub async fn an_idle_client_keeps_working(d: &dyn Deployment) {
    let idle = LockClient::new(d.idle_client().await);
    let holder = LockClient::new(d.idle_client().await);
    let name = unique("idle");
    // Connections (and a session, where the backend has one) exist before the idle time.
    let warm = idle.try_acquire(&name, &opts(d)).await.expect("acquire");
    assert!(warm.release().await.expect("release"));
    let held = holder
        .try_acquire(&unique("idle-held"), &opts(d))
        .await
        .expect("acquire");
    sleep(d.idle()).await;
    let lease = idle
        .try_acquire(&name, &opts(d))
        .await
        .expect("acquire after idling");
    lease.renew(d.ttl()).await.expect("renew after idling");
    assert!(lease.release().await.expect("release after idling"));
    assert_eq!(
        held.lost_reason(),
        None,
        "a lease held across the idle time was lost"
    );
    assert!(held.release().await.expect("release"));
}
