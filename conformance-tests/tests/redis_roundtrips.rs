//! Round trips of the Redis backend, counted by the server (`INFO commandstats`): an uncontended
//! acquire is one script call, a release is one, a watchdog tick for 100 leases is one.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::harness::RedisServer;
use distlock_redis::{RedisBackend, RedisOptions};

async fn script_calls(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("INFO");
    // Lines look like `cmdstat_evalsha:calls=3,usec=...`; EVAL counts too (script not cached).
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A server, an admin connection that reads its counters, and a lock client on it.
async fn setup() -> (RedisServer, redis::aio::MultiplexedConnection, LockClient) {
    let server = tokio::task::spawn_blocking(|| RedisServer::start().expect("redis"))
        .await
        .expect("start");
    let admin = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("admin");
    let backend = RedisBackend::connect(&server.url(), RedisOptions::default())
        .await
        .expect("connect");
    let locks = LockClient::new(Arc::new(backend));
    (server, admin, locks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_are_one_script_call_each() {
    let (_server, mut admin, locks) = setup().await;
    // A fixed lease: no watchdog renewal may run between the counts.
    let opts = AcquireOptions::with_ttl(Duration::from_secs(30)).fixed();
    // Warm up: the first call of each script also loads it (NOSCRIPT, SCRIPT LOAD).
    locks
        .try_acquire("warm", &opts)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let before = script_calls(&mut admin).await;
    let lease = locks.try_acquire("count", &opts).await.expect("acquire");
    let after_acquire = script_calls(&mut admin).await;
    assert!(lease.release().await.expect("release"));
    let after_release = script_calls(&mut admin).await;
    assert_eq!(
        after_acquire - before,
        1,
        "acquire took {} script calls",
        after_acquire - before
    );
    assert_eq!(
        after_release - after_acquire,
        1,
        "release took {} script calls",
        after_release - after_acquire
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_tick_for_100_leases_is_one_script_call() {
    let (_server, mut admin, locks) = setup().await;
    // Renewed every second.
    let opts = AcquireOptions::with_ttl(Duration::from_secs(3));
    let mut leases = Vec::new();
    for i in 0..100 {
        leases.push(
            locks
                .try_acquire(&format!("tick-{i}"), &opts)
                .await
                .expect("acquire"),
        );
    }
    // The first tick (at ~1 s) also loads the script; count the two after it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = script_calls(&mut admin).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = script_calls(&mut admin).await - before;
    assert_eq!(
        calls, 2,
        "two ticks of 100 leases took {calls} script calls"
    );
    assert!(leases.iter().all(|l| l.lost_reason().is_none()));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(leases[0].backend_key())
        .query_async(&mut admin)
        .await
        .expect("PTTL");
    assert!(ttl > 1_000, "the lease was renewed: PTTL {ttl} ms");
}
