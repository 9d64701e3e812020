//! Redis: one redis-server shared by the scenarios (unique names keep them apart), and a
//! server of its own for the scenario that kills it. Cut clients go through a [`Proxy`](crate::harness::Proxy).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_redis::{RedisBackend, RedisOptions, keys::lock_keys};
use redis::aio::ConnectionLike;

use crate::Factory;
use crate::deployment::{Cut, Deployment, ProxyCut, ServerFaults, shared_or_new};
use crate::harness::RedisServer;
use crate::harness::ServerProcess;

/// The Redis backend's factory.
pub const FACTORY: Factory = Factory {
    label: "redis",
    capabilities,
    shared: || Box::pin(async { deploy(true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy(false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: false,
};

fn capabilities() -> Capabilities {
    // Declared statically by the backend; no server is needed to read it.
    distlock_redis::CAPABILITIES.clone()
}

/// The options every client of the suite uses.
pub fn options() -> RedisOptions {
    RedisOptions {
        prefix: "distlock-test".into(),
        op_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

/// What is left of `name` on the server, read through any admin connection (a single
/// server's or a cluster's).
pub(crate) async fn artifacts(admin: &mut impl ConnectionLike, name: &LockName) -> usize {
    crate::leftovers::redis(admin, &options().prefix, name).await
}

/// How long the server keeps `name`'s lock key (`PTTL`), if it exists.
pub(crate) async fn pttl(admin: &mut impl ConnectionLike, name: &LockName) -> Option<Duration> {
    let ms: i64 = redis::cmd("PTTL")
        .arg(lock_keys(&options().prefix, name).lock)
        .query_async(admin)
        .await
        .expect("PTTL");
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// Deletes `name`'s lock key behind its holder's back.
pub(crate) async fn delete_lock(admin: &mut impl ConnectionLike, name: &LockName) {
    let n: i64 = redis::cmd("DEL")
        .arg(lock_keys(&options().prefix, name).lock)
        .query_async(admin)
        .await
        .expect("DEL");
    assert_eq!(n, 1, "nothing to delete");
}

async fn deploy(shared: bool) -> Arc<RedisDeployment> {
    static SHARED: OnceLock<Arc<RedisServer>> = OnceLock::new();
    let server = shared_or_new(&SHARED, shared, || {
        RedisServer::start().unwrap_or_else(|e| panic!("{e}"))
    })
    .await;
    let admin = server.admin().await.expect("admin connection");
    Arc::new(RedisDeployment {
        server,
        admin,
        owns_server: !shared,
    })
}

/// A Redis deployment: the server, and an admin connection that peeks at keys.
pub struct RedisDeployment {
    server: Arc<RedisServer>,
    admin: redis::aio::MultiplexedConnection,
    owns_server: bool,
}

impl ServerFaults for RedisDeployment {
    fn processes(&self) -> Vec<&ServerProcess> {
        vec![self.server.process()]
    }
}

#[async_trait]
impl Deployment for RedisDeployment {
    fn label(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::connect(&self.server.url(), options())
                .await
                .expect("connect"),
        )
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        let proxy = ProxyCut::to_ports([self.server.port()]);
        let url = format!("redis://{}", proxy.addrs()[0]);
        let client = RedisBackend::connect(&url, options())
            .await
            .expect("connect through proxy");
        (Arc::new(client), Box::new(proxy))
    }

    async fn artifacts(&self, name: &LockName) -> usize {
        artifacts(&mut self.admin.clone(), name).await
    }

    async fn delete_lock(&self, name: &LockName) {
        delete_lock(&mut self.admin.clone(), name).await
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn expiry_slack(&self) -> Duration {
        Duration::from_millis(200)
    }

    fn url(&self) -> Option<String> {
        Some(format!(
            "{}?prefix=distlock-test&op_timeout=1s",
            self.server.url()
        ))
    }

    fn servers(&self) -> Option<&dyn ServerFaults> {
        self.owns_server.then_some(self as &dyn ServerFaults)
    }

    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        pttl(&mut self.admin.clone(), name).await
    }

    /// Past the 2 s idle timeout of [`Deployment::idle_client`]'s server.
    fn idle(&self) -> Duration {
        Duration::from_secs(3)
    }

    /// A client of a server of its own that closes connections idle for 2 s (`timeout 2`, off
    /// in stock redis.conf but common in production): the setting the idle scenario varies.
    async fn idle_client(&self) -> Arc<dyn LockBackend> {
        static IDLE: OnceLock<Arc<RedisServer>> = OnceLock::new();
        let server = shared_or_new(&IDLE, true, || {
            RedisServer::start_with(&["--timeout", "2"], None).unwrap_or_else(|e| panic!("{e}"))
        })
        .await;
        Arc::new(
            RedisBackend::connect(&server.url(), options())
                .await
                .expect("connect"),
        )
    }
}
