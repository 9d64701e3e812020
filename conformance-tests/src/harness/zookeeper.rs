//! ZooKeeper from Debian's `zookeeper` jar, run with `java`: standalone or an ensemble.

use std::time::Duration;

use super::{
    HarnessError, Proxy, ProxyMode, ServerProcess, TempDir, ask, free_port, local, require,
    retry_port_clash,
};

const JAR: &str = "/usr/share/java/zookeeper.jar";
const JAVA: &str = "/usr/bin/java";

/// A standalone ZooKeeper (n = 1) or an ensemble of n nodes on free loopback ports.
#[derive(Debug)]
pub struct ZkEnsemble {
    /// Client ports, node i at index i.
    pub client_ports: Vec<u16>,
    /// The nodes' processes, for faults.
    pub nodes: Vec<ServerProcess>,
    /// The peer-link proxies, by (dialling node, dialled node), when started with them.
    links: Vec<((usize, usize), Proxy)>,
    _dir: TempDir,
}

impl ZkEnsemble {
    /// Starts the nodes with Debian's stock `zoo.cfg` timing (`tickTime=2000`, `initLimit=10`,
    /// `syncLimit=5`: sessions of 4 s to 40 s, as users' servers negotiate them) and waits until
    /// each serves (`srvr` reports standalone, leader or follower). Besides ports and data dirs,
    /// only what the harness itself needs differs from stock: small heaps and serial GC (2
    /// cores), the admin server off (every node would take port 8080), the four-letter words
    /// the harness reads (`srvr`, `mntr`), and no cap on connections per address (every client
    /// of the suite comes from loopback, where users' clients come from many hosts).
    pub fn start(n: usize) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(n, false, false))
    }

    /// Like [`ZkEnsemble::start`] with one server that keeps the stock cap of 60 connections
    /// from one address (`maxClientCnxns`), for the scenario that passes it.
    pub fn start_with_stock_connection_cap() -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(1, false, true))
    }

    /// Like [`ZkEnsemble::start`], with every peer link (node `i` dialling node `j`, quorum and
    /// election ports) through a [`Proxy`] of its own: [`ZkEnsemble::isolate`] then cuts one
    /// node off from the others while its clients still reach it.
    pub fn start_with_peer_links(n: usize) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(n, true, false))
    }

    /// Blackholes (`true`) or restores every peer link to and from node `i`.
    pub fn isolate(&self, i: usize, cut: bool) {
        let mode = if cut {
            ProxyMode::Blackhole
        } else {
            ProxyMode::Pass
        };
        for ((from, to), proxy) in &self.links {
            if *from == i || *to == i {
                proxy.set_mode(mode);
                if !cut {
                    proxy.reset();
                }
            }
        }
    }

    fn start_once(n: usize, peer_links: bool, stock_cap: bool) -> Result<Self, HarnessError> {
        require(JAVA, "default-jre-headless")?;
        require(JAR, "zookeeper")?;
        let dir = TempDir::new("zk").map_err(|source| HarnessError::Io {
            server: "zookeeper".into(),
            source,
        })?;
        let io = |source| HarnessError::Io {
            server: "zookeeper".into(),
            source,
        };
        let client_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let quorum: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        // Node i dials node j at these ports: its real ones, or a proxy per link.
        let mut links = Vec::new();
        let mut dial = vec![quorum.clone(); n];
        if peer_links {
            for (i, row) in dial.iter_mut().enumerate() {
                for (j, (p1, p2)) in quorum.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    let q = Proxy::start(local(*p1)).map_err(io)?;
                    let e = Proxy::start(local(*p2)).map_err(io)?;
                    row[j] = (q.addr().port(), e.addr().port());
                    links.push(((i, j), q));
                    links.push(((i, j), e));
                }
            }
        }
        let mut pending = Vec::new();
        for (i, &port) in client_ports.iter().enumerate() {
            let data = dir.path().join(format!("z{i}"));
            std::fs::create_dir_all(&data).map_err(io)?;
            let mut cfg = format!(
                "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=srvr,ruok,stat,mntr\n",
                data.display()
            );
            if !stock_cap {
                cfg.push_str("maxClientCnxns=0\n");
            }
            if n > 1 {
                std::fs::write(data.join("myid"), format!("{}\n", i + 1)).map_err(io)?;
                for (j, (p1, p2)) in dial[i].iter().enumerate() {
                    cfg.push_str(&format!("server.{}=127.0.0.1:{p1}:{p2}\n", j + 1));
                }
            }
            let cfg_path = dir.path().join(format!("zoo{i}.cfg"));
            std::fs::write(&cfg_path, cfg).map_err(io)?;
            let main = if n > 1 {
                "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            } else {
                "org.apache.zookeeper.server.ZooKeeperServerMain"
            };
            let args: Vec<String> = vec![
                "-Xms32m".into(),
                "-Xmx256m".into(),
                "-XX:+UseSerialGC".into(),
                "-XX:TieredStopAtLevel=1".into(),
                "-Dzookeeper.admin.enableServer=false".into(),
                "-cp".into(),
                format!("/etc/zookeeper/conf:{JAR}"),
                main.into(),
                cfg_path.display().to_string(),
            ];
            pending.push((i, port, args, dir.path().join(format!("zk{i}.log"))));
        }
        let nodes = std::thread::scope(|s| {
            let handles: Vec<_> = pending
                .into_iter()
                .map(|(i, port, args, log)| {
                    s.spawn(move || {
                        ServerProcess::start(
                            format!("zookeeper z{i} :{port}"),
                            JAVA.into(),
                            args.into_iter().map(Into::into).collect(),
                            log,
                            Box::new(move || mode(port).is_some()),
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| panic!("zookeeper start thread panicked"))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        Ok(ZkEnsemble {
            client_ports,
            nodes,
            links,
            _dir: dir,
        })
    }

    /// The connect string `127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn connect_string(&self) -> String {
        let hosts: Vec<String> = self
            .client_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        hosts.join(",")
    }

    /// `zk://h1:p1,h2:p2,...`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// Index of the node that is leader now (standalone counts as leader).
    pub fn leader(&self) -> Option<usize> {
        self.client_ports
            .iter()
            .position(|&p| matches!(mode(p).as_deref(), Some("leader" | "standalone")))
    }
}

/// How many packets the node on `port` has received (`mntr`; client pings included): counts
/// the requests a client sends, from the server's side.
pub fn packets_received(port: u16) -> Option<u64> {
    mntr(port, "zk_packets_received")
}

/// How many watches the node on `port` holds for its clients (`mntr`): tells when a waiter
/// has settled on its predecessor.
pub fn watch_count(port: u16) -> Option<u64> {
    mntr(port, "zk_watch_count")
}

/// One integer of the node's `mntr` output.
fn mntr(port: u16, key: &str) -> Option<u64> {
    let r = ask(local(port), b"mntr", Duration::from_secs(2))?;
    r.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

/// The node's mode (`standalone`, `leader`, `follower`) from the `srvr` command.
pub fn mode(port: u16) -> Option<String> {
    let r = ask(local(port), b"srvr", Duration::from_millis(500))?;
    let line = r.lines().find(|l| l.starts_with("Mode: "))?;
    Some(line.trim_start_matches("Mode: ").trim().to_string())
}
