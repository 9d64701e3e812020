//! The lost signal fires before anybody else can hold the lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{LockClient, LockError};
use tokio::time::{Instant, sleep};

use super::{client, opts, unique};
use crate::deployment::Deployment;

/// The holder is cut off from the servers: its lost signal fires before a competitor acquires.
pub async fn lost_signal_fires_before_a_competitor_acquires(d: &dyn Deployment) {
    let name = unique("lost-signal");
    let (backend, cut) = d.cuttable_client().await;
    let a = LockClient::new(backend);
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let fired = Arc::new(Mutex::new(None));
    let signal = lease.lost_signal();
    let f = fired.clone();
    let watcher = tokio::spawn(async move {
        let reason = signal.wait().await;
        *f.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        reason
    });
    cut.cut();
    let b = client(d).await;
    let give_up = Instant::now() + d.ttl() * 4 + d.expiry_slack();
    let won = loop {
        match b.try_acquire(&name, &opts(d)).await {
            Ok(l) => break l,
            Err(LockError::Busy { .. }) if Instant::now() < give_up => {
                sleep(Duration::from_millis(10)).await
            }
            other => panic!("competitor: {other:?}"),
        }
    };
    let won_at = Instant::now();
    let fired_at = fired
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .expect("the lost signal had not fired when the competitor acquired");
    assert!(
        fired_at <= won_at,
        "lost signal at {fired_at:?}, competitor at {won_at:?}"
    );
    watcher.await.expect("watcher");
    assert!(lease.remaining().is_zero());
    cut.restore();
    assert!(won.release().await.expect("release"));
}
