//! etcd: a single member ([`FACTORY`]) or a 3-member cluster ([`CLUSTER_FACTORY`]), shared by
//! the scenarios, and a deployment of its own for the scenario that kills servers. Cut clients go
//! through a [`Proxy`](crate::harness::Proxy) per member.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::{GetOptions, SortOrder, SortTarget};

use crate::Factory;
use crate::deployment::{Cut, Deployment, ProxyCut, ServerFaults, shared_or_new};
use crate::harness::EtcdCluster;
use crate::harness::ServerProcess;

/// The etcd backend on a single member.
pub const FACTORY: Factory = Factory {
    label: "etcd",
    capabilities: || distlock_etcd::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy("etcd", 1, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy("etcd", 1, false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: false,
};

/// The etcd backend on a 3-member cluster.
pub const CLUSTER_FACTORY: Factory = Factory {
    label: "etcd3",
    capabilities: || distlock_etcd::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy("etcd3", 3, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy("etcd3", 3, false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: true,
};

const TTL: Duration = Duration::from_secs(2);

/// The options every client of the suite uses.
pub fn options() -> EtcdOptions {
    EtcdOptions {
        prefix: "distlock-test".into(),
        session_ttl: TTL,
        op_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        ..EtcdOptions::default()
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
    fn processes(&self) -> Vec<&ServerProcess> {
        self.cluster.members.iter().collect()
    }
    fn leader(&self) -> Option<usize> {
        self.cluster.leader()
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
        crate::leftovers::etcd(&self.admin, &options().prefix, name).await
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

    /// The remaining TTL of the holder's session lease, plus one second: etcd reports whole
    /// seconds, rounded down.
    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        let prefix = distlock_etcd::keys::name_prefix(&options().prefix, name);
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut admin = self.admin.clone();
        let got = admin.get(prefix, Some(first)).await.expect("get");
        let lease = got.kvs().first()?.lease();
        let ttl = admin
            .lease_time_to_live(lease, None)
            .await
            .expect("lease ttl")
            .ttl();
        u64::try_from(ttl).ok().map(|s| Duration::from_secs(s + 1))
    }

    /// Two of a stock etcd's 5 s HTTP/2 ping windows, on a client with the default 10 s session
    /// (whose keep-alives, every few seconds, leave pings time to pile up in between).
    fn idle(&self) -> Duration {
        Duration::from_secs(11)
    }

    async fn idle_client(&self) -> Arc<dyn LockBackend> {
        let o = EtcdOptions {
            session_ttl: Duration::from_secs(10),
            ..options()
        };
        Arc::new(
            EtcdBackend::connect(&self.cluster.endpoints(), o)
                .await
                .expect("connect"),
        )
    }
}
