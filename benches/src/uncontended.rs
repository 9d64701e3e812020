//! One task, sequential acquire + release pairs on one name: ours, the raw client minimum, and
//! the rslock peer. Ours and the baseline alternate in blocks within one round (in rotating
//! order), so a noisy moment of the machine hits both alike.

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
    /// PostgreSQL's session advisory lock: `pg_try_advisory_lock`, then `pg_advisory_unlock`
    /// (no write, no durability, no TTL: the floor a lease table is compared with).
    RawPostgres(tokio_postgres::Client),
    /// The rslock crate over these Redis masters (1 = plain Redis).
    Rslock(rslock::LockManager),
    /// etcd's own lock service (`etcd_client::Client::lock`, v3lock) on a lease of its own.
    EtcdLock(Box<etcd_client::Client>, i64),
    /// `zookeeper_client::Client::lock` (Curator's recipe), released by a delete whose answer
    /// is awaited (as ours is).
    ZkLock(zookeeper_client::Client),
    /// Our backend's own server work, sent by hand on a raw connection (no library around it):
    /// what the guarantees cost on the server, apart from the library's overhead.
    Same(SameWork),
}

/// The requests one of our acquire + release pairs sends, by backend.
pub enum SameWork {
    /// Redis: our acquire script (fencing counter, queue check) + our release script. On several
    /// connections (Redlock): `SET NX PX` on all, then the release script on all.
    Redis(Vec<redis::aio::MultiplexedConnection>),
    /// etcd: our enqueue txn as a repeat acquire on an idle cluster sends it (put-if-absent of
    /// our reused key, no read of the keys ahead), then our release (a compare-value delete txn).
    Etcd(Box<etcd_client::Client>, i64),
    /// ZooKeeper: create with our node name and data, then delete (a repeat acquire on an idle
    /// ensemble reads no queue: see `distlock_zk`'s repeat grant).
    Zk(zookeeper_client::Client),
    /// PostgreSQL: our `acquire` function, then our `release` function, in the schema of
    /// [`SAME_SCHEMA`], as unnamed typed statements (as ours sends them).
    Postgres(tokio_postgres::Client),
}

/// The schema of [`SameWork::Postgres`] (installed by a client of ours first).
pub const SAME_SCHEMA: &str = "bench_same";

impl Pair {
    pub fn ours(backend: Arc<dyn LockBackend>) -> Self {
        Pair::Ours(
            LockClient::new(backend),
            AcquireOptions::with_ttl(Duration::from_secs(10)),
        )
    }

    pub async fn raw_redis(urls: &[String]) -> Self {
        Pair::RawRedis(
            redis_conns(urls).await,
            redis::Script::new(
                "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
            ),
        )
    }

    pub async fn raw_etcd(endpoints: &[String]) -> Self {
        let (client, lease) = etcd_with_lease(endpoints).await;
        Pair::RawEtcd(client, lease)
    }

    pub async fn raw_zk(connect: &str) -> Self {
        Pair::RawZk(zk_with_parent(connect).await)
    }

    /// Our server work on raw connections to `urls` (see [`SameWork::Redis`]).
    pub async fn same_redis(urls: &[String]) -> Self {
        Pair::Same(SameWork::Redis(redis_conns(urls).await))
    }

    pub async fn same_etcd(endpoints: &[String]) -> Self {
        let (client, lease) = etcd_with_lease(endpoints).await;
        Pair::Same(SameWork::Etcd(client, lease))
    }

    pub async fn same_zk(connect: &str) -> Self {
        Pair::Same(SameWork::Zk(zk_with_parent(connect).await))
    }

    pub async fn raw_postgres(url: &str) -> Self {
        Pair::RawPostgres(postgres_client(url).await)
    }

