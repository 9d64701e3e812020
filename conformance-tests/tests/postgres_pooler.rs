//! Through a pooler: in session mode a client keeps its server process and works; in
//! transaction mode (where LISTEN and the queue's session cannot work) it is refused at
//! connect, naming the pooler, never left to wait for notifications that cannot come.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::deployments::postgres::options;
use distlock_conformance::harness::{Pgbouncer, PostgresServer};
use distlock_postgres::PostgresBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pooler_is_refused_and_a_session_pooler_works() {
    let (server, session, transaction) = tokio::task::spawn_blocking(|| {
        let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
        let session = Pgbouncer::start(&server, "session").unwrap_or_else(|e| panic!("{e}"));
        let transaction =
            Pgbouncer::start(&server, "transaction").unwrap_or_else(|e| panic!("{e}"));
        (server, session, transaction)
    })
    .await
    .expect("start");
    let through = |p: &Pgbouncer| options(vec![format!("127.0.0.1:{}", p.port())]);

    let refused = PostgresBackend::connect(through(&transaction))
        .await
        .map(drop)
        .expect_err("a pooler in transaction mode");
    assert!(
        refused.to_string().contains("pooler in transaction mode"),
        "{refused}"
    );
    assert!(!refused.is_retryable(), "{refused}");

    let locks = LockClient::new(Arc::new(
        PostgresBackend::connect(through(&session))
            .await
            .expect("through a session pooler"),
    ));
    let waiter = LockClient::new(Arc::new(
        PostgresBackend::connect(through(&session))
            .await
            .expect("through a session pooler"),
    ));
    let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
    let held = locks.try_acquire("pooled", &opts).await.expect("acquire");
    let (o, started) = (opts.clone(), std::time::Instant::now());
    let next =
        tokio::spawn(async move { waiter.acquire("pooled", &o, Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(held.release().await.expect("release"));
    let next = next
        .await
        .expect("waiter")
        .expect("woken through the pooler");
    // Woken by its notification, not by the 1 s re-check.
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert!(next.release().await.expect("release"));
    drop(server);
}
