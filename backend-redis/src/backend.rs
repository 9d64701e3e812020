//! [`RedisBackend`]: the lock contract over one Redis server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, Leader,
    LockBackend, LockError, LockName, LockStatus, OwnerSecret, Reentrancy, Renewal, Result, Wakeup,
};
use futures_util::stream::BoxStream;
use rand::Rng;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError, RetryMethod};
use tokio::time::{Instant, sleep_until, timeout};

use crate::config::{RedisOptions, RedisTopology};
use crate::conn::Conn;
use crate::keys::{LockKeys, lock_keys, slot};
use crate::notify::{Notifier, Subscription};
use crate::scripts::{self, Call};

/// What the Redis backend declares: efficiency grade, per-name fencing that holds while the
/// server keeps its data, FIFO among live waiters (a server-side queue; a crashed waiter holds
/// its place for at most 3 s), client-side re-entrancy, millisecond TTLs, pub/sub wake-ups
/// that wake only the waiter whose turn it is.
pub const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Efficiency,
    fencing: Fencing::PerNameWhileServerKeepsData,
    fifo: true,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(10),
    wakeup: Wakeup::PubSub,
    policies: true,
};

/// A waiter that stops re-checking (it crashed) is dropped from the queue after this.
pub(crate) const WAITER_TTL: Duration = Duration::from_secs(3);

/// A waiter re-checks at least this often, which also keeps its place in the queue.
const RECHECK: Duration = Duration::from_secs(1);

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
    conn: Conn,
    notifier: Arc<Notifier>,
    options: RedisOptions,
    server: String,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.server)
            .field("prefix", &self.options.prefix)
            .finish()
    }
}

/// How an attempt asks for the lock.
#[derive(Clone, Copy)]
pub(crate) enum Ask {
    /// The [`scripts::ACQUIRE`] script: a fencing token from the name's counter, FIFO queue
    /// (`waiting`: join it when the lock is taken).
    Fenced { waiting: bool },
    /// The same script on the name's Redlock arbiter: no counter (token 0), the caller joins or
    /// keeps its place in the queue (liveness `waiter_ttl`), and a waiter granted stays at its
    /// head until its release leaves it (see [`scripts::ACQUIRE`]).
    Arbiter { waiter_ttl: Duration },
    /// A plain `SET NX PX` with token 0: a Redlock node's first ask, which hands out no token and
    /// does not queue; no script runs, so a node grants at the cost of the raw minimum.
    Plain,
    /// The [`scripts::ADMIT`] script: the same queue, admitting by `admission`'s policy (a
    /// semaphore's permit, a read-write lock's reader or writer).
    Admitted { admission: Admission, waiting: bool },
}

impl Ask {
    /// Whether a grant of this ask is a field of the name's shared hash (else the lock key).
    fn shared(self) -> bool {
        matches!(
            self,
            Ask::Admitted {
                admission: Admission::Permit(_) | Admission::Shared,
                ..
            }
        )
    }
}

/// Whom a release wakes.
#[derive(Clone, Copy)]
pub(crate) enum Tell {
    /// The live head of the name's queue, if any.
    QueueHead,
    /// The same, once the releaser left the queue (a Redlock holder its arbiter granted).
    LeaveQueue,
    /// Nobody (a Redlock node that keeps no queue, or a waiter that keeps its turn).
    Nobody,
}

/// How a release script is sent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// By its hash: the usual, cheapest send (a `NOSCRIPT` answer is followed by the source).
    Hash,
    /// With its source ([`Call::with_source`]): a clean-up of a request that may still be in
    /// flight, which must run whenever the server gets to it.
    Source,
}

/// The outcome of one attempt.
pub(crate) enum Attempt {
    /// Granted, with this node's counter value.
    Granted(u64),
    /// Held by another owner, who has this much TTL left.
    Busy { pttl_ms: i64 },
    /// A permit refused: the semaphore is in use with `theirs` permits.
    Mismatch { theirs: u32 },
}

