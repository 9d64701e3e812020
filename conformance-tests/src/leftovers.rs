//! What a backend left on its servers for one lock name, counted from the raw layout (keys,
//! hash fields, znodes), not through the backend: the suite's scenarios and the fault campaign
//! both ask "is anything left?" here.

use distlock_api::LockName;
use redis::aio::ConnectionLike;

/// The holder's key, the queued waiters (queue and liveness index) and the shared holders'
/// fields (permits, read leases) of `name` under `prefix`, through any admin connection (a single server's or a cluster's).
/// The token counter is not counted: it outlives every lease by design.
///
/// # Panics
/// When the server does not answer (a test's failure).
pub async fn redis(admin: &mut impl ConnectionLike, prefix: &str, name: &LockName) -> usize {
    let keys = distlock_redis::keys::lock_keys(prefix, name);
    let held: i64 = redis::cmd("EXISTS")
        .arg(&keys.lock)
        .query_async(admin)
        .await
        .expect("EXISTS");
    let queued = members(admin, keys.queue()).await;
    // The waiters' liveness index names the same waiters: one there but not in the queue is
    // left behind too (counted once, so a waiter still counts as one entry).
    let alive = members(admin, keys.alive()).await;
    let stray = alive.iter().filter(|a| !queued.contains(a)).count();
    // So does a lock waiter's ask (what a release reads to grant it).
    let asks: Vec<String> = redis::cmd("HKEYS")
        .arg(keys.asks())
        .query_async(admin)
        .await
        .expect("HKEYS");
    let stray = stray + asks.iter().filter(|a| !queued.contains(a)).count();
    // Permits and read leases (their fields expire with the hash at the latest).
    let shared: i64 = redis::cmd("HLEN")
        .arg(keys.shared())
        .query_async(admin)
        .await
        .expect("HLEN");
    held as usize + queued.len() + stray + shared as usize
}

/// What the Redis plain layout holds of `name` under `prefix`: its one key, or nothing.
pub async fn redis_plain(admin: &mut impl ConnectionLike, prefix: &str, name: &LockName) -> usize {
    let held: i64 = redis::cmd("EXISTS")
        .arg(distlock_redis::keys::plain_keys(prefix, name).lock)
        .query_async(admin)
        .await
        .expect("EXISTS");
    held as usize
}

/// [`redis()`] on a Redis Cluster whose nodes are `urls`: one cluster connection sends each key
/// to the master of its slot.
pub async fn redis_cluster_at(urls: &[String], prefix: &str, name: &LockName) -> usize {
    let mut admin = redis::cluster::ClusterClient::new(urls.to_vec())
        .expect("cluster urls")
        .get_async_connection()
        .await
        .expect("admin connection");
    redis(&mut admin, prefix, name).await
}

/// Every member of the sorted set `key`.
async fn members(admin: &mut impl ConnectionLike, key: impl redis::ToRedisArgs) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(admin)
        .await
        .expect("ZRANGE")
}

/// The keys under `name`'s prefix (holder and waiters alike) in etcd.
///
/// # Panics
/// When the cluster gives no answer within 30 s.
pub async fn etcd(admin: &etcd_client::Client, prefix: &str, name: &LockName) -> usize {
    let range = distlock_etcd::keys::name_prefix(prefix, name);
    let mut admin = admin.clone();
    let options = || {
        etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only()
    };
    // A cluster whose member was just let back from a partition may still change leaders
    // ("leader changed", a member without one): ask again until it settles.
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match admin.get(range.as_str(), Some(options())).await {
            Ok(resp) => return resp.count() as usize,
            Err(_) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("count keys: {e}"),
        }
    }
}

/// The children of `name`'s queue node under `root` in ZooKeeper, read after a `sync` (the
/// admin's server may lag the leader: a delete acknowledged to another client is seen here too).
///
/// # Panics
/// When the ensemble does not answer.
pub async fn zk(admin: &zookeeper_client::Client, root: &str, name: &LockName) -> usize {
    let dir = distlock_zk::paths::lock_dir(root, name);
    match admin.sync(root).await {
        Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
        Err(e) => panic!("sync {root}: {e}"),
    }
    match admin.list_children(&dir).await {
        Ok(children) => children.len(),
        Err(zookeeper_client::Error::NoNode) => 0,
        Err(e) => panic!("listing {dir}: {e}"),
    }
}

/// [`etcd`] through a client of its own to `endpoints`.
///
/// # Panics
/// When the cluster does not answer.
pub async fn etcd_at(endpoints: &[String], prefix: &str, name: &LockName) -> usize {
    let admin = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("admin client");
    etcd(&admin, prefix, name).await
}

/// [`zk`] through a client of its own to `connect` (`host:port,...`).
///
/// # Panics
/// When the ensemble gives no session within 30 s.
pub async fn zk_at(connect: &str, root: &str, name: &LockName) -> usize {
    // An ensemble whose member was just cut from its peers and let back may still be electing:
    // a connect then times out (4 s, two fifths of the session timeout), and the next succeeds.
    let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let admin = loop {
        match zookeeper_client::Client::connector()
            .with_session_timeout(std::time::Duration::from_secs(10))
            .connect(connect)
            .await
        {
            Ok(admin) => break admin,
            Err(e) if tokio::time::Instant::now() >= give_up => panic!("admin client: {e:?}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    };
    zk(&admin, root, name).await
}

/// The live entries of `name` in the PostgreSQL layout under `schema`: holders and waiters.
/// An expired entry is not counted: it binds nobody (every call on the name deletes it first,
/// as an expired Redis key reads as absent before the server evicts it), and a client's sweep
/// deletes it within minutes. The token sequence is not counted: it outlives every lease by
/// design.
///
/// # Panics
/// When the server does not answer (a test's failure).
pub async fn postgres(admin: &tokio_postgres::Client, schema: &str, name: &LockName) -> usize {
    let installed: bool = admin
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{schema}.entry")],
        )
        .await
        .expect("look up the table")
        .get(0);
    if !installed {
        return 0;
    }
    let n: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {schema}.entry \
                 WHERE name = $1 AND expires_at > clock_timestamp()"
            ),
            &[&name.as_str()],
        )
        .await
        .expect("count entries")
        .get(0);
    n as usize
}

/// [`postgres`] through a connection of its own to `url`. The table does not exist before
/// the first client connects: then nothing is left.
///
/// # Panics
/// When the server does not answer.
pub async fn postgres_at(url: &str, schema: &str, name: &LockName) -> usize {
    let (admin, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    postgres(&admin, schema, name).await
}
