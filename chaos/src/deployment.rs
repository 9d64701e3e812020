//! Where a campaign runs: the deployments, the servers of one run (started as its fault needs
//! them), their fault hooks, and a raw count of what they hold under a name.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::LockName;
use distlock_conformance::harness::{
    ClockOffset, EtcdCluster, HarnessError, PostgresPair, PostgresServer, RedisCluster,
    RedisMasters, RedisReplicated, RedisSentinel, RedisServer, ServerProcess, ZkEnsemble,
};
use distlock_conformance::leftovers;
use rand::Rng;

use crate::nemesis::Nemesis;

/// The prefix (etcd, Redis) or root (ZooKeeper, with a `/`) of every run's keys.
const PREFIX: &str = "chaos";
/// The plain layout's key prefix (the key is the prefix and the name, verbatim).
const PLAIN_PREFIX: &str = "chaos:";

/// Where a campaign runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// One redis-server, stock settings.
    Redis,
    /// One redis-server with an append-only file synced at every write: the crash-safe Redis.
    RedisAof,
    /// One redis-server, stock settings, with the plain layout other languages' clients share
    /// (`layout=plain`: one key, no token, no queue; waiters poll). Locks only.
    RedisPlain,
    /// Redlock over 3 masters without persistence (a crash restarts empty).
    Redlock,
    /// etcd, one member.
    Etcd,
    /// etcd, three members.
    Etcd3,
    /// ZooKeeper, standalone.
    Zk,
    /// ZooKeeper, three nodes.
    Zk3,
    /// A Redis master and one replica (asynchronous replication, no persistence) watched by a
    /// Sentinel, which promotes the replica when the master dies; clients find the master
    /// through the Sentinel.
    RedisSentinel,
    /// A Redis Cluster of 3 masters (no replicas, stock persistence); each client connects as
    /// its own ACL user, by which it is cut (a proxy cannot stand in front of a cluster client,
    /// which learns the nodes' addresses from the cluster).
    RedisCluster,
    /// One PostgreSQL server, stock settings (fsync on: the correctness grade).
    Postgres,
    /// A PostgreSQL primary and its synchronous standby; a failover promotes the standby and
    /// rebuilds the old primary as the new one's standby. Clients list both servers.
    PostgresSync,
}

/// Every deployment.
pub const DEPLOYMENTS: [Deployment; 12] = [
    Deployment::Redis,
    Deployment::RedisAof,
    Deployment::RedisPlain,
    Deployment::RedisSentinel,
    Deployment::RedisCluster,
    Deployment::Redlock,
    Deployment::Etcd,
    Deployment::Etcd3,
    Deployment::Zk,
    Deployment::Zk3,
    Deployment::Postgres,
    Deployment::PostgresSync,
];

