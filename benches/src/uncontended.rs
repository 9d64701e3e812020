//! One task, sequential acquire + release pairs on one name: ours, the raw client minimum, and
//! the rslock peer. Ours and the baseline alternate in blocks within one round, so a noisy
//! moment of the machine hits both alike.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient};
use futures_util::future::join_all;
use tokio::time::Instant;

use crate::stats::{Stats, stats};

/// A way to take and release a lock once; each call is one timed pair.
pub enum Pair {
    /// Ours, through the generic layer (lease, watchdog, lost signal).
    Ours(LockClient, AcquireOptions),
    /// Raw Redis on each of these connections (one = a single server, N = Redlock's minimum):
    /// `SET NX PX` on all at once, then compare-and-delete on all at once.
    RawRedis(Vec<redis::aio::MultiplexedConnection>, redis::Script),
    /// Raw etcd: txn put-if-absent with a reused lease, then delete.
    RawEtcd(Box<etcd_client::Client>, i64),
    /// Raw ZooKeeper: create ephemeral-sequential, then delete.
    RawZk(zookeeper_client::Client),
    /// The rslock crate over these Redis masters (1 = plain Redis).
    Rslock(rslock::LockManager),
}

impl Pair {
    pub fn ours(backend: Arc<dyn LockBackend>) -> Self {
        Pair::Ours(
            LockClient::new(backend),
            AcquireOptions::with_ttl(Duration::from_secs(10)),
        )
    }

    pub async fn raw_redis(urls: &[String]) -> Self {
        let mut conns = Vec::new();
        for url in urls {
            conns.push(
                redis::Client::open(url.as_str())
                    .expect("url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect"),
            );
        }
        Pair::RawRedis(
            conns,
            redis::Script::new(
                "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
            ),
        )
    }

    pub async fn raw_etcd(endpoints: &[String]) -> Self {
        let mut client = etcd_client::Client::connect(endpoints, None)
            .await
            .expect("connect");
        let lease = client.lease_grant(60, None).await.expect("lease").id();
        Pair::RawEtcd(Box::new(client), lease)
    }

    pub async fn raw_zk(connect: &str) -> Self {
        let client = zookeeper_client::Client::connect(connect)
            .await
            .expect("connect");
        let open = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::anyone_all());
        let _ = client.create("/bench-raw", &[], &open).await;
        Pair::RawZk(client)
    }

    pub fn rslock(urls: &[String]) -> Self {
        Pair::Rslock(rslock::LockManager::new(urls.to_vec()))
    }

    /// One acquire + release on `name`.
    pub async fn once(&self, name: &str, i: usize) {
        match self {
            Pair::Ours(locks, opts) => {
                let lease = locks.try_acquire(name, opts).await.expect("acquire");
                lease.release().await.expect("release");
            }
            Pair::RawRedis(conns, del) => {
                let token = format!("{i:032x}");
                join_all(conns.iter().map(|c| {
                    let mut c = c.clone();
                    let token = &token;
                    async move {
                        let _: Option<String> = redis::cmd("SET")
                            .arg(name)
                            .arg(token)
                            .arg("NX")
                            .arg("PX")
                            .arg(10_000)
                            .query_async(&mut c)
                            .await
                            .expect("SET");
                    }
                }))
                .await;
                join_all(conns.iter().map(|c| {
                    let mut c = c.clone();
                    let token = &token;
                    async move {
                        let _: i64 = del
                            .key(name)
                            .arg(token)
                            .invoke_async(&mut c)
                            .await
                            .expect("del");
                    }
                }))
                .await;
            }
            Pair::RawEtcd(client, lease) => {
                use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
                let mut c = (**client).clone();
                let txn = Txn::new()
                    .when([Compare::create_revision(name, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        name,
                        "x",
                        Some(PutOptions::new().with_lease(*lease)),
                    )]);
                c.txn(txn).await.expect("txn");
                c.delete(name, None).await.expect("delete");
            }
            Pair::RawZk(client) => {
                let mode = zookeeper_client::CreateMode::EphemeralSequential
                    .with_acls(zookeeper_client::Acls::anyone_all());
                let (_, seq) = client
                    .create("/bench-raw/n-", &[], &mode)
                    .await
                    .expect("create");
                client
                    .delete(&format!("/bench-raw/n-{seq}"), None)
                    .await
                    .expect("delete");
            }
            Pair::Rslock(manager) => {
                let lock = manager
                    .lock(name, Duration::from_secs(10))
                    .await
                    .expect("rslock lock");
                manager.unlock(&lock).await;
            }
        }
    }
}

/// `pairs` pairs of each contender, alternating in blocks of 50; one Stats per contender.
pub async fn interleaved(contenders: &[(&Pair, &str)], pairs: usize) -> Vec<Stats> {
    const BLOCK: usize = 50;
    // Warm-up: connections, script caches, server-side directories.
    for (pair, name) in contenders {
        for i in 0..BLOCK.min(pairs) {
            pair.once(name, i).await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = contenders.iter().map(|_| Vec::new()).collect();
    let mut busy = vec![Duration::ZERO; contenders.len()];
    let mut done = 0;
    while done < pairs {
        let n = BLOCK.min(pairs - done);
        for (c, (pair, name)) in contenders.iter().enumerate() {
            let block = Instant::now();
            for i in 0..n {
                let t = Instant::now();
                pair.once(name, done + i).await;
                samples[c].push(t.elapsed());
            }
            busy[c] += block.elapsed();
        }
        done += n;
    }
    samples
        .into_iter()
        .zip(busy)
        .map(|(s, b)| stats(s, b))
        .collect()
}
