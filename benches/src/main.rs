//! distlock benchmarks: every backend against its raw client in the same run, plus the rslock
//! peer, on servers the conformance harness starts on loopback.
//!
//! `cargo run --release -p distlock-bench -- [--quick | --smoke] [--only LIST [--merge]] [--delay-us N] [--out DIR]` writes
//! `DIR/bench.md`, `DIR/bench.json` and `DIR/bench-handover.svg` (default DIR `target/bench`;
//! the checked-in report is `docs/bench.md`, made with `--out docs`). Figures are medians of
//! several rounds; the ratios are what to track, since machines are noisy. `--smoke` runs a few
//! hundred iterations in all, to prove the bench still works (CI runs it). `--only etcd,zk`
//! measures just those backends (the first word of a label: memory, redis, redlock, etcd, zk,
//! postgres); with `--merge` their rows replace theirs in DIR's report, which says so. On
//! PostgreSQL the raw minimum is a session advisory lock pair.
//!
//! Workloads: uncontended pairs (ours, raw minimum, our own requests sent raw, the peers),
//! hand-over with 8, 24 and 64 clients on one name, election, semaphore and read-write mix, 1 000
//! names under 256 tasks, 100 000 leases held with the watchdog on, and 1 000 waiters on one
//! name (these three on servers started for them). The uncontended, hand-over, semaphore and
//! read-write tables run twice: on loopback, then through latency links that add `--delay-us`
//! (default 250) each way, a datacenter's 0.5 ms round trip (`--delay-us 0` skips that pass).

mod election;
mod handover;
mod primitives;
mod report;
mod rtt;
mod scale;
mod stats;
mod uncontended;

use std::sync::Arc;
use std::time::Duration;

use distlock::LockBackend;
use distlock_conformance::harness::{
    EtcdCluster, LatencyLink, PostgresServer, RedisMasters, RedisServer, ZkEnsemble,
};

use crate::handover::{Waiter, counted_handover, handover};
use crate::report::{Crowd, Election, Handover, Network, Primitives, Report, Scale, Uncontended};
use crate::rtt::Ping;
use crate::scale::Counter;
use crate::stats::{Stats, median};
use crate::uncontended::{Pair, Peer, interleaved, postgres_client};

/// How much of everything to run.
#[derive(Clone, Copy)]
struct Size {
    rounds: usize,
    /// Uncontended pairs per round (half on etcd and ZooKeeper, which sync every write).
    pairs: usize,
    /// Hand-over grants per run, and the time budget of one run.
    grants: usize,
    budget: Duration,
    /// Pairs per task in the many-names run (256 tasks).
    scale_pairs: usize,
    held: usize,
}

/// The datacenter setting's added delay each way (0.5 ms RTT, as within one datacenter) and
/// its rounds (each takes ten times as long as on loopback).
const DATACENTER_ONE_WAY_US: u64 = 250;
const NETWORK_ROUNDS: usize = 3;

/// Candidates of the election run (a control plane's replica count).
const CANDIDATES: usize = 3;

/// The crowd run: this many waiters on one name, each its own client (connection or session).
pub(crate) const WAITERS: usize = 1_000;

/// The semaphore run: this many contenders on a semaphore of `PERMITS`; the read-write mix
/// runs as many clients.
const CONTENDERS: usize = 16;
const PERMITS: u32 = 4;

const FULL: Size = Size {
    rounds: 5,
    pairs: 2_000,
    grants: 2_000,
    budget: Duration::from_secs(20),
    scale_pairs: 40,
    held: 100_000,
};
const QUICK: Size = Size {
    rounds: 1,
    pairs: 500,
    grants: 500,
    budget: Duration::from_secs(10),
    scale_pairs: 10,
    held: 10_000,
};
const SMOKE: Size = Size {
    rounds: 1,
    pairs: 100,
    grants: 50,
    budget: Duration::from_secs(5),
    scale_pairs: 1,
    held: 200,
};