impl RedisBackend {
    /// The one queue: a lock's entry (`admission` `None`: [`scripts::ACQUIRE`]) or one admitted
    /// by a policy ([`scripts::ADMIT`]). Without a deadline, one try: `Busy` unless granted,
    /// nothing queued. Else it waits in the name's queue. The first try goes out alone (an
    /// uncontended acquire is one script call); when it is not admitted, the waiter subscribes
    /// to its own turn channel and tries again at once, so a release between the two is not
    /// missed. Then it is woken only when its turn comes (a connection drop too), and re-checks
    /// when the first holder's TTL runs out and at least every second (which keeps its place).
    /// Leaves the queue on timeout, error or cancellation.
    async fn queued(
        &self,
        name: &LockName,
        ttl: Duration,
        deadline: Option<Instant>,
        admission: Option<Admission>,
    ) -> Result<Grant> {
        let keys = self.keys(name);
        let secret = OwnerSecret::random()?;
        let started = Instant::now();
        let mut released: Option<Subscription> = None;
        let waiting = deadline.is_some();
        let ask = match admission {
            None => Ask::Fenced { waiting },
            Some(admission) => Ask::Admitted { admission, waiting },
        };
        // A try joins nothing, so it has nothing to leave.
        let queued =
            waiting.then(|| QueueGuard::new(self, &keys, queue_member(&secret, admission)));
        loop {
            let sent = Instant::now();
            let pttl_ms = match self.attempt(&keys, &secret, ttl, ask).await {
                Ok(Attempt::Granted(token)) => {
                    // The script took us out of the queue with the grant.
                    QueueGuard::keep_if_any(queued);
                    let resource = if ask.shared() {
                        keys.shared().to_string()
                    } else {
                        keys.lock
                    };
                    return Ok(self.grant(name, resource, secret, token, ttl, sent));
                }
                Ok(Attempt::Mismatch { theirs }) => {
                    // The script took us out of the queue.
                    QueueGuard::keep_if_any(queued);
                    return Err(LockError::LimitMismatch {
                        name: name.to_string(),
                        ours: admission.map_or(1, Admission::limit),
                        theirs,
                    });
                }
                Ok(Attempt::Busy { pttl_ms }) => pttl_ms,
                Err(e) => {
                    if let Some(q) = queued {
                        q.leave().await;
                    }
                    return Err(e);
                }
            };
            let Some(deadline) = deadline else {
                return Err(LockError::Busy {
                    name: name.to_string(),
                });
            };
            let now = Instant::now();
            if now >= deadline {
                if let Some(q) = queued {
                    q.leave().await;
                }
                return Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: now - started,
                });
            }
            let Some(sub) = released.as_mut() else {
                match self.subscribe_turn(&keys, &secret).await {
                    Ok(sub) => released = Some(sub),
                    Err(e) => {
                        if let Some(q) = queued {
                            q.leave().await;
                        }
                        return Err(e);
                    }
                }
                continue;
            };
            // Negative: the lock is free but promised to the waiter ahead of us.
            let wait =
                u64::try_from(pttl_ms).map_or(RECHECK, |ms| Duration::from_millis(ms).min(RECHECK));
            let jitter = Duration::from_micros(rand::rng().random_range(0..2_000));
            tokio::select! {
                _ = sub.released() => {}
                _ = sleep_until((now + wait + jitter).min(deadline)) => {}
            }
        }
    }

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
        let server = format!("redis {}", info.addr());
        let notifier = Arc::new(Notifier::default());
        let conn = connecting(&server, &options, Conn::single(info, &notifier, &options)).await?;
        Ok(RedisBackend {
            conn,
            notifier,
            options,
            server,
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
        let conn = connecting(&server, &options, Conn::cluster(infos, &notifier, &options)).await?;
        Ok(RedisBackend {
            conn,
            notifier,
            options,
            server,
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
            Conn::sentinel(infos, service, node, &notifier, &options),
        )
        .await?;
        Ok(RedisBackend {
            conn,
            notifier,
            options,
            server,
        })
    }

    /// Joins the release announcements of `keys`' lock (shared per client): Redlock waiters
    /// hear there the releases their arbiter could not tell them.
    pub(crate) async fn subscribe_releases(&self, keys: &LockKeys) -> Result<Subscription> {
        self.subscribe(&keys.channel().to_string()).await
    }

    /// Joins the waiter `secret`'s own "your turn" channel for `keys`' lock.
    pub(crate) async fn subscribe_turn(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
    ) -> Result<Subscription> {
        self.subscribe(&format!("{}{}", keys.turn(), secret.expose_hex()))
            .await
    }

    pub(crate) async fn subscribe(&self, channel: &str) -> Result<Subscription> {
        self.with_timeout(self.notifier.subscribe(channel, &self.conn))
            .await
    }

    /// The keys of `name` under this client's prefix (see [`crate::keys`]).
    pub fn keys(&self, name: &LockName) -> LockKeys {
        lock_keys(&self.options.prefix, name)
    }

    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    fn err(&self, e: RedisError) -> LockError {
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
    /// after which the connection reconnects), rather than failing a release that a second send
    /// would complete.
    pub(crate) async fn run_repeatable<T: redis::FromRedisValue>(
        &self,
        call: &Call,
        conn: &mut Conn,
    ) -> Result<T> {
        match call.run(conn, self.options.op_timeout).await {
            Err(e) if e.is_connection_dropped() => self.run(call, conn).await,
            other => other.map_err(|e| self.err(e)),
        }
    }

    /// One acquire script call, made cancellation safe without a task of its own: a guard is
    /// armed while the call is in flight; dropped armed (the caller was cancelled) or left armed
    /// by a failed call (the reply may be lost after the server granted), it releases by our
    /// secret in the background. That release goes down the same pipelined connection after the
    /// acquire, and compare-and-delete never touches a lock that is not ours.
    pub(crate) async fn attempt(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        ask: Ask,
    ) -> Result<Attempt> {
        let mut guard = AttemptGuard {
            backend: self,
            keys,
            secret,
            shared: ask.shared(),
            armed: true,
        };
        let mut conn = self.conn.clone();
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let hex = secret.expose_hex_bytes();
        // The queue scripts share their keys (lock, fence, queue, alive; `ADMIT` adds the shared
        // hash) and their first arguments (see `scripts`).
        let queue_call = |lua, shared: bool, waiting: bool, waiter_ttl: Duration| {
            let mut call = Call::new(lua, 4 + usize::from(shared));
            call.arg(&keys.lock)
                .arg(keys.fence())
                .arg(keys.queue())
                .arg(keys.alive());
            if shared {
                call.arg(keys.shared());
            }
            call.arg(&hex[..])
                .arg(ttl_ms)
                .arg(u8::from(waiting))
                .arg(waiter_ttl.as_millis() as u64)
                .arg(keys.turn());
            call
        };
        let call = match ask {
            Ask::Fenced { waiting } => {
                let mut call = queue_call(&scripts::ACQUIRE, false, waiting, WAITER_TTL);
                call.arg(0u8);
                Some(call)
            }
            Ask::Arbiter { waiter_ttl } => {
                let mut call = queue_call(&scripts::ACQUIRE, false, true, waiter_ttl);
                call.arg(1u8);
                Some(call)
            }
            Ask::Admitted { admission, waiting } => {
                let mut call = queue_call(&scripts::ADMIT, true, waiting, WAITER_TTL);
                call.arg(admission.limit()).arg(match admission {
                    Admission::Exclusive => "x",
                    Admission::Permit(_) => "p",
                    Admission::Shared => "s",
                });
                Some(call)
            }
            Ask::Plain => None,
        };
        let outcome: Result<(i64, i64)> = match call {
            Some(call) => self.run(&call, &mut conn).await,
            None => {
                // `<secret>:0`: the lock value layout (see `scripts`), with no token.
                let mut value = [b':'; 34];
                value[..32].copy_from_slice(&hex);
                value[33] = b'0';
                self.with_timeout(
                    redis::cmd("SET")
                        .arg(&keys.lock)
                        .arg(&value[..])
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async::<Option<String>>(&mut conn),
                )
                .await
                .map(|set| if set.is_some() { (1, 0) } else { (0, -1) })
            }
        };
        let outcome = match outcome {
            Ok((1, token)) => self
                .replicated(keys)
                .await
                .map(|()| Attempt::Granted(token.max(0) as u64)),
            Ok((-2, theirs)) => Ok(Attempt::Mismatch {
                theirs: u32::try_from(theirs).unwrap_or(u32::MAX),
            }),
            Ok((_, pttl_ms)) => Ok(Attempt::Busy { pttl_ms }),
            Err(e) => Err(e),
        };
        // Disarmed only when the outcome is known: a failed WAIT also releases the grant.
        guard.armed = outcome.is_err();
        drop(guard);
        outcome
    }

    /// With [`RedisOptions::min_replicas`], waits for that many replicas to acknowledge the
    /// grant (`WAIT` on the connection that carried it).
    async fn replicated(&self, keys: &LockKeys) -> Result<()> {
        let wanted = self.options.min_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let acked = self
            .with_timeout(self.conn.wait_replicas(
                slot(&keys.lock),
                wanted,
                self.options.replica_timeout,
            ))
            .await?;
        if acked >= wanted {
            return Ok(());
        }
        Err(LockError::backend(
            self.server.clone(),
            true,
            format!(
                "only {acked} of {wanted} replicas acknowledged the lock within {:?}; released",
                self.options.replica_timeout
            ),
        ))
    }

    /// Releases and tells the queue's head (a Redlock node that is not the name's arbiter keeps
    /// no queue, so there it tells nobody).
    pub(crate) async fn release_keys(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        sent: Sent,
    ) -> Result<bool> {
        self.release_telling(keys, secret, Tell::QueueHead, sent)
            .await
    }

    /// Releases a shared grant (a permit, a read lease) and wakes the queue's head.
    pub(crate) async fn release_shared(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        sent: Sent,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let mut call = Call::new(&scripts::RELEASE_SHARED, 3);
        call.arg(keys.shared())
            .arg(keys.queue())
            .arg(keys.alive())
            .arg(&secret.expose_hex_bytes()[..])
            .arg(keys.turn());
        let call = match sent {
            Sent::Hash => call,
            Sent::Source => call.with_source(),
        };
        let n: i64 = self.run_repeatable(&call, &mut conn).await?;
        Ok(n == 1)
    }

    /// Releases (compare-and-delete), then wakes whom `tell` says.
    pub(crate) async fn release_telling(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        tell: Tell,
        sent: Sent,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let mut call = Call::new(&scripts::RELEASE, 3);
        call.arg(&keys.lock)
            .arg(keys.queue())
            .arg(keys.alive())
            .arg(&secret.expose_hex_bytes()[..]);
        // The script's second argument: see `scripts::RELEASE`.
        match tell {
            Tell::QueueHead => call.arg("head"),
            Tell::LeaveQueue => call.arg("leave"),
            Tell::Nobody => call.arg("none"),
        };
        call.arg(keys.turn());
        let call = match sent {
            Sent::Hash => call,
            Sent::Source => call.with_source(),
        };
        let n: i64 = self.run_repeatable(&call, &mut conn).await?;
        Ok(n == 1)
    }

    /// Publishes a release of `keys`' lock on its channel (for a Redlock release whose arbiter
    /// did not answer).
    pub(crate) async fn announce_release(&self, keys: &LockKeys) -> Result<()> {
        let mut conn = self.conn.clone();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(keys.channel()).arg(1);
        let _: i64 = self.with_timeout(publish.query_async(&mut conn)).await?;
        Ok(())
    }

    /// How many connections listen for `keys`' release announcements (`PUBSUB NUMSUB`): the
    /// Redlock waiters one announcement wakes together.
    pub(crate) async fn listeners(&self, keys: &LockKeys) -> Result<usize> {
        let mut conn = self.conn.clone();
        let mut numsub = redis::cmd("PUBSUB");
        numsub.arg("NUMSUB").arg(keys.channel());
        let counts: Vec<(String, usize)> = self.with_timeout(numsub.query_async(&mut conn)).await?;
        Ok(counts.first().map_or(0, |(_, n)| *n))
    }

    /// Takes a waiter that gives up (or a Redlock holder its arbiter did not grant) out of the
    /// queue, and tells the next one if the lock is free. `member` is the entry as it was queued
    /// ([`queue_member`]). Best effort: a waiter left behind is dropped when its liveness runs
    /// out.
    pub(crate) async fn leave_queue(&self, keys: &LockKeys, member: &[u8]) {
        let mut conn = self.conn.clone();
        let left: Result<i64> = self
            .run(
                Call::new(&scripts::LEAVE, 3)
                    .arg(keys.queue())
                    .arg(keys.alive())
                    .arg(&keys.lock)
                    .arg(member)
                    .arg(keys.turn()),
                &mut conn,
            )
            .await;
        if let Err(error) = left {
            tracing::debug!(%error, "distlock redis: leaving the queue failed; liveness will drop us");
        }
    }

    async fn renew_group(
        &self,
        batch: &[(&GrantKey, Duration)],
        members: &[usize],
    ) -> Result<Vec<i64>> {
        let mut call = Call::new(&scripts::RENEW, members.len());
        for i in members {
            call.arg(&batch[*i].0.resource);
        }
        for i in members {
            let (key, ttl) = batch[*i];
            call.arg(&key.secret.expose_hex_bytes()[..])
                .arg(ttl.as_millis().max(1) as u64);
        }
        let mut conn = self.conn.clone();
        self.run(&call, &mut conn).await
    }

    fn grant(
        &self,
        name: &LockName,
        resource: String,
        secret: OwnerSecret,
        token: u64,
        ttl: Duration,
        sent_at: Instant,
    ) -> Grant {
        Grant {
            key: GrantKey {
                name: name.clone(),
                resource,
                secret,
            },
            token: Some(FencingToken(token)),
            ttl,
            sent_at,
            session: None,
        }
    }
}

/// Releases an acquire attempt that may have been granted but will never be seen.
struct AttemptGuard<'a> {
    backend: &'a RedisBackend,
    keys: &'a LockKeys,
    secret: &'a OwnerSecret,
    /// The grant would be a shared field, not the lock key.
    shared: bool,
    armed: bool,
}

impl Drop for AttemptGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (b, k, s) = (self.backend.clone(), self.keys.clone(), self.secret.clone());
            let shared = self.shared;
            rt.spawn(async move {
                let _ = if shared {
                    b.release_shared(&k, &s, Sent::Source).await
                } else {
                    b.release_keys(&k, &s, Sent::Source).await
                };
            });
        }
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