    /// Our SQL by hand on a raw connection to `url`, whose layout a client of ours installs
    /// first in [`SAME_SCHEMA`].
    pub async fn same_postgres(url: &str) -> Self {
        distlock::connect(&format!("{url}?schema={SAME_SCHEMA}"))
            .await
            .expect("install the layout");
        Pair::Same(SameWork::Postgres(postgres_client(url).await))
    }

    /// The peer library of a backend (see [`Peer`]).
    pub async fn peer(peer: &Peer) -> Self {
        match peer {
            Peer::Rslock(urls) => Pair::Rslock(rslock::LockManager::new(urls.clone())),
            Peer::EtcdLock(endpoints) => {
                let (client, lease) = etcd_with_lease(endpoints).await;
                Pair::EtcdLock(client, lease)
            }
            Peer::ZkLock(connect) => Pair::ZkLock(zk_with_parent(connect).await),
        }
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
                set_nx_everywhere(conns, name, &token).await;
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
            Pair::RawEtcd(client, lease) => etcd_pair(client, *lease, name, "x", false).await,
            Pair::RawZk(client) => zk_pair(client, "/bench-raw/n-", "").await,
            Pair::RawPostgres(client) => {
                for sql in [
                    "SELECT pg_try_advisory_lock(hashtext($1))",
                    "SELECT pg_advisory_unlock(hashtext($1))",
                ] {
                    let held: bool = client
                        .query_typed_one(sql, &[(&name, tokio_postgres::types::Type::TEXT)])
                        .await
                        .expect("advisory lock")
                        .get(0);
                    assert!(held, "{sql}");
                }
            }
            Pair::Same(work) => work.once(name, i).await,
            Pair::Rslock(manager) => {
                let lock = manager
                    .lock(name, Duration::from_secs(10))
                    .await
                    .expect("rslock lock");
                manager.unlock(&lock).await;
            }
            Pair::EtcdLock(client, lease) => etcd_lock_pair(client, *lease, name, async {}).await,
            Pair::ZkLock(client) => zk_lock_pair(client, async {}).await,
        }
    }
}

/// A peer library: the natural alternative a user of that backend would reach for.
pub enum Peer {
    /// rslock (Redlock) over these Redis URLs; one URL = plain Redis.
    Rslock(Vec<String>),
    /// etcd's lock service through `etcd_client`, over these endpoints.
    EtcdLock(Vec<String>),
    /// `zookeeper_client`'s lock recipe on this connect string.
    ZkLock(String),
}

/// etcd's lock service: lock `name` on `lease`, run `critical`, unlock.
pub(crate) async fn etcd_lock_pair(
    client: &etcd_client::Client,
    lease: i64,
    name: &str,
    critical: impl Future<Output = ()>,
) {
    let mut c = client.clone();
    let held = c
        .lock(
            name,
            Some(etcd_client::LockOptions::new().with_lease(lease)),
        )
        .await
        .expect("etcd lock");
    critical.await;
    c.unlock(held.key()).await.expect("etcd unlock");
}

