//! etcd: one member or a cluster of N on loopback.

use std::time::Duration;

use super::{
    HarnessError, Proxy, ProxyMode, ServerProcess, TempDir, TlsFiles, ask, free_port, local,
    require, retry_port_clash,
};

const BINARY: &str = "/usr/bin/etcd";

/// An etcd cluster of 1 or more members on free loopback ports.
#[derive(Debug)]
pub struct EtcdCluster {
    /// Client ports, member i at index i.
    pub client_ports: Vec<u16>,
    /// Plain-HTTP metrics and health ports, member i at index i.
    pub metrics_ports: Vec<u16>,
    /// The members' processes, for faults.
    pub members: Vec<ServerProcess>,
    /// A proxy in front of each member's peer port, when started with them.
    peer_proxies: Vec<Proxy>,
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until each reports healthy (the cluster has a leader).
    pub fn start(n: usize) -> Result<Self, HarnessError> {
        Self::start_with(n, None)
    }

    /// Like [`EtcdCluster::start`], serving clients over TLS with `tls` (peers stay plain). No
    /// `--trusted-ca-file`: etcd 3.4 would then demand a client certificate from every client.
    pub fn start_tls(n: usize, tls: &TlsFiles) -> Result<Self, HarnessError> {
        Self::start_with(n, Some(tls))
    }

