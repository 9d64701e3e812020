//! The `distlock` facade against real servers: backends built from the URLs a user writes, and
//! the grade profiles.

use std::time::Duration;

use distlock::{Config, Guarantee, LockError, Locks};
use distlock_conformance::harness::{EtcdCluster, RedisServer, ZkEnsemble};

async fn start<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("server start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efficiency_on_redis_and_correctness_on_etcd() {
    let redis = start(|| RedisServer::start().expect("redis")).await;
    let etcd = start(|| EtcdCluster::start(1).expect("etcd")).await;
    let toml = format!(
        r#"
        efficiency = "cache"
        correctness = "main"
        [backends.cache]
        url = "{}?prefix=facade"
        [backends.main]
        url = "etcd://{}/facade"
        options = {{ session_ttl = "2s" }}
        [lease]
        ttl = "2s"
        "#,
        redis.url(),
        etcd.endpoints().join(",")
    );
    let locks = Locks::from_config(&Config::from_toml(&toml).expect("parses"))
        .await
        .expect("loads");
    assert_eq!(locks.profiles(), ("cache", Some("main")));
    let rebuild = locks
        .efficiency("cache:42")
        .try_now()
        .await
        .expect("efficiency lock");
    assert_eq!(rebuild.backend(), "redis");
    let pay = locks
        .correctness("payment:7")
        .wait(Duration::from_secs(5))
        .await
        .expect("correctness lock");
    assert_eq!(pay.backend(), "etcd");
    assert_eq!(pay.guarantee(), Guarantee::Correctness);
    assert!(pay.fencing_token().is_some());
    assert!(matches!(
        locks.correctness("payment:7").try_now().await,
        Err(LockError::Busy { .. })
    ));
    assert!(rebuild.release().await.expect("release"));
    assert!(pay.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_redis_backend_has_no_correctness_profile() {
    let redis = start(|| RedisServer::start().expect("redis")).await;
    let toml = format!("[backends.cache]\nurl = \"{}\"", redis.url());
    let locks = Locks::from_config(&Config::from_toml(&toml).expect("parses"))
        .await
        .expect("loads");
    assert_eq!(locks.profiles(), ("cache", None));
    match locks.correctness("payment:7").try_now().await {
        Err(LockError::Unsupported { what, .. }) => assert!(what.contains("correctness"), "{what}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let lease = locks
        .efficiency("cache:1")
        .try_now()
        .await
        .expect("efficiency works");
    assert!(lease.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_url_with_chroot_and_nested_root() {
    let zk = start(|| ZkEnsemble::start(1).expect("zookeeper")).await;
    // Neither the chroot (nested) nor the lock root below it exists: both are created.
    let admin = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .expect("admin");
    let url = format!(
        "zk://{}/apps/app?root=/locks/nested&session_timeout=2s",
        zk.connect_string()
    );
    let backend = distlock::connect(&url).await.expect("connects");
    let locks = distlock::LockClient::new(backend);
    let lease = locks
        .try_acquire(
            "orders/1",
            &distlock::AcquireOptions::with_ttl(Duration::from_secs(2)),
        )
        .await
        .expect("acquire under the chroot");
    assert!(
        lease.backend_key().starts_with("/locks/nested/orders%2F1/"),
        "{}",
        lease.backend_key()
    );
    let children = admin
        .list_children("/apps/app/locks/nested/orders%2F1")
        .await
        .expect("listed outside the chroot");
    assert_eq!(children.len(), 1);
    assert!(lease.release().await.expect("release"));
}

/// The guide's configuration example, with its servers replaced by this run's (scheme, path,
/// options and lease settings kept), loads and gives a lock in each profile, the way its command
/// line `run --correctness --wait 30s ledger-migration` takes one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_configuration_example_works() {
    const GUIDE: &str = include_str!("../../docs/guide.md");
    let example = GUIDE
        .split("```toml")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("[backends."))
        .expect("the guide's configuration example");
    let redis = start(|| RedisServer::start().expect("redis")).await;
    let etcd = start(|| EtcdCluster::start(1).expect("etcd")).await;
    let mut config = Config::from_toml(example).expect("the example parses");
    let redis_host = redis.url().trim_start_matches("redis://").to_string();
    let etcd_hosts = etcd.endpoints().join(",");
    for backend in config.backends.values_mut() {
        let (scheme, rest) = backend.url.split_once("://").expect("a URL");
        // The authority ends at the path or the query.
        let at = rest.find(['/', '?']).unwrap_or(rest.len());
        let hosts = match scheme {
            "redis" => redis_host.trim_end_matches('/').to_string(),
            "etcd" => etcd_hosts.clone(),
            other => panic!("the example uses {other}://: give this test its server"),
        };
        // Redis's database number is kept; the test server has no password.
        backend.url = format!("{scheme}://{hosts}{}", &rest[at..]);
    }
    let locks = Locks::from_config(&config)
        .await
        .expect("the example loads");
    let efficiency = locks
        .efficiency("nightly-backup")
        .try_now()
        .await
        .expect("an efficiency lock");
    let correctness = locks
        .correctness("ledger-migration")
        .wait(Duration::from_secs(30))
        .await
        .expect("a correctness lock");
    assert!(correctness.fencing_token().is_some());
    assert!(efficiency.release().await.expect("release"));
    assert!(correctness.release().await.expect("release"));
}