/// `zookeeper_client`'s lock: take it, run `critical`, delete the node and wait for the answer.
pub(crate) async fn zk_lock_pair(
    client: &zookeeper_client::Client,
    critical: impl Future<Output = ()>,
) {
    let prefix =
        zookeeper_client::LockPrefix::new_curator("/bench-peer", "lock-").expect("lock prefix");
    let lock = client
        .lock(prefix, b"", zookeeper_client::Acls::anyone_all())
        .await
        .expect("zookeeper lock");
    critical.await;
    let path = lock.lock_path().to_string();
    // Its Drop deletes in the background, unanswered; ours is timed to the delete's answer.
    std::mem::forget(lock);
    client.delete(&path, None).await.expect("delete");
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
        // Each block starts with the next contender: none always follows the same one (which
        // measurably favoured whoever came second).
        let first = (done / BLOCK) % contenders.len();
        for c in (0..contenders.len()).map(|k| (first + k) % contenders.len()) {
            let (pair, name) = contenders[c];
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

impl SameWork {
    async fn once(&self, name: &str, i: usize) {
        let secret = format!("{i:032x}");
        // Who holds, as every grant writes it.
        let holder = distlock::HolderInfo::now().segment();
        match self {
            SameWork::Redis(conns) if conns.len() == 1 => {
                let keys = same_keys(name);
                let mut c = conns[0].clone();
                acquire_script(&mut c, &keys, &secret, &holder, false).await;
                release_script(&mut c, &keys, &secret, "head").await;
            }
            SameWork::Redis(conns) => {
                let keys = same_keys(name);
                // Only the name's arbiter looks for waiters (`RedlockBackend::arbiter`): its ask
                // is the queue's script, the others' a plain `SET NX PX`.
                let arbiter = distlock_redis::redlock::arbiter_index(&keys.lock, conns.len());
                let value = format!("{secret}:0{holder}");
                join_all(conns.iter().enumerate().map(|(i, c)| {
                    let mut c = c.clone();
                    let (keys, secret, holder, value) = (&keys, &secret, &holder, &value);
                    async move {
                        if i == arbiter {
                            acquire_script(&mut c, keys, secret, holder, true).await;
                        } else {
                            set_nx(&mut c, &keys.lock, value).await;
                        }
                    }
                }))
                .await;
                join_all(conns.iter().enumerate().map(|(i, c)| {
                    let mut c = c.clone();
                    let (keys, secret) = (&keys, &secret);
                    let tell = if i == arbiter { "leave" } else { "none" };
                    async move { release_script(&mut c, keys, secret, tell).await }
                }))
                .await;
            }
            SameWork::Etcd(client, lease) => {
                let key = format!("bench-same/{name}/{lease:016x}.{:016x}", 0);
                etcd_pair(client, *lease, &key, &secret, true).await;
            }
            SameWork::Zk(client) => {
                zk_pair(client, &format!("/bench-raw/_c_{secret}-lock-"), &secret).await;
            }
            SameWork::Postgres(client) => postgres_same(client, name, &secret, &holder).await,
        }
    }
}

/// etcd: txn put-if-absent of `key` = `value` with `lease`, then delete it: plainly, or (as our
/// release does, so that a late delete cannot remove the path's next grant) by a txn that
/// compares the value first.
async fn etcd_pair(
    client: &etcd_client::Client,
    lease: i64,
    key: &str,
    value: &str,
    compare_delete: bool,
) {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let mut c = client.clone();
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    c.txn(txn).await.expect("txn");
    if compare_delete {
        let txn = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, value)])
            .and_then([TxnOp::delete(key, None)])
            .or_else([TxnOp::get(key, None)]);
        assert!(c.txn(txn).await.expect("txn").succeeded(), "not deleted");
    } else {
        c.delete(key, None).await.expect("delete");
    }
}

/// ZooKeeper: create an ephemeral-sequential node at `prefix` holding `data`, then delete it.
async fn zk_pair(client: &zookeeper_client::Client, prefix: &str, data: &str) {
    let mode = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let (_, seq) = client
        .create(prefix, data.as_bytes(), &mode)
        .await
        .expect("create");
    client
        .delete(&format!("{prefix}{seq}"), None)
        .await
        .expect("delete");
}

/// `SET key value NX PX 10000` on every connection at once.
async fn set_nx_everywhere(conns: &[redis::aio::MultiplexedConnection], key: &str, value: &str) {
    join_all(conns.iter().map(|c| {
        let mut c = c.clone();
        async move { set_nx(&mut c, key, value).await }
    }))
    .await;
}

/// `SET key value NX PX 10000`.
async fn set_nx(c: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    let _: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(c)
        .await
        .expect("SET");
}

