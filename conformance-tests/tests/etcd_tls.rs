//! etcd over TLS: a CA and a server certificate made with `openssl`, a member serving clients
//! over HTTPS, and a client that trusts the CA through the facade URL.

use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::harness::{EtcdCluster, TempDir, TlsFiles};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_and_plain_text_is_refused() {
    let dir = TempDir::new("etcd-tls").expect("temp dir");
    let files = TlsFiles::generate(dir.path()).expect("certificates");
    let f = files.clone();
    let etcd =
        tokio::task::spawn_blocking(move || EtcdCluster::start_tls(1, &f).expect("etcd with TLS"))
            .await
            .expect("start");
    let endpoint = etcd.endpoints().join(",");
    let url = format!(
        "etcd://{endpoint}/tls?ca={}&session_ttl=2s&connect_timeout=2s",
        files.ca.display()
    );
    let locks = LockClient::new(distlock::connect(&url).await.expect("connect over TLS"));
    let lease = locks
        .try_acquire(
            "over-tls",
            &AcquireOptions::with_ttl(Duration::from_secs(2)),
        )
        .await
        .expect("acquire over TLS");
    assert!(lease.fencing_token().is_some());
    assert!(lease.release().await.expect("release"));
    // Without the CA the client speaks plain HTTP/2 to a TLS port: it must fail, not hang.
    let plain = format!("etcd://{endpoint}/tls?op_timeout=1s&connect_timeout=1s");
    let outcome = async {
        let locks = LockClient::new(distlock::connect(&plain).await?);
        locks
            .try_acquire(
                "over-tls",
                &AcquireOptions::with_ttl(Duration::from_secs(2)),
            )
            .await
            .map_err(|source| distlock::ConfigError::Backend {
                backend: "plain".into(),
                source,
            })
    };
    let outcome = tokio::time::timeout(Duration::from_secs(10), outcome)
        .await
        .expect("no hang");
    assert!(
        outcome.is_err(),
        "a plain-text client got a lock from a TLS-only member"
    );
}
