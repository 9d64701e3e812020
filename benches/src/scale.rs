//! Scale: many names under many tasks through one client, and many leases held at once with the
//! watchdog on (process memory and server round trips per renewal tick).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distlock::{AcquireOptions, Lease, LockBackend, LockClient};
use distlock_conformance::harness::{metric_sum, packets_received};
use distlock_conformance::scenarios::Counting;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Aggregate acquire + release pairs per second of `tasks` tasks over `names` names, all through
/// one client (one connection or session), `pairs` pairs per task.
pub async fn many_names(
    backend: Arc<dyn LockBackend>,
    names: usize,
    tasks: usize,
    pairs: usize,
) -> f64 {
    let locks = LockClient::new(backend);
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let locks = locks.clone();
        handles.push(tokio::spawn(async move {
            let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
            for i in 0..pairs {
                // A spread that makes two tasks meet on a name now and then.
                let name = format!("bench/scale/{}", (t * 7919 + i * 104_729) % names);
                let lease = locks
                    .acquire(&name, &opts, Duration::from_secs(120))
                    .await
                    .expect("acquire");
                lease.release().await.expect("release");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    (tasks * pairs) as f64 / start.elapsed().as_secs_f64()
}

/// How a server counts the requests it served.
pub enum Counter {
    /// No server (in-process store).
    None,
    /// Redis `INFO commandstats`: script calls (every renewal is one); the server's port.
    Redis(redis::aio::MultiplexedConnection, u16),
    /// etcd's Prometheus metrics: txns, keep-alive messages and lease lookups.
    Etcd(u16),
    /// ZooKeeper `mntr`: packets received (pings included).
    Zk(u16),
}

impl Counter {
    /// This counter as a command-line argument (see [`Counter::from_arg`]).
    fn arg(&self) -> String {
        match self {
            Counter::None => "none".into(),
            Counter::Redis(_, port) => format!("redis:{port}"),
            Counter::Etcd(port) => format!("etcd:{port}"),
            Counter::Zk(port) => format!("zk:{port}"),
        }
    }

    /// The counter `arg` names, as [`Counter::arg`] wrote it.
    pub async fn from_arg(arg: &str) -> Counter {
        let port = |p: &str| p.parse::<u16>().expect("counter port");
        match arg.split_once(':') {
            Some(("redis", p)) => Counter::Redis(
                redis::Client::open(format!("redis://127.0.0.1:{}", port(p)))
                    .expect("redis url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("redis admin connection"),
                port(p),
            ),
            Some(("etcd", p)) => Counter::Etcd(port(p)),
            Some(("zk", p)) => Counter::Zk(port(p)),
            _ => Counter::None,
        }
    }

    /// Requests served so far, or `None` without a server.
    pub async fn read(&self) -> Option<f64> {
        match self {
            Counter::None => None,
            Counter::Redis(c, _) => Some(redis_calls(c, &["evalsha", "eval"]).await),
            Counter::Etcd(port) => {
                let port = *port;
                tokio::task::spawn_blocking(move || {
                    metric_sum(
                        port,
                        &[
                            ("grpc_server_handled_total", "grpc_method=\"Txn\""),
                            (
                                "grpc_server_msg_received_total",
                                "grpc_method=\"LeaseKeepAlive\"",
                            ),
                            (
                                "grpc_server_handled_total",
                                "grpc_method=\"LeaseTimeToLive\"",
                            ),
                        ],
                    )
                })
                .await
                .expect("metrics")
            }
            Counter::Zk(port) => {
                let port = *port;
                tokio::task::spawn_blocking(move || packets_received(port))
                    .await
                    .expect("mntr")
                    .map(|n| n as f64)
            }
        }
    }

    /// Every request clients sent so far, as the server counts them, or `None` without a
    /// server: on Redis script calls and (un)subscribes (the commands a script runs are counted
    /// apart from them); on etcd every message received, unary requests and stream messages
    /// alike; on ZooKeeper every packet received.
    pub async fn requests(&self) -> Option<f64> {
        match self {
            Counter::None => None,
            Counter::Redis(c, _) => {
                Some(redis_calls(c, &["evalsha", "eval", "subscribe", "unsubscribe"]).await)
            }
            Counter::Etcd(port) => {
                let port = *port;
                tokio::task::spawn_blocking(move || {
                    metric_sum(port, &[("grpc_server_msg_received_total", "")])
                })
                .await
                .expect("metrics")
            }
            Counter::Zk(_) => self.read().await,
        }
    }
}

/// Calls of `commands` so far, by Redis `INFO commandstats` (lines `cmdstat_<c>:calls=<n>,...`).
async fn redis_calls(conn: &redis::aio::MultiplexedConnection, commands: &[&str]) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn.clone())
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            commands.contains(&name).then_some(())?;
            rest.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

/// Held leases with the watchdog on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Held {
    /// Leases held at once.
    pub leases: usize,
    /// Takes that failed retryably and were taken again (a server that stalls past the request
    /// timeout under the load: a user would retry).
    #[serde(default)]
    pub retried: usize,
    /// Leases whose lost signal fired while held (a target row: none).
    #[serde(default)]
    pub lost: usize,
    /// Process RSS growth from before the first acquire to all held, MB.
    pub rss_growth_mb: f64,
    /// Server requests per renewal tick while all are held (`None` without a server).
    pub round_trips_per_tick: Option<f64>,
    /// What the server counts in the same time with the same client holding nothing (its
    /// session's own keep-alives, and the pings of the bench's other clients of that server).
    pub idle_per_tick: Option<f64>,
}

/// The RSS once the allocator gave back what earlier runs of this process freed: otherwise the
/// held leases would reuse those pages unseen, and their growth would depend on what ran before.
fn settled_rss_kb() -> f64 {
    // SAFETY: `malloc_trim` only releases free memory of glibc's arenas.
    unsafe {
        libc::malloc_trim(0);
    }
    rss_kb()
}

fn rss_kb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0.0)
}

/// Runs [`held`] in a fresh process of this bench (`--held-child`), so the RSS growth is that of
/// a process holding the leases, not also the arenas the earlier runs here left fragmented (the
/// same leases grew this process 130 MB on a run of ZooKeeper alone and 232 MB after the other
/// backends' runs).
pub async fn held_in_child(url: &str, n: usize, ttl: Duration, counter: &Counter) -> Held {
    let exe = std::env::current_exe().expect("the bench's own path");
    let out = tokio::process::Command::new(exe)
        .args([
            "--held-child",
            url,
            &n.to_string(),
            &ttl.as_millis().to_string(),
            &counter.arg(),
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .expect("start the held run's process");
    assert!(out.status.success(), "the held run failed: {}", out.status);
    serde_json::from_slice(&out.stdout).expect("the held run's answer")
}

/// The child's side of [`held_in_child`]: `args` are what follows `--held-child`; prints the
/// [`Held`] as JSON.
pub async fn held_child(args: &[String]) {
    let [url, n, ttl_ms, counter] = args else {
        panic!("--held-child takes: url leases ttl-ms counter");
    };
    let backend = distlock::connect(url).await.expect("connect");
    let n = n.parse().expect("leases");
    let ttl = Duration::from_millis(ttl_ms.parse().expect("ttl-ms"));
    let held = held(backend, n, ttl, &Counter::from_arg(counter).await).await;
    println!("{}", serde_json::to_string(&held).expect("json"));
}

/// Takes `n` leases of `ttl` through one client with the watchdog on, lets it settle, then
/// counts server requests over three renewal ticks (from the end of one renewal call to the end
/// of the third after it), minus what the server counts at the same rate with the client
/// holding nothing.
pub async fn held(
    backend: Arc<dyn LockBackend>,
    n: usize,
    ttl: Duration,
    counter: &Counter,
) -> Held {
    const IDLE: Duration = Duration::from_secs(3);
    let ticks = Counting::wrap(backend);
    let locks = LockClient::new(ticks.clone());
    // The session (etcd lease, ZooKeeper session) is up before the idle window.
    locks
        .try_acquire("bench/held/warm-up", &AcquireOptions::with_ttl(ttl))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let idle_from = counter.read().await;
    let idle_start = Instant::now();
    tokio::time::sleep(IDLE).await;
    let idle_to = counter.read().await;
    let idle_rate = idle_from
        .zip(idle_to)
        .map(|(a, b)| (b - a) / idle_start.elapsed().as_secs_f64());
    let before = settled_rss_kb();
    let mut leases: Vec<Lease> = Vec::with_capacity(n);
    let retried = AtomicUsize::new(0);
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let taken = futures_util::future::join_all(chunk.iter().map(|i| {
            let (locks, retried) = (&locks, &retried);
            async move {
                let name = format!("bench/held/{i}");
                // As a user would: a retryable failure is tried again (the try it cut short
                // was released by its guard, which may still be on its way: `Busy` for a
                // moment), a few times.
                for _ in 0..20 {
                    match locks
                        .try_acquire(&name, &AcquireOptions::with_ttl(ttl))
                        .await
                    {
                        Ok(lease) => return lease,
                        Err(e) if e.is_retryable() => {
                            retried.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("acquire {name}: {e}"),
                    }
                }
                panic!("acquire {name}: 20 retryable failures in a row")
            }
        }))
        .await;
        leases.extend(taken);
    }
    let rss_growth_mb = (rss_kb() - before) / 1024.0;
    // Leases taken over a spread settle into one call per tick within two ticks.
    ticks.wait_batches(2, Duration::from_secs(30)).await;
    let from = counter.read().await;
    let start = Instant::now();
    ticks.wait_batches(3, Duration::from_secs(30)).await;
    let to = counter.read().await;
    let window = start.elapsed().as_secs_f64();
    let lost = leases.iter().filter(|l| l.lost_reason().is_some()).count();
    let mut leases = leases.into_iter().peekable();
    while leases.peek().is_some() {
        let chunk: Vec<Lease> = leases.by_ref().take(256).collect();
        futures_util::future::join_all(chunk.into_iter().map(Lease::release)).await;
    }
    Held {
        leases: n,
        retried: retried.into_inner(),
        lost,
        rss_growth_mb,
        round_trips_per_tick: from.zip(to).map(|(a, b)| (b - a) / 3.0),
        idle_per_tick: idle_rate.map(|r| r * window / 3.0),
    }
}