/// Our acquire script as a first, uncontended ask sends it: not waiting, on a Redlock arbiter
/// (no counter) or a single server.
async fn acquire_script(
    c: &mut redis::aio::MultiplexedConnection,
    keys: &distlock_redis::keys::LockKeys,
    secret: &str,
    holder: &str,
    arbiter: bool,
) {
    let _: (i64, i64) = distlock_redis::scripts::ACQUIRE
        .key(&keys.lock)
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.alive())
        .key(keys.asks())
        .arg(secret)
        .arg(10_000)
        .arg(0)
        .arg(3_000)
        .arg(u8::from(arbiter))
        .arg(holder)
        // Its client's turn channel: written only by a waiter, which this is not.
        .arg("")
        .invoke_async(c)
        .await
        .expect("acquire script");
}

/// One multiplexed connection per Redis URL (the raw contenders and the round-trip yardstick).
pub(crate) async fn redis_conns(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
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
    conns
}

/// A client and a lease of its own (granted once, as a session would be; long enough for the
/// whole run, since nothing keeps it alive).
async fn etcd_with_lease(endpoints: &[String]) -> (Box<etcd_client::Client>, i64) {
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("connect");
    let lease = client.lease_grant(3_600, None).await.expect("lease").id();
    (Box::new(client), lease)
}

/// A client, with the persistent parents `/bench-raw` (raw nodes) and `/bench-peer` (the peer's
/// lock, alone in its directory as its recipe expects) in place.
async fn zk_with_parent(connect: &str) -> zookeeper_client::Client {
    let client = zookeeper_client::Client::connect(connect)
        .await
        .expect("connect");
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for dir in ["/bench-raw", "/bench-peer"] {
        let _ = client.create(dir, &[], &open).await;
    }
    client
}

fn same_keys(name: &str) -> distlock_redis::keys::LockKeys {
    distlock_redis::keys::lock_keys(
        "bench-same",
        &distlock::LockName::new(name).expect("a valid bench name"),
    )
}

/// Our release script; `channel` is the name's channel on Redlock nodes, empty on one server
/// (as our backend sends it).
async fn release_script(
    c: &mut redis::aio::MultiplexedConnection,
    keys: &distlock_redis::keys::LockKeys,
    secret: &str,
    tell: &str,
) {
    let _: i64 = distlock_redis::scripts::RELEASE
        .key(&keys.lock)
        .key(keys.queue())
        .key(keys.alive())
        .key(keys.fence())
        .key(keys.asks())
        .key(keys.shared())
        .arg(secret)
        .arg(tell)
        .invoke_async(c)
        .await
        .expect("release script");
}

/// A connection to `url`, driven in the background.
pub(crate) async fn postgres_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// Our `acquire` (a lock, granted at once on an idle name) and `release`, by hand.
async fn postgres_same(client: &tokio_postgres::Client, name: &str, secret: &str, holder: &str) {
    use distlock_postgres::sql::{ACQUIRE, RELEASE, in_schema};
    use tokio_postgres::types::Type;
    let (acquire, release) = (
        in_schema(ACQUIRE, SAME_SCHEMA),
        in_schema(RELEASE, SAME_SCHEMA),
    );
    let (limit, ttl_ms, waiter_ms) = (1i64, 10_000i64, 3_000i64);
    let granted: Vec<i64> = client
        .query_typed_one(
            &acquire,
            &[
                (&name, Type::TEXT),
                (&secret, Type::TEXT),
                (&limit, Type::INT8),
                (&false, Type::BOOL),
                (&ttl_ms, Type::INT8),
                (&false, Type::BOOL),
                (&waiter_ms, Type::INT8),
                (&"bench_same_c", Type::TEXT),
                (&holder, Type::TEXT),
            ],
        )
        .await
        .expect("acquire")
        .get(0);
    assert_eq!(granted.first(), Some(&1), "not granted: {granted:?}");
    let released: bool = client
        .query_typed_one(&release, &[(&name, Type::TEXT), (&secret, Type::TEXT)])
        .await
        .expect("release")
        .get(0);
    assert!(released, "not released");
}