impl Deployment {
    /// Its label in the report.
    pub fn label(self) -> &'static str {
        match self {
            Deployment::Redis => "redis",
            Deployment::RedisAof => "redis-aof",
            Deployment::RedisPlain => "redis-plain",
            Deployment::Redlock => "redlock",
            Deployment::Etcd => "etcd",
            Deployment::Etcd3 => "etcd3",
            Deployment::Zk => "zk",
            Deployment::Zk3 => "zk3",
            Deployment::RedisSentinel => "redis-sentinel",
            Deployment::RedisCluster => "redis-cluster",
            Deployment::Postgres => "postgres",
            Deployment::PostgresSync => "postgres-sync",
        }
    }

    /// The faults this deployment runs under: the client faults everywhere (but behind a
    /// Sentinel, whose clients reach the master directly), server kills where a server runs
    /// alone or in a quorum, a wall-clock jump where TTLs are counted by a server's clock
    /// (Redis, Redlock), Redlock's delayed restart, a failover (Sentinel, PostgreSQL's
    /// synchronous standby), and where there are
    /// several servers, a client cut from one of them; a member cut from its peers in a quorum
    /// or a Redis Cluster (a master, through its bus proxies). A Redis Cluster client is cut by
    /// its ACL user: no proxy delays it.
    pub fn nemeses(self) -> Vec<Nemesis> {
        use Nemesis::*;
        let server: &[Nemesis] = match self {
            Deployment::RedisSentinel | Deployment::PostgresSync => return vec![Failover],
            Deployment::RedisCluster => {
                return vec![
                    PauseClient,
                    KillClient,
                    CutClient,
                    ResetClient,
                    KillServer,
                    PartitionMember,
                ];
            }
            Deployment::Redis | Deployment::RedisPlain => &[KillServer, ClockJump],
            Deployment::Redlock => &[KillServer, KillServerLate, ClockJump, CutClientMinority],
            Deployment::Etcd3 | Deployment::Zk3 => {
                &[KillServer, PartitionMember, CutClientMinority]
            }
            _ => &[KillServer],
        };
        [PauseClient, KillClient, CutClient, DelayClient, ResetClient]
            .into_iter()
            .chain(server.iter().copied())
            .collect()
    }

    /// Which violations are the known hazard of fault `n` on this deployment (and so expected),
    /// as (two holders and what they broke at the resource; tokens, terms and what observers
    /// report).
    pub fn hazards(self, n: Nemesis) -> (bool, bool) {
        match (n, self) {
            // No lease survives a pause past its TTL without the resource's check: two holders,
            // and an unfenced write from the stale one (Kleppmann; Jepsen's lock-set).
            (Nemesis::PauseClient, _) => (true, false),
            // One server without replication or fsync forgets locks and its token counter, which
            // then hands out tokens again (the register sees one token from two holders).
            // A cluster master is such a server for the names in its slots.
            (Nemesis::KillServer, Deployment::Redis | Deployment::RedisCluster) => (true, true),
            // The plain layout hands out no token: only the second holder.
            (Nemesis::KillServer, Deployment::RedisPlain) => (true, false),
            // A Redlock node restarted empty within the TTL gives a second majority.
            (Nemesis::KillServer, Deployment::Redlock) => (true, false),
            // Redis counts a TTL on its wall clock: a step forward expires locks early (one
            // server: a second holder; Redlock: a second majority where the first had the jumped
            // node in its majority). Tokens still come from the counter, in order.
            (
                Nemesis::ClockJump,
                Deployment::Redis | Deployment::RedisPlain | Deployment::Redlock,
            ) => (true, false),
            // Asynchronous replication: the promoted replica may lack the last locks and counter
            // steps (two holders, a token handed out twice).
            (Nemesis::Failover, Deployment::RedisSentinel) => (true, true),
            _ => (false, false),
        }
    }

    /// The lease TTL clients use (the shortest session a stock ZooKeeper gives is 4 s).
    pub fn ttl(self) -> Duration {
        match self {
            Deployment::Zk | Deployment::Zk3 => Duration::from_secs(4),
            _ => Duration::from_secs(2),
        }
    }

    /// The backend URL over `hosts` (`host:port` each).
    pub fn url(self, hosts: &[String]) -> String {
        let all = hosts.join(",");
        match self {
            Deployment::Redis | Deployment::RedisAof => {
                format!("redis://{}?prefix={PREFIX}&op_timeout=1s", hosts[0])
            }
            Deployment::RedisPlain => format!(
                "redis://{}?layout=plain&prefix={PLAIN_PREFIX}&op_timeout=1s",
                hosts[0]
            ),
            Deployment::Redlock => {
                format!("redlock://{all}?prefix={PREFIX}&node_timeout=200ms&retry_delay=5ms..30ms")
            }
            Deployment::Etcd | Deployment::Etcd3 => {
                format!("etcd://{all}/{PREFIX}?session_ttl=2s&op_timeout=1s")
            }
            Deployment::Zk | Deployment::Zk3 => {
                format!("zk://{all}?root=/{PREFIX}&session_timeout=4s&op_timeout=1s")
            }
            Deployment::RedisSentinel => {
                format!("redis+sentinel://{all}/{SERVICE}?prefix={PREFIX}&op_timeout=1s")
            }
            // The client's credentials lead the first host (`user:pw@host:port`).
            Deployment::RedisCluster => {
                format!("redis+cluster://{all}?prefix={PREFIX}&op_timeout=1s")
            }
            Deployment::Postgres | Deployment::PostgresSync => {
                format!("postgres://postgres@{all}/postgres?schema={PREFIX}&op_timeout=1s")
            }
        }
    }
}

