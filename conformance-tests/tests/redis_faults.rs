//! Redis (one server, and a Cluster) under faults the conformance suite cannot express
//! generically: one hung Cluster node, a script cache flushed on a slow link, a dead waiter
//! handed the lock, a server out of memory, a slot resharded under a held lock.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, Lease, LockBackend, LockClient};
use distlock_conformance::deployments::redis::options;
use distlock_conformance::harness::{Proxy, ProxyMode, RedisCluster, RedisServer};
use distlock_conformance::refusal::refused_at_once;
use distlock_redis::keys::lock_keys;
use distlock_redis::{RedisBackend, RedisOptions};
use tokio::time::sleep;

async fn start<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("start")
}

/// The index of the node that owns `lease`'s key (the one that answers `EXISTS` with a count
/// instead of a redirection).
fn owner(cluster: &RedisCluster, lease: &Lease) -> usize {
    cluster
        .nodes
        .iter()
        .position(|n| {
            n.command(&format!("EXISTS {}", lease.backend_key()))
                .is_some_and(|r| r.starts_with(":1"))
        })
        .expect("some node holds the key")
}

/// One master of a 3-master Cluster stopped (SIGSTOP): the leases on the two healthy masters
/// stay renewed and held; only the stopped master's leases are lost. Then, with the script
/// cache flushed on the healthy masters, acquires there still work (the script is not loaded on
/// every node, which would wait for the stopped one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hung_cluster_node_costs_only_its_own_leases() {
    let cluster = start(|| RedisCluster::start(3).expect("cluster")).await;
    let ttl = Duration::from_secs(2);
    let backend: Arc<dyn LockBackend> = Arc::new(
        RedisBackend::connect_cluster(&cluster.urls(), options())
            .await
            .expect("connect"),
    );
    let client = LockClient::new(backend);
    let mut leases = Vec::new();
    for i in 0..12 {
        let lease = client
            .try_acquire(&format!("hung-{i}"), &AcquireOptions::with_ttl(ttl))
            .await
            .expect("acquire");
        let at = owner(&cluster, &lease);
        leases.push((at, lease));
    }
    let stopped = leases[0].0;
    assert!(
        leases.iter().any(|(at, _)| *at != stopped),
        "every key landed on one node"
    );
    cluster.nodes[stopped].process().pause();
    // Two TTLs: every lease went through several renewal ticks, each with the stopped node's
    // slot group hanging (the Cluster itself notices a stopped node only after 15 s).
    sleep(ttl * 2).await;
    for (at, lease) in &leases {
        if *at == stopped {
            assert!(
                lease.lost_reason().is_some(),
                "a lease on the stopped node was not lost"
            );
        } else {
            assert_eq!(
                lease.lost_reason(),
                None,
                "a lease on a healthy node was lost"
            );
        }
    }
    for (i, node) in cluster.nodes.iter().enumerate() {
        if i != stopped {
            assert!(
                node.command("SCRIPT FLUSH")
                    .is_some_and(|r| r.starts_with("+OK"))
            );
        }
    }
    let mut fresh = 0;
    for i in 0..12 {
        let name = format!("after-flush-{i}");
        let keys = lock_keys(
            &options().prefix,
            &distlock::LockName::new(name.as_str()).expect("valid"),
        );
        let on_healthy = cluster.nodes.iter().enumerate().any(|(i, n)| {
            i != stopped
                && n.command(&format!("EXISTS {}", keys.lock))
                    .is_some_and(|r| r.starts_with(':'))
        });
        if !on_healthy {
            continue; // its slot is on the stopped node
        }
        let lease = client
            .try_acquire(&name, &AcquireOptions::with_ttl(ttl))
            .await
            .expect("acquire on a healthy node with its script cache flushed");
        assert!(lease.release().await.expect("release"));
        fresh += 1;
    }
    assert!(fresh > 0, "no name landed on a healthy node");
    cluster.nodes[stopped].process().resume();
}

/// On a link with 350 ms each way and a 1 s per-request timeout, a call that finds the script
/// cache empty (`NOSCRIPT`, then the script sent again) needs two round trips, 1.4 s: each send
/// gets its own timeout, so the acquire and a clean-up release still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_on_a_slow_link_costs_no_call() {
    let server = start(|| RedisServer::start().expect("redis")).await;
    let proxy = Proxy::start(([127, 0, 0, 1], server.port()).into()).expect("proxy");
    let o = RedisOptions {
        op_timeout: Duration::from_secs(1),
        ..options()
    };
    let client = LockClient::new(Arc::new(
        RedisBackend::connect(&format!("redis://{}", proxy.addr()), o)
            .await
            .expect("connect"),
    ));
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(350)));
    let ttl = AcquireOptions::with_ttl(Duration::from_secs(10));
    let lease = client
        .try_acquire("slow-noscript", &ttl)
        .await
        .expect("acquire through NOSCRIPT on a slow link");
    assert!(
        server
            .command("SCRIPT FLUSH")
            .is_some_and(|r| r.starts_with("+OK"))
    );
    assert!(
        lease
            .release()
            .await
            .expect("release through NOSCRIPT on a slow link"),
        "the release did not find its lock"
    );
}

