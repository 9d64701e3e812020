//! redis-server: single (optionally also serving TLS), N independent masters (Redlock), a
//! 3-master Redis Cluster, a master with a replica behind a cuttable link, and Sentinel.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use super::{
    ClockOffset, HarnessError, Proxy, ProxyMode, ServerProcess, TempDir, TlsFiles, ask, free_port,
    local, require, retry_port_clash,
};

const BINARY: &str = "/usr/bin/redis-server";
const CLI: &str = "/usr/bin/redis-cli";

/// `--save ""`: no snapshot rules (see [`RedisServer::start_without_persistence`]).
const NO_PERSISTENCE: &[&str] = &["--save", ""];

/// One redis-server on a free loopback port, with redis-server's stock settings (as users run
/// it) apart from the port, the bind address, the data dir and what a caller passes.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    tls_port: Option<u16>,
    process: ServerProcess,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts it and waits for `PONG`.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(&[], None)
    }

    /// Starts it with no snapshots, so a killed server restarts empty: the crash hazard the
    /// Redlock and failover tests exist to show (stock snapshot rules could save a lock first).
    pub fn start_without_persistence() -> Result<Self, HarnessError> {
        Self::start_with(NO_PERSISTENCE, None)
    }

    /// Starts it with extra `redis-server` arguments, and also serving TLS with `tls` on a port
    /// of its own (the plain port stays, for the harness's readiness probe).
    pub fn start_with(extra: &[&str], tls: Option<&TlsFiles>) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(extra, tls, &[]))
    }

    /// Starts it without persistence, on the wall clock of `clock` (which a test moves).
    pub fn start_on_clock(clock: &ClockOffset) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(NO_PERSISTENCE, None, &clock.env()))
    }

    fn start_once(
        extra: &[&str],
        tls: Option<&TlsFiles>,
        env: &[(OsString, OsString)],
    ) -> Result<Self, HarnessError> {
        require(BINARY, "redis-server")?;
        let dir = TempDir::new("redis").map_err(|source| HarnessError::Io {
            server: "redis".into(),
            source,
        })?;
        let port = free_port();
        let tls_port = tls.map(|_| free_port());
        let mut args: Vec<OsString> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.path().to_string_lossy(),
        ]
        .iter()
        .map(Into::into)
        .collect();
        if let (Some(t), Some(p)) = (tls, tls_port) {
            let files = [&t.cert, &t.key, &t.ca];
            for (flag, file) in ["--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"]
                .iter()
                .zip(files)
            {
                args.push(flag.into());
                args.push(file.into());
            }
            args.extend(["--tls-port".into(), p.to_string().into()]);
            args.extend(["--tls-auth-clients".into(), "no".into()]);
        }
        args.extend(extra.iter().map(Into::into));
        let process = ServerProcess::start_with_env(
            format!("redis-server :{port}"),
            BINARY.into(),
            args,
            env.to_vec(),
            dir.path().join("redis.log"),
            Box::new(move || ping(port)),
        )?;
        Ok(RedisServer {
            port,
            tls_port,
            process,
            _dir: dir,
        })
    }

    /// `rediss://127.0.0.1:<tls port>` when it serves TLS.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    /// Sends one command line (inline protocol) and returns the raw reply.
    pub fn command(&self, line: &str) -> Option<String> {
        command(self.port, line)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process, for faults.
    pub fn process(&self) -> &ServerProcess {
        &self.process
    }

    /// A plain connection of its own, for a test's reads and the server's counters.
    ///
    /// # Errors
    /// The client's, when the server does not answer.
    pub async fn admin(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }
}

fn command(port: u16, line: &str) -> Option<String> {
    ask(
        local(port),
        format!("{line}\r\nQUIT\r\n").as_bytes(),
        Duration::from_secs(2),
    )
}

