//! The campaign: for each workload, deployment and nemesis, real servers, a resource process and
//! client processes, faults on a schedule, then the merged history through the checker, and what
//! the servers still hold once every client stopped and every TTL passed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::LockName;
use distlock_conformance::deployment::{Cut, ProxyCut};
use distlock_conformance::harness::{
    ClockOffset, EtcdCluster, ProxyMode, RedisMasters, RedisReplicated, RedisSentinel, RedisServer,
    ServerProcess, TempDir, ZkEnsemble,
};
use distlock_conformance::leftovers;
use rand::Rng;

use crate::check::{Findings, check};
use crate::history::{self, Event, NEMESIS, Recorder};
use crate::workload::{FIRST_OBSERVER, OBSERVERS, WORKLOADS, Workload};

/// The prefix (etcd, Redis) or root (ZooKeeper, with a `/`) of every run's keys.
const PREFIX: &str = "chaos";

/// Where a campaign runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// One redis-server, stock settings.
    Redis,
    /// One redis-server with an append-only file synced at every write: the crash-safe Redis.
    RedisAof,
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
}

/// Every deployment.
pub const DEPLOYMENTS: [Deployment; 8] = [
    Deployment::Redis,
    Deployment::RedisAof,
    Deployment::RedisSentinel,
    Deployment::Redlock,
    Deployment::Etcd,
    Deployment::Etcd3,
    Deployment::Zk,
    Deployment::Zk3,
];

impl Deployment {
    /// Its label in the report.
    pub fn label(self) -> &'static str {
        match self {
            Deployment::Redis => "redis",
            Deployment::RedisAof => "redis-aof",
            Deployment::Redlock => "redlock",
            Deployment::Etcd => "etcd",
            Deployment::Etcd3 => "etcd3",
            Deployment::Zk => "zk",
            Deployment::Zk3 => "zk3",
            Deployment::RedisSentinel => "redis-sentinel",
        }
    }

    /// The faults this deployment runs under: the client faults everywhere (but behind a
    /// Sentinel, whose clients reach the master directly), server kills where a server runs
    /// alone or in a quorum, a wall-clock jump where TTLs are counted by a server's clock
    /// (Redis, Redlock), Redlock's delayed restart, a Sentinel failover, and where there are
    /// several servers, a client cut from one of them; a member cut from its peers in a quorum.
    pub fn nemeses(self) -> Vec<Nemesis> {
        use Nemesis::*;
        let server: &[Nemesis] = match self {
            Deployment::RedisSentinel => return vec![Failover],
            Deployment::Redis => &[KillServer, ClockJump],
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

    /// The lease TTL clients use (the shortest session a stock ZooKeeper gives is 4 s).
    pub fn ttl(self) -> Duration {
        match self {
            Deployment::Zk | Deployment::Zk3 => Duration::from_secs(4),
            _ => Duration::from_secs(2),
        }
    }

    /// The backend URL over `hosts` (`host:port` each).
    fn url(self, hosts: &[String]) -> String {
        let all = hosts.join(",");
        match self {
            Deployment::Redis | Deployment::RedisAof => {
                format!("redis://{}?prefix={PREFIX}&op_timeout=1s", hosts[0])
            }
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
        }
    }
}

/// The Sentinel's name for the master.
const SERVICE: &str = "chaos";

/// One run of a campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// What the clients do.
    pub workload: Workload,
    /// Where.
    pub deployment: Deployment,
    /// Under which fault.
    pub nemesis: Nemesis,
}

impl Run {
    /// `workload/deployment/nemesis`.
    pub fn label(&self) -> String {
        format!(
            "{}/{}/{}",
            self.workload.label(),
            self.deployment.label(),
            self.nemesis.label()
        )
    }
}

/// Every run of the full campaign, in order: each workload on each deployment that offers it,
/// under each of that deployment's faults.
pub fn plan() -> Vec<Run> {
    WORKLOADS
        .iter()
        .flat_map(|w| {
            DEPLOYMENTS
                .iter()
                .filter(|d| w.offered_on(**d))
                .flat_map(move |d| {
                    d.nemeses().into_iter().map(move |n| Run {
                        workload: *w,
                        deployment: *d,
                        nemesis: n,
                    })
                })
        })
        .collect()
}