/// One backend under test.
struct Target {
    label: &'static str,
    url: String,
    /// Divides the pair and grant counts (disk-synced stores).
    slow: usize,
    raw: Option<Pair>,
    /// Our own server requests sent by hand on a raw connection.
    same: Option<Pair>,
    /// The peer library a user of this backend would reach for, and its label.
    peer: Option<(&'static str, Peer)>,
    ping: Option<Ping>,
    counter: Counter,
    /// Locks only (Redlock, the Redis plain layout): no terms, no policies, so no election,
    /// semaphore, read-write or scale tables.
    lock_only: bool,
}

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    distlock::connect(url).await.expect("connect")
}

async fn start<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("server start")
}

fn version(cmd: &str, arg: &str) -> String {
    std::process::Command::new(cmd)
        .arg(arg)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// Adds `pair` (if any) to the contenders; returns its index.
fn enter<'a>(
    contenders: &mut Vec<(&'a Pair, &'static str)>,
    pair: Option<&'a Pair>,
    name: &'static str,
) -> Option<usize> {
    pair.map(|p| {
        contenders.push((p, name));
        contenders.len() - 1
    })
}

/// Where the servers listen: directly, or through latency links.
struct Ports {
    redis: u16,
    masters: Vec<u16>,
    etcd: u16,
    zk: u16,
    postgres: u16,
}

