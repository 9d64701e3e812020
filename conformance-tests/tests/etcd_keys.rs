//! etcd attempt keys: a client reuses one key per name for sequential acquires (etcd keeps an
//! index entry for every key ever created until compaction), never a key that may still exist,
//! and only the holder's secret releases it.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient, LockName};
use distlock_api::{GrantKey, OwnerSecret};
use distlock_conformance::deployments::etcd::{deploy, options};
use distlock_etcd::EtcdBackend;

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
        resource: fourth.backend_key().to_string(),
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
