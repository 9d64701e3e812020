//! etcd attempt keys: a client reuses one key per name for sequential acquires (etcd keeps an
//! index entry for every key ever created until compaction), never a key that may still exist,
//! and only the holder's secret releases it; a session holds more keys than one answer can list.

use std::sync::Arc;
use std::time::Duration;

use distlock::{
    AcquireOptions, Lease, LockBackend, LockClient, LockError, LockName, RWLOCK_LOCK_PREFIX,
};
use distlock_api::{GrantKey, OwnerSecret};
use distlock_conformance::deployments::etcd::{deploy, options};
use distlock_etcd::{EtcdBackend, EtcdOptions};
use tokio::task::JoinHandle;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_reused_only_once_free() {
    let d = deploy("etcd", 1, false).await;
    let backend = Arc::new(
        EtcdBackend::connect(&d.cluster.endpoints(), options())
            .await
            .expect("connect"),
    );
    let locks = LockClient::new(backend.clone());
    let opts = AcquireOptions::with_ttl(Duration::from_secs(5));

    let first = locks.try_acquire("reuse", &opts).await.expect("acquire");
    let (key, token) = (first.backend_key().to_string(), first.fencing_token());
    assert!(first.release().await.expect("release"));
    let second = locks.try_acquire("reuse", &opts).await.expect("acquire");
    assert_eq!(
        second.backend_key(),
        key,
        "a sequential acquire took a new key"
    );
    assert!(
        second.fencing_token() > token,
        "the reused key's token did not grow: {:?} after {token:?}",
        second.fencing_token()
    );

    // A waiter of the same client while the key is held gets a key of its own.
    let waiter = {
        let locks = locks.clone();
        let opts = opts.clone();
        tokio::spawn(async move { locks.acquire("reuse", &opts, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held_token = second.fencing_token();
    assert!(second.release().await.expect("release"));
    let third = waiter.await.expect("task").expect("waiter acquires");
    assert_ne!(third.backend_key(), key, "a waiter shared the holder's key");
    assert!(third.fencing_token() > held_token);

    // A busy try frees its slot: the next waiter-free acquire after release reuses a key again.
    assert!(locks.try_acquire("reuse", &opts).await.is_err());
    let third_key = third.backend_key().to_string();
    assert!(third.release().await.expect("release"));
    let fourth = locks.try_acquire("reuse", &opts).await.expect("acquire");
    assert!(
        fourth.backend_key() == key || fourth.backend_key() == third_key,
        "no key was reused: {}",
        fourth.backend_key()
    );

    // Same client, right key, wrong secret: refused, the holder's key stays.
    let name = LockName::new("reuse").expect("valid");
    let forged = GrantKey {
        name: name.clone(),
        resource: fourth.backend_key().into(),
        secret: OwnerSecret::random().expect("rng"),
        holder: distlock::HolderInfo::now(),
    };
    assert!(!backend.release(&forged).await.expect("release call"));
    let mut admin = backend.client();
    let left = admin
        .get(fourth.backend_key(), None)
        .await
        .expect("get")
        .kvs()
        .len();
    assert_eq!(left, 1, "a forged secret deleted the holder's key");
    assert!(fourth.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holding_more_keys_than_one_answer_can_list_keeps_them_all() {
    // 19 000 keys of 238 bytes: a list of the session's keys (4.6 MB) passes the 4 MB the
    // client accepts in one answer, so a renewal that asks for it never gets it.
    const LEASES: usize = 19_000;
    let d = deploy("etcd", 1, false).await;
    // A session of 4 s, not the tests' 2 s: taking 19 000 keys loads a 2-core machine for
    // some 20 s, and with 2 s (a window of 1.8 s, a renewal every 0.7 s) 11 136 leases were
    // lost once, on a machine that had just installed its packages. What this checks is the
    // list's size, which the TTL does not change.
    let session = EtcdOptions {
        session_ttl: Duration::from_secs(4),
        ..options()
    };
    let locks = LockClient::new(Arc::new(
        EtcdBackend::connect(&d.cluster.endpoints(), session.clone())
            .await
            .expect("connect"),
    ));
    let opts = AcquireOptions::with_ttl(session.session_ttl);
    let mut leases = Vec::with_capacity(LEASES);
    let names: Vec<String> = (0..LEASES).map(|i| format!("{i:0>190}")).collect();
    for chunk in names.chunks(64) {
        leases.extend(
            futures_util::future::join_all(chunk.iter().map(|n| taken(&locks, n, &opts))).await,
        );
    }
    // Two session TTLs: renewals that failed would have run the session out.
    tokio::time::sleep(session.session_ttl * 2).await;
    let lost: Vec<_> = leases.iter().filter_map(|l| l.lost_reason()).collect();
    assert!(
        lost.is_empty(),
        "{} leases lost while held, the first for {:?}",
        lost.len(),
        lost.first()
    );
    let mut leases = leases.into_iter().peekable();
    while leases.peek().is_some() {
        let chunk: Vec<_> = leases.by_ref().take(256).collect();
        for released in futures_util::future::join_all(chunk.into_iter().map(|l| l.release())).await
        {
            assert!(
                released.expect("release"),
                "a lease was not held at its release"
            );
        }
    }
}

/// `name` taken; a take cut off by the 1 s request timeout of these tests (a slow disk on a
/// loaded machine) is taken again, as a user would.
async fn taken(locks: &LockClient, name: &str, opts: &AcquireOptions) -> distlock::Lease {
    for _ in 0..5 {
        match locks.try_acquire(name, opts).await {
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
            taken => return taken.expect("acquire"),
        }
    }
    panic!("acquire {name}: five retryable failures")
}

/// An operator clears a stuck lock with one delete of its name's keys (`etcdctl del --prefix`)
/// while waiters queue: a waiter whose own key went in that delete is never granted on the
/// delete of the key ahead of it. A waiter further back than 16 followed each key on a watch of
/// its own, and etcd sends two watches' events of one revision in either order: seen to grant
/// the waiter with its key gone, so another client could hold the lock with it. Now one watch
/// of the range from its key to the nearest ahead tells both, in order (else it reads its key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_an_operator_deleted_with_the_one_ahead_is_not_granted() {
    let d = deploy("etcd", 1, false).await;
    let mut q = Queue::new(&d, "cleared", false).await;
    // Each round has even odds to show the old order (eight rounds: all but certain).
    for round in 0..8 {
        let (nearest, last) = q.last_at_its_turn(Duration::from_secs(20)).await;
        let gone = q
            .admin
            .delete(
                q.prefix.clone(),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .expect("delete the name's keys");
        assert_eq!(
            gone.deleted(),
            2,
            "round {round}: the nearest's key and the last's"
        );
        match last.await.expect("join") {
            Err(e) => assert!(
                e.to_string().contains("died while waiting"),
                "round {round}: {e}"
            ),
            Ok(lease) => panic!(
                "round {round}: granted with its key {} deleted",
                lease.backend_key()
            ),
        }
        let _ = nearest.release().await;
    }
}

/// A waiter further back than 16 whose turn is next (the watch of the range from its key to the
/// nearest ahead made) times out, or is dropped: it leaves nothing queued, and the lock comes
/// free once the nearest lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_waiter_timed_out_or_dropped_as_its_turn_nears_leaves_nothing() {
    let d = deploy("etcd", 1, false).await;
    let q = Queue::new(&d, "near-turn-ends", false).await;
    for dropped in [false, true] {
        // Long enough for the queue ahead to pass (a slow machine times it out sooner).
        let (nearest, last) = q.last_at_its_turn(Duration::from_secs(2)).await;
        if dropped {
            last.abort();
            assert!(last.await.is_err_and(|e| e.is_cancelled()), "dropped");
        } else {
            let outcome = last.await.expect("join");
            assert!(
                matches!(outcome, Err(LockError::Timeout { .. })),
                "the last waiter got {outcome:?} while the nearest held"
            );
        }
        q.count_until(1).await;
        assert!(nearest.release().await.expect("release"));
        let free = q.clients[0].try_acquire(&q.name, &q.opts).await;
        assert!(free.expect("free").release().await.expect("release"));
    }
}

/// A waiter further back than 16, far from its turn (following the two nearest on a watch of
/// its own, or still putting its key or making that watch), dropped at any of those points or
/// timed out: it leaves nothing queued, and the queue ahead of it passes and frees the lock.
/// The same for a read-write lock's writer behind a writer and 16 readers (it waits for all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_waiter_timed_out_or_dropped_before_its_cue_leaves_nothing() {
    let d = deploy("etcd", 1, false).await;
    for (name, first, ahead, far) in [
        ("far-ends", Entry::Lock, Entry::Lock, Entry::Lock),
        ("far-writer", Entry::Write, Entry::Read, Entry::Write),
    ] {
        let q = Queue::new(&d, name, far == Entry::Write).await;
        let holder = q.take(0, first, None).await.expect("free");
        let mut waiting = Vec::new();
        for i in 1..17 {
            waiting.push(q.queue_as(i, ahead, Duration::from_secs(20)).await);
        }
        // 17 keys ahead of the last client: it is far.
        for after in [0, 1, 3, 10, 50, 300] {
            let gone = q.spawn(17, far, Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(after)).await;
            gone.abort();
            assert!(
                gone.await.is_err_and(|e| e.is_cancelled()),
                "{name}: the far waiter was granted or failed while 17 keys were ahead"
            );
            q.count_until(17).await;
        }
        let outcome = q.take(17, far, Some(Duration::from_millis(300))).await;
        assert!(
            matches!(outcome, Err(LockError::Timeout { .. })),
            "{name}: the far waiter got {outcome:?} while 17 keys were ahead"
        );
        q.count_until(17).await;
        assert!(holder.release().await.expect("release"));
        for t in waiting {
            let lease = t.await.expect("join").expect("a waiter's grant");
            assert!(lease.release().await.expect("release"));
        }
        q.count_until(0).await;
        let free = q.take(17, far, None).await;
        assert!(free.expect("free").release().await.expect("release"));
    }
}

/// How a queue's client takes its name.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Entry {
    Lock,
    Read,
    Write,
}

impl Entry {
    async fn take(
        self,
        c: &LockClient,
        name: &str,
        opts: &AcquireOptions,
        wait: Option<Duration>,
    ) -> distlock::Result<Lease> {
        if self == Entry::Lock {
            return match wait {
                Some(wait) => c.acquire(name, opts, wait).await,
                None => c.try_acquire(name, opts).await,
            };
        }
        let rw = c.rwlock(name)?.options(opts.clone());
        match (self, wait) {
            (Entry::Read, Some(wait)) => rw.read(wait).await,
            (Entry::Read, None) => rw.try_read().await,
            (_, Some(wait)) => rw.write(wait).await,
            (_, None) => rw.try_write().await,
        }
    }
}

/// 18 clients queueing on one name of a member, and a client of its own to count and delete
/// the name's keys.
struct Queue {
    clients: Vec<LockClient>,
    admin: etcd_client::Client,
    name: String,
    prefix: String,
    opts: AcquireOptions,
}

impl Queue {
    /// The queue of lock `name`, or of read-write lock `name` if `rw`.
    async fn new(
        d: &distlock_conformance::deployments::etcd::EtcdDeployment,
        name: &str,
        rw: bool,
    ) -> Self {
        let stored = if rw {
            format!("{RWLOCK_LOCK_PREFIX}{name}")
        } else {
            name.to_string()
        };
        let prefix = distlock_etcd::keys::name_prefix(
            &options().prefix,
            &LockName::new(&stored).expect("valid"),
        );
        let admin = etcd_client::Client::connect(d.cluster.endpoints(), None)
            .await
            .expect("connect");
        let mut clients = Vec::new();
        for _ in 0..18 {
            let backend = EtcdBackend::connect(&d.cluster.endpoints(), options())
                .await
                .expect("connect");
            clients.push(LockClient::new(Arc::new(backend)));
        }
        let opts = AcquireOptions::with_ttl(Duration::from_secs(30));
        let name = name.to_string();
        Queue {
            clients,
            admin,
            name,
            prefix,
            opts,
        }
    }

    /// A holder, 15 waiters released in turn, one that holds (the nearest ahead of the
    /// last), and the last, 17 from the head, waiting up to `last_wait`: returns the nearest's
    /// lease once it holds and the last has read its view again (one key ahead of it).
    async fn last_at_its_turn(
        &self,
        last_wait: Duration,
    ) -> (Lease, JoinHandle<distlock::Result<Lease>>) {
        let wait = Duration::from_secs(20);
        let holder = self.clients[0]
            .try_acquire(&self.name, &self.opts)
            .await
            .expect("acquire");
        let mut passing = Vec::new();
        for i in 1..16 {
            passing.push(self.queue(i, wait).await);
        }
        let nearest = self.queue(16, wait).await;
        // 17 ahead: it follows the two nearest.
        let last = self.queue(17, last_wait).await;
        assert!(holder.release().await.expect("release"));
        for t in passing {
            let lease = t.await.expect("join").expect("a passing waiter's grant");
            assert!(lease.release().await.expect("release"));
        }
        let nearest = nearest.await.expect("join").expect("the nearest's grant");
        // The last reads its view again as the key two ahead goes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        (nearest, last)
    }

    /// Client `i` queues, waiting up to `wait`; returns once its key is the name's `i + 1`th.
    async fn queue(&self, i: usize, wait: Duration) -> JoinHandle<distlock::Result<Lease>> {
        self.queue_as(i, Entry::Lock, wait).await
    }

    /// Client `i` queues as `entry`, waiting up to `wait`; returns once its key is the name's
    /// `i + 1`th.
    async fn queue_as(
        &self,
        i: usize,
        entry: Entry,
        wait: Duration,
    ) -> JoinHandle<distlock::Result<Lease>> {
        let waiting = self.spawn(i, entry, wait);
        self.count_until(i + 1).await;
        waiting
    }

    /// Client `i` takes the name as `entry` on a task of its own, waiting up to `wait`.
    fn spawn(&self, i: usize, entry: Entry, wait: Duration) -> JoinHandle<distlock::Result<Lease>> {
        let (c, n, o) = (
            self.clients[i].clone(),
            self.name.clone(),
            self.opts.clone(),
        );
        tokio::spawn(async move { entry.take(&c, &n, &o, Some(wait)).await })
    }

    /// Client `i` takes the name as `entry`, waiting up to `wait` (a try without).
    async fn take(
        &self,
        i: usize,
        entry: Entry,
        wait: Option<Duration>,
    ) -> distlock::Result<Lease> {
        entry
            .take(&self.clients[i], &self.name, &self.opts, wait)
            .await
    }

    /// Waits until the name holds `n` keys.
    async fn count_until(&self, n: usize) {
        let mut admin = self.admin.clone();
        let count = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        for _ in 0..500 {
            let r = admin
                .get(self.prefix.as_str(), Some(count.clone()))
                .await
                .expect("count");
            if r.count() as usize == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} never held {n} keys", self.prefix);
    }
}
