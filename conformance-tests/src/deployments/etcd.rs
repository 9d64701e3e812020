//! etcd: one single-member cluster shared by the scenarios, a member of its own for the scenario
//! that kills it. Cut clients go through a [`Proxy`].

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;

use crate::Factory;
use crate::deployment::{Cut, Deployment, ServerFaults};
use crate::harness::{EtcdCluster, Proxy, ProxyMode};

/// The etcd backend's factory.
pub const FACTORY: Factory = Factory {
    label: "etcd",
    capabilities: || distlock_etcd::CAPABILITIES.clone(),
    shared: || Box::pin(deploy(true)),
    isolated: Some(|| Box::pin(deploy(false))),
};

const TTL: Duration = Duration::from_secs(2);

fn options() -> EtcdOptions {
    EtcdOptions {
        prefix: "distlock-test".into(),
        session_ttl: TTL,
        op_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        credentials: None,
    }
}

async fn deploy(shared: bool) -> Arc<dyn Deployment> {
    static SHARED: OnceLock<Arc<EtcdCluster>> = OnceLock::new();
    let cluster = tokio::task::spawn_blocking(move || {
        let start = || Arc::new(EtcdCluster::start(1).unwrap_or_else(|e| panic!("{e}")));
        if shared {
            SHARED.get_or_init(start).clone()
        } else {
            start()
        }
    })
    .await
    .expect("starting etcd");
    let admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("admin client");
    Arc::new(EtcdDeployment {
        cluster,
        admin,
        owns_cluster: !shared,
    })
}

/// An etcd deployment: the cluster and an admin client that counts keys.
pub struct EtcdDeployment {
    cluster: Arc<EtcdCluster>,
    admin: etcd_client::Client,
    owns_cluster: bool,
}

struct ProxyCut(Vec<Proxy>);

impl Cut for ProxyCut {
    fn cut(&self) {
        self.0.iter().for_each(|p| p.set_mode(ProxyMode::Blackhole));
    }
    fn restore(&self) {
        self.0.iter().for_each(|p| p.set_mode(ProxyMode::Pass));
    }
}

impl ServerFaults for EtcdDeployment {
    fn kill_all(&self) {
        self.cluster.members.iter().for_each(|m| m.kill());
    }
    fn restart_all(&self) {
        std::thread::scope(|s| {
            for m in &self.cluster.members {
                s.spawn(|| m.restart().unwrap_or_else(|e| panic!("{e}")));
            }
        });
    }
}

#[async_trait]
impl Deployment for EtcdDeployment {
    fn label(&self) -> &'static str {
        "etcd"
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
        let proxies: Vec<Proxy> = self
            .cluster
            .client_ports
            .iter()
            .map(|&p| Proxy::start(([127, 0, 0, 1], p).into()).expect("proxy"))
            .collect();
        let endpoints: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
        let client = EtcdBackend::connect(&endpoints, options())
            .await
            .expect("connect through proxy");
        (Arc::new(client), Box::new(ProxyCut(proxies)))
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