/// A fault schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    /// SIGSTOP a client past its TTL, then SIGCONT.
    PauseClient,
    /// SIGKILL a client and start a new one.
    KillClient,
    /// Blackhole one client's connections to the servers past its TTL, then heal.
    CutClient,
    /// SIGKILL a server (leader and follower in turn) and restart it half a second later.
    KillServer,
    /// The same, restarting it only after 1.5 TTLs: Redlock's delayed-restart rule.
    KillServerLate,
    /// Delay one client's traffic by half a TTL each way (a round trip takes a whole TTL) for
    /// 1.5 TTLs: every request and answer arrives late, none is lost.
    DelayClient,
    /// Close every connection of one client at once (a TCP reset); it reconnects.
    ResetClient,
    /// Move one server's wall clock forward by 2 TTLs (an NTP step, an operator's `date -s`).
    ClockJump,
    /// SIGKILL the master; restart it once the Sentinel has promoted the replica (it comes back
    /// empty and is made a replica).
    Failover,
    /// Cut one member (the leader and a follower in turn) from its peers, both ways, for 1.5
    /// TTLs, while every client still reaches it: it answers, but cannot commit.
    PartitionMember,
    /// Blackhole one client's traffic to one server (the leader and a follower in turn) for
    /// 1.5 TTLs; it still reaches the others.
    CutClientMinority,
}

impl Nemesis {
    /// Its label in the history and the report.
    pub fn label(self) -> &'static str {
        match self {
            Nemesis::PauseClient => "pause-client",
            Nemesis::KillClient => "kill-client",
            Nemesis::CutClient => "cut-client",
            Nemesis::KillServer => "kill-server",
            Nemesis::KillServerLate => "kill-server-late",
            Nemesis::DelayClient => "delay-client",
            Nemesis::ResetClient => "reset-client",
            Nemesis::ClockJump => "clock-jump",
            Nemesis::Failover => "failover",
            Nemesis::PartitionMember => "partition-member",
            Nemesis::CutClientMinority => "cut-client-minority",
        }
    }

    /// Which violations are the known hazard of this fault on this deployment (and so expected),
    /// as (overlaps and lost elements, tokens: out of order or handed out twice).
    pub fn expected(self, d: Deployment) -> (bool, bool) {
        match (self, d) {
            // No lease survives a pause past its TTL without the resource's check: two holders,
            // and an unfenced write from the stale one (Kleppmann; Jepsen's lock-set).
            (Nemesis::PauseClient, _) => (true, false),
            // One server without replication or fsync forgets locks and its token counter, which
            // then hands out tokens again (the register sees one token from two holders).
            (Nemesis::KillServer, Deployment::Redis) => (true, true),
            // A Redlock node restarted empty within the TTL gives a second majority.
            (Nemesis::KillServer, Deployment::Redlock) => (true, false),
            // Redis counts a TTL on its wall clock: a step forward expires locks early (one
            // server: a second holder; Redlock: a second majority where the first had the jumped
            // node in its majority). Tokens still come from the counter, in order.
            (Nemesis::ClockJump, Deployment::Redis | Deployment::Redlock) => (true, false),
            // Asynchronous replication: the promoted replica may lack the last locks and counter
            // steps (two holders, a token handed out twice).
            (Nemesis::Failover, Deployment::RedisSentinel) => (true, true),
            _ => (false, false),
        }
    }
}

