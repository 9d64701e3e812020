//! The guarded transaction: a write to data in the same database commits only while its lease
//! holds, whatever the holder's pauses, and never after a successor's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, Guarantee, Lease, LockClient};
use distlock_conformance::deployments::postgres::options;
use distlock_conformance::harness::PostgresServer;
use distlock_postgres::tokio_postgres::{Client, NoTls};
use distlock_postgres::{PostgresBackend, guard};

const TTL: Duration = Duration::from_secs(1);

struct Setup {
    _server: PostgresServer,
    url: String,
    locks: [LockClient; 2],
}

async fn setup() -> Setup {
    let server =
        tokio::task::spawn_blocking(|| PostgresServer::start().unwrap_or_else(|e| panic!("{e}")))
            .await
            .expect("start");
    let hosts = || vec![format!("127.0.0.1:{}", server.port())];
    let client = || async {
        LockClient::new(Arc::new(
            PostgresBackend::connect(options(hosts()))
                .await
                .expect("connect"),
        ))
    };
    let locks = [client().await, client().await];
    let url = server.url();
    let data = connect(&url).await;
    data.batch_execute("CREATE TABLE ledger (id int PRIMARY KEY, writer text NOT NULL); INSERT INTO ledger VALUES (1, 'nobody')")
        .await
        .expect("data table");
    Setup {
        _server: server,
        url,
        locks,
    }
}

/// A user's own connection to the data.
async fn connect(url: &str) -> Client {
    let (client, connection) = distlock_postgres::tokio_postgres::connect(url, NoTls)
        .await
        .expect("data connection");
    tokio::spawn(connection);
    client
}

/// A lease that is not renewed: a paused holder's.
async fn fixed(locks: &LockClient, wait: Duration) -> Lease {
    let opts = AcquireOptions::with_ttl(TTL)
        .fixed()
        .guarantee(Guarantee::Correctness);
    locks.acquire("ledger", &opts, wait).await.expect("acquire")
}

/// Writes `who` into the ledger in a guarded transaction: whether the guard let it through.
async fn guarded_write(data: &mut Client, lease: &Lease, who: &str) -> bool {
    let txn = data.transaction().await.expect("begin");
    if !guard(&txn, lease).await.expect("guard") {
        return false;
    }
    txn.execute("UPDATE ledger SET writer = $1 WHERE id = 1", &[&who])
        .await
        .expect("write");
    txn.commit().await.expect("commit");
    true
}

async fn writer(url: &str) -> String {
    connect(url)
        .await
        .query_one("SELECT writer FROM ledger WHERE id = 1", &[])
        .await
        .expect("read")
        .get(0)
}

/// A holder paused past its TTL before its transaction: the guard itself refuses its write,
/// while its successor's commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_write_is_refused_by_the_guard_while_its_successors_commits() {
    let s = setup().await;
    let paused = fixed(&s.locks[0], TTL).await;
    let successor = fixed(&s.locks[1], TTL * 5).await;
    assert!(
        successor.fencing_token() > paused.fencing_token(),
        "granted in order"
    );
    let (mut a, mut b) = (connect(&s.url).await, connect(&s.url).await);
    assert!(guarded_write(&mut b, &successor, "successor").await);
    assert!(
        !guarded_write(&mut a, &paused, "paused").await,
        "the guard let a lease past its TTL write"
    );
    assert_eq!(writer(&s.url).await, "successor");
}

/// A holder whose guarded transaction runs on past its TTL (a slow statement, not idle) keeps
/// the lock from its successor until it commits: the successor is admitted only after the
/// commit, and its write lands after the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_transaction_past_its_ttl_holds_the_successor_until_it_commits() {
    let s = setup().await;
    let slow = fixed(&s.locks[0], TTL).await;
    let mut a = connect(&s.url).await;
    let txn = a.transaction().await.expect("begin");
    assert!(guard(&txn, &slow).await.expect("guard"), "held at first");
    let locks = s.locks[1].clone();
    let successor = tokio::spawn(async move {
        let lease = fixed(&locks, TTL * 10).await;
        (lease, Instant::now())
    });
    // Past the TTL inside the transaction, busy (an idle one is ended by the server).
    txn.batch_execute("SELECT pg_sleep(2.5)")
        .await
        .expect("slow work");
    txn.execute("UPDATE ledger SET writer = 'slow' WHERE id = 1", &[])
        .await
        .expect("write");
    // No grant can come before the commit is sent.
    let committing = Instant::now();
    txn.commit()
        .await
        .expect("the holder's transaction commits");
    let (lease, granted) = successor.await.expect("successor");
    assert!(
        granted >= committing,
        "the successor was admitted {:?} before the guarded transaction committed",
        committing - granted
    );
    assert_eq!(writer(&s.url).await, "slow");
    let mut b = connect(&s.url).await;
    assert!(guarded_write(&mut b, &lease, "successor").await);
    assert_eq!(writer(&s.url).await, "successor");
}

/// A guarded transaction left idle is ended by the server once idle for the lease's TTL: it
/// cannot hold the queue for ever, and its write never lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_guarded_transaction_is_ended_and_its_write_lost() {
    let s = setup().await;
    let idle = fixed(&s.locks[0], TTL).await;
    let mut a = connect(&s.url).await;
    let txn = a.transaction().await.expect("begin");
    assert!(guard(&txn, &idle).await.expect("guard"));
    txn.execute("UPDATE ledger SET writer = 'idle' WHERE id = 1", &[])
        .await
        .expect("write");
    let started = Instant::now();
    let successor = fixed(&s.locks[1], TTL * 10).await;
    assert!(
        started.elapsed() < TTL * 4,
        "the idle transaction held the queue for {:?}",
        started.elapsed()
    );
    assert!(
        txn.commit().await.is_err(),
        "an idle guarded transaction committed after its successor was admitted"
    );
    assert_eq!(writer(&s.url).await, "nobody");
    let mut b = connect(&s.url).await;
    assert!(guarded_write(&mut b, &successor, "successor").await);
}