/// A waiter cut off while it heads the queue (a process that died, a link gone silent) is
/// granted the lock by the release all the same, but only for what its liveness has left: the
/// waiter behind it holds within a few seconds, not the 30 s the dead one asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_to_a_dead_waiter_is_free_once_its_liveness_runs_out() {
    let server = start(|| RedisServer::start().expect("redis")).await;
    let proxy = Proxy::start(([127, 0, 0, 1], server.port()).into()).expect("proxy");
    let direct = || async {
        LockClient::new(Arc::new(
            RedisBackend::connect(&server.url(), options())
                .await
                .expect("connect"),
        ))
    };
    let (holder, behind) = (direct().await, direct().await);
    let cut = LockClient::new(Arc::new(
        RedisBackend::connect(&format!("redis://{}", proxy.addr()), options())
            .await
            .expect("connect"),
    ));
    let opts = AcquireOptions::with_ttl(Duration::from_secs(30));
    let held = holder
        .try_acquire("dead-head", &opts)
        .await
        .expect("acquire");
    let o = opts.clone();
    let dead =
        tokio::spawn(async move { cut.acquire("dead-head", &o, Duration::from_secs(60)).await });
    let keys = lock_keys(
        &options().prefix,
        &distlock::LockName::new("dead-head").expect("name"),
    );
    let queued = || async {
        server
            .command(&format!("ZCARD {}", keys.queue()))
            .unwrap_or_default()
    };
    while !queued().await.starts_with(":1") {
        sleep(Duration::from_millis(10)).await;
    }
    // Subscribed and re-checked, then silent.
    sleep(Duration::from_millis(200)).await;
    proxy.set_mode(ProxyMode::Blackhole);
    let o = opts.clone();
    let next = tokio::spawn(async move {
        behind
            .acquire("dead-head", &o, Duration::from_secs(20))
            .await
    });
    while !queued().await.starts_with(":2") {
        sleep(Duration::from_millis(10)).await;
    }
    let released = tokio::time::Instant::now();
    assert!(held.release().await.expect("release"));
    let lease = next.await.expect("task").expect("the live waiter holds");
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "the live waiter waited {waited:?} behind a dead one's grant"
    );
    assert!(lease.release().await.expect("release"));
    // The cut waiter ends one way or the other once its link is back (its lease, if any, goes).
    proxy.reset();
    let outcome = tokio::time::timeout(Duration::from_secs(30), dead)
        .await
        .expect("the cut waiter ends")
        .expect("task");
    if let Ok(lease) = outcome {
        let _ = lease.release().await;
    }
}

/// A server at its `maxmemory` with `noeviction` (the policy the guide asks for: an evicting one
/// would drop fence counters): it refuses every command that may grow its memory, unless a
/// script already wrote. A new acquire must then fail at once with the server's reason, not wait
/// out its deadline; a release hands the lock on to its waiter; a lock already held is renewed
/// and released, and a waiter whose refresh of its place comes first ends, told why, rather than
/// waits; and once memory is freed, locks are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_memory_refuses_new_locks_and_keeps_held_ones() {
    // The limit is the setting this scenario varies (stock: none).
    let server = start(|| {
        RedisServer::start_with(
            &["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"],
            None,
        )
        .expect("redis with maxmemory")
    })
    .await;
    let connect = || async {
        LockClient::new(Arc::new(
            RedisBackend::connect(&server.url(), options())
                .await
                .expect("connect"),
        ))
    };
    let (holder, waiter, newcomer) = (connect().await, connect().await, connect().await);
    let ttl = Duration::from_secs(2);
    let opts = AcquireOptions::with_ttl(ttl);
    let held = holder.try_acquire("oom", &opts).await.expect("acquire");
    let o = opts.clone();
    let waiting =
        tokio::spawn(async move { waiter.acquire("oom", &o, Duration::from_secs(60)).await });
    let (h2, w2) = (connect().await, connect().await);
    let held2 = h2.try_acquire("oom-hand", &opts).await.expect("acquire");
    let o = opts.clone();
    let waiting2 =
        tokio::spawn(async move { w2.acquire("oom-hand", &o, Duration::from_secs(60)).await });
    sleep(Duration::from_millis(300)).await;
    let mut filled = 0;
    while filled < 200 {
        let r = server
            .command(&format!("SETRANGE fill:{filled} 99999 x"))
            .unwrap_or_default();
        if r.starts_with("-OOM") {
            break;
        }
        filled += 1;
    }
    assert!(
        filled < 200,
        "20 MB went into a server with 8 MB of maxmemory"
    );
    // A release as the server fills hands the lock on all the same: a script that has written
    // (its delete) may go on writing, so the grant is not refused.
    assert!(held2.release().await.expect("a release on a full server"));
    let granted = waiting2
        .await
        .expect("task")
        .expect("the next waiter granted by a release on a full server");
    assert!(granted.fencing_token().is_some());
    assert!(granted.release().await.expect("release"));
    refused_at_once(&newcomer, "oom-2", &opts, "OOM").await;
    // Two TTLs: the held lock is renewed on a full server.
    sleep(ttl * 2).await;
    assert!(
        held.lost_reason().is_none(),
        "lost on a full server: {:?}",
        held.lost_reason()
    );
    assert!(held.release().await.expect("release on a full server"));
    // A waiter refreshes its place in the queue, a write the full server refuses: it may be
    // told so before the release reaches it.
    let outcome = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the queued waiter ends")
        .expect("task");
    match outcome {
        Ok(lease) => assert!(lease.release().await.expect("release")),
        Err(e) => assert!(
            e.to_string().contains("OOM") && e.is_retryable(),
            "the waiter was told something else: {e}"
        ),
    }
    for i in 0..=filled {
        server.command(&format!("DEL fill:{i}"));
    }
    for name in ["oom", "oom-2"] {
        let again = newcomer
            .try_acquire(name, &opts)
            .await
            .expect("a lock once memory is freed");
        assert!(again.release().await.expect("release"));
    }
}

