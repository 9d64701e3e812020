//! Redis over TLS: a server with a throw-away CA, a client that trusts the CA through the facade
//! URL (`rediss://...?ca=`), and a plain-text client refused with a typed error.

use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::harness::{RedisServer, TempDir, TlsFiles};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_and_plain_text_is_refused() {
    let dir = TempDir::new("redis-tls").expect("temp dir");
    let files = TlsFiles::generate(dir.path()).expect("certificates");
    let f = files.clone();
    let server = tokio::task::spawn_blocking(move || {
        RedisServer::start_with(&[], Some(&f)).expect("redis with TLS")
    })
    .await
    .expect("start");
    let tls_url = server.tls_url().expect("serves TLS");
    let url = format!("{tls_url}?ca={}&connect_timeout=2s", files.ca.display());
    let locks = LockClient::new(distlock::connect(&url).await.expect("TLS connect"));
    let opts = AcquireOptions::with_ttl(Duration::from_secs(5));
    let lease = locks.try_acquire("tls", &opts).await.expect("acquire");
    assert!(lease.fencing_token().is_some());
    assert!(lease.release().await.expect("release"));

    let plain = tls_url.replacen("rediss://", "redis://", 1) + "?connect_timeout=2s";
    let refused = match distlock::connect(&plain).await {
        Err(e) => e.to_string(),
        Ok(backend) => LockClient::new(backend)
            .try_acquire("tls", &opts)
            .await
            .expect_err("plain text to a TLS port")
            .to_string(),
    };
    assert!(
        refused.contains("127.0.0.1"),
        "the error names the server: {refused}"
    );
}
