//! The Redis failover hazard, shown honestly: a master with one replica, replication blocked, a
//! lock taken on the master, the master killed and the replica promoted by hand. Without `WAIT`
//! a second client takes the same lock while the first still holds it, and the fencing counter
//! goes backwards: documented efficiency-grade behaviour, not a bug to hide. With
//! `min_replicas = 1` the first acquire fails (and releases) instead.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient, LockError, LockName};
use distlock_conformance::harness::{ProxyMode, RedisReplicated};
use distlock_redis::keys::lock_keys;
use distlock_redis::{RedisBackend, RedisOptions};

const TTL: Duration = Duration::from_secs(30);

async fn client(url: &str, min_replicas: u32) -> LockClient {
    let options = RedisOptions {
        // Above the replica timeout: WAIT holds the reply that long.
        op_timeout: Duration::from_secs(3),
        min_replicas,
        replica_timeout: Duration::from_secs(1),
        ..RedisOptions::default()
    };
    LockClient::new(Arc::new(
        RedisBackend::connect(url, options).await.expect("connect"),
    ))
}

async fn get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

async fn pair() -> RedisReplicated {
    tokio::task::spawn_blocking(|| RedisReplicated::start().expect("master + replica"))
        .await
        .expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_a_replica_fails_the_acquire_when_replication_is_blocked() {
    let servers = pair().await;
    let careful = client(&servers.master.url(), 1).await;
    let opts = AcquireOptions::with_ttl(TTL);
    // Control: with replication flowing, the replica acknowledges and the grant stands.
    let lease = careful
        .try_acquire("pay", &opts)
        .await
        .expect("acked grant");
    assert!(lease.release().await.expect("release"));

    servers.link.set_mode(ProxyMode::Blackhole);
    let err = careful
        .try_acquire("pay", &opts)
        .await
        .expect_err("no replica can acknowledge");
    assert!(
        matches!(
            &err,
            LockError::Backend {
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    // The unacknowledged grant was released, so nobody is locked out by it.
    let key = lock_keys("distlock", &LockName::new("pay").expect("name")).lock;
    let mut master = servers.master.admin().await.expect("admin");
    let start = tokio::time::Instant::now();
    while get(&mut master, &key).await.is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "grant not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_a_failover_gives_two_holders_and_a_token_going_backwards() {
    let servers = pair().await;
    let first = client(&servers.master.url(), 0).await;
    let opts = AcquireOptions::with_ttl(TTL);
    // Three hand-overs while replication flows: the replica has the counter at 3.
    for _ in 0..3 {
        let l = first.try_acquire("stock", &opts).await.expect("acquire");
        assert!(l.release().await.expect("release"));
    }
    let fence = lock_keys("distlock", &LockName::new("stock").expect("name"))
        .fence()
        .to_string();
    let mut replica = servers.replica.admin().await.expect("admin");
    let start = tokio::time::Instant::now();
    while get(&mut replica, &fence).await.as_deref() != Some("3") {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "replica never caught up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    servers.link.set_mode(ProxyMode::Blackhole);
    let held = first.try_acquire("stock", &opts).await.expect("acquire");
    let held_token = held.fencing_token().expect("token");
    assert_eq!(held_token.0, 4);

    servers.master.process().kill();
    let promoted = servers
        .replica
        .command("REPLICAOF NO ONE")
        .unwrap_or_default();
    assert!(promoted.starts_with("+OK"), "{promoted}");

    let second = client(&servers.replica.url(), 0).await;
    let stolen = second
        .try_acquire("stock", &opts)
        .await
        .expect("the promoted replica never saw the lock");
    assert!(
        held.lost_reason().is_none() && held.remaining() > Duration::from_secs(20),
        "the first holder still believes it holds: two holders"
    );
    let stolen_token = stolen.fencing_token().expect("token");
    assert!(
        stolen_token <= held_token,
        "the counter went backwards: {stolen_token:?} after {held_token:?}"
    );
}
