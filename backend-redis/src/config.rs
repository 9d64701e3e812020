//! Options of the Redis backend.

use std::time::Duration;

/// How a [`crate::RedisBackend`] talks to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Namespace of every key (see [`crate::keys`]). Default `distlock`. Not used by
    /// [`RedisLayout::Plain`], which has its own.
    pub prefix: String,
    /// Where the locks live on the server: distlock's own layout (the default) or the plain
    /// lock other languages' clients share.
    pub layout: RedisLayout,
    /// Every command is cut off after this and reported as a retryable error. Default 5 s.
    pub op_timeout: Duration,
    /// Connecting (and reconnecting) is cut off after this. Default 5 s.
    pub connect_timeout: Duration,
    /// After each grant, `WAIT` until this many replicas have the lock, or fail the acquire
    /// (releasing what was granted). Best effort, not consensus: a replica that acknowledged can
    /// still lose the write, and a failover can still promote one that did not. Default 0 (off).
    pub min_replicas: u32,
    /// How long `WAIT` waits for `min_replicas`. Default 100 ms. `WAIT` holds the client's one
    /// multiplexed connection that long at most, so keep it small and below `op_timeout`.
    pub replica_timeout: Duration,
    /// TLS material for `rediss://` servers with a private CA or client certificates; `None`
    /// uses the system's roots. Default `None`.
    pub tls: Option<RedisTls>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "distlock".to_string(),
            layout: RedisLayout::Distlock,
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            min_replicas: 0,
            replica_timeout: Duration::from_millis(100),
            tls: None,
        }
    }
}

/// Where a [`crate::RedisBackend`] keeps its locks on the server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RedisLayout {
    /// distlock's own keys ([`crate::keys`]): fencing tokens, a FIFO queue with one wake-up per
    /// hand-over, semaphores, read-write locks and elections.
    #[default]
    Distlock,
    /// The plain lock that redis-py's `Lock`, redsync, node-redlock and rslock take: the key
    /// is `<prefix><name>` verbatim, taken by `SET key value NX PX ttl`, renewed by
    /// compare-and-`PEXPIRE` and released by compare-and-delete, so a lock of those clients on
    /// the same key excludes ours and ours excludes theirs. Locks only, efficiency grade, with
    /// no fencing token and no queue (a waiter retries: first come is not first served, across
    /// languages or not); waiters wake on the key's deletion or expiry where the server
    /// publishes keyspace events for them (`notify-keyspace-events` with `K`, `g` and `x`, one
    /// server), else they retry every 20-60 ms.
    Plain {
        /// Put before every name, verbatim (`""`: the key is the name).
        prefix: String,
    },
}

/// TLS material for `rediss://`. The private key never appears in `Debug` output.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RedisTls {
    /// PEM of the CA that signed the servers' certificates (instead of the system's roots).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate and PEM private key of this client, for servers that verify clients.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Which Redis deployment a [`crate::RedisBackend`] connects to.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server: `redis://[user:password@]host:port[/db]` or `rediss://` (TLS).
    Single(String),
    /// A Redis Cluster, reached through any of these nodes (`redis://` or `rediss://` URLs).
    Cluster(Vec<String>),
    /// The master that these Sentinels (`redis://host:port` URLs) name for `service`.
    Sentinel {
        /// The Sentinels.
        sentinels: Vec<String>,
        /// The monitored master's name.
        service: String,
        /// A `redis://user:password@` URL whose credentials the data nodes need, if any.
        node_auth: Option<String>,
    },
}

impl std::fmt::Debug for RedisTopology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hide = |urls: &[String]| urls.iter().map(|u| redact(u)).collect::<Vec<_>>();
        match self {
            RedisTopology::Single(url) => f.debug_tuple("Single").field(&redact(url)).finish(),
            RedisTopology::Cluster(nodes) => f.debug_tuple("Cluster").field(&hide(nodes)).finish(),
            RedisTopology::Sentinel {
                sentinels,
                service,
                node_auth,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", &hide(sentinels))
                .field("service", service)
                .field("node_auth", &node_auth.as_ref().map(|_| "<redacted>"))
                .finish(),
        }
    }
}

/// How a [`crate::RedlockBackend`] runs the Redlock algorithm over independent masters.
#[derive(Debug, Clone, PartialEq)]
pub struct RedlockOptions {
    /// Key namespace on every node (see [`crate::keys`]). Default `distlock`.
    pub prefix: String,
    /// Each node's answer is waited for this long at most; keep it small against the TTL (the
    /// time spent waiting is subtracted from the lease's validity). Default 50 ms.
    pub node_timeout: Duration,
    /// Clock drift allowance as a fraction of the TTL (plus 2 ms). Default 0.01.
    pub drift_factor: f64,
    /// A failed round is retried after a random delay in this range, or as soon as the name's
    /// arbiter tells the waiter its turn (each retry also keeps its place in the arbiter's
    /// queue, which drops a waiter not heard from for twice the maximum, at least 3 s).
    /// Default 50..250 ms.
    pub retry_delay: (Duration, Duration),
    /// How many rounds a waiting acquire tries at most, if it should stop before the caller's
    /// deadline; `None` (the default) tries until the deadline, as
    /// [`distlock_api::LockClient::acquire`] promises.
    pub retry_count: Option<u32>,
    /// Connecting to each node is cut off after this. Default 2 s.
    pub connect_timeout: Duration,
}

impl Default for RedlockOptions {
    fn default() -> Self {
        RedlockOptions {
            prefix: "distlock".to_string(),
            node_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            retry_delay: (Duration::from_millis(50), Duration::from_millis(250)),
            retry_count: None,
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// Hides the password of a URL before it goes into an error message.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://<redacted>@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(
            redact("redis://user:hunter2@h:6379/0"),
            "redis://<redacted>@h:6379/0"
        );
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
    }
}
