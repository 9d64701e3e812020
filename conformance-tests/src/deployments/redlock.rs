//! Redlock over 5 independent redis-server masters, shared by the scenarios, and a set of its own
//! for the scenario that kills servers. Cut clients go through a [`Proxy`](crate::harness::Proxy) per node.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_redis::{RedlockBackend, RedlockOptions, keys::lock_keys};

use crate::Factory;
use crate::deployment::{Cut, Deployment, ProxyCut, ServerFaults, shared_or_new};
use crate::harness::RedisMasters;
use crate::harness::ServerProcess;

/// Redlock on 5 masters.
pub const FACTORY: Factory = Factory {
    label: "redlock",
    capabilities: || distlock_redis::REDLOCK_CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy(5, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy(5, false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: true,
};

/// The options every client of the suite uses: a node timeout small against the 2 s TTL but
/// roomy enough for a loaded 2-core machine.
pub fn options() -> RedlockOptions {
    RedlockOptions {
        prefix: "distlock-test".into(),
        node_timeout: Duration::from_millis(200),
        retry_delay: (Duration::from_millis(5), Duration::from_millis(30)),
        ..RedlockOptions::default()
    }
}

/// A deployment of `n` masters: the shared one, or a new one.
pub async fn deploy(n: usize, shared: bool) -> Arc<RedlockDeployment> {
    static SHARED: OnceLock<Arc<RedisMasters>> = OnceLock::new();
    let masters = shared_or_new(&SHARED, shared, move || {
        RedisMasters::start(n).unwrap_or_else(|e| panic!("{e}"))
    })
    .await;
    let mut admins = Vec::new();
    for node in &masters.nodes {
        admins.push(node.admin().await.expect("admin connection"));
    }
    Arc::new(RedlockDeployment {
        masters,
        admins,
        owns_servers: !shared,
    })
}

/// A Redlock deployment: the masters and an admin connection to each.
pub struct RedlockDeployment {
    /// The servers, for fault tests.
    pub masters: Arc<RedisMasters>,
    admins: Vec<redis::aio::MultiplexedConnection>,
    owns_servers: bool,
}

impl RedlockDeployment {
    /// The node URLs.
    pub fn urls(&self) -> Vec<String> {
        self.masters.nodes.iter().map(|n| n.url()).collect()
    }

    /// How many nodes hold a key for `name` right now.
    pub async fn nodes_holding(&self, name: &LockName) -> usize {
        let key = lock_keys(&options().prefix, name).lock;
        let mut n = 0;
        for admin in &self.admins {
            let held: Option<i64> = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut admin.clone())
                .await
                .ok();
            n += usize::from(held == Some(1));
        }
        n
    }
}

impl ServerFaults for RedlockDeployment {
    fn processes(&self) -> Vec<&ServerProcess> {
        self.masters.nodes.iter().map(|n| n.process()).collect()
    }
}

#[async_trait]
impl Deployment for RedlockDeployment {
    fn label(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> Capabilities {
        distlock_redis::REDLOCK_CAPABILITIES.clone()
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedlockBackend::connect(&self.urls(), options())
                .await
                .expect("connect"),
        )
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        let proxies = ProxyCut::to_ports(self.masters.nodes.iter().map(|n| n.port()));
        let urls: Vec<String> = proxies
            .addrs()
            .iter()
            .map(|a| format!("redis://{a}"))
            .collect();
        let client = RedlockBackend::connect(&urls, options())
            .await
            .expect("connect through proxies");
        (Arc::new(client), Box::new(proxies))
    }

    /// The number of distinct owners with a key on any node: one holder counts once, however
    /// many nodes granted it.
    async fn artifacts(&self, name: &LockName) -> usize {
        let key = lock_keys(&options().prefix, name).lock;
        let mut owners = BTreeSet::new();
        for admin in &self.admins {
            let value: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut admin.clone())
                .await
                .expect("GET");
            if let Some(v) = value {
                owners.insert(v.split(':').next().unwrap_or_default().to_string());
            }
        }
        owners.len()
    }

    async fn delete_lock(&self, name: &LockName) {
        let key = lock_keys(&options().prefix, name).lock;
        for admin in &self.admins {
            let _: i64 = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut admin.clone())
                .await
                .expect("DEL");
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// Redlock has no queue: 32 contenders split the votes of 5 nodes round after round, and
    /// 6 400 hand-overs take minutes. 8 x 50 still runs 400 contended hand-overs through the
    /// same exclusion check.
    fn contention(&self) -> (u64, u64) {
        (8, 50)
    }

    fn expiry_slack(&self) -> Duration {
        Duration::from_millis(300)
    }

    fn url(&self) -> Option<String> {
        let hosts: Vec<String> = self
            .masters
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        Some(format!(
            "redlock://{}?prefix=distlock-test&node_timeout=200ms&retry_delay=5ms..30ms",
            hosts.join(",")
        ))
    }

    fn servers(&self) -> Option<&dyn ServerFaults> {
        self.owns_servers.then_some(self as &dyn ServerFaults)
    }

    /// Until fewer than a majority of nodes keep the key: the majority-th longest `PTTL`.
    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        let mut left = Vec::new();
        for admin in &self.admins {
            if let Some(t) = crate::deployments::redis::pttl(&mut admin.clone(), name).await {
                left.push(t);
            }
        }
        left.sort_unstable_by(|a, b| b.cmp(a));
        left.get(self.admins.len() / 2).copied()
    }

    /// Stock servers close no idle connection; this only proves idling costs nothing.
    fn idle(&self) -> Duration {
        Duration::from_secs(3)
    }
}
