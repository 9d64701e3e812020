//! The plain layout ([`RedisLayout::Plain`]): the lock other languages' Redis clients take, one
//! key and nothing else. Acquire is `SET key <secret>:0<holder> NX PX ttl` (the value keeps our
//! lock value's layout, so renew and release are the usual compare-and-`PEXPIRE` and
//! compare-and-delete scripts, and a peer's value is never ours); a waiter retries, woken by the
//! key's keyspace events where the server publishes them, else every 20-60 ms (jittered, so
//! waiters do not retry in step).

use std::time::Duration;

use distlock_api::{
    Admission, Capabilities, Fencing, Grant, Guarantee, HolderInfo, HolderStatus, LockError,
    LockName, LockStatus, OwnerSecret, Reentrancy, Result, Wakeup,
};
use rand::Rng;
use tokio::time::{Instant, sleep_until};

use crate::client::RedisBackend;
use crate::keys::looks_shared;
use crate::notify::Subscription;
use crate::queue::{Ask, Attempt};
use crate::scripts::{self, Call};

/// What the plain layout declares: efficiency grade, no fencing token, no queue (not FIFO), no
/// policies, client-side re-entrancy, waiters that poll.
pub const PLAIN_CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Efficiency,
    fencing: Fencing::None,
    fifo: false,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(10),
    wakeup: Wakeup::Polling,
    policies: false,
    permits: false,
    listed_waiters: false,
};

/// The same, on a server that publishes the key's keyspace events: waiters watch the key.
pub const PLAIN_WATCHED_CAPABILITIES: Capabilities = Capabilities {
    wakeup: Wakeup::Watch,
    ..PLAIN_CAPABILITIES
};

/// A watching waiter still retries this often (an event lost with a dropped connection, or
/// the server's setting changed since we connected).
const RECHECK: Duration = Duration::from_secs(1);

/// A polling waiter retries after a random delay in this range (in ms).
const POLL_MS: std::ops::Range<u64> = 20..60;

impl RedisBackend {
    /// What this client declares: the plain layout's, or [`crate::CAPABILITIES`].
    pub(crate) fn layout_capabilities(&self) -> &'static Capabilities {
        match (self.plain(), &self.keyspace) {
            (false, _) => &crate::CAPABILITIES,
            (true, None) => &PLAIN_CAPABILITIES,
            (true, Some(_)) => &PLAIN_WATCHED_CAPABILITIES,
        }
    }

    /// A plain lock: one try (no deadline) or retries until `deadline`. Nothing is ever left on
    /// the server by a waiter; an attempt cancelled in flight is released by its guard.
    pub(crate) async fn plain_acquire(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        if admission != Admission::Exclusive {
            return Err(LockError::Unsupported {
                backend: "redis",
                what: "semaphores and read-write locks on the plain layout (layout=plain)"
                    .to_string(),
            });
        }
        let keys = self.keys(name);
        if looks_shared(&keys.lock) {
            return Err(LockError::InvalidName {
                name: name.to_string(),
                reason: "on the plain layout a key may not read as distlock's shared-holders \
                         hash ({...}:shared:...)",
            });
        }
        let (secret, holder) = (OwnerSecret::random()?, HolderInfo::now());
        let started = Instant::now();
        let mut watched: Option<Subscription> = None;
        loop {
            let sent = Instant::now();
            if let Attempt::Granted(_) = self
                .attempt(&keys, (&secret, &holder), ttl, Ask::Plain)
                .await?
            {
                return Ok(Grant::own_ttl(
                    name,
                    keys.lock,
                    (secret, holder),
                    None,
                    ttl,
                    sent,
                ));
            }
            let Some(deadline) = deadline else {
                return Err(LockError::Busy {
                    name: name.to_string(),
                });
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: now - started,
                });
            }
            if let Some(channel) = &self.keyspace
                && watched.is_none()
            {
                watched = Some(self.subscribe(&format!("{channel}{}", keys.lock)).await?);
                // Tried again at once: a deletion before the subscription landed is not missed.
                continue;
            }
            let wait = match watched {
                Some(_) => RECHECK,
                None => Duration::from_millis(rand::rng().random_range(POLL_MS)),
            };
            let wake = sleep_until((now + wait).min(deadline));
            match watched.as_mut() {
                Some(sub) => {
                    tokio::select! {
                        _ = sub.released() => {}
                        _ = wake => {}
                    }
                }
                None => wake.await,
            }
        }
    }

    /// The plain key's holder, read in one step ([`scripts::PEEK`]): no token, and who holds it
    /// when the value is one of ours (a peer's value names nobody). Nobody queues here.
    pub(crate) async fn plain_inspect(&self, name: &LockName) -> Result<LockStatus> {
        let keys = self.keys(name);
        let mut call = Call::new(&scripts::PEEK, 1);
        call.arg(&keys.lock);
        let (value, pttl): (Option<Vec<u8>>, i64) =
            self.run(&call, &mut self.conn().clone()).await?;
        let holders = value
            .map(|v| HolderStatus {
                token: None,
                expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
                admission: Admission::Exclusive,
                holder: ours(&v).then(|| HolderInfo::in_head(&v)).flatten(),
            })
            .into_iter()
            .collect();
        Ok(LockStatus {
            holders,
            waiters: 0,
        })
    }
}

/// Whether a lock value has our layout, `<32 hex>:<token>...` (a peer's is anything else).
fn ours(value: &[u8]) -> bool {
    value.len() > 33 && value[32] == b':' && value[..32].iter().all(u8::is_ascii_hexdigit)
}

/// Elections need a term number, which the plain layout does not hand out.
pub(crate) fn no_plain_election() -> LockError {
    LockError::Unsupported {
        backend: "redis",
        what: "leader election on the plain layout (layout=plain): no fencing token to number \
               terms with"
            .to_string(),
    }
}
