//! Running a future under a lock: cut short when the lease is lost, the lock released on every
//! path (completion, panic, cancellation).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use distlock_api::{LockClient, LockError, Ran};
use tokio::time::{Instant, sleep};

use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;

/// Sets its flag when dropped: proves the future under the lock was dropped.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The holder is cut off mid-run: the run ends with `Lost`, the future was dropped (it takes
/// no step after that), and no competitor got the lock before the future was gone.
pub async fn a_run_whose_lease_is_lost_is_cut_short_and_says_so(d: &dyn Deployment) {
    let name = unique("run-lost");
    let (backend, cut) = d.cuttable_client().await;
    let a = LockClient::new(backend);
    let (steps, dropped) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (s, dr, n, o) = (steps.clone(), dropped.clone(), name.clone(), opts(d));
    let run = tokio::spawn(async move {
        a.try_run(&n, &o, |_held| async move {
            let _flag = Dropped(dr);
            loop {
                s.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    });
    sleep(Duration::from_millis(200)).await;
    cut.cut();
    let b = client(d).await;
    let give_up = Instant::now() + d.ttl() * 3 + d.expiry_slack();
    let won = loop {
        match b.try_acquire(&name, &opts(d)).await {
            Ok(l) => break l,
            Err(LockError::Busy { .. }) if Instant::now() < give_up => {
                sleep(Duration::from_millis(10)).await
            }
            other => panic!("competitor: {other:?}"),
        }
    };
    assert!(
        dropped.load(Ordering::SeqCst),
        "a competitor holds the lock while the run's future still runs"
    );
    let ran = tokio::time::timeout(d.ttl(), run)
        .await
        .expect("the run ended")
        .expect("run task")
        .expect("the lock was held");
    assert!(matches!(ran, Ran::Lost(_)), "{ran:?}");
    let after = steps.load(Ordering::SeqCst);
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        steps.load(Ordering::SeqCst),
        after,
        "the future ran on after the loss"
    );
    cut.restore();
    assert!(won.release().await.expect("release"));
}

/// A run that completes returns its output; one that panics reports the panic; one whose caller
/// drops it mid-run is dropped: each time the lock is free right after (not at a TTL).
pub async fn a_run_releases_on_completion_panic_and_cancellation(d: &dyn Deployment) {
    let (a, b) = (client(d).await, client(d).await);
    let name = unique("run-done");
    let ran = a
        .try_run(&name, &opts(d), |held| async move { held.fencing_token() })
        .await
        .expect("run");
    assert!(matches!(ran, Ran::Completed(_)), "{ran:?}");
    let free = b
        .try_acquire(&name, &opts(d))
        .await
        .expect("free after completion");
    assert!(free.release().await.expect("release"));

    let name = unique("run-panic");
    let ran = a
        .try_run(&name, &opts(d), |_| async {
            panic!("the work under the lock panicked")
        })
        .await
        .expect("run");
    assert!(matches!(ran, Ran::<()>::Panicked(_)), "{ran:?}");
    let free = b
        .try_acquire(&name, &opts(d))
        .await
        .expect("free after a panic");
    assert!(free.release().await.expect("release"));

    let name = unique("run-cancel");
    let (a2, n, o) = (a.clone(), name.clone(), opts(d));
    let run =
        tokio::spawn(async move { a2.try_run(&n, &o, |_| std::future::pending::<()>()).await });
    sleep(Duration::from_millis(200)).await;
    run.abort();
    let _ = run.await;
    let free = eventually(d.ttl() / 2, || async {
        match b.try_acquire(&name, &opts(d)).await {
            Ok(l) => l.release().await.expect("release"),
            Err(_) => false,
        }
    })
    .await;
    assert!(free, "a cancelled run left the lock held");
}