/// Moves `slot` from master `from` to master `to` as `redis-cli --cluster reshard` does: the
/// target importing, the source migrating, the keys moved in one `MIGRATE`, then the slot
/// assigned to the target on every node.
async fn move_slot(cluster: &RedisCluster, slot: u16, (from, to): (usize, usize)) {
    let id = |i: usize| {
        cluster.nodes[i]
            .command("CLUSTER MYID")
            .and_then(|r| r.lines().nth(1).map(str::to_string))
            .expect("node id")
    };
    let (from_id, to_id) = (id(from), id(to));
    let setslot = |state: &str, id: &str| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot).arg(state).arg(id);
        c
    };
    let mut src = cluster.nodes[from].admin().await.expect("admin");
    let mut dst = cluster.nodes[to].admin().await.expect("admin");
    let _: () = setslot("IMPORTING", &from_id)
        .query_async(&mut dst)
        .await
        .expect("importing");
    let _: () = setslot("MIGRATING", &to_id)
        .query_async(&mut src)
        .await
        .expect("migrating");
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query_async(&mut src)
        .await
        .expect("keys");
    assert!(!keys.is_empty(), "nothing to move in slot {slot}");
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(cluster.nodes[to].port())
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&keys)
        .query_async(&mut src)
        .await
        .expect("migrate");
    for node in &cluster.nodes {
        let mut c = node.admin().await.expect("admin");
        let _: () = setslot("NODE", &to_id)
            .query_async(&mut c)
            .await
            .expect("node");
    }
}

/// A Cluster resharded under a held lock and its waiter: the holder keeps its lease through
/// the move (its renewals follow the redirection), its release hands the lock on to the
/// waiter on the new node, and the fencing counter moved with the lock (the next token is
/// higher).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_its_waiter_move_with_their_slot() {
    let cluster = start(|| RedisCluster::start(3).expect("cluster")).await;
    let ttl = Duration::from_secs(1);
    let opts = AcquireOptions::with_ttl(ttl);
    let connect = || async {
        let b: Arc<dyn LockBackend> = Arc::new(
            RedisBackend::connect_cluster(&cluster.urls(), options())
                .await
                .expect("connect"),
        );
        LockClient::new(b)
    };
    let (a, b) = (connect().await, connect().await);
    let held = a.try_acquire("moving", &opts).await.expect("acquire");
    let waiter = tokio::spawn({
        let opts = opts.clone();
        async move { b.acquire("moving", &opts, Duration::from_secs(30)).await }
    });
    sleep(Duration::from_millis(300)).await;
    let from = owner(&cluster, &held);
    let to = (from + 1) % cluster.nodes.len();
    let slot: u16 = {
        let mut c = cluster.nodes[from].admin().await.expect("admin");
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(held.backend_key())
            .query_async(&mut c)
            .await
            .expect("keyslot")
    };
    move_slot(&cluster, slot, (from, to)).await;
    assert_eq!(owner(&cluster, &held), to, "the key did not move");
    sleep(ttl * 2).await;
    assert_eq!(
        held.lost_reason(),
        None,
        "the holder lost its lease in the move"
    );
    assert!(
        !waiter.is_finished(),
        "the wait ended while the lock was held"
    );
    let token = held.fencing_token();
    assert!(
        held.release().await.expect("release"),
        "release found nothing held"
    );
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not handed the lock")
        .expect("join")
        .expect("the waiter's acquire");
    assert!(
        next.fencing_token() > token,
        "the token went back after the move"
    );
    sleep(ttl * 2).await;
    assert_eq!(next.lost_reason(), None, "the new holder lost its lease");
    assert!(next.release().await.expect("release"));
}
