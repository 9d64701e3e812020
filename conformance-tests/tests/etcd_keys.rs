//! etcd attempt keys: a client reuses one key per name for sequential acquires (etcd keeps an
//! index entry for every key ever created until compaction), never a key that may still exist,
//! and only the holder's secret releases it; a session holds more keys than one answer can list.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient, LockName};
use distlock_api::{GrantKey, OwnerSecret};
use distlock_conformance::deployments::etcd::{deploy, options};
use distlock_etcd::{EtcdBackend, EtcdOptions};

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
    let name = "cleared";
    let prefix =
        distlock_etcd::keys::name_prefix(&options().prefix, &LockName::new(name).expect("valid"));
    let mut admin = etcd_client::Client::connect(d.cluster.endpoints(), None)
        .await
        .expect("connect");
    let mut clients = Vec::new();
    for _ in 0..19 {
        let backend = EtcdBackend::connect(&d.cluster.endpoints(), options())
            .await
            .expect("connect");
        clients.push(LockClient::new(Arc::new(backend)));
    }
    let opts = AcquireOptions::with_ttl(Duration::from_secs(30));
    let wait = Duration::from_secs(20);
    // Each round has even odds to show the old order (eight rounds: all but certain).
    for round in 0..8 {
        let holder = clients[0].try_acquire(name, &opts).await.expect("acquire");
        // 15 waiters that release at once, then one that holds: the nearest ahead of the last.
        let mut passing = Vec::new();
        for c in &clients[1..16] {
            let c = c.clone();
            let opts = opts.clone();
            passing.push(tokio::spawn(async move {
                let lease = c.acquire(name, &opts, wait).await.expect("acquire");
                assert!(lease.release().await.expect("release"));
            }));
            queued_until(&mut admin, &prefix, passing.len() + 1).await;
        }
        let (c, o) = (clients[16].clone(), opts.clone());
        let nearest = tokio::spawn(async move { c.acquire(name, &o, wait).await });
        queued_until(&mut admin, &prefix, 17).await;
        // 17 ahead: it follows its own key and the two nearest.
        let (c, o) = (clients[17].clone(), opts.clone());
        let last = tokio::spawn(async move { c.acquire(name, &o, wait).await });
        queued_until(&mut admin, &prefix, 18).await;
        assert!(holder.release().await.expect("release"));
        for t in passing {
            t.await.expect("a passing waiter");
        }
        let nearest = nearest.await.expect("join").expect("the nearest's grant");
        // The last has read its view again (the key two ahead went): one key ahead of it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let gone = admin
            .delete(
                prefix.clone(),
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

/// Waits until `prefix` holds `n` keys.
async fn queued_until(admin: &mut etcd_client::Client, prefix: &str, n: usize) {
    let count = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    for _ in 0..500 {
        let r = admin.get(prefix, Some(count.clone())).await.expect("count");
        if r.count() as usize >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{prefix} never held {n} keys");
}
