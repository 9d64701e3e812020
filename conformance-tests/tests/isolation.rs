//! Isolation: two applications on one server, each under its own prefix (Redis key prefix, etcd
//! prefix, ZooKeeper root), never see, block or release each other's locks; and a client whose
//! server credentials are limited to its prefix (a Redis ACL user with key and channel
//! patterns, an etcd role with a key range, ZooKeeper creator-only nodes under its digest) does
//! everything a lock needs (acquire, wait in the queue, renew, release) and nothing outside it.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient, LockError};
use distlock_conformance::harness::{EtcdCluster, RedisServer, ZkEnsemble};
use distlock_etcd::{EtcdBackend, EtcdOptions};
use distlock_redis::{RedisBackend, RedisOptions};
use distlock_zk::{NodeAcl, ZkBackend, ZkOptions};

fn opts() -> AcquireOptions {
    AcquireOptions::with_ttl(Duration::from_secs(4))
}

async fn start<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("start")
}

/// Everything a lock does, on one backend: a grant, a waiter queued behind it and granted at the
/// release (queue, notification), a renewal, a release.
async fn everything(one: Arc<dyn LockBackend>, two: Arc<dyn LockBackend>) {
    let (a, b) = (LockClient::new(one), LockClient::new(two));
    let held = a.try_acquire("job", &opts()).await.expect("acquire");
    let waiter =
        tokio::spawn(async move { b.acquire("job", &opts(), Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.renew(Duration::from_secs(4)).await.expect("renew");
    assert!(held.release().await.expect("release"));
    let next = waiter
        .await
        .expect("waiter")
        .expect("the waiter is granted");
    assert!(next.release().await.expect("release"));
}

/// Two applications with the same lock name under different prefixes hold it at once, and one
/// releasing touches nothing of the other's.
async fn apart(app1: Arc<dyn LockBackend>, app2: Arc<dyn LockBackend>) {
    let (a, b) = (LockClient::new(app1), LockClient::new(app2));
    let one = a.try_acquire("shared", &opts()).await.expect("app1");
    let two = b
        .try_acquire("shared", &opts())
        .await
        .expect("app2 is not blocked by app1");
    assert!(one.release().await.expect("release"));
    assert!(
        matches!(
            b.try_acquire("shared", &opts()).await,
            Err(LockError::Busy { .. })
        ),
        "app1's release freed app2's lock"
    );
    assert!(two.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_prefixes_and_an_acl_user_limited_to_its_prefix() {
    let server = start(|| RedisServer::start().expect("redis")).await;
    // Keys `{app1:<bucket>}:...` and channels of the same form: its prefix, nothing else.
    for user in ["app1", "app2"] {
        let reply = server
            .command(&format!(
                "ACL SETUSER {user} on >pw ~{{{user}:* &{{{user}:* +@all -@dangerous"
            ))
            .unwrap_or_default();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    let connect = |user: &'static str| {
        let url = format!("redis://{user}:pw@127.0.0.1:{}", server.port());
        async move {
            let o = RedisOptions {
                prefix: user.into(),
                ..RedisOptions::default()
            };
            Arc::new(RedisBackend::connect(&url, o).await.expect("connect")) as Arc<dyn LockBackend>
        }
    };
    everything(connect("app1").await, connect("app1").await).await;
    apart(connect("app1").await, connect("app2").await).await;
    // Nothing outside its prefix: app1 cannot read or delete app2's keys, nor flush the server.
    let app1 = redis::Client::open(format!("redis://app1:pw@127.0.0.1:{}", server.port()))
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    for cmd in [
        redis::cmd("GET").arg("{app2:0}:fence").clone(),
        redis::cmd("DEL").arg("{app2:0}:fence").clone(),
        redis::cmd("FLUSHALL").clone(),
    ] {
        let refused: redis::RedisResult<redis::Value> = cmd.query_async(&mut app1.clone()).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().to_lowercase().contains("noperm")),
            "{cmd:?} outside the prefix: {refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_prefixes_and_a_role_limited_to_its_key_range() {
    let cluster = start(|| EtcdCluster::start(1).expect("etcd")).await;
    let endpoints = cluster.endpoints();
    let mut admin = etcd_client::Client::connect(&endpoints, None)
        .await
        .expect("admin");
    admin
        .user_add("root", "rootpw", None)
        .await
        .expect("root user");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("root role");
    for app in ["app1", "app2"] {
        admin.role_add(app).await.expect("role");
        admin
            .role_grant_permission(
                app,
                etcd_client::Permission::read_write(format!("{app}/")).with_prefix(),
            )
            .await
            .expect("permission");
        admin.user_add(app, "pw", None).await.expect("user");
        admin.user_grant_role(app, app).await.expect("grant");
    }
    admin.auth_enable().await.expect("auth on");
    let connect = |app: &'static str| {
        let endpoints = endpoints.clone();
        async move {
            let o = EtcdOptions {
                prefix: app.into(),
                credentials: Some((app.into(), "pw".into())),
                session_ttl: Duration::from_secs(4),
                ..EtcdOptions::default()
            };
            Arc::new(EtcdBackend::connect(&endpoints, o).await.expect("connect"))
                as Arc<dyn LockBackend>
        }
    };
    everything(connect("app1").await, connect("app1").await).await;
    apart(connect("app1").await, connect("app2").await).await;
    // Nothing outside its range.
    let mut app1 = etcd_client::Client::connect(
        &endpoints,
        Some(etcd_client::ConnectOptions::new().with_user("app1", "pw")),
    )
    .await
    .expect("connect as app1");
    for outside in [
        app1.get("app2/x", None).await.map(drop),
        app1.put("other", "x", None).await.map(drop),
    ] {
        assert!(
            outside
                .as_ref()
                .is_err_and(|e| e.to_string().contains("permission denied")),
            "outside the range: {outside:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_roots_and_creator_only_nodes_under_a_digest() {
    let ensemble = start(|| ZkEnsemble::start(1).expect("zookeeper")).await;
    let connect = |app: &'static str| {
        let connect = ensemble.connect_string();
        async move {
            let o = ZkOptions {
                root: format!("/{app}"),
                digest: Some(format!("{app}:pw")),
                acl: NodeAcl::CreatorOnly,
                session_timeout: Duration::from_secs(4),
                ..ZkOptions::default()
            };
            Arc::new(ZkBackend::connect(&connect, o).await.expect("connect"))
                as Arc<dyn LockBackend>
        }
    };
    everything(connect("app1").await, connect("app1").await).await;
    apart(connect("app1").await, connect("app2").await).await;
    // Nothing outside its root: app2's credentials cannot touch app1's nodes.
    let app1 = LockClient::new(connect("app1").await);
    let held = app1.try_acquire("vault", &opts()).await.expect("acquire");
    let app2 = zookeeper_client::Client::connector()
        .with_auth("digest", b"app2:pw")
        .connect(&ensemble.connect_string())
        .await
        .expect("connect as app2");
    let delete = app2.delete(held.backend_key(), None).await;
    assert!(
        matches!(delete, Err(zookeeper_client::Error::NoAuth)),
        "{delete:?}"
    );
    let create = app2
        .create(
            "/app1/vault/intruder",
            &[],
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await;
    assert!(
        matches!(create, Err(zookeeper_client::Error::NoAuth)),
        "{create:?}"
    );
    assert!(held.release().await.expect("release"));
}