/// The queue member of an entry: the owner secret, then the limit's suffix when it is not 1
/// ([`Admission::entry_suffix`], as [`scripts::ADMIT`] writes it).
pub(crate) fn queue_member(secret: &OwnerSecret, admission: Option<Admission>) -> Vec<u8> {
    let mut member = secret.expose_hex_bytes().to_vec();
    if let Some(admission) = admission {
        member.extend_from_slice(admission.entry_suffix().as_bytes());
    }
    member
}

/// Armed while a waiter may be in the queue: dropped armed (the acquire future was cancelled)
/// it leaves the queue in the background.
pub(crate) struct QueueGuard<'a> {
    backend: &'a RedisBackend,
    keys: &'a LockKeys,
    /// The entry as queued ([`queue_member`]): a permit's or a reader's carries its limit.
    member: Vec<u8>,
    armed: bool,
}

impl<'a> QueueGuard<'a> {
    pub(crate) fn new(backend: &'a RedisBackend, keys: &'a LockKeys, member: Vec<u8>) -> Self {
        QueueGuard {
            backend,
            keys,
            member,
            armed: true,
        }
    }

    /// Stays in the queue (granted, and taken out of it by the script or by the release).
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }

    /// [`QueueGuard::keep`] for a guard a try never armed (taken by value, so the borrows it
    /// holds end here).
    fn keep_if_any(guard: Option<Self>) {
        if let Some(g) = guard {
            g.keep();
        }
    }

    /// Leaves the queue now (the caller waits). Armed until the script answered: a caller
    /// dropped meanwhile leaves it to the background, instead of leaving a waiter that holds the
    /// queue up until its liveness runs out.
    pub(crate) async fn leave(mut self) {
        self.backend.leave_queue(self.keys, &self.member).await;
        self.armed = false;
    }
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (b, k) = (self.backend.clone(), self.keys.clone());
            let member = std::mem::take(&mut self.member);
            rt.spawn(async move { b.leave_queue(&k, &member).await });
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