/// The Sentinel's name for the master.
const SERVICE: &str = "chaos";

/// The servers of one run.
pub(crate) struct Servers {
    pub(crate) kind: Deployment,
    pub(crate) ports: Vec<u16>,
    /// Each server's wall clock, where the run moves them (clock jumps).
    pub(crate) clocks: Vec<ClockOffset>,
    pub(crate) processes: Box<dyn Fn() -> Vec<Arc<dyn ProcessRef>> + Send + Sync>,
    pub(crate) leader: Box<dyn Fn() -> Option<usize> + Send + Sync>,
    /// Cuts (`true`) or heals member i's links to its peers, where the run started them behind
    /// proxies.
    pub(crate) isolate: Box<dyn Fn(usize, bool) + Send + Sync>,
    /// A Redis Cluster's nodes, whose clients are cut by their ACL user, not by proxies.
    pub(crate) cluster: Option<Arc<RedisCluster>>,
    /// Fails the primary over to its standby and returns once the deployment is whole again,
    /// where it has one.
    pub(crate) fail_over: Option<Box<dyn Fn() + Send + Sync>>,
    /// What the servers hold under a lock name, counted raw.
    pub(crate) leftovers: Box<dyn Fn(LockName) -> BoxFuture<usize> + Send + Sync>,
    pub(crate) _keep: Box<dyn std::any::Any + Send + Sync>,
}

/// A server process, whatever harness type owns it.
pub(crate) trait ProcessRef: Send + Sync {
    fn process(&self) -> &ServerProcess;
}

struct Held<T>(Arc<T>, usize);

impl ProcessRef for Held<RedisMasters> {
    fn process(&self) -> &ServerProcess {
        self.0.nodes[self.1].process()
    }
}
impl ProcessRef for Held<RedisServer> {
    fn process(&self) -> &ServerProcess {
        self.0.process()
    }
}
impl ProcessRef for Held<EtcdCluster> {
    fn process(&self) -> &ServerProcess {
        &self.0.members[self.1]
    }
}
impl ProcessRef for Held<(RedisReplicated, RedisSentinel)> {
    fn process(&self) -> &ServerProcess {
        let pair = &self.0.0;
        [&pair.master, &pair.replica][self.1].process()
    }
}
impl ProcessRef for Held<RedisCluster> {
    fn process(&self) -> &ServerProcess {
        self.0.nodes[self.1].process()
    }
}
impl ProcessRef for Held<PostgresServer> {
    fn process(&self) -> &ServerProcess {
        self.0.process()
    }
}
impl ProcessRef for Held<PostgresPair> {
    fn process(&self) -> &ServerProcess {
        self.0.server(self.1).process()
    }
}
impl ProcessRef for Held<ZkEnsemble> {
    fn process(&self) -> &ServerProcess {
        &self.0.nodes[self.1]
    }
}

pub(crate) type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Servers that can say what they hold under a name.
trait Leftovers: Send + Sync + 'static {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize>;
}

impl Leftovers for RedisServer {
    /// distlock's keys of `name`, and its plain layout's one key (`redis-plain` runs here too).
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move {
            let mut admin = self.admin().await.expect("admin connection");
            leftovers::redis(&mut admin, PREFIX, &name).await
                + leftovers::redis_plain(&mut admin, PLAIN_PREFIX, &name).await
        })
    }
}

impl Leftovers for RedisMasters {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move {
            let mut n = 0;
            for node in &self.nodes {
                let mut admin = node.admin().await.expect("admin connection");
                n += leftovers::redis(&mut admin, PREFIX, &name).await;
            }
            n
        })
    }
}

