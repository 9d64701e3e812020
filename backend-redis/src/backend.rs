//! [`RedisBackend`]: the lock contract over one Redis server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, LockBackend, LockError,
    LockName, OwnerSecret, Reentrancy, Renewal, Result, Wakeup,
};
use rand::Rng;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, RedisError, RetryMethod};
use tokio::time::{Instant, sleep_until, timeout};

use crate::config::RedisOptions;
use crate::keys::{LockKeys, lock_keys};
use crate::notify::{Notifier, Subscription};
use crate::scripts;

/// What the Redis backend declares: efficiency grade, per-name fencing that holds while the
/// server keeps its data, no FIFO fairness, client-side re-entrancy, millisecond TTLs, pub/sub
/// wake-ups.
pub const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Efficiency,
    fencing: Fencing::PerNameWhileServerKeepsData,
    fifo: false,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(10),
    wakeup: Wakeup::PubSub,
};

/// A lock client over one Redis server: one multiplexed, self-reconnecting RESP3 connection that
/// carries commands and release notifications. Cheap to clone (clones share the connection).
///
/// Efficiency grade: Redis replicates asynchronously and expires keys by its own clock, so a
/// failover or a restart without persistence can forget a lock (two holders) and reset the
/// fencing counter (tokens can go backwards). Use etcd or ZooKeeper for `Correctness`.
#[derive(Clone)]
pub struct RedisBackend {
    conn: ConnectionManager,
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

/// The outcome of one acquire script call.
pub(crate) enum Attempt {
    /// Granted, with this node's counter value.
    Granted(u64),
    /// Held by another owner, who has this much TTL left.
    Busy { pttl_ms: i64 },
}

impl RedisBackend {
    /// Connects to `url` (`redis://[user:password@]host:port[/db]`, `rediss://` for TLS).
    ///
    /// # Errors
    /// `InvalidConfig` naming the URL (without its password) when it does not parse; a retryable
    /// backend error when the server cannot be reached within `connect_timeout`.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        let info = url
            .into_connection_info()
            .map_err(|e| LockError::invalid_config("redis url", redact(url), e.to_string()))?;
        let server = format!("redis {}", info.addr());
        let redis_settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(redis_settings);
        let client = redis::Client::open(info)
            .map_err(|e| LockError::invalid_config("redis url", redact(url), e.to_string()))?;
        let notifier = Arc::new(Notifier::default());
        let n = notifier.clone();
        let config = ConnectionManagerConfig::new()
            .set_push_sender(move |push| {
                n.on_push(push);
                Ok::<(), std::convert::Infallible>(())
            })
            .set_automatic_resubscription()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.op_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn = timeout(
            options.connect_timeout,
            client.get_connection_manager_with_config(config),
        )
        .await
        .map_err(|_| LockError::backend(server.clone(), true, "connect timed out"))?
        .map_err(|e| redis_error(&server, e))?;
        Ok(RedisBackend {
            conn,
            notifier,
            options,
            server,
        })
    }

    /// Joins the release notifications of `keys`' lock (shared per client).
    pub(crate) async fn subscribe_releases(&self, keys: &LockKeys) -> Result<Subscription> {
        self.with_timeout(self.notifier.subscribe(&keys.channel, &self.conn))
            .await
    }

    /// The keys of `name` under this client's prefix (see [`crate::keys`]).
    pub fn keys(&self, name: &LockName) -> LockKeys {
        lock_keys(&self.options.prefix, name)
    }

    fn err(&self, e: RedisError) -> LockError {
        redis_error(&self.server, e)
    }

    async fn with_timeout<T>(&self, fut: impl Future<Output = redis::RedisResult<T>>) -> Result<T> {
        match timeout(self.options.op_timeout, fut).await {
            Ok(r) => r.map_err(|e| self.err(e)),
            Err(_) => Err(LockError::backend(
                self.server.clone(),
                true,
                format!("no answer within {:?}", self.options.op_timeout),
            )),
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
    ) -> Result<Attempt> {
        let mut guard = AttemptGuard {
            backend: self,
            keys,
            secret,
            armed: true,
        };
        let mut conn = self.conn.clone();
        let outcome: Result<(i64, i64)> = self
            .with_timeout(
                scripts::ACQUIRE
                    .key(&keys.lock)
                    .key(&keys.fence)
                    .arg(secret.expose_hex())
                    .arg(ttl.as_millis().max(1) as u64)
                    .invoke_async(&mut conn),
            )
            .await;
        guard.armed = outcome.is_err();
        drop(guard);
        match outcome? {
            (1, token) => Ok(Attempt::Granted(token.max(0) as u64)),
            (_, pttl_ms) => Ok(Attempt::Busy { pttl_ms }),
        }
    }

    pub(crate) async fn release_keys(&self, keys: &LockKeys, secret: &OwnerSecret) -> Result<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .with_timeout(
                scripts::RELEASE
                    .key(&keys.lock)
                    .arg(secret.expose_hex())
                    .arg(&keys.channel)
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(n == 1)
    }

    fn grant(
        &self,
        name: &LockName,
        keys: LockKeys,
        secret: OwnerSecret,
        token: u64,
        ttl: Duration,
        sent_at: Instant,
    ) -> Grant {
        Grant {
            key: GrantKey {
                name: name.clone(),
                resource: keys.lock,
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
    armed: bool,
}

impl Drop for AttemptGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (b, k, s) = (self.backend.clone(), self.keys.clone(), self.secret.clone());
            rt.spawn(async move {
                let _ = b.release_keys(&k, &s).await;
            });
        }
    }
}

/// Hides the password of a URL before it goes into an error message.
fn redact(url: &str) -> String {
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
        let keys = self.keys(name);
        let secret = OwnerSecret::random()?;
        let sent = Instant::now();
        match self.attempt(&keys, &secret, ttl).await? {
            Attempt::Granted(token) => Ok(self.grant(name, keys, secret, token, ttl, sent)),
            Attempt::Busy { .. } => Err(LockError::Busy {
                name: name.to_string(),
            }),
        }
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        let keys = self.keys(name);
        let secret = OwnerSecret::random()?;
        let started = Instant::now();
        // Subscribe before the first try, so a release between the try and the wait is seen.
        let mut released = self.subscribe_releases(&keys).await?;
        loop {
            let sent = Instant::now();
            let pttl_ms = match self.attempt(&keys, &secret, ttl).await? {
                Attempt::Granted(token) => {
                    return Ok(self.grant(name, keys, secret, token, ttl, sent));
                }
                Attempt::Busy { pttl_ms } => pttl_ms,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: now - started,
                });
            }
            // Re-check when the holder's TTL runs out at the latest, so a lost message only
            // delays; jitter spreads competing waiters.
            let jitter = Duration::from_micros(rand::rng().random_range(0..2_000));
            let recheck = now + Duration::from_millis(pttl_ms.max(0) as u64) + jitter;
            tokio::select! {
                _ = released.released() => {}
                _ = sleep_until(recheck.min(deadline)) => {}
            }
        }
    }

    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .with_timeout(
                scripts::RENEW
                    .key(&key.resource)
                    .arg(key.secret.expose_hex())
                    .arg(ttl.as_millis().max(1) as u64)
                    .invoke_async(&mut conn),
            )
            .await?;
        Ok(if n == 1 {
            Renewal::Renewed
        } else {
            Renewal::NotHeld
        })
    }

    async fn release(&self, key: &GrantKey) -> Result<bool> {
        self.release_keys(&self.keys(&key.name), &key.secret).await
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
