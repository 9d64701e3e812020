//! Reading a lock without touching it: what `status` pages and the `distlock status` command show.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock_api::{
    Admission, ELECTION_LOCK_PREFIX, HolderInfo, LockName, LockStatus, RWLOCK_LOCK_PREFIX,
    SEMAPHORE_LOCK_PREFIX,
};
use tokio::time::sleep;

use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;

/// Free, then held (with the holder's token, and a time to live no longer than the TTL where the
/// backend reports one), then held with one waiter (counted where waiters are listed on the
/// server, [`distlock_api::Capabilities::listed_waiters`]), then handed to that waiter; reading
/// changes nothing (the waiter is still granted in order, nothing is left at the end).
pub async fn inspection_reports_the_holder_and_its_waiters(d: &dyn Deployment) {
    let name = unique("inspect");
    let lock = LockName::new(name.as_str()).expect("valid");
    let observer = d.client().await;
    let status = || async { observer.inspect(&lock).await.expect("inspect") };
    assert_eq!(status().await, LockStatus::default());
    let a = client(d).await;
    let lease = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let held = status().await;
    assert_eq!(held.holders.len(), 1, "{held:?}");
    let holder = held.holder().expect("a holder after the grant");
    assert_eq!(holder.token, lease.fencing_token());
    assert_eq!(holder.admission, Admission::Exclusive);
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
    if d.capabilities().listed_waiters {
        assert!(
            eventually(Duration::from_secs(10), || async {
                status().await.waiters == 1
            })
            .await,
            "the waiter never showed: {:?}",
            status().await
        );
    } else {
        // Waiters that only retry leave no entry: the count stays 0 while one waits.
        sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "the waiter did not wait");
        assert_eq!(status().await.waiters, 0);
    }
    assert_eq!(
        status().await.holder().and_then(|h| h.token),
        lease.fencing_token()
    );
    sleep(Duration::from_millis(50)).await;
    assert!(lease.release().await.expect("release"));
    let next = waiting.await.expect("task").expect("the waiter is granted");
    let now = status().await;
    assert_eq!(now.holder().and_then(|h| h.token), next.fencing_token());
    assert_eq!(now.waiters, 0);
    assert!(next.release().await.expect("release"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            status().await.holders.is_empty()
        })
        .await
    );
}

/// Every holder of a name is reported, with what it holds: a semaphore of 2 with both permits
/// held and one waiter shows two permits (their tokens) and the waiter; a read-write lock with
/// two readers and a waiting writer shows both reads and the writer waiting, then the writer
/// holding with a reader waiting.
pub async fn inspection_reports_every_holder_of_a_semaphore_and_a_rwlock(d: &dyn Deployment) {
    let observer = d.client().await;
    let status = |name: String| {
        let observer = observer.clone();
        async move {
            let name = LockName::new(name).expect("valid");
            observer.inspect(&name).await.expect("inspect")
        }
    };
    let name = unique("inspect-semaphore");
    let queue = format!("{SEMAPHORE_LOCK_PREFIX}{name}");
    let semaphore =
        |c: distlock_api::LockClient| c.semaphore(&name, 2).expect("semaphore").options(opts(d));
    let s = semaphore(client(d).await);
    let permits = [
        s.try_acquire().await.expect("first"),
        s.try_acquire().await.expect("second"),
    ];
    let w = semaphore(client(d).await);
    let waiting = tokio::spawn(async move { w.acquire(Duration::from_secs(30)).await });
    assert!(
        eventually(Duration::from_secs(10), || async {
            status(queue.clone()).await.waiters == 1
        })
        .await,
        "the permit waiter never showed: {:?}",
        status(queue.clone()).await
    );
    let seen = status(queue.clone()).await;
    assert_eq!(seen.holders.len(), 2, "{seen:?}");
    assert!(
        seen.holders
            .iter()
            .all(|h| h.admission == Admission::Permit(2)),
        "{seen:?}"
    );
    let mut tokens: Vec<_> = seen.holders.iter().map(|h| h.token).collect();
    let mut expected: Vec<_> = permits.iter().map(|p| p.fencing_token()).collect();
    tokens.sort();
    expected.sort();
    assert_eq!(tokens, expected);
    for p in permits {
        assert!(p.release().await.expect("release"));
    }
    let last = waiting.await.expect("task").expect("the waiter's permit");
    assert!(last.release().await.expect("release"));

    let name = unique("inspect-rwlock");
    let queue = format!("{RWLOCK_LOCK_PREFIX}{name}");
    let rwlock = || async {
        client(d)
            .await
            .rwlock(&name)
            .expect("rwlock")
            .options(opts(d))
    };
    let readers = [
        rwlock().await.try_read().await.expect("first read"),
        rwlock().await.try_read().await.expect("second read"),
    ];
    let w = rwlock().await;
    let writing = tokio::spawn(async move { w.write(Duration::from_secs(30)).await });
    assert!(
        eventually(Duration::from_secs(10), || async {
            status(queue.clone()).await.waiters == 1
        })
        .await,
        "the writer never showed: {:?}",
        status(queue.clone()).await
    );
    let seen = status(queue.clone()).await;
    assert_eq!(seen.holders.len(), 2, "{seen:?}");
    assert!(
        seen.holders
            .iter()
            .all(|h| h.admission == Admission::Shared),
        "{seen:?}"
    );
    for r in readers {
        assert!(r.release().await.expect("release"));
    }
    let write = writing.await.expect("task").expect("the writer");
    let r = rwlock().await;
    let reading = tokio::spawn(async move { r.read(Duration::from_secs(30)).await });
    assert!(
        eventually(Duration::from_secs(10), || async {
            status(queue.clone()).await.waiters == 1
        })
        .await,
        "the reader never showed: {:?}",
        status(queue.clone()).await
    );
    let seen = status(queue.clone()).await;
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    assert_eq!(seen.holders[0].admission, Admission::Exclusive);
    assert_eq!(seen.holders[0].token, write.fencing_token());
    assert!(write.release().await.expect("release"));
    let read = reading.await.expect("task").expect("the reader");
    assert!(read.release().await.expect("release"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            status(queue.clone()).await == LockStatus::default()
        })
        .await,
        "{:?}",
        status(queue.clone()).await
    );
}