fn redis_error(server: &str, e: RedisError) -> LockError {
    let retryable = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || !matches!(e.retry_method(), RetryMethod::NoRetry);
    LockError::backend(server.to_string(), retryable, e)
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Grant> {
        self.queued(name, ttl, None, None).await
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        self.queued(name, ttl, Some(deadline), None).await
    }

    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        self.queued(name, ttl, deadline, Some(admission)).await
    }

    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let deadline = Instant::now() + self.options.op_timeout;
        distlock_api::renew_as_batch(self, key, ttl, deadline).await
    }

    /// One script call for the whole batch on a single server or Sentinel master; one per hash
    /// slot (concurrently) on Cluster, where a script cannot span slots, each cut off at
    /// `deadline` on its own: a hung node costs only the leases it holds. `PEXPIRE` applies
    /// each TTL exactly.
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, (key, _)) in batch.iter().enumerate() {
            let group = match self.conn {
                Conn::Cluster(_) => slot(&key.resource),
                _ => 0,
            };
            match groups.iter_mut().find(|(s, _)| *s == group) {
                Some((_, members)) => members.push(i),
                None => groups.push((group, vec![i])),
            }
        }
        let calls = groups.iter().map(|(_, members)| async move {
            tokio::time::timeout_at(deadline, self.renew_group(batch, members))
                .await
                .unwrap_or_else(|_| {
                    Err(LockError::backend(
                        self.server.clone(),
                        true,
                        "no answer by the renewal deadline",
                    ))
                })
        });
        let answers = futures_util::future::join_all(calls).await;
        let mut out: Vec<Option<Result<Renewal>>> = (0..batch.len()).map(|_| None).collect();
        for ((_, members), answer) in groups.iter().zip(answers) {
            for (n, i) in members.iter().enumerate() {
                out[*i] = Some(match &answer {
                    Ok(flags) => Ok(match flags.get(n) {
                        Some(1) => Renewal::Renewed { ttl: batch[*i].1 },
                        _ => Renewal::NotHeld,
                    }),
                    Err(e) => Err(e.for_each_item()),
                });
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or(Ok(Renewal::NotHeld)))
            .collect()
    }

    async fn release(&self, key: &GrantKey) -> Result<bool> {
        let keys = self.keys(&key.name);
        if keys.is_shared(&key.resource) {
            return self.release_shared(&keys, &key.secret, Sent::Hash).await;
        }
        self.release_keys(&keys, &key.secret, Sent::Hash).await
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        self.inspect_lock(name).await
    }

    async fn announce(&self, key: &GrantKey, token: FencingToken, value: &str) -> Result<bool> {
        self.announce_lock(key, token, value).await
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.lock_leader(name).await
    }

    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        self.announcements(name).await
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