impl Leftovers for RedisCluster {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move { leftovers::redis_cluster_at(&self.urls(), PREFIX, &name).await })
    }
}

impl Leftovers for (RedisReplicated, RedisSentinel) {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move {
            // The master the Sentinel names now (the replica copies it).
            let (pair, sentinel) = &*self;
            let port = sentinel.master_port(SERVICE);
            let master = [&pair.master, &pair.replica]
                .into_iter()
                .find(|s| Some(s.port()) == port)
                .unwrap_or(&pair.master);
            let mut admin = master.admin().await.expect("admin connection");
            leftovers::redis(&mut admin, PREFIX, &name).await
        })
    }
}

impl Leftovers for EtcdCluster {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move { leftovers::etcd_at(&self.endpoints(), PREFIX, &name).await })
    }
}

impl Leftovers for ZkEnsemble {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move {
            leftovers::zk_at(&self.connect_string(), &format!("/{PREFIX}"), &name).await
        })
    }
}

impl Leftovers for PostgresServer {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move { leftovers::postgres_at(&self.url(), PREFIX, &name).await })
    }
}

impl Leftovers for PostgresPair {
    /// On the primary of the moment (the standby copies it).
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move {
            let url = self.server(self.primary()).url();
            leftovers::postgres_at(&url, PREFIX, &name).await
        })
    }
}

fn leftovers_of<T: Leftovers>(
    s: &Arc<T>,
) -> Box<dyn Fn(LockName) -> BoxFuture<usize> + Send + Sync> {
    let s = s.clone();
    Box::new(move |name| s.clone().count(name))
}

/// The `n` server processes of `s`.
fn refs<T: Send + Sync + 'static>(s: &Arc<T>, n: usize) -> Vec<Arc<dyn ProcessRef>>
where
    Held<T>: ProcessRef,
{
    (0..n)
        .map(|i| Arc::new(Held(s.clone(), i)) as Arc<dyn ProcessRef>)
        .collect()
}

