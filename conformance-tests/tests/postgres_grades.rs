//! The PostgreSQL backend's grade is the server's: correctness on a server that keeps grants
//! durably, refused (naming the failed check) on one that does not, and a standby refused.

use std::time::Duration;

use distlock::{Config, Guarantee, LockBackend, Locks};
use distlock_conformance::deployments::postgres::options;
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
