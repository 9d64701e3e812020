//! Redis Cluster: three masters shared by the scenarios, and a cluster of its own for the
//! scenario that kills servers. A client is cut by switching its own ACL user off on every node
//! and killing its connections: a proxy cannot stand in front of a cluster client, which learns
//! the nodes' real addresses from the cluster itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_redis::RedisBackend;

use super::redis::{artifacts, delete_lock, options};
use crate::Factory;
use crate::deployment::{Cut, Deployment, ServerFaults, shared_or_new};
use crate::harness::RedisCluster;
use crate::harness::ServerProcess;

/// The Redis backend on a 3-master Redis Cluster.
pub const FACTORY: Factory = Factory {
    label: "redis_cluster",
    capabilities: || distlock_redis::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy(true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy(false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: false,
};

async fn deploy(shared: bool) -> Arc<ClusterDeployment> {
    static SHARED: OnceLock<Arc<RedisCluster>> = OnceLock::new();
    let cluster = shared_or_new(&SHARED, shared, || {
        RedisCluster::start(3).unwrap_or_else(|e| panic!("{e}"))
    })
    .await;
    let admin = redis::cluster::ClusterClient::new(cluster.urls())
        .expect("cluster urls")
        .get_async_connection()
        .await
        .expect("admin connection");
    Arc::new(ClusterDeployment {
        cluster,
        admin,
        owns_servers: !shared,
    })
}

/// A Redis Cluster deployment, and an admin connection that peeks at keys.
pub struct ClusterDeployment {
    cluster: Arc<RedisCluster>,
    admin: redis::cluster_async::ClusterConnection,
    owns_servers: bool,
}

impl ServerFaults for ClusterDeployment {
    fn processes(&self) -> Vec<&ServerProcess> {
        self.cluster.nodes.iter().map(|n| n.process()).collect()
    }
}

/// Cuts one client of a Redis Cluster by its ACL user, on every node (the fault campaign's
/// clients are cut this way too).
pub struct AclCut {
    cluster: Arc<RedisCluster>,
    user: String,
}

impl AclCut {
    /// Creates `user` (password `pw`, every permission) on every node of `cluster`: a client
    /// that connects as that user ([`AclCut::urls`]) can be cut alone.
    pub fn create(cluster: Arc<RedisCluster>, user: String) -> AclCut {
        let cut = AclCut { cluster, user };
        cut.on_every_node(&[format!("ACL SETUSER {} on >pw ~* &* +@all", cut.user)]);
        cut
    }

    /// `redis://<user>:pw@127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.hosts()
            .iter()
            .map(|h| format!("redis://{}:pw@{h}", self.user))
            .collect()
    }

    /// `127.0.0.1:<port>` of every node.
    pub fn hosts(&self) -> Vec<String> {
        self.cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect()
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.user
    }

    fn on_every_node(&self, commands: &[String]) {
        for node in &self.cluster.nodes {
            for c in commands {
                let reply = node.command(c).unwrap_or_default();
                assert!(!reply.starts_with('-'), "{c}: {reply}");
            }
        }
    }
}

impl Cut for AclCut {
    fn cut(&self) {
        self.on_every_node(&[
            format!("ACL SETUSER {} off", self.user),
            format!("CLIENT KILL USER {}", self.user),
        ]);
    }
    fn restore(&self) {
        self.on_every_node(&[format!("ACL SETUSER {} on", self.user)]);
    }
    fn reset(&self) {
        self.on_every_node(&[
            format!("ACL SETUSER {} on", self.user),
            format!("CLIENT KILL USER {}", self.user),
        ]);
    }
}

#[async_trait]
impl Deployment for ClusterDeployment {
    fn label(&self) -> &'static str {
        "redis_cluster"
    }

    fn capabilities(&self) -> Capabilities {
        distlock_redis::CAPABILITIES.clone()
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            RedisBackend::connect_cluster(&self.cluster.urls(), options())
                .await
                .expect("connect"),
        )
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let user = format!("cut{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let cut = AclCut::create(self.cluster.clone(), user);
        let client = RedisBackend::connect_cluster(&cut.urls(), options())
            .await
            .expect("connect as the cuttable user");
        (Arc::new(client), Box::new(cut))
    }

    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        crate::deployments::redis::pttl(&mut self.admin.clone(), name).await
    }

    /// Stock servers close no idle connection; this only proves idling costs nothing.
    fn idle(&self) -> Duration {
        Duration::from_secs(3)
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
        let hosts: Vec<String> = self
            .cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        Some(format!(
            "redis+cluster://{}?prefix=distlock-test&op_timeout=1s",
            hosts.join(",")
        ))
    }

    fn servers(&self) -> Option<&dyn ServerFaults> {
        self.owns_servers.then_some(self as &dyn ServerFaults)
    }
}
