//! distlock benchmarks: every backend against its raw client, in the same run, on servers the
//! conformance harness starts on loopback.
//!
//! `cargo run --release -p distlock-bench -- [--quick] [--out PATH]` writes PATH.md and
//! PATH.json (default `target/distlock-bench`). Figures are medians of several rounds; the
//! ratios ours / raw are what to track, since machines are noisy.
//!
//! * uncontended: one task, sequential acquire + release pairs on one name: pairs/s, p50, p99,
//!   and the same for the minimum raw client operations an acquire + release needs;
//! * hand-over: 8 tasks (each its own client) on one name: holder changes/s and the latency
//!   from a release to the next holder's grant.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient};
use distlock_conformance::harness::{EtcdCluster, RedisMasters, RedisServer, ZkEnsemble};
use serde::Serialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, Serialize)]
struct Stats {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

fn stats(mut samples: Vec<Duration>, total: Duration) -> Stats {
    samples.sort();
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Stats {
        per_sec: samples.len() as f64 / total.as_secs_f64(),
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

/// The median of each field over rounds.
fn median(mut rounds: Vec<Stats>) -> Stats {
    let mid = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut per_sec: Vec<f64> = rounds.iter().map(|s| s.per_sec).collect();
    let mut p50: Vec<f64> = rounds.iter().map(|s| s.p50_us).collect();
    let mut p99: Vec<f64> = rounds.iter_mut().map(|s| s.p99_us).collect();
    Stats {
        per_sec: mid(&mut per_sec),
        p50_us: mid(&mut p50),
        p99_us: mid(&mut p99),
    }
}

async fn timed<F, Fut>(pairs: usize, mut op: F) -> Stats
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut samples = Vec::with_capacity(pairs);
    let start = Instant::now();
    for i in 0..pairs {
        let t = Instant::now();
        op(i).await;
        samples.push(t.elapsed());
    }
    stats(samples, start.elapsed())
}

async fn ours_uncontended(backend: Arc<dyn LockBackend>, pairs: usize) -> Stats {
    let locks = LockClient::new(backend);
    let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
    timed(pairs, |_| {
        let (locks, opts) = (&locks, &opts);
        async move {
            let lease = locks
                .try_acquire("bench/uncontended", opts)
                .await
                .expect("acquire");
            lease.release().await.expect("release");
        }
    })
    .await
}

/// Raw Redis: `SET NX PX` with a random value, then the compare-and-delete script.
async fn raw_redis(url: &str, pairs: usize) -> Stats {
    let conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let del = redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    );
    timed(pairs, |i| {
        let (mut c, del) = (conn.clone(), &del);
        async move {
            let token = format!("{i:032x}");
            let _: Option<String> = redis::cmd("SET")
                .arg("bench/raw")
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async(&mut c)
                .await
                .expect("SET");
            let _: i64 = del
                .key("bench/raw")
                .arg(&token)
                .invoke_async(&mut c)
                .await
                .expect("del");
        }
    })
    .await
}

/// Raw etcd: a txn put-if-absent with an existing lease, then a delete.
async fn raw_etcd(endpoints: &[String], pairs: usize) -> Stats {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("connect");
    let lease = client.lease_grant(10, None).await.expect("lease").id();
    timed(pairs, |_| {
        let mut c = client.clone();
        async move {
            let key = "bench/raw";
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    "x",
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            c.txn(txn).await.expect("txn");
            c.delete(key, None).await.expect("delete");
        }
    })
    .await
}

/// Raw ZooKeeper: create an ephemeral sequential node, then delete it.
async fn raw_zk(connect: &str, pairs: usize) -> Stats {
    let client = zookeeper_client::Client::connect(connect)
        .await
        .expect("connect");
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let _ = client.create("/bench-raw", &[], &open).await;
    let mode = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    timed(pairs, |_| {
        let (c, mode) = (&client, &mode);
        async move {
            let (_, seq) = c.create("/bench-raw/n-", &[], mode).await.expect("create");
            c.delete(&format!("/bench-raw/n-{seq}"), None)
                .await
                .expect("delete");
        }
    })
    .await
}

/// 8 clients on one name: holder changes per second and release-to-grant latency.
async fn handover(clients: Vec<Arc<dyn LockBackend>>, per_task: usize) -> Stats {
    let last: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (id, backend) in clients.into_iter().enumerate() {
        let (last, samples) = (last.clone(), samples.clone());
        tasks.push(tokio::spawn(async move {
            let locks = LockClient::new(backend);
            let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
            for _ in 0..per_task {
                let lease = locks
                    .acquire("bench/handover", &opts, Duration::from_secs(60))
                    .await
                    .expect("acquire");
                let granted = Instant::now();
                if let Some((prev, released)) = *last.lock().await
                    && prev != id
                {
                    samples.lock().await.push(granted - released);
                }
                tokio::task::yield_now().await; // the critical section
                *last.lock().await = Some((id, Instant::now()));
                lease.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let samples = std::mem::take(&mut *samples.lock().await);
    stats(samples, start.elapsed())
}

/// The raw baseline of a backend.
enum Raw {
    None,
    Redis(String),
    Etcd(Vec<String>),
    Zk(String),
}

async fn raw(baseline: &Raw, pairs: usize) -> Option<Stats> {
    Some(match baseline {
        Raw::None => return None,
        Raw::Redis(url) => raw_redis(url, pairs).await,
        Raw::Etcd(endpoints) => raw_etcd(endpoints, pairs).await,
        Raw::Zk(connect) => raw_zk(connect, pairs).await,
    })
}

#[derive(Serialize)]
struct Row {
    backend: String,
    ours: Stats,
    raw: Option<Stats>,
    ratio_throughput: Option<f64>,
    ratio_p50: Option<f64>,
    handover: Stats,
}

async fn clients(url: &str, n: usize) -> Vec<Arc<dyn LockBackend>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(distlock::connect(url).await.expect("connect"));
    }
    out
}

async fn measure(backend: &str, url: &str, baseline: Raw, pairs: usize, rounds: usize) -> Row {
    let mut ours = Vec::new();
    let mut raws = Vec::new();
    let mut hands = Vec::new();
    for _ in 0..rounds {
        let one = distlock::connect(url).await.expect("connect");
        ours_uncontended(one.clone(), pairs / 10).await; // warm-up
        ours.push(ours_uncontended(one, pairs).await);
        raw(&baseline, pairs / 10).await; // warm-up
        raws.extend(raw(&baseline, pairs).await);
        hands.push(handover(clients(url, 8).await, (pairs / 40).max(10)).await);
    }
    let ours = median(ours);
    let raw = (!raws.is_empty()).then(|| median(raws));
    Row {
        backend: backend.to_string(),
        ours,
        raw,
        ratio_throughput: raw.map(|r| ours.per_sec / r.per_sec),
        ratio_p50: raw.map(|r| ours.p50_us / r.p50_us),
        handover: median(hands),
    }
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "target/distlock-bench".into());
    let (pairs, rounds) = if quick { (200, 1) } else { (2000, 3) };

    let redis = tokio::task::spawn_blocking(|| RedisServer::start().expect("redis"))
        .await
        .expect("start");
    let masters = tokio::task::spawn_blocking(|| RedisMasters::start(3).expect("redis masters"))
        .await
        .expect("start");
    let etcd = tokio::task::spawn_blocking(|| EtcdCluster::start(1).expect("etcd"))
        .await
        .expect("start");
    let zk = tokio::task::spawn_blocking(|| ZkEnsemble::start(1).expect("zookeeper"))
        .await
        .expect("start");

    let etcd_url = format!(
        "etcd://{}/bench?session_ttl=10s",
        etcd.endpoints().join(",")
    );
    let zk_url = format!("zk://{}?root=/bench", zk.connect_string());
    let rows = vec![
        measure("memory", "memory://bench", Raw::None, pairs, rounds).await,
        measure(
            "redis",
            &redis.url(),
            Raw::Redis(redis.url()),
            pairs,
            rounds,
        )
        .await,
        measure("redlock x3", &masters.url(), Raw::None, pairs, rounds).await,
        // etcd and ZooKeeper sync to disk on every write: fewer pairs keep the run short.
        measure(
            "etcd",
            &etcd_url,
            Raw::Etcd(etcd.endpoints()),
            pairs / 4,
            rounds,
        )
        .await,
        measure(
            "zk",
            &zk_url,
            Raw::Zk(zk.connect_string()),
            pairs / 4,
            rounds,
        )
        .await,
    ];

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut md = format!(
        "# distlock benchmarks\n\n{cores} cores; {}; etcd {}; ZooKeeper from `/usr/share/java/zookeeper.jar`. \
         Medians of {rounds} round(s); latencies in microseconds. Raw = the fewest raw client \
         operations an acquire + release needs on that backend, same run, same connection kind.\n\n\
         | backend | ours pairs/s | ours p50 | ours p99 | raw pairs/s | raw p50 | ours/raw throughput | ours/raw p50 | hand-overs/s (8 clients) | hand-over p50 | hand-over p99 |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        version("redis-server", "--version"),
        version("etcd", "--version").trim_start_matches("etcd Version: ")
    );
    let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |x| format!("{x:.digits$}"));
    for r in &rows {
        md.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} |\n",
            r.backend,
            r.ours.per_sec,
            r.ours.p50_us,
            r.ours.p99_us,
            f(r.raw.map(|x| x.per_sec), 0),
            f(r.raw.map(|x| x.p50_us), 0),
            f(r.ratio_throughput, 2),
            f(r.ratio_p50, 2),
            r.handover.per_sec,
            r.handover.p50_us,
            r.handover.p99_us,
        ));
    }
    let json = serde_json::to_string_pretty(&rows).expect("json");
    std::fs::write(format!("{out}.md"), &md).expect("write report");
    std::fs::write(format!("{out}.json"), json).expect("write json");
    print!("{md}");
    println!("\nwritten to {out}.md and {out}.json");
}
