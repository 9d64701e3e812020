//! Renewals: the validity a renewal gives is what the server applied, shorter or longer than
//! asked, and the watchdog follows it.

use distlock_api::{
    AcquireOptions, Admission, Lease, LockError, LockName, RWLOCK_LOCK_PREFIX,
    SEMAPHORE_LOCK_PREFIX,
};
use std::time::Duration;
use tokio::time::{Instant, sleep};

use super::{client, opts, unique};
use crate::deployment::Deployment;

/// The server's expiry may be read up to this much low (Redis rounds `PTTL` down to the ms).
const READ_SLACK: Duration = Duration::from_millis(5);

/// The lease's local deadline is no later than the server's own expiry of the lock, read from
/// the server.
async fn deadline_within_server_expiry(
    d: &dyn Deployment,
    key: &LockName,
    lease: &Lease,
    when: &str,
) {
    let asked = Instant::now();
    let expiry = d
        .server_expiry(key)
        .await
        .unwrap_or_else(|| panic!("{when}: the server shows no holder"));
    assert!(
        lease.valid_until() <= asked + expiry + READ_SLACK,
        "{when}: the lease says valid for {:?}, the server keeps it {expiry:?}",
        lease.valid_until().saturating_duration_since(asked)
    );
}

/// After the grant and after renewals asking far more, less, and the same as the TTL, the
/// lease is never valid past what the server applied (etcd and ZooKeeper keep their session's
/// TTL whatever is asked; Redis applies exactly what is asked, shorter too).
pub async fn a_renewal_is_valid_for_what_the_server_applied(d: &dyn Deployment) {
    let name = unique("applied");
    let key = LockName::new(name.as_str()).expect("valid");
    let a = client(d).await;
    let lease = a
        .try_acquire(&name, &opts(d).fixed())
        .await
        .expect("acquire");
    deadline_within_server_expiry(d, &key, &lease, "after the grant").await;
    for asked in [d.ttl() * 30, d.ttl() / 2, d.ttl()] {
        lease.renew(asked).await.expect("renew");
        deadline_within_server_expiry(d, &key, &lease, &format!("after renew({asked:?})")).await;
    }
    assert!(lease.release().await.expect("release"));
}

/// A lease renewed by hand to a shorter TTL: with the watchdog, renewals follow the shorter
/// TTL's schedule and the lease holds; without it, the lease ends at the shorter TTL and its
/// holder is told before a competitor gets the lock.
pub async fn a_shorter_renewal_shortens_the_lease_and_the_watchdog_follows(d: &dyn Deployment) {
    let (long, short) = (d.ttl() * 4, d.ttl());
    let (a, b) = (client(d).await, client(d).await);
    let name = unique("shorter-kept");
    let kept = a
        .try_acquire(&name, &AcquireOptions::with_ttl(long))
        .await
        .expect("acquire");
    kept.renew(short).await.expect("renew");
    let until = Instant::now() + short * 3;
    while Instant::now() < until {
        match b.try_acquire(&name, &opts(d)).await {
            Err(LockError::Busy { .. }) => {}
            other => panic!("a competitor got {other:?}: the watchdog kept the old schedule"),
        }
        assert_eq!(kept.lost_reason(), None);
        sleep(short / 5).await;
    }
    assert!(kept.release().await.expect("release"));

    let name = unique("shorter-fixed");
    let fixed = a
        .try_acquire(&name, &AcquireOptions::with_ttl(long).fixed())
        .await
        .expect("acquire");
    fixed.renew(short).await.expect("renew");
    let give_up = Instant::now() + long + d.expiry_slack();
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
        fixed.lost_reason().is_some(),
        "a competitor got the lock while the holder still counted on the old TTL"
    );
    assert!(won.release().await.expect("release"));
}

/// A renewal batch sent by a client cut off from the servers answers every item by the batch's
/// cutoff (the earliest deadline of its leases), as a retryable error: the watchdog plans the
/// retries and the lost signal from that answer, so a call that outlives the cutoff would leave
/// the holder untold past its deadline. The batch holds a lock and, where the backend admits
/// them, a permit of a semaphore of 2, a reader and a writer (one watchdog renews them all).
pub async fn a_renewal_batch_cut_off_answers_by_its_cutoff(d: &dyn Deployment) {
    const WITHIN: Duration = Duration::from_millis(300);
    const SLACK: Duration = Duration::from_millis(200);
    let caps = d.capabilities();
    let base = unique("renew-cutoff");
    let mut wanted = vec![(base.clone(), Admission::Exclusive)];
    if caps.policies && caps.permits {
        wanted.push((
            format!("{SEMAPHORE_LOCK_PREFIX}{base}"),
            Admission::Permit(2),
        ));
    }
    if caps.policies {
        wanted.push((format!("{RWLOCK_LOCK_PREFIX}{base}-r"), Admission::Shared));
        wanted.push((
            format!("{RWLOCK_LOCK_PREFIX}{base}-w"),
            Admission::Exclusive,
        ));
    }
    let (backend, cut) = d.cuttable_client().await;
    let mut grants = Vec::new();
    for (name, admission) in wanted {
        let name = LockName::new(name).expect("valid");
        let grant = backend
            .acquire_admitted(&name, admission, d.ttl(), None)
            .await
            .unwrap_or_else(|e| panic!("{admission:?} on {name}: {e}"));
        grants.push(grant);
    }
    let batch: Vec<_> = grants.iter().map(|g| (&g.key, d.ttl())).collect();
    cut.cut();
    let sent = Instant::now();
    let answers = backend.renew_batch(&batch, sent + WITHIN).await;
    let took = sent.elapsed();
    cut.restore();
    assert!(
        took <= WITHIN + SLACK,
        "answered {took:?} after it was sent, cutoff {WITHIN:?}"
    );
    assert!(
        answers.len() == batch.len()
            && answers
                .iter()
                .all(|a| matches!(a, Err(e) if e.is_retryable())),
        "answers: {answers:?}"
    );
    // Clean-up only: the TTL frees them otherwise.
    for g in &grants {
        backend.release(&g.key).await.ok();
    }
}
