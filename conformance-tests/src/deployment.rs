//! What a backend gives the suite: independent clients of one deployment, a peek at what the
//! backend stores, and fault hooks.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};

use crate::harness::{Proxy, ProxyMode, ServerProcess};

/// Cuts one client off from the servers and restores it.
pub trait Cut: Send + Sync {
    /// From now on, the client's traffic goes nowhere (its calls fail or hang until timeout).
    fn cut(&self);
    /// Traffic flows again.
    fn restore(&self);
    /// Closes every connection of the client (a TCP reset, or the server dropping it) and lets
    /// traffic flow again: a cut healed by reconnecting.
    fn reset(&self);
}

/// A client's proxies, one per server: cutting blackholes all of them.
pub struct ProxyCut(pub Vec<Proxy>);

impl ProxyCut {
    /// A proxy in front of each loopback port.
    ///
    /// # Panics
    /// When no loopback port can be bound (the test cannot run then).
    pub fn to_ports(ports: impl IntoIterator<Item = u16>) -> Self {
        ProxyCut(
            ports
                .into_iter()
                .map(|p| {
                    Proxy::start(([127, 0, 0, 1], p).into())
                        .unwrap_or_else(|e| panic!("proxy: {e}"))
                })
                .collect(),
        )
    }

    /// The proxies' `host:port` addresses, in order.
    pub fn addrs(&self) -> Vec<String> {
        self.0.iter().map(|p| p.addr().to_string()).collect()
    }
}

impl Cut for ProxyCut {
    fn cut(&self) {
        self.0.iter().for_each(|p| p.set_mode(ProxyMode::Blackhole));
    }
    fn restore(&self) {
        self.0.iter().for_each(|p| p.set_mode(ProxyMode::Pass));
    }
    fn reset(&self) {
        self.0.iter().for_each(|p| {
            p.reset();
            p.set_mode(ProxyMode::Pass);
        });
    }
}

/// SIGKILL every process.
pub fn kill_all<'a>(procs: impl IntoIterator<Item = &'a ServerProcess>) {
    procs.into_iter().for_each(ServerProcess::kill);
}

/// Restarts every process at once (a quorum member is only ready once its peers run).
///
/// # Panics
/// When a server does not come back: the test cannot go on.
pub fn restart_all<'a>(procs: impl IntoIterator<Item = &'a ServerProcess>) {
    std::thread::scope(|s| {
        for p in procs {
            s.spawn(move || p.restart().unwrap_or_else(|e| panic!("{e}")));
        }
    });
}

/// The servers in `cell` when `shared` (started once per test binary), else new ones; started
/// off the async runtime, since starting blocks.
///
/// # Panics
/// When the servers cannot start: the test cannot go on.
pub async fn shared_or_new<T: Send + Sync + 'static>(
    cell: &'static OnceLock<Arc<T>>,
    shared: bool,
    start: impl FnOnce() -> T + Send + 'static,
) -> Arc<T> {
    tokio::task::spawn_blocking(move || {
        if shared {
            cell.get_or_init(|| Arc::new(start())).clone()
        } else {
            Arc::new(start())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("starting servers: {e}"))
}

/// Process-level faults on the servers of a deployment.
pub trait ServerFaults: Send + Sync {
    /// The server processes, in order (each can be killed, paused and restarted on its own).
    fn processes(&self) -> Vec<&ServerProcess>;
    /// The index of the server that leads the others, where one does (etcd, ZooKeeper).
    fn leader(&self) -> Option<usize> {
        None
    }
    /// SIGKILL every server of the deployment.
    fn kill_all(&self) {
        kill_all(self.processes());
    }
    /// Start them again (same ports) and wait until they serve.
    fn restart_all(&self) {
        restart_all(self.processes());
    }
}

/// One deployment of one backend (a memory store, a Redis server, an etcd cluster, ...).
///
/// Scenarios take every client they need from [`Deployment::client`]: a competitor is always a
/// separate connection / session / lease, never the same client object.
#[async_trait]
pub trait Deployment: Send + Sync {
    /// The backend's label in test names and the matrix (`memory`, `redis`, `etcd`, ...).
    fn label(&self) -> &'static str;

    /// What the backend declares.
    fn capabilities(&self) -> Capabilities;

    /// A new, independent client.
    async fn client(&self) -> Arc<dyn LockBackend>;

    /// A new, independent client whose traffic can be cut.
    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>);

    /// How many artifacts the backend keeps for `name` (a live holder key, queued waiter keys or
    /// nodes); read from the server, not from a client's memory.
    async fn artifacts(&self, name: &LockName) -> usize;

    /// Deletes `name`'s lock on the server behind its holder's back, as an operator would
    /// (Redis `DEL`, etcd delete, ZooKeeper node delete, eviction from the memory store).
    async fn delete_lock(&self, name: &LockName);

    /// The lease TTL the scenarios use on this backend (short, so the suite stays fast).
    fn ttl(&self) -> Duration;

    /// How long after the TTL the server may take to free a dead holder's lock.
    fn expiry_slack(&self) -> Duration;

    /// Tasks and cycles of the contention scenario: 32 x 60 unless the deployment says why not
    /// (every task waits behind the 31 others each cycle; the fault campaign and the
    /// differential test run the long histories).
    fn contention(&self) -> (u64, u64) {
        (32, 60)
    }

    /// The URL another process would use to reach this deployment (with the suite's TTL and
    /// timeouts), or `None` for an in-process store.
    fn url(&self) -> Option<String> {
        None
    }

    /// Server faults, when the deployment runs server processes of its own.
    fn servers(&self) -> Option<&dyn ServerFaults> {
        None
    }

    /// How long the server will keep `name`'s current holder if nothing renews it, read from
    /// the server (Redis `PTTL`, the etcd lease's remaining TTL, ...), or `None` when nobody
    /// holds it. ZooKeeper cannot tell a session's remaining time: its negotiated timeout.
    async fn server_expiry(&self, name: &LockName) -> Option<Duration>;

    /// How long a client must stay idle to pass the server's own idle limits (connection idle
    /// timeouts, HTTP/2 ping policy, session pings); zero when there are none to pass.
    fn idle(&self) -> Duration {
        Duration::ZERO
    }

    /// A client to leave idle for [`Deployment::idle`]: on a server with an idle limit to pass
    /// (a Redis with `timeout`), which may be a server of its own.
    async fn idle_client(&self) -> Arc<dyn LockBackend> {
        self.client().await
    }
}