/// Starts `kind`'s servers as `nemesis` needs them (on shifted clocks, with peer links).
pub(crate) fn start(kind: Deployment, nemesis: Nemesis) -> Servers {
    let fail = |e: HarnessError| -> ! { panic!("{}: {e}", kind.label()) };
    let clocks = |n: usize| -> Vec<ClockOffset> {
        (0..n)
            .map(|_| ClockOffset::new().unwrap_or_else(|e| fail(e)))
            .collect()
    };
    match (kind, nemesis) {
        (Deployment::Redis | Deployment::RedisPlain, Nemesis::ClockJump) => {
            let clocks = clocks(1);
            let s = Arc::new(RedisServer::start_on_clock(&clocks[0]).unwrap_or_else(|e| fail(e)));
            let p = s.port();
            leaderless(kind, s, vec![p], clocks)
        }
        (Deployment::Redlock, Nemesis::ClockJump) => {
            let clocks = clocks(3);
            let s = Arc::new(RedisMasters::start_on_clocks(&clocks).unwrap_or_else(|e| fail(e)));
            let ports = s.nodes.iter().map(RedisServer::port).collect();
            leaderless(kind, s, ports, clocks)
        }
        (Deployment::RedisSentinel, _) => {
            let pair = RedisReplicated::start().unwrap_or_else(|e| fail(e));
            let sentinel =
                RedisSentinel::start(SERVICE, pair.master.port()).unwrap_or_else(|e| fail(e));
            let ports = vec![sentinel.port()];
            let s = Arc::new((pair, sentinel));
            // The server the Sentinel names as master now.
            let leader = |s: &(RedisReplicated, RedisSentinel)| {
                let (pair, sentinel) = s;
                let port = sentinel.master_port(SERVICE)?;
                [&pair.master, &pair.replica]
                    .iter()
                    .position(|s| s.port() == port)
            };
            // The Sentinel calls the master down after 1 s, then promotes the replica; the old
            // master comes back as its replica.
            let fail_over = move |s: &(RedisReplicated, RedisSentinel)| {
                let old = leader(s).unwrap_or(0);
                let servers = [&s.0.master, &s.0.replica];
                servers[old].process().kill();
                let promoted = Instant::now() + Duration::from_secs(20);
                while leader(s).is_none_or(|l| l == old) && Instant::now() < promoted {
                    std::thread::sleep(Duration::from_millis(50));
                }
                servers[old]
                    .process()
                    .restart()
                    .unwrap_or_else(|e| panic!("redis-sentinel: restart: {e}"));
            };
            failing_over(kind, s, ports, leader, fail_over)
        }
        (Deployment::PostgresSync, _) => {
            let s = Arc::new(PostgresPair::start().unwrap_or_else(|e| fail(e)));
            let ports = (0..2).map(|i| s.server(i).port()).collect();
            failing_over(
                kind,
                s,
                ports,
                |p| Some(p.primary()),
                |p| {
                    p.fail_over()
                        .unwrap_or_else(|e| panic!("postgres-sync: failover: {e}"))
                },
            )
        }
        (Deployment::Redis | Deployment::RedisAof | Deployment::RedisPlain, _) => {
            // The crash-safe variant differs from stock in what the run exists to vary.
            let aof: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];
            let extra = if kind == Deployment::RedisAof {
                aof
            } else {
                &[]
            };
            let s = Arc::new(RedisServer::start_with(extra, None).unwrap_or_else(|e| fail(e)));
            let p = s.port();
            leaderless(kind, s, vec![p], Vec::new())
        }
        (Deployment::Redlock, _) => {
            let s = Arc::new(RedisMasters::start(3).unwrap_or_else(|e| fail(e)));
            let ports = s.nodes.iter().map(RedisServer::port).collect();
            leaderless(kind, s, ports, Vec::new())
        }
        (Deployment::RedisCluster, _) => {
            let s = Arc::new(
                if nemesis == Nemesis::PartitionMember {
                    // A master is found cut off only once the cut outlasts the node timeout;
                    // stock (15 s) outlasts the cut (1.5 TTLs), so the cut would show nothing.
                    RedisCluster::start_with_bus_links(3, kind.ttl())
                } else {
                    RedisCluster::start(3)
                }
                .unwrap_or_else(|e| fail(e)),
            );
            let (ports, c) = (s.nodes.iter().map(RedisServer::port).collect(), s.clone());
            let cut = s.clone();
            Servers {
                kind,
                ports,
                clocks: Vec::new(),
                processes: Box::new(move || refs(&c, 3)),
                leader: Box::new(|| None),
                isolate: Box::new(move |i, on| cut.isolate(i, on)),
                cluster: Some(s.clone()),
                fail_over: None,
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
        (Deployment::Postgres, _) => {
            let s = Arc::new(PostgresServer::start().unwrap_or_else(|e| fail(e)));
            let p = s.port();
            leaderless(kind, s, vec![p], Vec::new())
        }
        (Deployment::Etcd, _) => quorum::<EtcdCluster>(kind, 1, nemesis),
        (Deployment::Etcd3, _) => quorum::<EtcdCluster>(kind, 3, nemesis),
        (Deployment::Zk, _) => quorum::<ZkEnsemble>(kind, 1, nemesis),
        (Deployment::Zk3, _) => quorum::<ZkEnsemble>(kind, 3, nemesis),
    }
}

/// Servers with no leader and no links between them to cut (one server, Redlock's masters):
/// each of `s`'s processes, clients on `ports`, wall clocks `clocks` where the run moves them.
fn leaderless<T: Leftovers>(
    kind: Deployment,
    s: Arc<T>,
    ports: Vec<u16>,
    clocks: Vec<ClockOffset>,
) -> Servers
where
    Held<T>: ProcessRef,
{
    let (n, c) = (ports.len(), s.clone());
    Servers {
        kind,
        ports,
        clocks,
        processes: Box::new(move || refs(&c, n)),
        leader: Box::new(|| None),
        isolate: Box::new(|_, _| {}),
        cluster: None,
        fail_over: None,
        leftovers: leftovers_of(&s),
        _keep: Box::new(s),
    }
}

/// Two servers, one leading (`leader`), whose run fails the leader over (`fail_over` returns
/// once the deployment is whole again); clients on `ports`.
fn failing_over<T: Leftovers>(
    kind: Deployment,
    s: Arc<T>,
    ports: Vec<u16>,
    leader: impl Fn(&T) -> Option<usize> + Send + Sync + 'static,
    fail_over: impl Fn(&T) + Send + Sync + 'static,
) -> Servers
where
    Held<T>: ProcessRef,
{
    let (c, l, f) = (s.clone(), s.clone(), s.clone());
    Servers {
        kind,
        ports,
        clocks: Vec::new(),
        processes: Box::new(move || refs(&c, 2)),
        leader: Box::new(move || leader(&l)),
        isolate: Box::new(|_, _| {}),
        cluster: None,
        fail_over: Some(Box::new(move || fail_over(&f))),
        leftovers: leftovers_of(&s),
        _keep: Box::new(s),
    }
}

/// An etcd cluster or a ZooKeeper ensemble, as a run drives it.
trait Quorum: Leftovers + Sized {
    fn start(n: usize, peer_links: bool) -> Result<Self, HarnessError>;
    fn client_ports(&self) -> Vec<u16>;
    fn leader(&self) -> Option<usize>;
    fn isolate(&self, i: usize, cut: bool);
}

impl Quorum for EtcdCluster {
    fn start(n: usize, peer_links: bool) -> Result<Self, HarnessError> {
        if peer_links {
            EtcdCluster::start_with_peer_links(n)
        } else {
            EtcdCluster::start(n)
        }
    }
    fn client_ports(&self) -> Vec<u16> {
        self.client_ports.clone()
    }
    fn leader(&self) -> Option<usize> {
        EtcdCluster::leader(self)
    }
    fn isolate(&self, i: usize, cut: bool) {
        EtcdCluster::isolate(self, i, cut);
    }
}

impl Quorum for ZkEnsemble {
    fn start(n: usize, peer_links: bool) -> Result<Self, HarnessError> {
        if peer_links {
            ZkEnsemble::start_with_peer_links(n)
        } else {
            ZkEnsemble::start(n)
        }
    }
    fn client_ports(&self) -> Vec<u16> {
        self.client_ports.clone()
    }
    fn leader(&self) -> Option<usize> {
        ZkEnsemble::leader(self)
    }
    fn isolate(&self, i: usize, cut: bool) {
        ZkEnsemble::isolate(self, i, cut);
    }
}

/// `n` members of `T`, with links between them behind proxies where `nemesis` cuts them.
fn quorum<T: Quorum>(kind: Deployment, n: usize, nemesis: Nemesis) -> Servers
where
    Held<T>: ProcessRef,
{
    let s = Arc::new(
        T::start(n, nemesis == Nemesis::PartitionMember)
            .unwrap_or_else(|e| panic!("{}: {e}", kind.label())),
    );
    let (c, l, cut) = (s.clone(), s.clone(), s.clone());
    Servers {
        kind,
        ports: s.client_ports(),
        clocks: Vec::new(),
        processes: Box::new(move || refs(&c, n)),
        leader: Box::new(move || l.leader()),
        isolate: Box::new(move |i, on| cut.isolate(i, on)),
        cluster: None,
        fail_over: None,
        leftovers: leftovers_of(&s),
        _keep: Box::new(s),
    }
}

/// The server a fault hits this turn: the leader on even turns, a follower on odd ones (any
/// where there is no leader).
pub(crate) fn in_turn(servers: &Servers, turn: &mut usize, rng: &mut impl Rng) -> usize {
    let n = (servers.processes)().len();
    let i = match (servers.leader)() {
        Some(l) if *turn % 2 == 0 || n == 1 => l,
        Some(l) => (l + 1) % n,
        None => rng.random_range(0..n),
    };
    *turn += 1;
    i
}
