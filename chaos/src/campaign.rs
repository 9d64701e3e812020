//! The campaign: for each workload, deployment and nemesis, real servers, a resource process and
//! client processes, faults on a schedule, then the merged history through the checker, and what
//! the servers still hold once every client stopped and every TTL passed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock::LockName;
use distlock_conformance::deployment::{Cut, ProxyCut};
use distlock_conformance::deployments::redis_cluster::AclCut;
use distlock_conformance::harness::{ProxyMode, TempDir};
use rand::Rng;

use crate::check::{Findings, check};
use crate::deployment::{DEPLOYMENTS, Deployment, Servers, in_turn, start};
use crate::history::{self, Event, NEMESIS, Recorder};
use crate::nemesis::Nemesis;
use crate::workload::{FIRST_OBSERVER, OBSERVERS, WORKLOADS, Workload};

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

/// One client process and how it is cut.
struct Client {
    process: Process,
    cut: ClientCut,
}

/// How a client reaches the servers, and so how it is cut.
enum ClientCut {
    /// Through a proxy per server (delayed, cut from one server, ... by the proxies).
    Proxies(ProxyCut),
    /// As its own ACL user of a Redis Cluster (a cut or reset only).
    Acl(AclCut),
}

impl ClientCut {
    fn cut(&self) -> &dyn Cut {
        match self {
            ClientCut::Proxies(p) => p,
            ClientCut::Acl(a) => a,
        }
    }

    /// The proxies, for the faults only proxies make (not offered where there are none).
    fn proxies(&self) -> &ProxyCut {
        match self {
            ClientCut::Proxies(p) => p,
            ClientCut::Acl(_) => unreachable!("a fault that needs proxies on a Redis Cluster"),
        }
    }
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
        let (lease_hazard, token_hazard) = self.deployment.hazards(self.nemesis);
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
    let (url, cut) = match &servers.cluster {
        Some(cluster) => {
            // Unique per run and client: a restarted client is a new user.
            let cut = AclCut::create(cluster.clone(), format!("chaos{id}"));
            let mut hosts = cut.hosts();
            hosts[0] = format!("{}:pw@{}", cut.user(), hosts[0]);
            (r.deployment.url(&hosts), ClientCut::Acl(cut))
        }
        None => {
            let cut = ProxyCut::to_ports(servers.ports.iter().copied());
            (r.deployment.url(&cut.addrs()), ClientCut::Proxies(cut))
        }
    };
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
                clients[pick].1.cut.cut().cut();
                std::thread::sleep(ttl * 3 / 2);
                clients[pick].1.cut.cut().reset();
            }
            Nemesis::DelayClient => {
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target,
                });
                let cut = clients[pick].1.cut.proxies();
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
                clients[pick].1.cut.cut().reset();
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
                let old = (servers.leader)().unwrap_or(0);
                rec.record(Event::FaultStart {
                    kind: nemesis.label().into(),
                    target: format!("server {old}"),
                });
                (servers
                    .fail_over
                    .as_ref()
                    .expect("a deployment that fails over"))();
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
                let proxy = &clients[pick].1.cut.proxies().0[i];
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
    (findings.leftovers, findings.clean_after) =
        rt.block_on(left_after_ttl(&servers, r.workload, ttl));
    RunResult {
        workload: r.workload,
        deployment: kind,
        nemesis,
        findings,
        history,
        span: (begin, end),
    }
}

/// What the servers still hold under the workload's name once every client was killed, and
/// how long after the kill they held nothing: looked at until it is nothing, for at most two
/// TTLs and 10 s (a ZooKeeper session ends on the server's next tick after its timeout; an etcd
/// lease is revoked through its log, which a loaded machine delays).
async fn left_after_ttl(servers: &Servers, workload: Workload, ttl: Duration) -> (usize, u64) {
    let name = LockName::new(workload.queue()).expect("the campaign's name is valid");
    let start = tokio::time::Instant::now();
    let until = start + ttl * 2 + Duration::from_secs(10);
    loop {
        let left = (servers.leftovers)(name.clone()).await;
        if left == 0 || tokio::time::Instant::now() >= until {
            return (left, start.elapsed().as_nanos() as u64);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
