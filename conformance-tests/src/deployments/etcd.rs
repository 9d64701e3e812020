//! etcd: a single member ([`FACTORY`]) or a 3-member cluster ([`CLUSTER_FACTORY`]), shared by
//! the scenarios, and a deployment of its own for the scenario that kills servers. Cut clients go
//! through a [`Proxy`] per member.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;

use crate::Factory;
use crate::deployment::{
    Cut, Deployment, ProxyCut, ServerFaults, kill_all, restart_all, shared_or_new,
};
use crate::harness::EtcdCluster;

/// The etcd backend on a single member.
pub const FACTORY: Factory = Factory {
    label: "etcd",
    capabilities: || distlock_etcd::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy("etcd", 1, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy("etcd", 1, false).await as Arc<dyn Deployment> })),
};

/// The etcd backend on a 3-member cluster.
pub const CLUSTER_FACTORY: Factory = Factory {
    label: "etcd3",
    capabilities: || distlock_etcd::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy("etcd3", 3, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy("etcd3", 3, false).await as Arc<dyn Deployment> })),
};

const TTL: Duration = Duration::from_secs(2);

/// The options every client of the suite uses.
pub fn options() -> EtcdOptions {
    EtcdOptions {
        prefix: "distlock-test".into(),
        session_ttl: TTL,
        op_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        credentials: None,
        tls: None,
    }
}

/// A deployment of `members` servers: the shared one of that size, or a new one.
pub async fn deploy(label: &'static str, members: usize, shared: bool) -> Arc<EtcdDeployment> {
    static SINGLE: OnceLock<Arc<EtcdCluster>> = OnceLock::new();
    static TRIPLE: OnceLock<Arc<EtcdCluster>> = OnceLock::new();
    let cell = if members == 1 { &SINGLE } else { &TRIPLE };
    let cluster = shared_or_new(cell, shared, move || {
        EtcdCluster::start(members).unwrap_or_else(|e| panic!("{e}"))
    })
    .await;
    let admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("admin client");
    Arc::new(EtcdDeployment {
        label,
        cluster,
        admin,
        owns_cluster: !shared,
    })
}

/// An etcd deployment: the cluster and an admin client that counts keys.
pub struct EtcdDeployment {
    label: &'static str,
    /// The servers, for fault tests.
    pub cluster: Arc<EtcdCluster>,
    admin: etcd_client::Client,
    owns_cluster: bool,
}

impl ServerFaults for EtcdDeployment {
    fn kill_all(&self) {
        kill_all(&self.cluster.members);
    }
    fn restart_all(&self) {
        restart_all(&self.cluster.members);
    }
}

#[async_trait]
impl Deployment for EtcdDeployment {
    fn label(&self) -> &'static str {
        self.label
    }

    fn capabilities(&self) -> Capabilities {
        distlock_etcd::CAPABILITIES.clone()
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            EtcdBackend::connect(&self.cluster.endpoints(), options())
                .await
                .expect("connect"),
        )
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        let proxies = ProxyCut::to_ports(self.cluster.client_ports.iter().copied());
        let client = EtcdBackend::connect(&proxies.addrs(), options())
            .await
            .expect("connect through proxy");
        (Arc::new(client), Box::new(proxies))
    }

    async fn artifacts(&self, name: &LockName) -> usize {
        let prefix = distlock_etcd::keys::name_prefix(&options().prefix, name);
        let resp = self
            .admin
            .clone()
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .expect("count keys");
        resp.count() as usize
    }

    async fn delete_lock(&self, name: &LockName) {
        let prefix = distlock_etcd::keys::name_prefix(&options().prefix, name);
        let resp = self
            .admin
            .clone()
            .delete(
                prefix,
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .expect("delete");
        assert!(resp.deleted() > 0, "nothing to delete");
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn expiry_slack(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn url(&self) -> Option<String> {
        Some(format!(
            "etcd://{}/distlock-test?session_ttl=2s&op_timeout=1s",
            self.cluster.endpoints().join(",")
        ))
    }

    fn servers(&self) -> Option<&dyn ServerFaults> {
        self.owns_cluster.then_some(self as &dyn ServerFaults)
    }
}
