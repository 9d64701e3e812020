//! Redis: one redis-server shared by the scenarios (unique names keep them apart), and a
//! server of its own for the scenario that kills it. Cut clients go through a [`Proxy`](crate::harness::Proxy).
//! `redis_plain` is the same server with the plain layout (`layout=plain`), the one other
//! languages' clients share.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_redis::keys::{lock_keys, plain_keys};
use distlock_redis::{RedisBackend, RedisLayout, RedisOptions};
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

/// The plain layout's factory, on the same servers.
pub const PLAIN_FACTORY: Factory = Factory {
    label: "redis_plain",
    capabilities: plain_capabilities,
    shared: || Box::pin(async { deploy_plain(true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy_plain(false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: false,
};

fn capabilities() -> Capabilities {
    // Declared statically by the backend; no server is needed to read it.
    distlock_redis::CAPABILITIES.clone()
}

fn plain_capabilities() -> Capabilities {
    // A stock server publishes no keyspace events: plain waiters poll.
    distlock_redis::PLAIN_CAPABILITIES.clone()
}

/// The plain layout's key prefix in the suite.
pub const PLAIN_PREFIX: &str = "distlock-plain-test:";

/// The options of the suite's plain-layout clients.
pub fn plain_options() -> RedisOptions {
    RedisOptions {
        layout: RedisLayout::Plain {
            prefix: PLAIN_PREFIX.into(),
        },
        ..options()
    }
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
    deploy_with(shared, false).await
}

async fn deploy_plain(shared: bool) -> Arc<RedisDeployment> {
    deploy_with(shared, true).await
}

async fn deploy_with(shared: bool, plain: bool) -> Arc<RedisDeployment> {
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
        plain,
    })
}

/// A Redis deployment: the server, and an admin connection that peeks at keys.
pub struct RedisDeployment {
    server: Arc<RedisServer>,
    admin: redis::aio::MultiplexedConnection,
    owns_server: bool,
    /// The plain layout (`redis_plain`).
    plain: bool,
}

impl RedisDeployment {
    fn options(&self) -> RedisOptions {
        if self.plain {
            plain_options()
        } else {
            options()
        }
    }

    /// The plain layout's one key of `name`.
    fn plain_key(name: &LockName) -> String {
        plain_keys(PLAIN_PREFIX, name).lock
    }

    async fn plain_cmd(&self, cmd: &str, name: &LockName) -> i64 {
        redis::cmd(cmd)
            .arg(Self::plain_key(name))
            .query_async(&mut self.admin.clone())
            .await
            .unwrap_or_else(|e| panic!("{cmd}: {e}"))
    }
}

impl ServerFaults for RedisDeployment {
    fn processes(&self) -> Vec<&ServerProcess> {
        vec![self.server.process()]
    }
}

#[async_trait]
impl Deployment for RedisDeployment {
    fn label(&self) -> &'static str {
        if self.plain { "redis_plain" } else { "redis" }
    }

    fn capabilities(&self) -> Capabilities {
        if self.plain {
            plain_capabilities()
        } else {
            capabilities()
        }
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::connect(&self.server.url(), self.options())
                .await
                .expect("connect"),
        )
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        let proxy = ProxyCut::to_ports([self.server.port()]);
        let url = format!("redis://{}", proxy.addrs()[0]);
        let client = RedisBackend::connect(&url, self.options())
            .await
            .expect("connect through proxy");
        (Arc::new(client), Box::new(proxy))
    }

    async fn artifacts(&self, name: &LockName) -> usize {
        if self.plain {
            // The key is all the plain layout ever writes.
            return crate::leftovers::redis_plain(&mut self.admin.clone(), PLAIN_PREFIX, name)
                .await;
        }
        artifacts(&mut self.admin.clone(), name).await
    }

    async fn delete_lock(&self, name: &LockName) {
        if self.plain {
            assert_eq!(self.plain_cmd("DEL", name).await, 1, "nothing to delete");
            return;
        }
        delete_lock(&mut self.admin.clone(), name).await
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn expiry_slack(&self) -> Duration {
        Duration::from_millis(200)
    }

    fn url(&self) -> Option<String> {
        Some(if self.plain {
            format!(
                "{}?layout=plain&prefix={PLAIN_PREFIX}&op_timeout=1s",
                self.server.url()
            )
        } else {
            format!("{}?prefix=distlock-test&op_timeout=1s", self.server.url())
        })
    }

    fn servers(&self) -> Option<&dyn ServerFaults> {
        self.owns_server.then_some(self as &dyn ServerFaults)
    }

    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        if self.plain {
            return u64::try_from(self.plain_cmd("PTTL", name).await)
                .ok()
                .map(Duration::from_millis);
        }
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
            RedisBackend::connect(&server.url(), self.options())
                .await
                .expect("connect"),
        )
    }
}