/// Every backend under test, its baselines and peer, on these ports; `counters` count server
/// requests of Redis, etcd and ZooKeeper for the scale table.
async fn backends(p: &Ports, counters: [Counter; 3]) -> Vec<Target> {
    let [redis_counter, etcd_counter, zk_counter] = counters;
    let redis = format!("redis://127.0.0.1:{}", p.redis);
    let masters: Vec<String> = p
        .masters
        .iter()
        .map(|m| format!("redis://127.0.0.1:{m}"))
        .collect();
    let redlock = format!(
        "redlock://{}",
        p.masters
            .iter()
            .map(|m| format!("127.0.0.1:{m}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let etcd = vec![format!("127.0.0.1:{}", p.etcd)];
    let zk = format!("127.0.0.1:{}", p.zk);
    let postgres = format!("postgres://postgres@127.0.0.1:{}/postgres", p.postgres);
    vec![
        Target {
            label: "memory",
            url: "memory://bench".into(),
            slow: 1,
            raw: None,
            same: None,
            peer: None,
            ping: None,
            counter: Counter::None,
            lock_only: false,
        },
        Target {
            label: "redis",
            url: redis.clone(),
            slow: 1,
            raw: Some(Pair::raw_redis(std::slice::from_ref(&redis)).await),
            same: Some(Pair::same_redis(std::slice::from_ref(&redis)).await),
            peer: Some(("rslock (1 server)", Peer::Rslock(vec![redis.clone()]))),
            ping: Some(Ping::redis(std::slice::from_ref(&redis)).await),
            counter: redis_counter,
            lock_only: false,
        },
        Target {
            // The key other languages' clients share: its recipe is the raw pair itself, so
            // ours / raw is what the layout costs over `SET NX PX` and compare-and-delete by
            // hand; its waiters poll (no keyspace events on a stock server).
            label: "redis plain",
            url: format!("{redis}?layout=plain&prefix=bench-plain:"),
            slow: 1,
            raw: Some(Pair::raw_redis(std::slice::from_ref(&redis)).await),
            same: None,
            peer: None,
            ping: Some(Ping::redis(std::slice::from_ref(&redis)).await),
            counter: Counter::None,
            lock_only: true,
        },
        Target {
            label: "redlock x3",
            // Wait as long as it takes, like the rslock waiters (the default gives up after 32 rounds).
            url: format!("{redlock}?retry_count=1000000"),
            slow: 1,
            raw: Some(Pair::raw_redis(&masters).await),
            same: Some(Pair::same_redis(&masters).await),
            peer: Some(("rslock x3", Peer::Rslock(masters.clone()))),
            ping: Some(Ping::redis(&masters).await),
            counter: Counter::None,
            lock_only: true,
        },
        Target {
            label: "etcd",
            url: format!("etcd://{}/bench?session_ttl=10s", etcd.join(",")),
            slow: 2,
            raw: Some(Pair::raw_etcd(&etcd).await),
            same: Some(Pair::same_etcd(&etcd).await),
            peer: Some(("etcd-client lock", Peer::EtcdLock(etcd.clone()))),
            ping: Some(Ping::Etcd(Box::new(
                etcd_client::Client::connect(&etcd, None)
                    .await
                    .expect("connect"),
            ))),
            counter: etcd_counter,
            lock_only: false,
        },
        Target {
            label: "zk",
            url: format!("zk://{zk}?root=/bench"),
            slow: 2,
            raw: Some(Pair::raw_zk(&zk).await),
            same: Some(Pair::same_zk(&zk).await),
            peer: Some(("zookeeper-client lock", Peer::ZkLock(zk.clone()))),
            ping: Some(Ping::Zk(
                zookeeper_client::Client::connect(&zk)
                    .await
                    .expect("connect"),
            )),
            counter: zk_counter,
            lock_only: false,
        },
        Target {
            // Raw: a session advisory lock pair (no write, no TTL, no token); same work: our
            // functions called by hand.
            label: "postgres",
            url: format!("{postgres}?schema=bench"),
            slow: 2,
            raw: Some(Pair::raw_postgres(&postgres).await),
            same: Some(Pair::same_postgres(&postgres).await),
            peer: None,
            ping: Some(Ping::Postgres(postgres_client(&postgres).await)),
            counter: Counter::None,
            lock_only: false,
        },
    ]
}

/// `--only etcd,zk`: keeps just those backends (by the first word of their label).
fn retain_only(targets: &mut Vec<Target>, only: Option<&[String]>) {
    if let Some(only) = only {
        targets.retain(|t| {
            only.iter()
                .any(|o| t.label.split(' ').next() == Some(o.as_str()))
        });
    }
}

/// The uncontended and hand-over tables of one backend: ours, its baselines and its peer.
async fn lock_tables(t: &Target, size: Size, out: &mut Network) {
    let pairs = size.pairs / t.slow;
    let ours = Pair::ours(connect(&t.url).await);
    let peer = match &t.peer {
        Some((_, p)) => Some(Pair::peer(p).await),
        None => None,
    };
    // Ours first; then whichever of raw, same-work and peer this backend has.
    let mut contenders = vec![(&ours, "bench/ours")];
    let raw_at = enter(&mut contenders, t.raw.as_ref(), "bench-raw");
    let same_at = enter(&mut contenders, t.same.as_ref(), "bench/same");
    let peer_at = enter(&mut contenders, peer.as_ref(), "bench/peer");
    let mut rounds: Vec<Vec<_>> = contenders.iter().map(|_| Vec::new()).collect();
    for _ in 0..size.rounds {
        for (i, s) in interleaved(&contenders, pairs)
            .await
            .into_iter()
            .enumerate()
        {
            rounds[i].push(s);
        }
    }
    let ours_stats = median(&rounds[0]);
    let raw_stats = raw_at.map(|i| median(&rounds[i]));
    let same_stats = same_at.map(|i| median(&rounds[i]));
    out.uncontended
        .push(Uncontended::new(t.label, ours_stats, raw_stats, same_stats));
    if let (Some((label, _)), Some(i)) = (&t.peer, peer_at) {
        out.uncontended
            .push(Uncontended::new(label, median(&rounds[i]), raw_stats, None));
    }

    let rtt = match &t.ping {
        Some(p) => Some(p.measure(200).await.p50_us),
        None => None,
    };
    let grants = size.grants / t.slow;
    // 24: a queue longer than etcd's near-head window (16) whose turns still come sooner than
    // etcd's 100 ms catch-up loop, where its far waiters once waited on that loop.
    for clients in [8, 24, 64] {
        let (mut ours_runs, mut peer_runs) = (Vec::new(), Vec::new());
        let (mut requests, mut handed) = (Some(0.0), 0);
        for round in 0..size.rounds {
            // Ours and the peer alternate, each round started by the other one, with the same
            // number of grants: a slow phase of the machine (a disk stall, a busy neighbour)
            // falls on both, as in the uncontended table's blocks.
            for peer_turn in [round % 2 == 1, round % 2 == 0] {
                match (peer_turn, &t.peer) {
                    (false, _) => {
                        let mut waiters = Vec::new();
                        for _ in 0..clients {
                            waiters.push(Waiter::ours(connect(&t.url).await));
                        }
                        let name = format!("bench/handover/{clients}");
                        let before = t.counter.requests().await;
                        let (stats, n) =
                            counted_handover(waiters, &name, grants, size.budget).await;
                        let after = t.counter.requests().await;
                        requests = requests.zip(before.zip(after)).map(|(r, (b, a))| r + a - b);
                        handed += n;
                        ours_runs.push(stats);
                    }
                    (true, Some((_, peer))) => {
                        let mut waiters = Vec::new();
                        for _ in 0..clients {
                            waiters.push(Waiter::peer(peer).await);
                        }
                        let name = format!("bench/peer-handover/{clients}");
                        peer_runs.push(handover(waiters, &name, grants, size.budget).await);
                    }
                    (true, None) => {}
                }
            }
        }
        out.handover.push(Handover {
            backend: t.label.to_string(),
            clients,
            stats: median(&ours_runs),
            rtt_p50_us: rtt,
            requests_per_handover: requests.map(|r| r / handed.max(1) as f64),
        });
        if let Some((label, _)) = &t.peer {
            out.handover.push(Handover {
                backend: label.to_string(),
                clients,
                stats: median(&peer_runs),
                rtt_p50_us: rtt,
                requests_per_handover: None,
            });
        }
    }
}

/// The semaphore and read-write rows of `t` on the network `label`: medians of `size.rounds`
/// rounds, each a lock hand-over, a semaphore run and a read-write mix with as many clients.
async fn primitives_row(t: &Target, size: Size, label: &str) -> Primitives {
    let (mut locks, mut permits, mut mixes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..size.rounds {
        let grants = size.grants / t.slow;
        let mut waiters = Vec::new();
        for _ in 0..CONTENDERS {
            waiters.push(Waiter::ours(connect(&t.url).await));
        }
        locks.push(handover(waiters, "bench/lock-16", grants, size.budget).await);
        let mut clients = Vec::new();
        for _ in 0..CONTENDERS {
            clients.push(connect(&t.url).await);
        }
        permits.push(primitives::semaphore(clients, "bench", PERMITS, grants, size.budget).await);
        let mut clients = Vec::new();
        for _ in 0..CONTENDERS {
            clients.push(connect(&t.url).await);
        }
        mixes.push(primitives::read_write(clients, "bench", grants, size.budget).await);
    }
    let per_sec = mixes
        .iter()
        .map(|m| Stats {
            per_sec: m.per_sec,
            ..Stats::default()
        })
        .collect::<Vec<_>>();
    Primitives {
        backend: t.label.to_string(),
        network: label.to_string(),
        clients: CONTENDERS,
        permits: PERMITS,
        lock: median(&locks),
        semaphore: median(&permits),
        mix_per_sec: median(&per_sec).per_sec,
        read: median(&mixes.iter().map(|m| m.read).collect::<Vec<_>>()),
        write: median(&mixes.iter().map(|m| m.write).collect::<Vec<_>>()),
        rw_handover: median(&mixes.iter().map(|m| m.handover).collect::<Vec<_>>()),
    }
}

/// Counters of the server requests of these servers, read directly (not through a link).
async fn counters_of(redis: &RedisServer, etcd: &EtcdCluster, zk: &ZkEnsemble) -> [Counter; 3] {
    [
        Counter::Redis(redis.admin().await.expect("admin"), redis.port()),
        Counter::Etcd(etcd.metrics_ports[0]),
        Counter::Zk(zk.client_ports[0]),
    ]
}

/// The scale row of one backend: many names, leases held, and the crowd of waiters.
async fn scale_row(t: &mut Target, size: Size) -> Scale {
    // The other clients of this server go first: their keep-alives would blur the server's
    // request count of the held leases.
    (t.raw, t.same, t.ping) = (None, None, None);
    let many = scale::many_names(connect(&t.url).await, 1_000, 256, size.scale_pairs).await;
    // PostgreSQL renews each lease's own row: an update of 100 000 rows took 0.3-1.4 s
    // a tick here, too close to a 3 s TTL's 1 s ticks (the full run lost 11 776 of
    // them); it holds them for 10 s, as etcd's and ZooKeeper's sessions do.
    let ttl = Duration::from_secs(if t.label == "postgres" { 10 } else { 3 });
    let held = scale::held_in_child(&t.url, size.held, ttl, &t.counter).await;
    let crowd = if t.label == "postgres" {
        None
    } else {
        let waiters = WAITERS.min(size.grants);
        let mut clients = Vec::new();
        for _ in 0..waiters {
            clients.push(Waiter::ours(connect(&t.url).await));
        }
        let before = t.counter.requests().await;
        let (stats, handed) =
            counted_handover(clients, "bench/crowd", size.grants, size.budget).await;
        let after = t.counter.requests().await;
        Some(Crowd {
            waiters,
            stats,
            requests_per_handover: before
                .zip(after)
                .map(|(b, a)| (a - b) / handed.max(1) as f64),
        })
    };
    Scale {
        backend: t.label.to_string(),
        many_names_per_sec: many,
        held,
        crowd,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--held-child") {
        return scale::held_child(&args[2..]).await;
    }
    let size = if args.iter().any(|a| a == "--smoke") {
        SMOKE
    } else if args.iter().any(|a| a == "--quick") {
        QUICK
    } else {
        FULL
    };
    let dir = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "target/bench".into());
    // `--only etcd,zk`: just those backends (by the first word of their label).
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(str::to_string).collect());
    // `--delay-us N`: the second network setting adds N us each way (0: loopback only).
    let delay_us: u64 = args
        .iter()
        .position(|a| a == "--delay-us")
        .and_then(|i| args.get(i + 1))
        .map_or(DATACENTER_ONE_WAY_US, |v| {
            v.parse().expect("--delay-us takes microseconds")
        });

    let redis = start(|| RedisServer::start().expect("redis")).await;
    let masters = start(|| RedisMasters::start(3).expect("redis masters")).await;
    let etcd = start(|| EtcdCluster::start(1).expect("etcd")).await;
    let zk = start(|| ZkEnsemble::start(1).expect("zookeeper")).await;
    let postgres = start(|| PostgresServer::start().expect("postgres")).await;
    let direct = Ports {
        redis: redis.port(),
        masters: masters.nodes.iter().map(RedisServer::port).collect(),
        etcd: etcd.client_ports[0],
        zk: zk.client_ports[0],
        postgres: postgres.port(),
    };
    let counters = counters_of(&redis, &etcd, &zk).await;
    let mut targets = backends(&direct, counters).await;
    retain_only(&mut targets, only.as_deref());

    let mut report = Report {
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        servers: format!(
            "{}; etcd {}; ZooKeeper 3.8 (Debian); {} (stock settings: fsync on)",
            version("redis-server", "--version"),
            version("etcd", "--version").trim_start_matches("etcd Version: "),
            version("/usr/lib/postgresql/15/bin/postgres", "--version")
        ),
        networks: Vec::new(),
        elections: Vec::new(),
        primitives: Vec::new(),
        scale: Vec::new(),
        merged: Vec::new(),
    };

    let mut loopback = Network::new("loopback", 0, size.rounds);
    for t in &mut targets {
        eprintln!("== {}", t.label);
        lock_tables(t, size, &mut loopback).await;

        // Redlock and the plain layout have no tokens, so no terms: no election there.
        if !t.lock_only {
            let mut locks = Vec::new();
            let mut leaders = Vec::new();
            for _ in 0..size.rounds {
                let mut waiters = Vec::new();
                let mut candidates = Vec::new();
                for _ in 0..CANDIDATES {
                    waiters.push(Waiter::ours(connect(&t.url).await));
                    candidates.push(connect(&t.url).await);
                }
                let grants = size.grants / t.slow / 2;
                locks.push(handover(waiters, "bench/lock-3", grants, size.budget).await);
                let observer = connect(&t.url).await;
                leaders.push(
                    election::election(candidates, observer, "bench", grants, size.budget).await,
                );
            }
            report.elections.push(Election {
                backend: t.label.to_string(),
                candidates: CANDIDATES,
                lock: median(&locks),
                leader: median(&leaders.iter().map(|e| e.handover).collect::<Vec<_>>()),
                observed: median(&leaders.iter().map(|e| e.observed).collect::<Vec<_>>()),
            });
        }

        // Neither keeps a queue that admits by policy: no semaphores or read-write locks there.
        if !t.lock_only {
            report
                .primitives
                .push(primitives_row(t, size, &loopback.label).await);
        }
        // Its baselines' connections (ZooKeeper's sessions ping) close before the next backend.
        (t.raw, t.same, t.ping) = (None, None, None);
    }

    report.networks.push(loopback);
    drop(targets);

    // Scale runs on servers of its own, started for it and stopped after it: the 100 000 lock
    // containers its held run leaves empty kept ZooKeeper reaping them (10 000 a minute) through
    // the next stage, which taxed that stage's every write; and its takes meet a server in the
    // same state whatever ran before.
    {
        let redis = start(|| RedisServer::start().expect("redis")).await;
        let etcd = start(|| EtcdCluster::start(1).expect("etcd")).await;
        let zk = start(|| ZkEnsemble::start(1).expect("zookeeper")).await;
        let postgres = start(|| PostgresServer::start().expect("postgres")).await;
        let fresh = Ports {
            redis: redis.port(),
            masters: direct.masters.clone(),
            etcd: etcd.client_ports[0],
            zk: zk.client_ports[0],
            postgres: postgres.port(),
        };
        let counters = counters_of(&redis, &etcd, &zk).await;
        let mut targets = backends(&fresh, counters).await;
        retain_only(&mut targets, only.as_deref());
        for t in targets.iter_mut().filter(|t| !t.lock_only) {
            eprintln!("== {}, scale", t.label);
            report.scale.push(scale_row(t, size).await);
        }
    }

    // The datacenter setting: every connection through a link that adds `delay_us` each way.
    if delay_us > 0 {
        let one_way = Duration::from_micros(delay_us);
        let link = |port: u16| {
            LatencyLink::start(([127, 0, 0, 1], port).into(), one_way).expect("latency link")
        };
        let links: Vec<LatencyLink> = [direct.redis, direct.etcd, direct.zk, direct.postgres]
            .into_iter()
            .chain(direct.masters.iter().copied())
            .map(link)
            .collect();
        let linked = Ports {
            redis: links[0].addr().port(),
            etcd: links[1].addr().port(),
            zk: links[2].addr().port(),
            postgres: links[3].addr().port(),
            masters: links[4..].iter().map(|l| l.addr().port()).collect(),
        };
        let rounds = size.rounds.min(NETWORK_ROUNDS);
        let mut network = Network::new(
            &format!("{:.1} ms RTT", 2.0 * delay_us as f64 / 1000.0),
            delay_us,
            rounds,
        );
        // The counters read the servers directly, as on loopback.
        let counters = counters_of(&redis, &etcd, &zk).await;
        let mut targets = backends(&linked, counters).await;
        retain_only(&mut targets, only.as_deref());
        for t in &mut targets {
            eprintln!("== {}, {}", t.label, network.label);
            lock_tables(t, Size { rounds, ..size }, &mut network).await;
            // A quarter of the grants: each takes ten times as long as on loopback.
            if !t.lock_only {
                let size = Size {
                    rounds,
                    grants: size.grants / 4,
                    ..size
                };
                report
                    .primitives
                    .push(primitives_row(t, size, &network.label).await);
            }
        }
        report.networks.push(network);
    }

    std::fs::create_dir_all(&dir).expect("output directory");
    // `--merge` (with `--only`): this run's rows replace those backends' rows in the report
    // already in DIR, so one backend can be measured again without running them all.
    if args.iter().any(|a| a == "--merge") {
        assert!(
            only.is_some(),
            "--merge replaces the rows of the --only backends"
        );
        let json = std::fs::read_to_string(format!("{dir}/bench.json"))
            .expect("--merge needs a bench.json in the --out directory");
        let mut earlier: Report = serde_json::from_str(&json).expect("an earlier bench.json");
        earlier.merge(report);
        report = earlier;
    }
    let md = report.markdown();
    std::fs::write(format!("{dir}/bench.md"), &md).expect("write report");
    std::fs::write(
        format!("{dir}/bench.json"),
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .expect("write json");
    std::fs::write(format!("{dir}/bench-handover.svg"), report.svg()).expect("write svg");
    print!("{md}");
    eprintln!("\nwritten to {dir}/bench.md, bench.json and bench-handover.svg");
}