/// Polls `check` every 50 ms until it holds or `timeout` passes.
fn wait_for(what: &str, timeout: Duration, check: impl Fn() -> bool) -> Result<(), HarnessError> {
    let start = Instant::now();
    while !check() {
        if start.elapsed() > timeout {
            return Err(HarnessError::NotReady {
                server: what.to_string(),
                after: timeout,
                exited: false,
                log: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn ping(port: u16) -> bool {
    ask(local(port), b"PING\r\nQUIT\r\n", Duration::from_millis(500))
        .is_some_and(|r| r.starts_with("+PONG"))
}

/// N independent redis masters (no replication between them), for Redlock.
#[derive(Debug)]
pub struct RedisMasters {
    /// The servers, in order.
    pub nodes: Vec<RedisServer>,
}

impl RedisMasters {
    /// Starts `n` servers, without persistence: a crashed master restarts empty, which is the
    /// hazard Redlock's tests show.
    pub fn start(n: usize) -> Result<Self, HarnessError> {
        Ok(RedisMasters {
            nodes: (0..n)
                .map(|_| RedisServer::start_without_persistence())
                .collect::<Result<_, _>>()?,
        })
    }

    /// Starts one server per clock (without persistence), each on its own wall clock.
    pub fn start_on_clocks(clocks: &[ClockOffset]) -> Result<Self, HarnessError> {
        Ok(RedisMasters {
            nodes: clocks
                .iter()
                .map(RedisServer::start_on_clock)
                .collect::<Result<_, _>>()?,
        })
    }

    /// `redlock://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }
}

/// A Redis Cluster of N masters (no replicas), slots spread by `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    /// The masters, in order.
    pub nodes: Vec<RedisServer>,
    /// With [`RedisCluster::start_with_bus_links`], a proxy in front of each node's cluster bus
    /// port (what the node announces to its peers), and each node's ID as the proxies tell
    /// diallers apart (the first 16 hex digits of its name).
    bus: Vec<(Proxy, u64)>,
}

impl RedisCluster {
    /// Starts `n` (at least 3) cluster-enabled servers, joins them and waits for
    /// `cluster_state:ok` on every node.
    pub fn start(n: usize) -> Result<Self, HarnessError> {
        Self::start_inner(n, None)
    }

    /// [`RedisCluster::start`] with each node's cluster bus behind a proxy, so
    /// [`RedisCluster::isolate`] can cut one master from the others while its clients still
    /// reach it. `node_timeout` is the setting such a cut varies: a master is found unreachable
    /// only once a cut outlasts it (stock 15 s, longer than a fault-campaign run).
    pub fn start_with_bus_links(n: usize, node_timeout: Duration) -> Result<Self, HarnessError> {
        Self::start_inner(n, Some(node_timeout))
    }

    fn start_inner(n: usize, bus_links: Option<Duration>) -> Result<Self, HarnessError> {
        require(CLI, "redis-tools")?;
        let timeout = bus_links.map(|t| t.as_millis().to_string());
        let nodes = (0..n)
            .map(|_| {
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ];
                if let Some(ms) = &timeout {
                    args.extend(["--cluster-node-timeout", ms.as_str()]);
                }
                RedisServer::start_with(&args, None)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let io = |source| HarnessError::Io {
            server: "redis cluster bus proxy".into(),
            source,
        };
        let mut proxies = Vec::new();
        if bus_links.is_some() {
            for node in &nodes {
                // The bus listens on the client port + 10 000; peers (and `--cluster create`'s
                // MEETs) dial the port a node announces, which is its proxy's.
                let proxy = Proxy::start(local(node.port + 10_000)).map_err(io)?;
                let set = format!(
                    "CONFIG SET cluster-announce-bus-port {}",
                    proxy.addr().port()
                );
                if !node.command(&set).is_some_and(|r| r.starts_with("+OK")) {
                    return Err(HarnessError::NotReady {
                        server: "redis cluster bus proxy".into(),
                        after: Duration::ZERO,
                        exited: false,
                        log: set,
                    });
                }
                proxies.push(proxy);
            }
        }
        let mut cli = std::process::Command::new(CLI);
        cli.arg("--cluster").arg("create");
        cli.args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        cli.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = cli.output().map_err(|source| HarnessError::Io {
            server: "redis-cli --cluster create".into(),
            source,
        })?;
        if !out.status.success() {
            return Err(HarnessError::NotReady {
                server: "redis cluster".into(),
                after: Duration::ZERO,
                exited: false,
                log: String::from_utf8_lossy(&out.stdout).into_owned(),
            });
        }
        let cluster_ok = |nodes: &[RedisServer]| {
            nodes.iter().all(|n| {
                n.command("CLUSTER INFO")
                    .is_some_and(|r| r.contains("cluster_state:ok"))
            })
        };
        wait_for("redis cluster", Duration::from_secs(30), || {
            cluster_ok(&nodes)
        })?;
        let bus = proxies
            .into_iter()
            .zip(&nodes)
            .map(|(proxy, node)| {
                let id = node.command("CLUSTER MYID").and_then(|r| node_id(&r));
                id.map(|id| (proxy, id)).ok_or(HarnessError::NotReady {
                    server: "redis cluster".into(),
                    after: Duration::ZERO,
                    exited: false,
                    log: "CLUSTER MYID gave no node name".into(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RedisCluster { nodes, bus })
    }

    /// Blackholes (`true`) or restores every cluster bus link to and from master `i` (its
    /// clients still reach it), where the cluster was started with
    /// [`RedisCluster::start_with_bus_links`]; nothing otherwise. Restored links are reset, so
    /// the nodes reconnect at once.
    pub fn isolate(&self, i: usize, cut: bool) {
        let Some((_, from)) = self.bus.get(i) else {
            return;
        };
        for (j, (proxy, _)) in self.bus.iter().enumerate() {
            proxy.set_mode(match (cut, j == i) {
                (false, _) => ProxyMode::Pass,
                (true, true) => ProxyMode::Blackhole,
                (true, false) => ProxyMode::BlackholeFrom(*from),
            });
            if !cut {
                proxy.reset();
            }
        }
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// The first 16 hex digits of the 40-character node name in a `CLUSTER MYID` reply: what a
/// [`Proxy`] reads off a cluster bus message's sender to tell diallers apart.
fn node_id(reply: &str) -> Option<u64> {
    let name = reply
        .split_whitespace()
        .find(|w| w.len() == 40 && w.bytes().all(|b| b.is_ascii_hexdigit()))?;
    u64::from_str_radix(&name[..16], 16).ok()
}

/// A master and one replica whose replication link runs through a [`Proxy`], so a test can
/// block replication (blackhole the link) and then fail over by hand (`REPLICAOF NO ONE`).
#[derive(Debug)]
pub struct RedisReplicated {
    /// The master.
    pub master: RedisServer,
    /// The replica.
    pub replica: RedisServer,
    /// The replica's link to the master.
    pub link: Proxy,
}

impl RedisReplicated {
    /// Starts both (without persistence: a killed master must come back empty for the
    /// failover hazard) and waits until the replica is in sync.
    pub fn start() -> Result<Self, HarnessError> {
        let master = RedisServer::start_without_persistence()?;
        let link = Proxy::start(local(master.port)).map_err(|source| HarnessError::Io {
            server: "replication proxy".into(),
            source,
        })?;
        let link_port = link.addr().port().to_string();
        // The replica's first sync starts at once (stock waits 5 s for more replicas), and a
        // blackholed link does not time out during a test (stock: 60 s, said here for clarity).
        let replica = RedisServer::start_with(
            &[
                "--save",
                "",
                "--replicaof",
                "127.0.0.1",
                &link_port,
                "--repl-timeout",
                "60",
                "--repl-diskless-sync-delay",
                "0",
            ],
            None,
        )?;
        wait_for("redis replica sync", Duration::from_secs(30), || {
            replica
                .command("INFO replication")
                .is_some_and(|r| r.contains("master_link_status:up"))
        })?;
        Ok(RedisReplicated {
            master,
            replica,
            link,
        })
    }
}

/// One Sentinel monitoring a master as `service` (quorum 1, down after 1 s).
#[derive(Debug)]
pub struct RedisSentinel {
    port: u16,
    process: ServerProcess,
    _dir: TempDir,
}

impl RedisSentinel {
    /// Starts it and waits until it knows the master.
    pub fn start(service: &str, master_port: u16) -> Result<Self, HarnessError> {
        require(BINARY, "redis-server")?;
        let io = |source| HarnessError::Io {
            server: "redis-sentinel".into(),
            source,
        };
        let dir = TempDir::new("sentinel").map_err(io)?;
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor {service} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {service} 1000\n\
                 sentinel failover-timeout {service} 5000\n",
                dir.path().display()
            ),
        )
        .map_err(io)?;
        let process = ServerProcess::start(
            format!("redis-sentinel :{port}"),
            BINARY.into(),
            vec![conf.into(), "--sentinel".into()],
            dir.path().join("sentinel.log"),
            Box::new(move || ping(port)),
        )?;
        let service = service.to_string();
        wait_for("redis sentinel", Duration::from_secs(30), || {
            command(port, &format!("SENTINEL get-master-addr-by-name {service}"))
                .is_some_and(|r| r.contains(&master_port.to_string()))
        })?;
        Ok(RedisSentinel {
            port,
            process,
            _dir: dir,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>` of the Sentinel.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port of the master Sentinel names now, if it names one.
    pub fn master_port(&self, service: &str) -> Option<u16> {
        let reply = command(
            self.port,
            &format!("SENTINEL get-master-addr-by-name {service}"),
        )?;
        // *2 $9 127.0.0.1 $5 <port>
        reply.lines().nth(4)?.trim().parse().ok()
    }

    /// The process, for faults.
    pub fn process(&self) -> &ServerProcess {
        &self.process
    }
}