/// The servers of one run.
struct Servers {
    kind: Deployment,
    ports: Vec<u16>,
    /// Each server's wall clock, where the run moves them (clock jumps).
    clocks: Vec<ClockOffset>,
    processes: Box<dyn Fn() -> Vec<Arc<dyn ProcessRef>> + Send + Sync>,
    leader: Box<dyn Fn() -> Option<usize> + Send + Sync>,
    /// Cuts (`true`) or heals member i's links to its peers, where the run started them behind
    /// proxies.
    isolate: Box<dyn Fn(usize, bool) + Send + Sync>,
    /// What the servers hold under a lock name, counted raw.
    leftovers: Box<dyn Fn(LockName) -> BoxFuture<usize> + Send + Sync>,
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

/// A server process, whatever harness type owns it.
trait ProcessRef: Send + Sync {
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
impl ProcessRef for Held<ZkEnsemble> {
    fn process(&self) -> &ServerProcess {
        &self.0.nodes[self.1]
    }
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Servers that can say what they hold under a name.
trait Leftovers: Send + Sync + 'static {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize>;
}

impl Leftovers for RedisServer {
    fn count(self: Arc<Self>, name: LockName) -> BoxFuture<usize> {
        Box::pin(async move {
            let mut admin = self.admin().await.expect("admin connection");
            leftovers::redis(&mut admin, PREFIX, &name).await
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

fn leftovers_of<T: Leftovers>(
    s: &Arc<T>,
) -> Box<dyn Fn(LockName) -> BoxFuture<usize> + Send + Sync> {
    let s = s.clone();
    Box::new(move |name| s.clone().count(name))
}

fn start(kind: Deployment, nemesis: Nemesis) -> Servers {
    fn refs<T: Send + Sync + 'static>(s: &Arc<T>, n: usize) -> Vec<Arc<dyn ProcessRef>>
    where
        Held<T>: ProcessRef,
    {
        (0..n)
            .map(|i| Arc::new(Held(s.clone(), i)) as Arc<dyn ProcessRef>)
            .collect()
    }
    let fail =
        |e: distlock_conformance::harness::HarnessError| -> ! { panic!("{}: {e}", kind.label()) };
    let clocks = |n: usize| -> Vec<ClockOffset> {
        (0..n)
            .map(|_| ClockOffset::new().unwrap_or_else(|e| fail(e)))
            .collect()
    };
    match (kind, nemesis) {
        (Deployment::Redis, Nemesis::ClockJump) => {
            let clocks = clocks(1);
            let s = Arc::new(RedisServer::start_on_clock(&clocks[0]).unwrap_or_else(|e| fail(e)));
            let (p, c) = (s.port(), s.clone());
            Servers {
                kind,
                ports: vec![p],
                clocks,
                processes: Box::new(move || refs(&c, 1)),
                leader: Box::new(|| None),
                isolate: Box::new(|_, _| {}),
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
        (Deployment::Redlock, Nemesis::ClockJump) => {
            let clocks = clocks(3);
            let s = Arc::new(RedisMasters::start_on_clocks(&clocks).unwrap_or_else(|e| fail(e)));
            let (ports, c) = (s.nodes.iter().map(RedisServer::port).collect(), s.clone());
            Servers {
                kind,
                ports,
                clocks,
                processes: Box::new(move || refs(&c, 3)),
                leader: Box::new(|| None),
                isolate: Box::new(|_, _| {}),
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
        (Deployment::RedisSentinel, _) => {
            let pair = RedisReplicated::start().unwrap_or_else(|e| fail(e));
            let sentinel =
                RedisSentinel::start(SERVICE, pair.master.port()).unwrap_or_else(|e| fail(e));
            let ports = vec![sentinel.port()];
            let s = Arc::new((pair, sentinel));
            let (c, l) = (s.clone(), s.clone());
            Servers {
                kind,
                ports,
                clocks: Vec::new(),
                processes: Box::new(move || refs(&c, 2)),
                // The server the Sentinel names as master now.
                isolate: Box::new(|_, _| {}),
                leader: Box::new(move || {
                    let (pair, sentinel) = &*l;
                    let port = sentinel.master_port(SERVICE)?;
                    [&pair.master, &pair.replica]
                        .iter()
                        .position(|s| s.port() == port)
                }),
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
        (Deployment::Redis | Deployment::RedisAof, _) => {
            // The crash-safe variant differs from stock in what the run exists to vary.
            let aof: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];
            let extra = if kind == Deployment::RedisAof {
                aof
            } else {
                &[]
            };
            let s = Arc::new(RedisServer::start_with(extra, None).unwrap_or_else(|e| fail(e)));
            let (p, c) = (s.port(), s.clone());
            Servers {
                kind,
                ports: vec![p],
                clocks: Vec::new(),
                processes: Box::new(move || refs(&c, 1)),
                leader: Box::new(|| None),
                isolate: Box::new(|_, _| {}),
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
        (Deployment::Redlock, _) => {
            let s = Arc::new(RedisMasters::start(3).unwrap_or_else(|e| fail(e)));
            let (ports, c) = (s.nodes.iter().map(RedisServer::port).collect(), s.clone());
            Servers {
                kind,
                ports,
                clocks: Vec::new(),
                processes: Box::new(move || refs(&c, 3)),
                leader: Box::new(|| None),
                isolate: Box::new(|_, _| {}),
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
        (Deployment::Etcd | Deployment::Etcd3, _) => {
            let n = if kind == Deployment::Etcd { 1 } else { 3 };
            let s = Arc::new(
                if nemesis == Nemesis::PartitionMember {
                    EtcdCluster::start_with_peer_links(n)
                } else {
                    EtcdCluster::start(n)
                }
                .unwrap_or_else(|e| fail(e)),
            );
            let (ports, c, l, cut) = (s.client_ports.clone(), s.clone(), s.clone(), s.clone());
            Servers {
                kind,
                ports,
                clocks: Vec::new(),
                processes: Box::new(move || refs(&c, n)),
                leader: Box::new(move || l.leader()),
                isolate: Box::new(move |i, on| cut.isolate(i, on)),
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
        (Deployment::Zk | Deployment::Zk3, _) => {
            let n = if kind == Deployment::Zk { 1 } else { 3 };
            let s = Arc::new(
                if nemesis == Nemesis::PartitionMember {
                    ZkEnsemble::start_with_peer_links(n)
                } else {
                    ZkEnsemble::start(n)
                }
                .unwrap_or_else(|e| fail(e)),
            );
            let (ports, c, l, cut) = (s.client_ports.clone(), s.clone(), s.clone(), s.clone());
            Servers {
                kind,
                ports,
                clocks: Vec::new(),
                processes: Box::new(move || refs(&c, n)),
                leader: Box::new(move || l.leader()),
                isolate: Box::new(move |i, on| cut.isolate(i, on)),
                leftovers: leftovers_of(&s),
                _keep: Box::new(s),
            }
        }
    }
}

/// A child process of the campaign, killed with the campaign.
struct Process {
    child: Child,
}

impl Process {
    fn spawn(args: &[String], stdout: Stdio) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(args).stdin(Stdio::null()).stdout(stdout);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        Ok(Process {
            child: cmd.spawn()?,
        })
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One client process and the proxies it reaches the servers through.
struct Client {
    process: Process,
    cut: ProxyCut,
}

/// The server a fault hits this turn: the leader on even turns, a follower on odd ones (any
/// where there is no leader).
fn in_turn(servers: &Servers, turn: &mut usize, rng: &mut impl Rng) -> usize {
    let n = (servers.processes)().len();
    let i = match (servers.leader)() {
        Some(l) if *turn % 2 == 0 || n == 1 => l,
        Some(l) => (l + 1) % n,
        None => rng.random_range(0..n),
    };
    *turn += 1;
    i
}

/// What one run recorded.
pub struct RunResult {
    /// What the clients did.
    pub workload: Workload,
    /// The deployment.
    pub deployment: Deployment,
    /// The nemesis.
    pub nemesis: Nemesis,
    /// What the checker found.
    pub findings: Findings,
    /// The merged history.
    pub history: Vec<history::Entry>,
    /// When the run started and ended (`CLOCK_MONOTONIC` ns).
    pub span: (u64, u64),
}

impl RunResult {
    /// Violations that are not the known hazard of this fault on this deployment.
    pub fn unexpected(&self) -> usize {
        let (lease_hazard, token_hazard) = self.nemesis.expected(self.deployment);
        let f = &self.findings;
        // Nothing is ever left once every TTL passed, whatever the fault.
        let mut n = f.leftovers;
        if !lease_hazard {
            n += f.lease_violations();
        }
        if !token_hazard {
            n += f.token_violations();
        }
        n
    }
}

/// The index in `clients` of one (of those `wanted`) that holds the lock now, by its history;
/// looked for during up to 3 s.
fn holder(dir: &Path, clients: &[(u32, Client)], wanted: impl Fn(u32) -> bool) -> Option<usize> {
    for _ in 0..3_000 {
        for (i, (id, _)) in clients
            .iter()
            .enumerate()
            .filter(|(_, (id, _))| wanted(*id))
        {
            let file = dir.join(format!("client-{id}.jsonl"));
            let last = history::read(&[file]).pop();
            if matches!(
                last.map(|e| e.ev),
                Some(
                    Event::AcquireOk { .. }
                        | Event::Proclaim { .. }
                        | Event::WriteInvoke { .. }
                        | Event::WriteOk { .. }
                        | Event::SetAdd { .. }
                )
            ) {
                return Some(i);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// The client a cut targets: it keeps the lock for 3 TTLs after its writes (a long job), so a
/// cut (or a server clock jump) lands on a lease that must be kept alive, and the time to its
/// lost signal is measured.
const LONG_HOLDER: u32 = 0;

fn client_args(r: Run, url: &str, resource: &str, dir: &Path, id: u32) -> Vec<String> {
    let kind = r.deployment;
    let mut args = vec![
        "client".into(),
        "--url".into(),
        url.into(),
        "--workload".into(),
        r.workload.label(),
        "--resource".into(),
        resource.into(),
        "--history".into(),
        dir.join(format!("client-{id}.jsonl")).display().to_string(),
        "--id".into(),
        id.to_string(),
        "--ttl-ms".into(),
        kind.ttl().as_millis().to_string(),
    ];
    if matches!(r.nemesis, Nemesis::CutClient | Nemesis::ClockJump) && id == LONG_HOLDER {
        args.extend(["--hold-ms".into(), (kind.ttl() * 3).as_millis().to_string()]);
    }
    args
}

fn start_client(r: Run, servers: &Servers, resource: &str, dir: &Path, id: u32) -> Client {
    let cut = ProxyCut::to_ports(servers.ports.iter().copied());
    let url = r.deployment.url(&cut.addrs());
    let args = client_args(r, &url, resource, dir, id);
    let process =
        Process::spawn(&args, Stdio::null()).unwrap_or_else(|e| panic!("client {id}: {e}"));
    Client { process, cut }
}

/// Runs `r` on a fresh deployment for `length`.
pub fn run(r: Run, length: Duration) -> RunResult {
    let (kind, nemesis) = (r.deployment, r.nemesis);
    let dir = TempDir::new("chaos").unwrap_or_else(|e| panic!("temp dir: {e}"));
    let servers = start(kind, nemesis);
    let resource_history = dir.path().join("resource.jsonl");
    let mut resource = Process::spawn(
        &[
            "resource".into(),
            "--history".into(),
            resource_history.display().to_string(),
        ],
        Stdio::piped(),
    )
    .unwrap_or_else(|e| panic!("resource: {e}"));
    let resource_addr = {
        use std::io::BufRead;
        let out = resource.child.stdout.take().expect("resource stdout");
        let mut line = String::new();
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("resource address: {e}"));
        line.trim().to_string()
    };
    let nemesis_history = dir.path().join("nemesis.jsonl");
    let rec = Recorder::open(&nemesis_history, NEMESIS).unwrap_or_else(|e| panic!("{e}"));
    let start = |id| start_client(r, &servers, &resource_addr, dir.path(), id);
    let mut clients: Vec<(u32, Client)> = (0..r.workload.clients())
        .map(|id| (id, start(id)))
        .collect();
    // An election's observers: never a fault's target, so what they report is checked whole.
    let observers: Vec<Client> = if r.workload == Workload::Election {
        (FIRST_OBSERVER..FIRST_OBSERVER + OBSERVERS)
            .map(start)
            .collect()
    } else {
        Vec::new()
    };
    let mut next_id = r.workload.clients();
    let begin = history::now_ns();
    let until = Instant::now() + length;
    let ttl = kind.ttl();
    let mut rng = rand::rng();
    let mut turn = 0usize;
    // Let the clients settle into a rhythm, then one fault every few TTLs.
    std::thread::sleep(ttl.min(length / 4));
    while Instant::now() + ttl * 2 < until {
        // A pause or a cut hits the holder of the moment (a fault on a client that holds
        // nothing shows nothing): the client whose history ends with a grant.
        let pick = match nemesis {
            Nemesis::PauseClient
            | Nemesis::DelayClient
            | Nemesis::ResetClient
            | Nemesis::CutClientMinority => holder(dir.path(), &clients, |_| true),
            // A jump lands while the long holder holds: its lock is the one that expires early.
            Nemesis::CutClient | Nemesis::ClockJump => {
                holder(dir.path(), &clients, |id| id == LONG_HOLDER)
            }
            _ => None,
        }
        .unwrap_or_else(|| rng.random_range(0..clients.len()));
        let (id, _) = &clients[pick];
        let target = id.to_string();
        match nemesis {
            Nemesis::PauseClient => {
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target,
                });
                clients[pick].1.process.signal(libc::SIGSTOP);
                std::thread::sleep(ttl * 3 / 2);
                clients[pick].1.process.signal(libc::SIGCONT);
            }
            Nemesis::KillClient => {
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target,
                });
                clients.remove(pick);
                clients.push((next_id, start(next_id)));
                next_id += 1;
            }
            Nemesis::CutClient => {
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target,
                });
                clients[pick].1.cut.cut();
                std::thread::sleep(ttl * 3 / 2);
                clients[pick].1.cut.reset();
            }
            Nemesis::DelayClient => {
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target,
                });
                let cut = &clients[pick].1.cut;
                cut.0
                    .iter()
                    .for_each(|p| p.set_mode(ProxyMode::Delay(ttl / 2)));
                std::thread::sleep(ttl * 3 / 2);
                cut.restore();
            }
            Nemesis::ResetClient => {
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target,
                });
                clients[pick].1.cut.reset();
            }
            Nemesis::ClockJump => {
                let i = rng.random_range(0..servers.clocks.len());
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target: format!("server {i}"),
                });
                servers.clocks[i].jump(ttl * 2);
            }
            Nemesis::Failover => {
                let procs = (servers.processes)();
                let old = (servers.leader)().unwrap_or(0);
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target: format!("server {old}"),
                });
                procs[old].process().kill();
                // The Sentinel waits 1 s before it calls the master down, then promotes.
                let promoted = Instant::now() + Duration::from_secs(20);
                while (servers.leader)().is_none_or(|l| l == old) && Instant::now() < promoted {
                    std::thread::sleep(Duration::from_millis(50));
                }
                procs[old]
                    .process()
                    .restart()
                    .unwrap_or_else(|e| panic!("{}: restart: {e}", servers.kind.label()));
            }
            Nemesis::PartitionMember => {
                let i = in_turn(&servers, &mut turn, &mut rng);
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target: format!("server {i}"),
                });
                (servers.isolate)(i, true);
                std::thread::sleep(ttl * 3 / 2);
                (servers.isolate)(i, false);
            }
            Nemesis::CutClientMinority => {
                let i = in_turn(&servers, &mut turn, &mut rng);
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target: format!("{target} from server {i}"),
                });
                let proxy = &clients[pick].1.cut.0[i];
                proxy.set_mode(ProxyMode::Blackhole);
                std::thread::sleep(ttl * 3 / 2);
                proxy.reset();
                proxy.set_mode(ProxyMode::Pass);
            }
            Nemesis::KillServer | Nemesis::KillServerLate => {
                let i = in_turn(&servers, &mut turn, &mut rng);
                let procs = (servers.processes)();
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target: format!("server {i}"),
                });
                procs[i].process().kill();
                std::thread::sleep(if nemesis == Nemesis::KillServerLate {
                    ttl * 3 / 2
                } else {
                    Duration::from_millis(500)
                });
                procs[i]
                    .process()
                    .restart()
                    .unwrap_or_else(|e| panic!("{}: restart: {e}", servers.kind.label()));
            }
        }
        rec.record(Event::FaultEnd {
            kind: nemesis.label().into(),
        });
        std::thread::sleep(ttl * 2);
    }
    let rest = until.saturating_duration_since(Instant::now());
    std::thread::sleep(rest);
    let end = history::now_ns();
    drop(clients);
    drop(observers);
    // The final set, as the resource holds it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        if let Ok(mut line) = crate::resource::Line::connect(&resource_addr).await {
            let _ = line.ask("END").await;
        }
    });
    drop(resource);
    let mut files: Vec<PathBuf> = vec![resource_history, nemesis_history];
    files.extend(
        (0..next_id)
            .chain(FIRST_OBSERVER..FIRST_OBSERVER + OBSERVERS)
            .map(|id| dir.path().join(format!("client-{id}.jsonl"))),
    );
    let history = history::read(&files);
    let mut findings = check(&history, end, r.workload.shared_limit());
    findings.leftovers = rt.block_on(left_after_ttl(&servers, r.workload, ttl));
    RunResult {
        workload: r.workload,
        deployment: kind,
        nemesis,
        findings,
        history,
        span: (begin, end),
    }
}

/// What the servers still hold under the workload's name once every client was killed and
/// every TTL passed: looked at until it is nothing, for at most two TTLs (a ZooKeeper session
/// ends on the server's next tick after its timeout).
async fn left_after_ttl(servers: &Servers, workload: Workload, ttl: Duration) -> usize {
    let name = LockName::new(workload.queue()).expect("the campaign's name is valid");
    let until = tokio::time::Instant::now() + ttl * 2;
    loop {
        let left = (servers.leftovers)(name.clone()).await;
        if left == 0 || tokio::time::Instant::now() >= until {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
