//! The client: connecting to one server, a Cluster or Sentinel's master, and every request
//! sent with its timeout and error mapping; the release notifications' subscriptions.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use distlock_api::{LockError, LockName, OwnerSecret, Reconnect, Result};
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError, RetryMethod};
use tokio::time::timeout;

use crate::config::redact;
use crate::config::{RedisLayout, RedisOptions, RedisTopology};
use crate::conn::{Conn, Pushes};
use crate::keys::{LockKeys, grants_channel, lock_keys, plain_keys};
use crate::notify::{Notifier, Subscription, Turn, TurnChannel};
use crate::scripts::Call;

/// A lock client over one Redis deployment: a single server ([`RedisBackend::connect`]), a Redis
/// Cluster ([`RedisBackend::connect_cluster`]) or the master Sentinel names
/// ([`RedisBackend::connect_sentinel`]). One multiplexed, self-reconnecting RESP3 connection (per
/// node on Cluster) carries commands and release notifications. Cheap to clone (clones share the
/// connection).
///
/// Efficiency grade: Redis replicates asynchronously and expires keys by its own clock, so a
/// failover or a restart without persistence can forget a lock (two holders) and reset the
/// fencing counter (tokens can go backwards). Use etcd or ZooKeeper for `Correctness`.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) conn: Conn,
    pub(crate) notifier: Arc<Notifier>,
    /// This client's turn channel, where its lock's waiters hear their grants.
    pub(crate) turns: Arc<TurnChannel>,
    pub(crate) options: RedisOptions,
    /// What it was connected to, for [`RedisBackend::reconnected`].
    pub(crate) topology: RedisTopology,
    pub(crate) server: String,
    /// On the plain layout, the keyspace channel prefix (`__keyspace@<db>__:`) when the server
    /// publishes the events a waiter needs (see `plain.rs`).
    pub(crate) keyspace: Option<String>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.server)
            .field("prefix", &self.options.prefix)
            .finish()
    }
}

impl RedisBackend {
    /// Connects to `topology`: [`RedisBackend::connect`], [`RedisBackend::connect_cluster`] or
    /// [`RedisBackend::connect_sentinel`].
    ///
    /// # Errors
    /// Those of the constructor it calls.
    pub async fn connect_to(topology: &RedisTopology, options: RedisOptions) -> Result<Self> {
        match topology {
            RedisTopology::Single(url) => Self::connect(url, options).await,
            RedisTopology::Cluster(nodes) => Self::connect_cluster(nodes, options).await,
            RedisTopology::Sentinel {
                sentinels,
                service,
                node_auth,
            } => Self::connect_sentinel(sentinels, service, node_auth.as_deref(), options).await,
        }
    }

