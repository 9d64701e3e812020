//! Redlock over 5 masters under faults (issue 5): what a majority buys, and the hazards it does
//! not remove, asserted as such.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient, LockName};
use distlock_conformance::deployments::redlock::{RedlockDeployment, deploy, options};
use distlock_conformance::harness::{Proxy, ProxyMode};
use distlock_redis::RedlockBackend;
use distlock_redis::keys::lock_keys;
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(3);

async fn client(d: &RedlockDeployment) -> LockClient {
    // Clients connect while every node is up; nodes fail afterwards.
    LockClient::new(Arc::new(
        RedlockBackend::connect(&d.urls(), options())
            .await
            .expect("connect"),
    ))
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid")
}

/// Waits (5 s at most) until one waiter is queued on `name`'s arbiter, node `arbiter`.
async fn queued_on(d: &RedlockDeployment, arbiter: usize, name: &LockName) {
    let queue = lock_keys(&options().prefix, name).queue().to_string();
    let mut admin = d.masters.nodes[arbiter].admin().await.expect("admin");
    let mut queued = 0u64;
    for _ in 0..500 {
        queued = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut admin)
            .await
            .expect("ZCARD");
        if queued == 1 {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(queued, 1, "no waiter queued on the arbiter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_still_grants() {
    let d = deploy(5, false).await;
    let a = client(&d).await;
    d.masters.nodes[0].process().kill();
    d.masters.nodes[1].process().kill();
    let lease = a
        .try_acquire("minority", &AcquireOptions::with_ttl(TTL))
        .await
        .expect("3 of 5 grant");
    assert_eq!(d.nodes_holding(&name("minority")).await, 3);
    assert!(
        lease.fencing_token().is_none(),
        "Redlock must not hand out a token that looks monotonic"
    );
    assert!(
        lease.release().await.expect("release"),
        "a majority confirmed the release"
    );
    assert_eq!(d.nodes_holding(&name("minority")).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_arbiter_is_down_still_takes_the_lock_at_its_release() {
    let d = deploy(5, false).await;
    let a = client(&d).await;
    let backend = RedlockBackend::connect(&d.urls(), options())
        .await
        .expect("connect");
    let arbiter = backend.arbiter(&name("arbiter-down"));
    let b = LockClient::new(Arc::new(backend));
    d.masters.nodes[arbiter].process().kill();
    let held = a
        .try_acquire("arbiter-down", &AcquireOptions::with_ttl(TTL))
        .await
        .expect("4 of 5 grant");
    let waiter = tokio::spawn(async move {
        b.acquire(
            "arbiter-down",
            &AcquireOptions::with_ttl(TTL),
            Duration::from_secs(2),
        )
        .await
    });
    // Refused at first; its retries find the arbiter silent and go to every node instead.
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "granted while the lock was held");
    assert!(held.release().await.expect("release"));
    let lease = waiter
        .await
        .expect("task")
        .expect("granted without the arbiter");
    assert_eq!(d.nodes_holding(&name("arbiter-down")).await, 4);
    assert!(lease.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_its_arbiter_granted_that_crashed_holds_the_queue_up_only_until_its_lock_expires()
{
    let d = deploy(3, false).await;
    let n = name("crashed-head");
    let backend = RedlockBackend::connect(&d.urls(), options())
        .await
        .expect("connect");
    let arbiter = backend.arbiter(&n);
    let (a, b, c) = (
        client(&d).await,
        LockClient::new(Arc::new(backend)),
        client(&d).await,
    );
    let held = a
        .try_acquire("crashed-head", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .expect("acquire");
    // b waits in the arbiter's queue, is told at a's release and granted there: it keeps the
    // queue's head while it holds.
    let short = AcquireOptions::with_ttl(Duration::from_millis(300)).fixed();
    let b_waits = {
        let short = short.clone();
        tokio::spawn(async move {
            b.acquire("crashed-head", &short, Duration::from_secs(10))
                .await
        })
    };
    queued_on(&d, arbiter, &n).await;
    assert!(held.release().await.expect("release"));
    let crashed = b_waits.await.expect("task").expect("b is granted");
    // b crashes: no release, no renewal. Its place in the queue must not outlive its lock (300
    // ms), or c, queued behind it, would wait for the queue's liveness (3 s).
    std::mem::forget(crashed);
    let granted = c
        .acquire("crashed-head", &short, Duration::from_secs(2))
        .await
        .expect("granted once b's lock expired, well within the queue's liveness");
    assert!(granted.release().await.expect("release"));
}

/// A waiter that goes silent (its process died) while it heads the arbiter's queue is told its
/// turn at the release and never takes it. The arbiter refuses newcomers for a live head, so the
/// name is held up, but only until that head's liveness runs out (3 s): not for good, and not
/// for the TTL the dead waiter asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_heading_the_arbiters_queue_holds_the_name_only_for_its_liveness() {
    let d = deploy(3, false).await;
    let n = name("dead-waiter");
    let proxies: Vec<Proxy> = d
        .masters
        .nodes
        .iter()
        .map(|node| Proxy::start(([127, 0, 0, 1], node.port()).into()).expect("proxy"))
        .collect();
    let through: Vec<String> = proxies
        .iter()
        .map(|p| format!("redis://{}", p.addr()))
        .collect();
    let (holder, newcomer) = (client(&d).await, client(&d).await);
    let dying = LockClient::new(Arc::new(
        RedlockBackend::connect(&through, options())
            .await
            .expect("connect"),
    ));
    let long = AcquireOptions::with_ttl(Duration::from_secs(30));
    let held = holder
        .try_acquire("dead-waiter", &long)
        .await
        .expect("acquire");
    let dead = {
        let long = long.clone();
        tokio::spawn(async move {
            dying
                .acquire("dead-waiter", &long, Duration::from_secs(60))
                .await
        })
    };
    let arbiter = RedlockBackend::connect(&d.urls(), options())
        .await
        .expect("connect")
        .arbiter(&n);
    queued_on(&d, arbiter, &n).await;
    for p in &proxies {
        p.set_mode(ProxyMode::Blackhole);
    }
    let released = Instant::now();
    assert!(held.release().await.expect("release"));
    let lease = newcomer
        .acquire("dead-waiter", &long, Duration::from_secs(10))
        .await
        .expect("granted once the dead head's liveness ran out");
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "the newcomer waited {waited:?} behind a dead head"
    );
    assert!(lease.release().await.expect("release"));
    // The silent waiter ends once its links are back (a lease it got, if any, goes).
    for p in &proxies {
        p.set_mode(ProxyMode::Pass);
        p.reset();
    }
    let outcome = tokio::time::timeout(Duration::from_secs(30), dead)
        .await
        .expect("the silent waiter ends")
        .expect("task");
    if let Ok(lease) = outcome {
        let _ = lease.release().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_fails_and_leaves_no_partial_keys() {
    let d = deploy(5, false).await;
    let a = client(&d).await;
    for i in 0..3 {
        d.masters.nodes[i].process().kill();
    }
    let err = a
        .try_acquire("majority", &AcquireOptions::with_ttl(TTL))
        .await
        .expect_err("2 of 5 cannot grant");
    assert!(err.is_retryable(), "{err}");
    assert_eq!(
        d.nodes_holding(&name("majority")).await,
        0,
        "the granted minority was not released"
    );
    let err = a
        .acquire(
            "majority",
            &AcquireOptions::with_ttl(TTL),
            Duration::from_millis(500),
        )
        .await
        .expect_err("still no majority");
    assert!(err.is_retryable(), "{err}");
    assert_eq!(d.nodes_holding(&name("majority")).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_shortens_the_validity_and_a_paused_majority_fails() {
    let d = deploy(5, false).await;
    let a = client(&d).await;
    d.masters.nodes[4].process().pause();
    let before = Instant::now();
    let lease = a
        .try_acquire("paused-node", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .expect("4 of 5 grant");
    let waited = before.elapsed();
    assert!(
        waited >= options().node_timeout,
        "the round did not wait for the paused node"
    );
    // Validity = TTL - elapsed - drift: the time spent waiting for the paused node is gone.
    assert!(
        lease.remaining() <= TTL - options().node_timeout,
        "validity {:?} not shortened by the {:?} wait",
        lease.remaining(),
        waited
    );
    assert!(lease.release().await.expect("release"));
    d.masters.nodes[3].process().pause();
    d.masters.nodes[2].process().pause();
    let err = a
        .try_acquire("paused-node", &AcquireOptions::with_ttl(TTL))
        .await
        .expect_err("2 of 5 answer");
    assert!(err.is_retryable(), "{err}");
    for i in 2..5 {
        d.masters.nodes[i].process().resume();
    }
    // The paused nodes answered late; the failed round released them too.
    let freed = async {
        while d.nodes_holding(&name("paused-node")).await > 0 {
            sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(TTL * 2, freed)
        .await
        .expect("late grants were released or expired");
}

/// The documented hazard: a node that crashes and restarts empty before the TTL ran out lets a
/// second client reach a majority while the first still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_restart_within_the_ttl_gives_two_holders() {
    let d = deploy(5, false).await;
    let (a, b) = (client(&d).await, client(&d).await);
    // A gets exactly nodes 0, 1, 2: 3 and 4 are paused during its round.
    d.masters.nodes[3].process().pause();
    d.masters.nodes[4].process().pause();
    let first = a
        .try_acquire("hazard", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .expect("3 of 5");
    d.masters.nodes[3].process().resume();
    d.masters.nodes[4].process().resume();
    // Node 2 crashes and comes back at once, without its data.
    d.masters.nodes[2].process().kill();
    d.masters.nodes[2].process().restart().expect("restart");
    let second = b
        .acquire("hazard", &AcquireOptions::with_ttl(TTL).fixed(), TTL)
        .await
        .expect("nodes 2, 3, 4 grant the second client");
    assert!(
        first.lost_reason().is_none() && !first.remaining().is_zero(),
        "the first holder still believes it holds"
    );
    assert!(!second.remaining().is_zero());
    // Two holders at once: this is the hazard, not a bug to hide. Fencing (etcd, ZooKeeper)
    // is the remedy; Redlock has no token to offer.
    drop((first, second));
}

/// The same crash, with the restart delayed beyond the TTL: the first lease has run out before
/// anyone else can reach a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_restart_after_the_ttl_gives_no_second_holder() {
    let d = deploy(5, false).await;
    let (a, b) = (client(&d).await, client(&d).await);
    d.masters.nodes[3].process().pause();
    d.masters.nodes[4].process().pause();
    let first = a
        .try_acquire("delayed", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .expect("3 of 5");
    d.masters.nodes[3].process().resume();
    d.masters.nodes[4].process().resume();
    d.masters.nodes[2].process().kill();
    sleep(TTL + Duration::from_millis(300)).await;
    d.masters.nodes[2].process().restart().expect("restart");
    let second = b
        .acquire("delayed", &AcquireOptions::with_ttl(TTL).fixed(), TTL)
        .await
        .expect("the second client acquires after the TTL");
    assert!(
        first.lost_reason().is_some(),
        "the first lease had to be over before the second began"
    );
    assert!(first.remaining().is_zero());
    drop(second);
}

/// An acquire dropped while some nodes granted and others hang (three of five under
/// `CLIENT PAUSE ... WRITE`) leaves no key behind on the nodes that granted: they are released
/// at once in the background, not left for the TTL with nobody holding the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_mid_round_leaves_no_key() {
    let d = deploy(5, false).await;
    let a = client(&d).await;
    let lock = name("dropped-mid-round");
    for node in &d.masters.nodes[2..] {
        let reply = node.command("CLIENT PAUSE 2000 WRITE").unwrap_or_default();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    let ttl = AcquireOptions::with_ttl(Duration::from_secs(10));
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        a.acquire("dropped-mid-round", &ttl, Duration::from_secs(5)),
    )
    .await;
    assert!(dropped.is_err(), "the acquire finished: {dropped:?}");
    // The two nodes that granted are cleaned while the others still hang.
    let until = Instant::now() + Duration::from_millis(1_000);
    while d.nodes_holding(&lock).await > 0 {
        assert!(
            Instant::now() < until,
            "keys left on the nodes that granted"
        );
        sleep(Duration::from_millis(20)).await;
    }
    // Once the pause ends, the hung nodes' late writes are released too: the lock is free long
    // before its 10 s TTL.
    let b = client(&d).await;
    let until = Instant::now() + Duration::from_secs(4);
    let lease = loop {
        match b.acquire_until("dropped-mid-round", &ttl, until).await {
            Ok(l) => break l,
            // The paused majority cannot answer yet.
            Err(e) if e.is_retryable() && Instant::now() < until => {
                sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("not free after the pause: {e}"),
        }
    };
    assert!(lease.release().await.expect("release"));
}

/// The same, where the acquire's runtime ends mid-round (a process returning from `main` while
/// it waits): the round's clean-up task is dropped unrun with the runtime, and the keys on the
/// nodes that granted are released through new connections before the runtime's drop returns,
/// not left for the 10 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_runtime_ends_mid_round_leaves_no_key() {
    let d = deploy(5, false).await;
    let lock = name("ended-mid-round");
    let urls = d.urls();
    // The client connects through the pause: a connect writes nothing.
    for node in &d.masters.nodes[2..] {
        let reply = node.command("CLIENT PAUSE 2000 WRITE").unwrap_or_default();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    let ended = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let a = LockClient::new(Arc::new(
                RedlockBackend::connect(&urls, options())
                    .await
                    .expect("connect"),
            ));
            let ttl = AcquireOptions::with_ttl(Duration::from_secs(10));
            tokio::time::timeout(
                Duration::from_millis(100),
                a.acquire("ended-mid-round", &ttl, Duration::from_secs(5)),
            )
            .await
            .is_err()
        })
    });
    let cut_short = tokio::task::spawn_blocking(move || ended.join().expect("thread"))
        .await
        .expect("join");
    assert!(cut_short, "the acquire finished");
    assert_eq!(
        d.nodes_holding(&lock).await,
        0,
        "keys left on the nodes that granted"
    );
}

/// With the default options, a waiting acquire waits for as long as its caller said (here
/// 10 s against a holder that keeps the lock 6 s): it is not cut short by a count of rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_waits_its_whole_timeout() {
    let d = deploy(5, false).await;
    let o = distlock_redis::RedlockOptions {
        prefix: options().prefix,
        node_timeout: options().node_timeout,
        ..distlock_redis::RedlockOptions::default()
    };
    let connect = || async {
        LockClient::new(Arc::new(
            RedlockBackend::connect(&d.urls(), o.clone())
                .await
                .expect("connect"),
        ))
    };
    let (a, b) = (connect().await, connect().await);
    let held = a
        .try_acquire("whole-wait", &AcquireOptions::with_ttl(TTL))
        .await
        .expect("acquire");
    let waiter = tokio::spawn(async move {
        b.acquire(
            "whole-wait",
            &AcquireOptions::with_ttl(TTL),
            Duration::from_secs(10),
        )
        .await
    });
    sleep(Duration::from_secs(6)).await;
    assert!(!waiter.is_finished(), "the waiter gave up early");
    assert!(held.release().await.expect("release"));
    let lease = waiter
        .await
        .expect("task")
        .expect("granted within its timeout");
    assert!(lease.release().await.expect("release"));
}
