//! Redis through Sentinel: the client finds the master by service name and follows it when
//! Sentinel promotes the replica after the master dies.

use std::time::Duration;

use distlock::{AcquireOptions, LockClient, LockName};
use distlock_conformance::harness::{RedisReplicated, RedisSentinel};
use distlock_redis::keys::lock_keys;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_follows_the_master_sentinel_promotes() {
    let (servers, sentinel) = tokio::task::spawn_blocking(|| {
        let servers = RedisReplicated::start().expect("master + replica");
        let sentinel = RedisSentinel::start("locks", servers.master.port()).expect("sentinel");
        (servers, sentinel)
    })
    .await
    .expect("start");
    let url = format!(
        "redis+sentinel://{}/locks?op_timeout=1s&connect_timeout=2s",
        sentinel.url().trim_start_matches("redis://")
    );
    let locks = LockClient::new(distlock::connect(&url).await.expect("connect"));
    let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
    let before = locks.try_acquire("before", &opts).await.expect("acquire");
    let key = lock_keys("distlock", &LockName::new("before").expect("name")).lock;
    assert!(
        servers
            .master
            .command(&format!("EXISTS {key}"))
            .is_some_and(|r| r.starts_with(":1")),
        "the lock lives on the master Sentinel named"
    );

    servers.master.process().kill();
    let replica_port = servers.replica.port();
    let start = tokio::time::Instant::now();
    while sentinel.master_port("locks") != Some(replica_port) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "Sentinel did not fail over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The same client, no reconfiguration: retryable errors until it has followed the master.
    let after = loop {
        match locks.try_acquire("after", &opts).await {
            Ok(l) => break l,
            Err(e) if e.is_retryable() && start.elapsed() < Duration::from_secs(45) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("never followed the new master: {e}"),
        }
    };
    let key = lock_keys("distlock", &LockName::new("after").expect("name")).lock;
    assert!(
        servers
            .replica
            .command(&format!("EXISTS {key}"))
            .is_some_and(|r| r.starts_with(":1")),
        "the new lock lives on the promoted replica"
    );
    assert!(after.release().await.expect("release"));
    drop(before);
}