/// Each holder is named as its holder wrote it: this process's host, pid and command, and since
/// a moment between asking and being granted; for a lock, each permit of a semaphore and each
/// reader (where the queue admits by policy), and an election's leader before and after it
/// announced (and re-announced) its value (where elections are offered).
pub async fn inspection_names_who_holds(d: &dyn Deployment) {
    let observer = d.client().await;
    let caps = observer.capabilities().clone();
    let me = HolderInfo::now();
    let status = |name: String| {
        let observer = observer.clone();
        async move {
            let name = LockName::new(name).expect("valid");
            observer.inspect(&name).await.expect("inspect")
        }
    };
    // Whole milliseconds, as entries keep them.
    let millis = |t: SystemTime| t.duration_since(UNIX_EPOCH).expect("clock").as_millis();
    let named = |seen: &LockStatus, before: SystemTime, after: SystemTime, n: usize| {
        assert_eq!(seen.holders.len(), n, "{seen:?}");
        for h in &seen.holders {
            let who = h
                .holder
                .as_ref()
                .unwrap_or_else(|| panic!("unnamed: {seen:?}"));
            assert_eq!(
                (&who.host, who.pid, &who.command),
                (&me.host, me.pid, &me.command)
            );
            let since = millis(who.since);
            assert!(
                millis(before) <= since && since <= millis(after),
                "since {since} not within [{}, {}]",
                millis(before),
                millis(after)
            );
        }
    };

    let name = unique("inspect-who");
    let before = SystemTime::now();
    let lease = client(d)
        .await
        .try_acquire(&name, &opts(d))
        .await
        .expect("acquire");
    let after = SystemTime::now();
    named(&status(name.clone()).await, before, after, 1);
    assert!(lease.release().await.expect("release"));

    if caps.policies && caps.permits {
        let name = unique("inspect-who-permits");
        let s = client(d)
            .await
            .semaphore(&name, 3)
            .expect("semaphore")
            .options(opts(d));
        let before = SystemTime::now();
        let permits = [
            s.try_acquire().await.expect("first"),
            s.try_acquire().await.expect("second"),
        ];
        let after = SystemTime::now();
        named(
            &status(format!("{SEMAPHORE_LOCK_PREFIX}{name}")).await,
            before,
            after,
            2,
        );
        for p in permits {
            assert!(p.release().await.expect("release"));
        }
    }
    if caps.policies {
        let name = unique("inspect-who-readers");
        let rw = client(d)
            .await
            .rwlock(&name)
            .expect("rwlock")
            .options(opts(d));
        let before = SystemTime::now();
        let read = rw.try_read().await.expect("read");
        let after = SystemTime::now();
        named(
            &status(format!("{RWLOCK_LOCK_PREFIX}{name}")).await,
            before,
            after,
            1,
        );
        assert!(read.release().await.expect("release"));
    }

    if caps.fencing.is_monotonic() {
        let name = unique("inspect-who-leader");
        let e = client(d)
            .await
            .election(&name)
            .expect("election")
            .options(opts(d));
        let before = SystemTime::now();
        let mut leading = e.campaign("http://a:1").await.expect("elected");
        let after = SystemTime::now();
        let queue = format!("{ELECTION_LOCK_PREFIX}{name}");
        named(&status(queue.clone()).await, before, after, 1);
        leading.proclaim("http://b:2").await.expect("proclaim");
        named(&status(queue.clone()).await, before, after, 1);
        let leader = e.leader().await.expect("leader").expect("a leader");
        assert_eq!(leader.value, "http://b:2");
        assert!(leading.resign().await.expect("resign"));
    }
}
