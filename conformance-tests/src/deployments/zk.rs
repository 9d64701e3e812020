//! ZooKeeper: a standalone server ([`FACTORY`]) or a 3-node ensemble ([`ENSEMBLE_FACTORY`]),
//! shared by the scenarios, and a deployment of its own for the scenario that kills servers. Cut
//! clients go through a [`Proxy`](crate::harness::Proxy) per node. `zk_kazoo` is the standalone
//! server with kazoo's node names (`layout=kazoo`, [`KAZOO_FACTORY`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_zk::{Layout, ZkBackend, ZkOptions};

use crate::Factory;
use crate::deployment::{Cut, Deployment, ProxyCut, ServerFaults, shared_or_new};
use crate::harness::ServerProcess;
use crate::harness::ZkEnsemble;

/// The ZooKeeper backend on a standalone server.
pub const FACTORY: Factory = Factory {
    label: "zk",
    capabilities: || distlock_zk::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy("zk", 1, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy("zk", 1, false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: false,
};

/// The ZooKeeper backend on a standalone server, with kazoo's node names.
pub const KAZOO_FACTORY: Factory = Factory {
    label: "zk_kazoo",
    capabilities: || distlock_zk::KAZOO_CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy("zk_kazoo", 1, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| {
        Box::pin(async { deploy("zk_kazoo", 1, false).await as Arc<dyn Deployment> })
    }),
    survives_a_member_kill: false,
};

/// The ZooKeeper backend on a 3-node ensemble.
pub const ENSEMBLE_FACTORY: Factory = Factory {
    label: "zk3",
    capabilities: || distlock_zk::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy("zk3", 3, true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy("zk3", 3, false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: true,
};

/// The shortest session a stock server negotiates (2 x its 2 s tick).
const TTL: Duration = Duration::from_secs(4);

/// The options every client of the suite uses.
pub fn options() -> ZkOptions {
    ZkOptions {
        root: "/distlock-test".into(),
        session_timeout: TTL,
        connect_timeout: Duration::from_secs(2),
        op_timeout: Duration::from_secs(1),
        ..ZkOptions::default()
    }
}

/// A deployment of `nodes` servers: the shared one of that size, or a new one.
pub async fn deploy(label: &'static str, nodes: usize, shared: bool) -> Arc<ZkDeployment> {
    static SINGLE: OnceLock<Arc<ZkEnsemble>> = OnceLock::new();
    static TRIPLE: OnceLock<Arc<ZkEnsemble>> = OnceLock::new();
    let cell = if nodes == 1 { &SINGLE } else { &TRIPLE };
    let ensemble = shared_or_new(cell, shared, move || {
        ZkEnsemble::start(nodes).unwrap_or_else(|e| panic!("{e}"))
    })
    .await;
    let admin = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&ensemble.connect_string())
        .await
        .expect("admin client");
    let layout = if label == "zk_kazoo" {
        Layout::Kazoo
    } else {
        Layout::Curator
    };
    Arc::new(ZkDeployment {
        label,
        layout,
        ensemble,
        admin,
        owns_ensemble: !shared,
    })
}

impl ZkDeployment {
    fn options(&self) -> ZkOptions {
        ZkOptions {
            layout: self.layout,
            ..options()
        }
    }
}

/// A ZooKeeper deployment: the ensemble and an admin client that lists queue nodes.
pub struct ZkDeployment {
    label: &'static str,
    /// Whose node names its clients write.
    layout: Layout,
    /// The servers, for fault tests.
    pub ensemble: Arc<ZkEnsemble>,
    /// A client of its own, for reading what the backend left.
    pub admin: zookeeper_client::Client,
    owns_ensemble: bool,
}

impl ServerFaults for ZkDeployment {
    fn processes(&self) -> Vec<&ServerProcess> {
        self.ensemble.nodes.iter().collect()
    }
    fn leader(&self) -> Option<usize> {
        (self.ensemble.nodes.len() > 1)
            .then(|| self.ensemble.leader())
            .flatten()
    }
}

#[async_trait]
impl Deployment for ZkDeployment {
    fn label(&self) -> &'static str {
        self.label
    }

    fn capabilities(&self) -> Capabilities {
        match self.layout {
            Layout::Curator => distlock_zk::CAPABILITIES.clone(),
            Layout::Kazoo => distlock_zk::KAZOO_CAPABILITIES.clone(),
        }
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            ZkBackend::connect(&self.ensemble.connect_string(), self.options())
                .await
                .expect("connect"),
        )
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        let proxies = ProxyCut::to_ports(self.ensemble.client_ports.iter().copied());
        let client = ZkBackend::connect(&proxies.addrs().join(","), self.options())
            .await
            .expect("connect through proxy");
        (Arc::new(client), Box::new(proxies))
    }

    async fn artifacts(&self, name: &LockName) -> usize {
        crate::leftovers::zk(&self.admin, &options().root, name).await
    }

    async fn delete_lock(&self, name: &LockName) {
        let dir = distlock_zk::paths::lock_dir(&options().root, name);
        let children = self.admin.list_children(&dir).await.expect("list");
        assert!(!children.is_empty(), "nothing to delete");
        for child in children {
            match self.admin.delete(&format!("{dir}/{child}"), None).await {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                Err(e) => panic!("delete {dir}/{child}: {e}"),
            }
        }
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    /// A stock server expires sessions in buckets of its 2 s tick: up to a tick after the
    /// timeout, plus a margin.
    fn expiry_slack(&self) -> Duration {
        Duration::from_millis(2_500)
    }

    fn url(&self) -> Option<String> {
        let layout = match self.layout {
            Layout::Curator => "",
            Layout::Kazoo => "&layout=kazoo",
        };
        Some(format!(
            "zk://{}?root=/distlock-test&session_timeout=4s&op_timeout=1s{layout}",
            self.ensemble.connect_string()
        ))
    }

    fn servers(&self) -> Option<&dyn ServerFaults> {
        self.owns_ensemble.then_some(self as &dyn ServerFaults)
    }

    /// ZooKeeper does not tell a session's remaining time: the negotiated timeout bounds it.
    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        (self.artifacts(name).await > 0).then_some(TTL)
    }

    /// Two session timeouts: the client's own pings must keep the session alive.
    fn idle(&self) -> Duration {
        TTL * 2
    }
}
