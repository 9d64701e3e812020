//! etcd on a 3-member cluster under faults (issue 6).

use std::time::Duration;

use distlock::{AcquireOptions, LockClient, LockError, LockName};
use distlock_conformance::Deployment;
use distlock_conformance::deployments::etcd::{deploy, options};
use distlock_conformance::harness::{
    EtcdCluster, Proxy, ProxyMode, TempDir, reply_lost_as_the_runtime_ends,
};
use distlock_conformance::refusal::refused_at_once;
use distlock_etcd::{EtcdBackend, EtcdOptions, TxnOp};
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, GetOptions};
use tokio::time::{Instant, sleep};

fn opts(ttl: Duration) -> AcquireOptions {
    AcquireOptions::with_ttl(ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_a_lock_is_held() {
    let d = deploy("etcd3", 3, false).await;
    // A session TTL well above an election (about 1.5 s here), as in production.
    let o = EtcdOptions {
        session_ttl: Duration::from_secs(5),
        ..options()
    };
    let connect = || async {
        EtcdBackend::connect(&d.cluster.endpoints(), o.clone())
            .await
            .expect("connect")
    };
    let (a, b) = (
        LockClient::new(std::sync::Arc::new(connect().await)),
        LockClient::new(std::sync::Arc::new(connect().await)),
    );
    let held = a
        .try_acquire("leader-kill", &opts(Duration::from_secs(5)))
        .await
        .expect("acquire");
    let leader = d.cluster.leader().expect("a leader");
    d.cluster.members[leader].kill();
    let until = Instant::now() + Duration::from_secs(10);
    let mut new_leader = None;
    while new_leader.is_none() && Instant::now() < until {
        sleep(Duration::from_millis(100)).await;
        new_leader = d.cluster.leader();
    }
    assert!(new_leader.is_some_and(|l| l != leader), "no new leader");
    // The lock survives the election: still ours, still refused to others, for a while.
    for _ in 0..10 {
        assert!(
            held.lost_reason().is_none(),
            "lost across the election: {:?}",
            held.lost_reason()
        );
        match b
            .try_acquire("leader-kill", &opts(Duration::from_secs(5)))
            .await
        {
            Err(LockError::Busy { .. }) => {}
            Err(e) if e.is_retryable() => {}
            other => panic!("a competitor got {other:?} while the lock was held"),
        }
        sleep(Duration::from_millis(300)).await;
    }
    let old = held.fencing_token();
    assert!(held.release().await.expect("release"));
    let next = b
        .acquire(
            "leader-kill",
            &opts(Duration::from_secs(5)),
            Duration::from_secs(10),
        )
        .await
        .expect("service resumes");
    assert!(
        next.fencing_token() > old,
        "tokens went backwards across the election"
    );
    assert!(next.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_loses_to_a_higher_token_and_its_guarded_txn_fails() {
    let d = deploy("etcd3", 3, false).await;
    let proxies: Vec<Proxy> = d
        .cluster
        .client_ports
        .iter()
        .map(|&p| Proxy::start(([127, 0, 0, 1], p).into()).expect("proxy"))
        .collect();
    let through: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let paused = EtcdBackend::connect(&through, options())
        .await
        .expect("connect");
    let fresh = EtcdBackend::connect(&d.cluster.endpoints(), options())
        .await
        .expect("connect");
    let a = LockClient::new(std::sync::Arc::new(paused.clone()));
    let b = LockClient::new(std::sync::Arc::new(fresh.clone()));
    let ttl = d.ttl();
    let old = a.try_acquire("guarded", &opts(ttl)).await.expect("acquire");
    proxies
        .iter()
        .for_each(|p| p.set_mode(ProxyMode::Blackhole));
    let new = b
        .acquire("guarded", &opts(ttl), ttl * 4)
        .await
        .expect("acquire after the pause");
    assert!(new.fencing_token() > old.fencing_token());
    proxies.iter().for_each(|p| p.set_mode(ProxyMode::Pass));
    let stale = loop {
        match paused
            .guarded_txn(
                &old,
                vec![TxnOp::put("guarded/resource", "old holder", None)],
            )
            .await
        {
            Err(e) if e.is_retryable() => sleep(Duration::from_millis(200)).await,
            other => break other.expect("guarded txn"),
        }
    };
    assert!(!stale, "the paused holder's guarded txn went through");
    assert!(
        fresh
            .guarded_txn(
                &new,
                vec![TxnOp::put("guarded/resource", "new holder", None)]
            )
            .await
            .expect("txn")
    );
    let value = fresh
        .client()
        .get("guarded/resource", None)
        .await
        .expect("get");
    assert_eq!(value.kvs()[0].value(), b"new holder");
    assert!(
        old.lost_reason().is_some(),
        "the paused holder was never told"
    );
    assert!(new.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_waiting_leaves_no_stale_key() {
    let d = deploy("etcd3", 3, false).await;
    let ttl = d.ttl();
    let holder = LockClient::new(d.client().await);
    let (waiter, quitter) = (
        LockClient::new(d.client().await),
        LockClient::new(d.client().await),
    );
    let held = holder
        .try_acquire("compact", &opts(ttl))
        .await
        .expect("acquire");
    let w = tokio::spawn(async move {
        waiter
            .acquire("compact", &opts(ttl), Duration::from_secs(30))
            .await
    });
    let q = tokio::spawn(async move {
        quitter
            .acquire("compact", &opts(ttl), Duration::from_secs(3))
            .await
    });
    sleep(Duration::from_millis(500)).await;
    // Move the revision on, then compact everything the waiters' watches started from.
    let mut admin = fresh_admin(&d.cluster.endpoints()).await;
    for i in 0..20 {
        admin
            .put(format!("compact/noise/{i}"), "x", None)
            .await
            .expect("put");
    }
    let rev = admin
        .get("compact/noise/0", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    admin.compact(rev, None).await.expect("compact");
    assert!(
        matches!(q.await.expect("task"), Err(LockError::Timeout { .. })),
        "the short waiter should time out"
    );
    assert!(held.release().await.expect("release"));
    let got = w
        .await
        .expect("task")
        .expect("the waiter is granted after the compaction");
    assert!(got.release().await.expect("release"));
    let name = LockName::new("compact").expect("valid");
    assert_eq!(d.artifacts(&name).await, 0, "a stale key was left behind");
    let leftovers = admin
        .get(
            distlock_etcd::keys::name_prefix(&options().prefix, &name),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .expect("get");
    assert!(leftovers.kvs().is_empty());
}

/// A member out of space: etcd 3.4 compacts nothing unless told to, so a busy name's revisions
/// fill a stock member's 2 GiB quota, after which it raises `NOSPACE` and refuses every request
/// that puts. A new acquire must then fail at once with etcd's reason, not wait out its deadline;
/// a lock already held keeps its session (keep-alives are still served) and is released; a
/// waiter already queued is granted, as a grant writes nothing; and once the operator compacts,
/// defragments and disarms, locks are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_out_of_space_refuses_new_locks_and_keeps_held_ones() {
    let cluster = tokio::task::spawn_blocking(|| {
        EtcdCluster::start_tuned("--quota-backend-bytes=4194304").expect("etcd with a 4 MiB quota")
    })
    .await
    .expect("start");
    let connect = || async {
        let b = EtcdBackend::connect(&cluster.endpoints(), options())
            .await
            .expect("connect");
        LockClient::new(std::sync::Arc::new(b))
    };
    let (holder, waiter) = (connect().await, connect().await);
    // A client with its session made (its acquire's put is refused) and one without (its
    // session's lease grant is refused).
    let (newcomer, fresh) = (connect().await, connect().await);
    let ttl = options().session_ttl;
    let warm = newcomer
        .try_acquire("space-2", &opts(ttl))
        .await
        .expect("acquire");
    assert!(warm.release().await.expect("release"));
    let held = holder
        .try_acquire("space", &opts(ttl))
        .await
        .expect("acquire");
    let waiting = tokio::spawn(async move {
        waiter
            .acquire("space", &opts(ttl), Duration::from_secs(60))
            .await
    });
    sleep(Duration::from_millis(300)).await;
    let mut admin = fresh_admin(&cluster.endpoints()).await;
    let full = async {
        for i in 0..200 {
            if let Err(e) = admin
                .put(format!("fill/{i}"), vec![b'x'; 100_000], None)
                .await
            {
                return e.to_string();
            }
        }
        panic!("20 MB went into a member with a 4 MiB quota");
    }
    .await;
    assert!(full.contains("database space exceeded"), "{full}");
    for client in [&newcomer, &fresh] {
        refused_at_once(client, "space-2", &opts(ttl), "database space exceeded").await;
    }
    // Two session TTLs: the held lock's session is kept alive through the alarm.
    sleep(ttl * 2).await;
    assert!(
        held.lost_reason().is_none(),
        "lost on a full member: {:?}",
        held.lost_reason()
    );
    assert!(held.release().await.expect("release on a full member"));
    let got = waiting
        .await
        .expect("task")
        .expect("the queued waiter is granted on a full member");
    assert!(got.release().await.expect("release"));
    // The operator's way out: delete what filled it (deletes are served), compact, defragment,
    // disarm.
    let rev = admin
        .delete(
            "fill/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("delete")
        .header()
        .expect("header")
        .revision();
    admin.compact(rev, None).await.expect("compact");
    admin.defragment().await.expect("defragment");
    let alarms = admin
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .expect("alarms");
    for a in alarms.alarms() {
        let mut which = AlarmOptions::new();
        which.with_member(a.member_id());
        admin
            .alarm(AlarmAction::Deactivate, a.alarm(), Some(which))
            .await
            .expect("disarm");
    }
    for (client, name) in [(&newcomer, "space-2"), (&fresh, "space")] {
        let again = client
            .try_acquire(name, &opts(ttl))
            .await
            .expect("a lock once the alarm is cleared");
        assert!(again.release().await.expect("release"));
    }
}

/// With auth on, etcd hands each client a token that lapses: a stock member's simple tokens
/// after 300 s unused, JWTs after their TTL whatever the use. A holder that holds longer must
/// still renew and release, and a client idle that long must still lock: the client
/// authenticates again when etcd refuses its token. The lifetime is the setting varied here
/// (2 s), so the test outlives it in seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_outlives_its_auth_token() {
    let cluster = tokio::task::spawn_blocking(|| {
        EtcdCluster::start_tuned("--auth-token-ttl=2").expect("etcd with 2 s auth tokens")
    })
    .await
    .expect("start");
    let endpoints = cluster.endpoints();
    auth_on(&endpoints).await;
    let connect = || connect_app(&endpoints);
    let (holder, early, idle) = (connect().await, connect().await, connect().await);
    let ttl = options().session_ttl;
    let held = holder
        .try_acquire("token", &opts(ttl))
        .await
        .expect("acquire");
    // A waiter queued (and watching) before the token lapses, one after.
    let wait = |client: LockClient| {
        tokio::spawn(async move {
            let lease = client
                .acquire("token", &opts(ttl), Duration::from_secs(30))
                .await?;
            lease.release().await
        })
    };
    let first = wait(early);
    // Well past the token's 2 s, renewals keeping the session meanwhile.
    sleep(Duration::from_secs(5)).await;
    let second = wait(idle);
    sleep(Duration::from_millis(300)).await;
    assert!(
        held.lost_reason().is_none(),
        "lost past the token's lifetime: {:?}",
        held.lost_reason()
    );
    assert!(
        held.release()
            .await
            .expect("a release past the token's lifetime")
    );
    for (who, waiter) in [("early", first), ("late", second)] {
        let released = waiter
            .await
            .expect("task")
            .unwrap_or_else(|e| panic!("the {who} waiter past the token's lifetime: {e}"));
        assert!(released, "the {who} waiter's lock was gone at its release");
    }
}

/// With JWT tokens (etcd's advice for production), any change to the auth store (an operator
/// adds a user) makes etcd refuse every token issued before it, "revision of auth store is old",
/// however young. A holder must still release, a waiter queued before the change must still be
/// granted, and its client must still lock: the client authenticates again. A holder whose
/// connection breaks after the change (a member restarted, a network blip) opens its session's
/// keep-alive stream again, and must keep the lock past two session TTLs.
/// The token kind is the setting varied here (stock: simple tokens, which carry no revision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_outlives_an_auth_store_change_with_jwt_tokens() {
    let keys = TempDir::new("etcd-jwt").expect("temp dir");
    let (private, public) = (keys.path().join("jwt.key"), keys.path().join("jwt.pub"));
    for args in [
        vec!["genrsa", "-out", path(&private), "2048"],
        vec![
            "rsa",
            "-in",
            path(&private),
            "-pubout",
            "-out",
            path(&public),
        ],
    ] {
        let made = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl");
        assert!(made.status.success(), "openssl {args:?}: {made:?}");
    }
    let setting = format!(
        "--auth-token=jwt,pub-key={},priv-key={},sign-method=RS256",
        path(&public),
        path(&private)
    );
    let cluster = tokio::task::spawn_blocking(move || {
        EtcdCluster::start_tuned(&setting).expect("etcd with JWT tokens")
    })
    .await
    .expect("start");
    let endpoints = cluster.endpoints();
    auth_on(&endpoints).await;
    // The holder's traffic through a proxy that can reset its connection.
    let proxy = Proxy::start(endpoints[0].parse().expect("host:port")).expect("proxy");
    let (holder, waiter) = (
        connect_app(&[proxy.addr().to_string()]).await,
        connect_app(&endpoints).await,
    );
    let ttl = options().session_ttl;
    let held = holder
        .try_acquire("jwt", &opts(ttl))
        .await
        .expect("acquire");
    let waiting = tokio::spawn(async move {
        let lease = waiter
            .acquire("jwt", &opts(ttl), Duration::from_secs(30))
            .await?;
        lease.release().await
    });
    // Renewals have opened the holder's keep-alive stream by now.
    sleep(ttl).await;
    let mut root = etcd_client::Client::connect(
        &endpoints,
        Some(etcd_client::ConnectOptions::new().with_user("root", "rootpw")),
    )
    .await
    .expect("root");
    root.user_add("another", "pw", None)
        .await
        .expect("another user");
    proxy.reset();
    sleep(ttl * 2 + Duration::from_millis(500)).await;
    assert!(
        held.lost_reason().is_none(),
        "lost once its connection broke after the auth store changed: {:?}",
        held.lost_reason()
    );
    assert!(
        held.release()
            .await
            .expect("a release after the auth store changed")
    );
    let released = waiting
        .await
        .expect("task")
        .expect("a waiter queued before the auth store changed");
    assert!(released, "the waiter's lock was gone at its release");
    let again = holder
        .try_acquire("jwt", &opts(ttl))
        .await
        .expect("a lock after the auth store changed");
    assert!(again.release().await.expect("release"));
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// Turns auth on: a root user, and a user `app` (password `pw`) limited to the prefix `app/`.
async fn auth_on(endpoints: &[String]) {
    let mut admin = fresh_admin(endpoints).await;
    admin.user_add("root", "rootpw", None).await.expect("root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("root role");
    admin.role_add("app").await.expect("role");
    admin
        .role_grant_permission(
            "app",
            etcd_client::Permission::read_write("app/").with_prefix(),
        )
        .await
        .expect("permission");
    admin.user_add("app", "pw", None).await.expect("user");
    admin.user_grant_role("app", "app").await.expect("grant");
    admin.auth_enable().await.expect("auth on");
}

/// A lock client as the user `auth_on` made.
async fn connect_app(endpoints: &[String]) -> LockClient {
    let o = EtcdOptions {
        prefix: "app".into(),
        credentials: Some(("app".into(), "pw".into())),
        ..options()
    };
    let b = EtcdBackend::connect(endpoints, o).await.expect("connect");
    LockClient::new(std::sync::Arc::new(b))
}

async fn fresh_admin(endpoints: &[String]) -> etcd_client::Client {
    etcd_client::Client::connect(endpoints, None)
        .await
        .expect("admin")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_after_session_loss_reports_not_held() {
    let d = deploy("etcd3", 3, false).await;
    let (backend, cut) = d.cuttable_client().await;
    let name = LockName::new("renew-after-loss").expect("valid");
    let grant = backend.try_acquire(&name, d.ttl()).await.expect("acquire");
    cut.cut();
    sleep(d.ttl() * 2).await;
    cut.restore();
    let renewal = loop {
        match backend.renew(&grant.key, d.ttl()).await {
            Err(e) if e.is_retryable() => sleep(Duration::from_millis(200)).await,
            other => break other.expect("renew"),
        }
    };
    assert_eq!(renewal, distlock::Renewal::NotHeld);
    assert_eq!(d.artifacts(&name).await, 0);
}

/// Acquire + release pairs one client completes in `span`, and how many failed.
async fn pairs(client: &LockClient, span: Duration) -> (usize, usize) {
    let until = Instant::now() + span;
    let (mut done, mut failed) = (0, 0);
    while Instant::now() < until {
        match client
            .try_acquire("throughput", &opts(Duration::from_secs(2)))
            .await
        {
            Ok(lease) => match lease.release().await {
                Ok(_) => done += 1,
                Err(_) => failed += 1,
            },
            Err(e) if e.is_retryable() => failed += 1,
            Err(e) => panic!("{e}"),
        }
    }
    (done, failed)
}

/// A follower of three killed and restarted under a steady load: the client keeps working
/// while it is down (transport errors go to live members), and once it is back the client's
/// throughput returns to its level before the fault (the balancer dropped the dead member's
/// connection and takes it back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_comes_back_after_a_member_returns() {
    let d = deploy("etcd3", 3, false).await;
    let client = LockClient::new(d.client().await);
    let span = Duration::from_secs(3);
    let (before, _) = pairs(&client, span).await;
    let leader = d.cluster.leader().expect("a leader");
    let victim = (leader + 1) % 3;
    d.cluster.members[victim].kill();
    let (during, failed) = pairs(&client, span).await;
    tokio::task::block_in_place(|| d.cluster.members[victim].restart()).expect("restart");
    // The member catches up and the client reconnects.
    sleep(Duration::from_secs(2)).await;
    let (after, _) = pairs(&client, span).await;
    eprintln!(
        "pairs per {span:?}: before {before}, during {during} ({failed} failed), after {after}"
    );
    assert!(
        during > before / 4,
        "the client stalled while a member was down: {during} vs {before}"
    );
    // The defect this guards halved the throughput for good; a 3 s window on a loaded 2-core
    // machine varies by a fifth (seen: 767 after 992 before, with the balancer fixed).
    assert!(
        after * 3 >= before * 2,
        "throughput did not come back: {after} after, {before} before"
    );
}

/// A waiter cut off for longer than its session TTL (its session dies on the server) rides the
/// stall out: it queues again on a new session once the link is back, and is granted when the
/// holder lets go, within its deadline; it was an error ("the session lease died while waiting").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_rides_out_a_stall_longer_than_its_session() {
    let d = deploy("etcd", 1, false).await;
    let proxies: Vec<Proxy> = d
        .cluster
        .client_ports
        .iter()
        .map(|&p| Proxy::start(([127, 0, 0, 1], p).into()).expect("proxy"))
        .collect();
    let through: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let waiter = LockClient::new(std::sync::Arc::new(
        EtcdBackend::connect(&through, options())
            .await
            .expect("connect"),
    ));
    let holder = LockClient::new(std::sync::Arc::new(
        EtcdBackend::connect(&d.cluster.endpoints(), options())
            .await
            .expect("connect"),
    ));
    let ttl = d.ttl();
    let held = holder
        .try_acquire("stall", &opts(ttl))
        .await
        .expect("acquire");
    let waiting = tokio::spawn(async move { waiter.acquire("stall", &opts(ttl), ttl * 10).await });
    sleep(Duration::from_millis(300)).await;
    proxies
        .iter()
        .for_each(|p| p.set_mode(ProxyMode::Blackhole));
    // Longer than the session TTL: the waiter's session dies on the server.
    sleep(ttl + Duration::from_millis(1500)).await;
    proxies.iter().for_each(|p| {
        p.reset();
        p.set_mode(ProxyMode::Pass);
    });
    sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the wait ended: {:?}",
        waiting.await
    );
    let first = held.fencing_token();
    assert!(held.release().await.expect("release"));
    let granted = tokio::time::timeout(ttl * 4, waiting)
        .await
        .expect("granted after the stall")
        .expect("task")
        .expect("the wait rode out the stall");
    assert!(granted.fencing_token() > first);
    assert!(granted.release().await.expect("release"));
}

/// A wait whose enqueue put reached the member but whose answer did not, as its process's
/// runtime ends: the queued key goes before the runtime's drop returns (deleted by its name and
/// value through a new client), not left heading the queue until the session's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_unanswered_as_its_runtime_ends_leaves_no_key() {
    let d = deploy("etcd", 1, false).await;
    let proxies: std::sync::Arc<Vec<Proxy>> = std::sync::Arc::new(
        d.cluster
            .client_ports
            .iter()
            .map(|&p| Proxy::start(([127, 0, 0, 1], p).into()).expect("proxy"))
            .collect(),
    );
    let name = LockName::new("ended-unanswered").expect("valid");
    let landed = reply_lost_as_the_runtime_ends(
        &proxies,
        |addrs, lose| async move {
            let ttl = Duration::from_secs(30);
            let waiter = LockClient::new(std::sync::Arc::new(
                EtcdBackend::connect(&addrs, options())
                    .await
                    .expect("connect"),
            ));
            // The session (its lease) is made on another name first: only the put is left.
            let warm = waiter
                .try_acquire("ended-unanswered-warm", &opts(ttl))
                .await
                .expect("acquire");
            assert!(warm.release().await.expect("release"));
            lose.now();
            let _ = waiter
                .acquire("ended-unanswered", &opts(ttl), Duration::from_secs(60))
                .await;
        },
        async || d.artifacts(&name).await > 0,
    )
    .await;
    assert!(landed, "the put never reached the member");
    assert_eq!(
        d.artifacts(&name).await,
        0,
        "the unanswered put's key outlived its process's runtime"
    );
}

/// A holder whose member is cut from its peers while the holder still reaches it (the member
/// answers, but can no longer commit: it lost the quorum): its session lease is kept alive by
/// nobody, the others' leader expires it, and another client is granted the lock. The holder
/// must be told before that. The cut is real peer traffic blackholed in both directions, so
/// this also shows the harness isolates a member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_member_cut_from_its_peers_is_told_before_another_is_granted() {
    let cluster = tokio::task::spawn_blocking(|| {
        distlock_conformance::harness::EtcdCluster::start_with_peer_links(3).expect("etcd")
    })
    .await
    .expect("start");
    let leader = cluster.leader().expect("a leader");
    let follower = (leader + 1) % 3;
    let endpoints = cluster.endpoints();
    let a = LockClient::new(std::sync::Arc::new(
        EtcdBackend::connect(&endpoints[follower..=follower], options())
            .await
            .expect("connect to the follower"),
    ));
    let others: Vec<String> = (0..3)
        .filter(|i| *i != follower)
        .map(|i| endpoints[i].clone())
        .collect();
    let b = LockClient::new(std::sync::Arc::new(
        EtcdBackend::connect(&others, options())
            .await
            .expect("connect to the others"),
    ));
    let ttl = options().session_ttl;
    let held = a
        .try_acquire("member-cut", &opts(ttl))
        .await
        .expect("acquire");
    let signal = held.lost_signal();
    let told = tokio::spawn(async move {
        signal.wait().await;
        Instant::now()
    });
    cluster.isolate(follower, true);
    let until = Instant::now() + Duration::from_secs(20);
    let won = loop {
        match b.try_acquire("member-cut", &opts(ttl)).await {
            Ok(l) => break l,
            Err(LockError::Busy { .. }) if Instant::now() < until => {
                sleep(Duration::from_millis(50)).await
            }
            Err(e) if Instant::now() < until && e.is_retryable() => {
                sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the others never freed the lock: {e}"),
        }
    };
    let won_at = Instant::now();
    assert!(
        told.is_finished(),
        "another client holds the lock while the cut-off holder still counts on it"
    );
    let told_at = told.await.expect("signal task");
    assert!(told_at <= won_at);
    // The cut member's leader is gone from its view: it cannot serve a linearizable read.
    let cut_alone = etcd_client::Client::connect([endpoints[follower].clone()], None)
        .await
        .expect("connect");
    let read = tokio::time::timeout(
        Duration::from_secs(3),
        cut_alone.kv_client().get("member-cut-probe", None),
    )
    .await;
    assert!(
        !matches!(read, Ok(Ok(_))),
        "a member cut from its peers served a linearizable read"
    );
    assert!(won.release().await.expect("release"));
    // Healed, the member rejoins (3.4 runs no pre-vote: its higher term forces an election).
    cluster.isolate(follower, false);
}
