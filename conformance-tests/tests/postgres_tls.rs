//! PostgreSQL over TLS: a CA and a server certificate made with `openssl`, a server with
//! `ssl=on`, and a client that trusts the CA through the facade URL. The connection is
//! encrypted (the server says so), and a client trusting another CA is refused.

use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::deployments::postgres::admin;
use distlock_conformance::harness::{PostgresServer, TempDir, TlsFiles};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_and_another_ca_is_refused() {
    let dir = TempDir::new("postgres-tls").expect("temp dir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for d in [&a, &b] {
        std::fs::create_dir(d).expect("a directory for each CA");
    }
    let files = TlsFiles::generate(&a).expect("certificates");
    let other = TlsFiles::generate(&b).expect("another CA");
    let f = files.clone();
    let server = tokio::task::spawn_blocking(move || {
        PostgresServer::start_tls(&f).unwrap_or_else(|e| panic!("{e}"))
    })
    .await
    .expect("start");
    let url = |ca: &std::path::Path| {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?schema=tls&ca={}&connect_timeout=2s",
            server.port(),
            ca.display()
        )
    };
    let locks = LockClient::new(
        distlock::connect(&url(&files.ca))
            .await
            .expect("connect over TLS"),
    );
    let lease = locks
        .try_acquire(
            "over-tls",
            &AcquireOptions::with_ttl(Duration::from_secs(2)),
        )
        .await
        .expect("acquire over TLS");
    assert!(lease.fencing_token().is_some());
    let admin = admin(&server).await;
    let encrypted: bool = admin
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'distlock'",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(encrypted, "the lock's connection is not encrypted");
    assert!(lease.release().await.expect("release"));
    let refused = distlock::connect(&url(&other.ca))
        .await
        .map(drop)
        .expect_err("a server whose certificate another CA signed");
    assert!(
        refused.to_string().to_lowercase().contains("certificate"),
        "{refused}"
    );
}
