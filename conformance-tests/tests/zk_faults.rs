//! ZooKeeper under faults: a 3-node ensemble's (issue 7), and a server past its connection cap.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient, LockError, LockName};
use distlock_conformance::Deployment;
use distlock_conformance::deployments::zk::{ZkDeployment, deploy, options};
use distlock_conformance::harness::{Proxy, ProxyMode, ZkEnsemble, reply_lost_as_the_runtime_ends};
use distlock_zk::{OnDisconnect, ZkBackend, ZkOptions};
use tokio::time::{Instant, sleep};

fn opts() -> AcquireOptions {
    AcquireOptions::with_ttl(Duration::from_secs(4))
}

fn proxies(ports: &[u16]) -> Vec<Proxy> {
    ports
        .iter()
        .map(|&p| Proxy::start(([127, 0, 0, 1], p).into()).expect("proxy"))
        .collect()
}

fn connect_string(proxies: &[Proxy]) -> String {
    proxies
        .iter()
        .map(|p| p.addr().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_a_lock_is_held() {
    let d = deploy("zk3", 3, false).await;
    // Waiting for the same session to come back (capped at the session timeout) rides out a
    // leader election, which takes well under a second here.
    let o = ZkOptions {
        session_timeout: Duration::from_secs(4),
        on_disconnect: OnDisconnect::WaitUpTo(Duration::from_secs(4)),
        ..options()
    };
    let a = LockClient::new(Arc::new(
        ZkBackend::connect(&d.ensemble.connect_string(), o.clone())
            .await
            .expect("connect"),
    ));
    let b = LockClient::new(Arc::new(
        ZkBackend::connect(&d.ensemble.connect_string(), o)
            .await
            .expect("connect"),
    ));
    let held = a
        .try_acquire("leader-kill", &opts())
        .await
        .expect("acquire");
    let leader = d.ensemble.leader().expect("a leader");
    d.ensemble.nodes[leader].kill();
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        if d.ensemble.leader().is_some_and(|l| l != leader) {
            break;
        }
        assert!(Instant::now() < until, "no new leader");
        sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..10 {
        assert!(
            held.lost_reason().is_none(),
            "lost across the election: {:?}",
            held.lost_reason()
        );
        match b.try_acquire("leader-kill", &opts()).await {
            Err(LockError::Busy { .. }) => {}
            Err(e) if e.is_retryable() => {}
            other => panic!("a competitor got {other:?} while the lock was held"),
        }
        sleep(Duration::from_millis(300)).await;
    }
    let old = held.fencing_token();
    assert!(held.release().await.expect("release"));
    let next = b
        .acquire("leader-kill", &opts(), Duration::from_secs(10))
        .await
        .expect("service resumes");
    assert!(
        next.fencing_token() > old,
        "czxid tokens went backwards across the election"
    );
    assert!(next.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_loses_to_a_higher_czxid_and_its_guarded_write_is_refused() {
    let d = deploy("zk3", 3, false).await;
    let p = proxies(&d.ensemble.client_ports);
    let paused = ZkBackend::connect(&connect_string(&p), options())
        .await
        .expect("connect");
    let fresh = ZkBackend::connect(&d.ensemble.connect_string(), options())
        .await
        .expect("connect");
    let data = "/guarded-data";
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    d.admin
        .create(data, b"none", &open)
        .await
        .expect("data node");
    let ttl = d.ttl();
    let old = LockClient::new(Arc::new(paused.clone()))
        .try_acquire("guarded", &AcquireOptions::with_ttl(ttl))
        .await
        .expect("acquire");
    p.iter().for_each(|x| x.set_mode(ProxyMode::Blackhole));
    let new = LockClient::new(Arc::new(fresh.clone()))
        .acquire("guarded", &AcquireOptions::with_ttl(ttl), ttl * 4)
        .await
        .expect("acquire after the pause");
    assert!(new.fencing_token() > old.fencing_token());
    p.iter().for_each(|x| x.set_mode(ProxyMode::Pass));
    let stale = loop {
        match paused
            .guarded_set_data(&old, data, b"old holder", None)
            .await
        {
            Err(e) if e.is_retryable() => sleep(Duration::from_millis(200)).await,
            other => break other.expect("guarded write"),
        }
    };
    assert!(!stale, "the paused holder's guarded write went through");
    assert!(
        fresh
            .guarded_set_data(&new, data, b"new holder", None)
            .await
            .expect("write")
    );
    assert_eq!(d.admin.get_data(data).await.expect("read").0, b"new holder");
    assert!(
        old.lost_reason().is_some(),
        "the paused holder was never told"
    );
    // A data node that does not exist is an error naming it, not a bare "NoNode".
    let missing = fresh
        .guarded_set_data(&new, "/guarded-missing", b"x", None)
        .await
        .expect_err("no such node");
    assert!(
        missing.to_string().contains("/guarded-missing"),
        "{missing}"
    );
    assert!(new.release().await.expect("release"));
}

/// Makes `name`'s queue directory (and the root above it).
async fn queue_dir(d: &ZkDeployment, name: &LockName) {
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let root = options().root;
    d.admin.create(&root, &[], &open).await.expect("root");
    d.admin
        .create(&distlock_zk::paths::lock_dir(&root, name), &[], &open)
        .await
        .expect("dir");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_loss_right_after_create_leaves_no_orphan() {
    let d = deploy("zk3", 3, false).await;
    let p = proxies(&d.ensemble.client_ports);
    let client = ZkBackend::connect(&connect_string(&p), options())
        .await
        .expect("connect");
    let name = LockName::new("lost-create-reply").expect("valid");
    // The queue directory exists beforehand, so the create itself is what loses its reply.
    queue_dir(&d, &name).await;
    p.iter().for_each(|x| x.set_mode(ProxyMode::DropReplies));
    let c = client.clone();
    let n = name.clone();
    // A wait, not a try: a try reads the queue before it creates (its read's reply would be
    // the one lost).
    let deadline = Instant::now() + Duration::from_secs(5);
    let attempt =
        tokio::spawn(async move { c.acquire(&n, Duration::from_secs(2), deadline).await });
    // The create reaches the ensemble; its reply does not reach us.
    let mut created = false;
    for _ in 0..100 {
        if d.artifacts(&name).await > 0 {
            created = true;
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }
    assert!(created, "the create never reached the server");
    p.iter().for_each(|x| {
        x.reset();
        x.set_mode(ProxyMode::Pass);
    });
    let outcome = attempt.await.expect("task");
    if let Ok(grant) = &outcome {
        assert_eq!(
            d.artifacts(&name).await,
            1,
            "a second node was created instead of finding ours"
        );
        assert!(client.release(&grant.key).await.expect("release"));
    }
    let until = Instant::now() + Duration::from_secs(10);
    while d.artifacts(&name).await > 0 {
        assert!(
            Instant::now() < until,
            "an orphan node was left behind (acquire: {outcome:?})"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// The same lost reply, where the process ends right then (its runtime dropped while the wait
/// has not heard its create's answer, so the node's path is unknown): the node goes before the
/// runtime's drop returns, found on a new session by the attempt's protected name, not left
/// heading the queue until the old session expires (4 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_unanswered_as_its_runtime_ends_leaves_no_node() {
    let d = deploy("zk", 1, false).await;
    let p = Arc::new(proxies(&d.ensemble.client_ports));
    let name = LockName::new("ended-unanswered").expect("valid");
    // The queue directory exists beforehand, so the create itself is what loses its reply.
    queue_dir(&d, &name).await;
    let n = name.clone();
    let landed = reply_lost_as_the_runtime_ends(
        &p,
        move |addrs, lose| async move {
            let client = ZkBackend::connect(&addrs.join(","), options())
                .await
                .expect("connect");
            lose.now();
            let deadline = Instant::now() + Duration::from_secs(10);
            let _ = client.acquire(&n, Duration::from_secs(60), deadline).await;
        },
        async || d.artifacts(&name).await > 0,
    )
    .await;
    assert!(landed, "the create never reached the server");
    assert_eq!(
        d.artifacts(&name).await,
        0,
        "the unanswered create's node outlived its process's runtime"
    );
}

/// A holder whose server is a follower cut off from the leader (its clients still reach it,
/// and it answers their pings and reads from its own copy until it gives up on the leader,
/// `syncLimit x tickTime` = 10 s on stock settings): the leader expires the holder's 4 s session
/// and grants the lock to another client. The holder must be told before that: its renewals
/// are proven through the leader, which a cut follower cannot reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_follower_cut_off_from_the_leader_is_told_before_another_is_granted() {
    let ensemble = tokio::task::spawn_blocking(|| {
        distlock_conformance::harness::ZkEnsemble::start_with_peer_links(3).expect("zookeeper")
    })
    .await
    .expect("start");
    let leader = ensemble.leader().expect("a leader");
    let follower = (leader + 1) % 3;
    let port = |i: usize| format!("127.0.0.1:{}", ensemble.client_ports[i]);
    let a = LockClient::new(Arc::new(
        ZkBackend::connect(&port(follower), options())
            .await
            .expect("connect to the follower"),
    ));
    let others: Vec<String> = (0..3).filter(|i| *i != follower).map(port).collect();
    let b = LockClient::new(Arc::new(
        ZkBackend::connect(&others.join(","), options())
            .await
            .expect("connect to the others"),
    ));
    let held = a
        .try_acquire("follower-cut", &opts())
        .await
        .expect("acquire");
    let signal = held.lost_signal();
    let told = tokio::spawn(async move {
        signal.wait().await;
        Instant::now()
    });
    ensemble.isolate(follower, true);
    let until = Instant::now() + Duration::from_secs(20);
    let won = loop {
        match b.try_acquire("follower-cut", &opts()).await {
            Ok(l) => break l,
            Err(e) if Instant::now() < until && (e.is_retryable()) => {
                sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the leader never freed the lock: {e}"),
        }
    };
    let won_at = Instant::now();
    assert!(
        told.is_finished(),
        "another client holds the lock while the cut-off holder still counts on it"
    );
    let told_at = told.await.expect("signal task");
    assert!(told_at <= won_at);
    ensemble.isolate(follower, false);
    assert!(won.release().await.expect("release"));
}

/// A host past a stock server's cap of 60 connections from one address (a cron host's 61st
/// `distlock run`, each its own client): no session is made, and the client is told why, the
/// server closing each new connection at once, not only that nothing answered. The 60 others
/// keep working, and once one is gone the next client connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_the_servers_connection_cap_is_told_why() {
    let zk = tokio::task::spawn_blocking(|| {
        ZkEnsemble::start_with_stock_connection_cap().expect("zookeeper")
    })
    .await
    .expect("start");
    let o = ZkOptions {
        op_timeout: Duration::from_secs(2),
        ..options()
    };
    let at = zk.connect_string();
    let connect = || ZkBackend::connect(&at, o.clone());
    let mut clients = Vec::new();
    for _ in 0..60 {
        clients.push(connect().await.expect("one of 60 clients connects"));
    }
    let refused = connect()
        .await
        .expect_err("a 61st connection from one address");
    let text = refused.to_string();
    assert!(
        text.contains("closes each new connection") && text.contains("maxClientCnxns"),
        "the client is not told why: {text}"
    );
    assert!(refused.is_retryable(), "{text}");
    let locks = LockClient::new(Arc::new(clients.pop().expect("a client")));
    let lease = locks.try_acquire("capped", &opts()).await.expect("acquire");
    assert!(lease.release().await.expect("release"));
    drop(locks);
    let late = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match connect().await {
                Ok(client) => return client,
                Err(_) => sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
    .expect("a client connects once another is gone");
    drop((late, clients));
}