    /// Like [`EtcdCluster::start`], with each member's peer URL a [`Proxy`] in front of its peer
    /// port: [`EtcdCluster::isolate`] then cuts one member off from the others while its clients
    /// still reach it.
    pub fn start_with_peer_links(n: usize) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(n, None, true, None))
    }

    /// Like [`EtcdCluster::start`] with one member and one setting changed from stock
    /// (`--flag=value`), for the scenario that varies it: a small space quota to fill, a short
    /// auth token lifetime to outlive.
    pub fn start_tuned(setting: &str) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(1, None, false, Some(setting)))
    }

    /// Blackholes (`true`) or restores every peer link to and from member `i`: what others
    /// dialled to it (its proxy), and what it dialled to others (told apart in their proxies by
    /// the member ID its requests carry).
    ///
    /// # Panics
    /// When the cluster was not started with peer links, or member `i` does not say its ID.
    pub fn isolate(&self, i: usize, cut: bool) {
        assert!(!self.peer_proxies.is_empty(), "started without peer links");
        let id = self
            .member_id(i)
            .unwrap_or_else(|| panic!("member {i} does not say its ID"));
        for (j, proxy) in self.peer_proxies.iter().enumerate() {
            let mode = match (cut, i == j) {
                (false, _) => ProxyMode::Pass,
                (true, true) => ProxyMode::Blackhole,
                (true, false) => ProxyMode::BlackholeFrom(id),
            };
            proxy.set_mode(mode);
            if !cut {
                proxy.reset();
            }
        }
    }

    /// Member `i`'s ID, from its `maintenance/status`.
    fn member_id(&self, i: usize) -> Option<u64> {
        let r = status(self.client_ports[i])?;
        json_field(&r, "member_id")?.parse().ok()
    }

    fn start_with(n: usize, tls: Option<&TlsFiles>) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(n, tls, false, None))
    }

    fn start_once(
        n: usize,
        tls: Option<&TlsFiles>,
        peer_links: bool,
        tuned: Option<&str>,
    ) -> Result<Self, HarnessError> {
        require(BINARY, "etcd-server")?;
        let dir = TempDir::new("etcd").map_err(|source| HarnessError::Io {
            server: "etcd".into(),
            source,
        })?;
        let client_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let peer_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        // Health is probed on a plain-HTTP metrics port, so it works with client TLS too.
        let metrics_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let peer_proxies: Vec<Proxy> = if peer_links {
            peer_ports
                .iter()
                .map(|p| Proxy::start(local(*p)))
                .collect::<std::io::Result<_>>()
                .map_err(|source| HarnessError::Io {
                    server: "etcd".into(),
                    source,
                })?
        } else {
            Vec::new()
        };
        // Where the others dial member i: its peer port, or its proxy.
        let advertised: Vec<u16> = match peer_proxies.is_empty() {
            true => peer_ports.clone(),
            false => peer_proxies.iter().map(|p| p.addr().port()).collect(),
        };
        let initial: Vec<String> = advertised
            .iter()
            .enumerate()
            .map(|(i, p)| format!("e{i}=http://127.0.0.1:{p}"))
            .collect();
        let initial = initial.join(",");
        // Start every member before waiting: a member is only healthy once a quorum runs.
        let mut pending = Vec::new();
        for i in 0..n {
            let (c, p, m, a) = (
                client_ports[i],
                peer_ports[i],
                metrics_ports[i],
                advertised[i],
            );
            let data = dir.path().join(format!("e{i}"));
            let args: Vec<String> = vec![
                format!("--name=e{i}"),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls={scheme}://127.0.0.1:{c}"),
                format!("--advertise-client-urls={scheme}://127.0.0.1:{c}"),
                format!("--listen-metrics-urls=http://127.0.0.1:{m}"),
                format!("--listen-peer-urls=http://127.0.0.1:{p}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{a}"),
                format!("--initial-cluster={initial}"),
                "--initial-cluster-state=new".into(),
                "--initial-cluster-token=distlock-test".into(),
                // Stock timing and gRPC keep-alive policy (users' servers run them): only
                // addresses, the data dir, logging and TLS are set (and the one setting a
                // scenario varies: `start_tuned`).
                "--logger=zap".into(),
                "--log-level=warn".into(),
            ];
            let mut args = args;
            if let Some(setting) = tuned {
                args.push(setting.to_string());
            }
            if let Some(t) = tls {
                args.push(format!("--cert-file={}", t.cert.display()));
                args.push(format!("--key-file={}", t.key.display()));
            }
            pending.push((i, args, dir.path().join(format!("e{i}.log"))));
        }
        let members = std::thread::scope(|s| {
            let handles: Vec<_> = pending
                .into_iter()
                .map(|(i, args, log)| {
                    let port = client_ports[i];
                    let metrics = metrics_ports[i];
                    s.spawn(move || {
                        ServerProcess::start(
                            format!("etcd e{i} :{port}"),
                            BINARY.into(),
                            args.into_iter().map(Into::into).collect(),
                            log,
                            Box::new(move || healthy(metrics)),
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| panic!("etcd start thread panicked"))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        Ok(EtcdCluster {
            client_ports,
            metrics_ports,
            members,
            peer_proxies,
            _dir: dir,
        })
    }

    /// The client endpoints, `127.0.0.1:<port>` each.
    pub fn endpoints(&self) -> Vec<String> {
        self.client_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// `etcd://h1:p1,h2:p2,...`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// Index of the member that is leader now, if any answers (from the v3 gateway's
    /// `maintenance/status`: a member leads when its `leader` equals its own `member_id`).
    pub fn leader(&self) -> Option<usize> {
        self.client_ports.iter().position(|&p| {
            status(p)
                .and_then(|r| Some(json_field(&r, "member_id")? == json_field(&r, "leader")?))
                .unwrap_or(false)
        })
    }
}

/// The string value of `"field":"..."` in a small JSON answer.
/// The member's `maintenance/status` through the v3 gateway on its client `port`.
fn status(port: u16) -> Option<String> {
    ask(
        local(port),
        b"POST /v3/maintenance/status HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        Duration::from_secs(1),
    )
}

fn json_field(text: &str, field: &str) -> Option<String> {
    let start = text.find(&format!("\"{field}\":\""))? + field.len() + 4;
    let end = text[start..].find('"')? + start;
    Some(text[start..end].to_string())
}

fn healthy(port: u16) -> bool {
    ask(
        local(port),
        b"GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n",
        Duration::from_secs(1),
    )
    .is_some_and(|r| r.contains("\"health\":\"true\""))
}

/// The sum of every sample of each Prometheus metric `(name, label)` in `series` (samples of
/// `name` whose labels contain `label`), as the member whose metrics listen on `port` reports
/// them now, in one read (`None` when it does not answer): counts requests from the server's
/// side.
pub fn metric_sum(port: u16, series: &[(&str, &str)]) -> Option<f64> {
    let text = ask(
        local(port),
        b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
        Duration::from_secs(5),
    )?;
    Some(
        text.lines()
            .filter(|l| {
                series
                    .iter()
                    .any(|(name, label)| l.starts_with(name) && l.contains(label))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}