    /// Connects to one server at `url`: `redis://[user:password@]host:port[/db]`, or
    /// `rediss://` for TLS (system roots, or [`RedisOptions::tls`]).
    ///
    /// # Errors
    /// `InvalidConfig` naming the URL (without its password) when it does not parse; a retryable
    /// backend error when the server cannot be reached within `connect_timeout`.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        let info = parse(url)?;
        let info_db = info.redis_settings().db();
        let server = format!("redis {}", info.addr());
        let notifier = Arc::new(Notifier::default());
        let conn = connecting(
            &server,
            &options,
            Conn::single(info, &pushes(&notifier), &options),
        )
        .await?;
        let keyspace = keyspace_events(&conn, &options, info_db).await;
        Ok(RedisBackend {
            conn,
            notifier,
            turns: turn_channel(&options),
            options,
            topology: RedisTopology::Single(url.to_string()),
            server,
            keyspace,
        })
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://` or `rediss://` URLs).
    /// A lock's key, fencing counter and channel share one hash tag, so every script runs on one
    /// slot; renewals are batched per slot.
    ///
    /// # Errors
    /// `InvalidConfig` for an empty list or a URL that does not parse; a retryable backend error
    /// when no node answers within `connect_timeout`.
    pub async fn connect_cluster(nodes: &[String], options: RedisOptions) -> Result<Self> {
        let infos = nodes.iter().map(|u| parse(u)).collect::<Result<Vec<_>>>()?;
        if infos.is_empty() {
            return Err(LockError::invalid_config(
                "redis cluster nodes",
                "[]",
                "name at least one node",
            ));
        }
        let server = format!(
            "redis cluster {}",
            infos
                .iter()
                .map(|i| i.addr().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let notifier = Arc::new(Notifier::default());
        let conn = connecting(
            &server,
            &options,
            Conn::cluster(infos, &pushes(&notifier), &options),
        )
        .await?;
        Ok(RedisBackend {
            conn,
            notifier,
            turns: turn_channel(&options),
            options,
            topology: RedisTopology::Cluster(nodes.to_vec()),
            server,
            // Keyspace events are per node (Cluster) and per server (a Sentinel failover moves
            // to one whose settings may differ): waiters there poll.
            keyspace: None,
        })
    }

    /// Connects to the master that the Sentinels at `sentinels` name for `service`, and follows
    /// it: when the master refuses writes (demoted) or goes away, Sentinel is asked again and
    /// the client (with its release subscriptions) moves to the new master. `node_auth`, when
    /// given, is a `redis://user:password@` URL whose credentials are used on the data nodes.
    ///
    /// A failover can still forget held locks (asynchronous replication): see
    /// [`RedisOptions::min_replicas`] for the best-effort mitigation.
    ///
    /// # Errors
    /// `InvalidConfig` for an empty list, a URL that does not parse or an empty service name; a
    /// retryable backend error when no Sentinel (or master) answers within `connect_timeout`.
    pub async fn connect_sentinel(
        sentinels: &[String],
        service: &str,
        node_auth: Option<&str>,
        options: RedisOptions,
    ) -> Result<Self> {
        let infos = sentinels
            .iter()
            .map(|u| parse(u))
            .collect::<Result<Vec<_>>>()?;
        if infos.is_empty() {
            return Err(LockError::invalid_config(
                "redis sentinels",
                "[]",
                "name at least one sentinel",
            ));
        }
        if service.is_empty() {
            return Err(LockError::invalid_config(
                "redis sentinel service",
                "\"\"",
                "name the monitored master",
            ));
        }
        let node = node_auth.map(parse).transpose()?;
        let server = format!(
            "redis sentinel {} ({})",
            service,
            infos
                .iter()
                .map(|i| i.addr().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let notifier = Arc::new(Notifier::default());
        let conn = connecting(
            &server,
            &options,
            Conn::sentinel(infos, service, node, &pushes(&notifier), &options),
        )
        .await?;
        Ok(RedisBackend {
            conn,
            notifier,
            turns: turn_channel(&options),
            options,
            topology: RedisTopology::Sentinel {
                sentinels: sentinels.to_vec(),
                service: service.to_string(),
                node_auth: node_auth.map(str::to_string),
            },
            server,
            // Keyspace events are per node (Cluster) and per server (a Sentinel failover moves
            // to one whose settings may differ): waiters there poll.
            keyspace: None,
        })
    }

    /// Joins the release announcements of `keys`' lock (shared per client): Redlock waiters
    /// hear there the releases their arbiter could not tell them.
    pub(crate) async fn subscribe_releases(&self, keys: &LockKeys) -> Result<Subscription> {
        self.subscribe(&keys.channel().to_string()).await
    }

    /// Listens for the turn (or grant) of the waiter `secret` on this client's turn channel,
    /// subscribing it first if this is the client's first waiter (once: it stays subscribed).
    pub(crate) async fn turn(&self, secret: &OwnerSecret) -> Result<Turn> {
        self.turns
            .subscribed
            .get_or_try_init(|| self.subscribe(&self.turns.name))
            .await?;
        Ok(self.notifier.turn(&secret.expose_hex()))
    }

    pub(crate) async fn subscribe(&self, channel: &str) -> Result<Subscription> {
        self.with_timeout(self.notifier.subscribe(channel, &self.conn))
            .await
    }

    /// The keys of `name` under this client's prefix and layout (see [`crate::keys`]).
    pub fn keys(&self, name: &LockName) -> LockKeys {
        match &self.options.layout {
            RedisLayout::Distlock => lock_keys(&self.options.prefix, name),
            RedisLayout::Plain { prefix } => plain_keys(prefix, name),
        }
    }

    /// Whether this client uses the plain layout.
    pub(crate) fn plain(&self) -> bool {
        matches!(self.options.layout, RedisLayout::Plain { .. })
    }

    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    pub(crate) fn err(&self, e: RedisError) -> LockError {
        redis_error(&self.server, e)
    }

    pub(crate) async fn with_timeout<T>(
        &self,
        fut: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        match timeout(self.options.op_timeout, fut).await {
            Ok(r) => r.map_err(|e| self.err(e)),
            Err(_) => Err(LockError::backend(
                self.server.clone(),
                true,
                format!("no answer within {:?}", self.options.op_timeout),
            )),
        }
    }

    /// One script call, each of its sends cut off at `op_timeout` (a `NOSCRIPT` answer costs a
    /// second send, which gets its own time: a clean-up release must not be lost to it).
    pub(crate) async fn run<T: redis::FromRedisValue>(
        &self,
        call: &Call,
        conn: &mut Conn,
    ) -> Result<T> {
        call.run(conn, self.options.op_timeout)
            .await
            .map_err(|e| self.err(e))
    }

    /// [`RedisBackend::run`] for a call that is harmless to repeat (a compare-and-delete): sent
    /// once more when the connection turns out to have dropped (a reset found by this very call,
    /// after which the connection reconnects) or the call went unanswered (sent into a
    /// connection just cut, or while it reconnected after a cut healed), rather than failing a
    /// release that a second send would complete.
    pub(crate) async fn run_repeatable<T: redis::FromRedisValue>(
        &self,
        call: &Call,
        conn: &mut Conn,
    ) -> Result<T> {
        match call.run(conn, self.options.op_timeout).await {
            Err(e) if e.is_connection_dropped() || e.is_timeout() => self.run(call, conn).await,
            other => other.map_err(|e| self.err(e)),
        }
    }
}

impl Reconnect for RedisBackend {
    fn identity(&self) -> Weak<dyn Any + Send + Sync> {
        Arc::downgrade(&self.notifier) as Weak<Notifier>
    }

    /// A new client of the same servers with the same options (see
    /// [`distlock_api::LockBackend::reconnect`]).
    async fn reconnected(&self) -> Result<Self> {
        Self::connect_to(&self.topology, self.options.clone()).await
    }
}

fn parse(url: &str) -> Result<ConnectionInfo> {
    url.into_connection_info()
        .map_err(|e| LockError::invalid_config("redis url", redact(url), e.to_string()))
}

/// Checks the options, bounds connecting by `connect_timeout` and names the deployment in the
/// error.
async fn connecting(
    server: &str,
    options: &RedisOptions,
    connect: impl Future<Output = redis::RedisResult<Conn>>,
) -> Result<Conn> {
    if options.min_replicas > 0 && options.replica_timeout >= options.op_timeout {
        return Err(LockError::invalid_config(
            "replica_timeout",
            options.replica_timeout,
            format!(
                "must be below op_timeout ({:?}): WAIT holds the reply that long",
                options.op_timeout
            ),
        ));
    }
    timeout(options.connect_timeout, connect)
        .await
        .map_err(|_| LockError::backend(server.to_string(), true, "connect timed out"))?
        .map_err(|e| redis_error(server, e))
}

/// A client error as a [`LockError`]: retryable when the link failed, the client says to retry,
/// or the server is out of memory (`OOM`: it takes the same call once it has room again, as
/// every backend's full server does).
pub(crate) fn redis_error(server: &str, e: RedisError) -> LockError {
    let retryable = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || !matches!(e.retry_method(), RetryMethod::NoRetry)
        || e.code() == Some("OOM");
    LockError::backend(server.to_string(), retryable, e)
}

/// The notifier as the connection sees it.
fn pushes(notifier: &Arc<Notifier>) -> Arc<dyn Pushes> {
    notifier.clone()
}

/// The keyspace channel prefix of database `db` when the layout is plain and the server
/// publishes what a waiter needs: keyspace events (`K`) for generic commands (`g`: `DEL`) and
/// expiries (`x`), or all (`A`). `None` otherwise, also when `CONFIG GET` is refused (a managed
/// or ACL-restricted server): then waiters poll. Read once at connect, never changed.
async fn keyspace_events(conn: &Conn, options: &RedisOptions, db: i64) -> Option<String> {
    if !matches!(options.layout, RedisLayout::Plain { .. }) {
        return None;
    }
    let mut conn = conn.clone();
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("notify-keyspace-events");
    let answer = tokio::time::timeout(
        options.op_timeout,
        // A map in RESP3 (our connection's protocol), a flat pair in RESP2: both read as one.
        get.query_async::<HashMap<String, String>>(&mut conn),
    )
    .await;
    let flags = match answer {
        Ok(Ok(mut map)) => map.remove("notify-keyspace-events").unwrap_or_default(),
        _ => return None,
    };
    let has = |c: char| flags.contains(c);
    (has('K') && (has('A') || (has('g') && has('x')))).then(|| format!("__keyspace@{db}__:"))
}

/// A new client's turn channel, named by a random id under its prefix.
fn turn_channel(options: &RedisOptions) -> Arc<TurnChannel> {
    Arc::new(TurnChannel {
        name: grants_channel(&options.prefix, rand::random()),
        subscribed: tokio::sync::OnceCell::new(),
    })
}
