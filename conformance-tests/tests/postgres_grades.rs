//! The PostgreSQL backend's grade is the server's: correctness on a server that keeps grants
//! durably, refused (naming the failed check) on one that does not (no fsync, an asynchronous
//! standby), and a standby refused.

use std::time::Duration;

use distlock::{Config, Guarantee, LockBackend, Locks};
use distlock_conformance::deployments::postgres::{admin, options};
use distlock_conformance::harness::PostgresServer;
use distlock_postgres::PostgresBackend;

fn start(settings: &'static [(&'static str, &'static str)]) -> PostgresServer {
    PostgresServer::start_with(settings).unwrap_or_else(|e| panic!("{e}"))
}

/// Locks on `server`'s one backend, with the correctness profile named when `correctness`.
async fn load(server: &PostgresServer, correctness: bool) -> Result<Locks, distlock::ConfigError> {
    let profile = if correctness {
        "correctness = \"main\"\n"
    } else {
        ""
    };
    let toml = format!(
        "{profile}[backends.main]\nurl = \"{}?schema=grades\"\n",
        server.url()
    );
    Locks::from_config(&Config::from_toml(&toml)?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_server_gives_correctness() {
    let server = tokio::task::spawn_blocking(|| start(&[]))
        .await
        .expect("start");
    let backend = PostgresBackend::connect(options(vec![format!("127.0.0.1:{}", server.port())]))
        .await
        .expect("connect");
    assert_eq!(backend.downgrade_reason(), None);
    assert_eq!(backend.capabilities().guarantee, Guarantee::Correctness);
    let locks = load(&server, true)
        .await
        .expect("a correctness profile on a stock server");
    let lease = locks.correctness("grades").try_now().await.expect("lock");
    assert!(
        lease.fencing_token().is_some(),
        "a correctness lease carries a token"
    );
    assert!(lease.release().await.expect("release"));
}

/// The setting this scenario varies: `fsync=off` (a crash can lose committed grants, so their
/// tokens could be handed out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correctness_is_refused_on_a_server_without_fsync_naming_it() {
    let server = tokio::task::spawn_blocking(|| start(&[("fsync", "off")]))
        .await
        .expect("start");
    let backend = PostgresBackend::connect(options(vec![format!("127.0.0.1:{}", server.port())]))
        .await
        .expect("an efficiency client connects");
    let why = backend.downgrade_reason().expect("downgraded").to_string();
    assert!(why.contains("fsync is off"), "{why}");
    assert_eq!(backend.capabilities().guarantee, Guarantee::Efficiency);
    let refused = distlock::LockClient::new(std::sync::Arc::new(backend))
        .acquire(
            "grades",
            &distlock::AcquireOptions::default().guarantee(Guarantee::Correctness),
            Duration::from_secs(1),
        )
        .await
        .map(drop)
        .expect_err("a correctness lock on a server without fsync");
    assert!(
        matches!(refused, distlock::LockError::Unsupported { .. }),
        "{refused}"
    );
    let err = load(&server, true)
        .await
        .map(drop)
        .expect_err("a correctness profile on a server without fsync");
    assert!(err.to_string().contains("fsync is off"), "{err}");
    // Nobody asked for correctness: the one backend serves efficiency alone.
    let locks = load(&server, false).await.expect("an efficiency profile");
    assert_eq!(locks.profiles(), ("main", None));
}

fn host(server: &PostgresServer) -> String {
    format!("127.0.0.1:{}", server.port())
}

/// Polls `query` (one boolean) on a fresh connection to `server` until it answers true.
async fn until(server: &PostgresServer, query: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let admin = admin(server).await;
        let done: bool = admin.query_one(query, &[]).await.expect(query).get(0);
        if done {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never: {query}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A standby cannot write a grant: refused outright. Its primary, with that standby streaming
/// asynchronously, is graded efficiency (a failover could lose grants), naming why; once the
/// primary waits for it (`synchronous_standby_names`, the setting this scenario varies), it
/// gives correctness again, and several hosts find the primary among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_refused_and_an_asynchronous_one_downgrades_its_primary() {
    let (primary, standby) = tokio::task::spawn_blocking(|| {
        let primary = start(&[]);
        let standby = PostgresServer::start_standby(&primary).unwrap_or_else(|e| panic!("{e}"));
        (primary, standby)
    })
    .await
    .expect("start");
    let refused = PostgresBackend::connect(options(vec![host(&standby)]))
        .await
        .map(drop)
        .expect_err("a standby");
    assert!(refused.to_string().contains("standby"), "{refused}");
    assert!(!refused.is_retryable(), "{refused}");

    until(&primary, "SELECT count(*) = 1 FROM pg_stat_replication").await;
    let backend = PostgresBackend::connect(options(vec![host(&primary)]))
        .await
        .expect("connect");
    let why = backend.downgrade_reason().expect("downgraded").to_string();
    assert!(why.contains("asynchronously"), "{why}");

    let admin = admin(&primary).await;
    // One statement each: ALTER SYSTEM refuses to run in a transaction block.
    for statement in [
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(statement).await.expect(statement);
    }
    until(
        &primary,
        "SELECT current_setting('synchronous_standby_names') = '*'",
    )
    .await;
    // Long enough for the harness to see the grant's commit waiting below and cancel it.
    let patient = distlock_postgres::PostgresOptions {
        op_timeout: Duration::from_secs(10),
        ..options(vec![host(&standby), host(&primary)])
    };
    let backend = PostgresBackend::connect(patient)
        .await
        .expect("the primary among several hosts");
    assert_eq!(backend.downgrade_reason(), None);
    let client = distlock::LockClient::new(std::sync::Arc::new(backend));
    let correctness = distlock::AcquireOptions::default().guarantee(Guarantee::Correctness);
    let lease = client
        .try_acquire("grades", &correctness)
        .await
        .expect("a grant the synchronous standby acknowledges");
    assert!(lease.release().await.expect("release"));

    // The standby stops acknowledging, and the grant's commit waits for it until an operator
    // cancels the wait: the server keeps that commit on the primary alone (a failover would
    // lose it), so the grant counts as failed and is released, not held.
    standby.process().pause();
    let attempt = tokio::spawn({
        let (client, correctness) = (client.clone(), correctness.clone());
        async move { client.try_acquire("grades", &correctness).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    loop {
        let cancelled: i64 = admin
            .query_one(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity \
                 WHERE wait_event = 'SyncRep' AND application_name = 'distlock'",
                &[],
            )
            .await
            .expect("cancel")
            .get(0);
        if cancelled > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no commit waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Back before the answer: the release that follows it waits for the standby too.
    standby.process().resume();
    let refused = attempt
        .await
        .expect("join")
        .map(drop)
        .expect_err("a grant kept on the primary alone");
    assert!(
        refused.to_string().contains("synchronous standby"),
        "{refused}"
    );
    // Released, not held for its 30 s TTL: the lock is free well before.
    let lease = client
        .acquire("grades", &correctness, Duration::from_secs(10))
        .await
        .expect("the lock comes free");
    assert!(lease.release().await.expect("release"));
}

/// The disk syncs of the server's write-ahead log so far, once no client but the asking one is
/// connected (a backend's counts reach `pg_stat_wal` when it exits at the latest).
async fn wal_syncs(server: &PostgresServer) -> i64 {
    until(
        server,
        "SELECT count(*) = 0 FROM pg_stat_activity \
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .await;
    admin(server)
        .await
        .query_one("SELECT wal_sync FROM pg_stat_wal", &[])
        .await
        .expect("pg_stat_wal")
        .get(0)
}

/// Issue 39: only a grant waits for the disk. A release grants nothing and the durable commit
/// of the grant after it flushes the log up to its own, so an uncontended pair costs one sync,
/// the grant's (every commit waited for one before: two a pair, the release's in the way of the
/// hand-over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_waits_for_the_disk_once() {
    const PAIRS: i64 = 40;
    let server = tokio::task::spawn_blocking(|| start(&[]))
        .await
        .expect("start");
    let connect = || PostgresBackend::connect(options(vec![host(&server)]));
    // The layout is installed (its own syncs) before the count starts.
    drop(connect().await.expect("connect"));
    let before = wal_syncs(&server).await;
    let locks = distlock::LockClient::new(std::sync::Arc::new(connect().await.expect("connect")));
    let opts = distlock::AcquireOptions::with_ttl(Duration::from_secs(10));
    for _ in 0..PAIRS {
        let lease = locks.try_acquire("syncs", &opts).await.expect("acquire");
        assert!(lease.release().await.expect("release"));
    }
    drop(locks);
    let per_pair = (wal_syncs(&server).await - before) as f64 / PAIRS as f64;
    assert!(
        per_pair < 1.5,
        "{per_pair:.2} log syncs per acquire and release: the release should not wait for one"
    );
}
