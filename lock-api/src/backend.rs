//! The backend trait every store implements, and what it hands back on a grant.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use tokio::time::Instant;

use crate::admission::Admission;
use crate::error::{LockError, Result};
use crate::fencing::FencingToken;
use crate::guarantee::Capabilities;
use crate::holder::HolderInfo;
use crate::leader::Leader;
use crate::name::LockName;
use crate::secret::OwnerSecret;
use crate::signal::LostSignal;

/// What a backend needs to renew or release one grant.
#[derive(Debug, Clone)]
pub struct GrantKey {
    /// The lock name.
    pub name: LockName,
    /// The backend's own address of this grant (Redis key, etcd key, znode path). Shared: a
    /// backend that keeps its own map of held grants keys it by this, not a copy.
    pub resource: Arc<str>,
    /// The proof of ownership written into the backend (never logged).
    pub secret: OwnerSecret,
    /// Who holds it, as written with the entry (an announcement writes it again).
    pub holder: HolderInfo,
}

/// A granted lock, as a backend reports it to the generic layer that wraps it in a
/// [`crate::Lease`].
#[derive(Debug)]
pub struct Grant {
    /// How to renew and release it.
    pub key: GrantKey,
    /// The fencing token; `Some` whenever the backend's fencing is monotonic.
    pub token: Option<FencingToken>,
    /// The TTL the server applied (after rounding to its granularity; etcd's session TTL,
    /// ZooKeeper's negotiated session timeout).
    pub ttl: Duration,
    /// When the request the TTL counts from was sent, on the monotonic clock: a moment at which
    /// the server had not yet started counting. The local validity deadline is
    /// `sent_at + ttl - margins`, so it is always before the server-side expiry.
    pub sent_at: Instant,
    /// Fires when the backend session carrying this grant dies (etcd lease, ZooKeeper session);
    /// `None` when the grant has no session beyond its own TTL.
    pub session: Option<LostSignal>,
    /// The TTL the grant itself got, when shorter than `ttl`: a grant another request made on
    /// the waiter's behalf (a release that hands the lock on), bounded by the waiter's liveness
    /// so a waiter that died never strands it for a full TTL. The first validity window counts
    /// this from `sent_at`; the first renewal (asking for `ttl`) falls inside it, and a lease
    /// that never renews by itself ([`crate::LeaseMode::Fixed`]) is renewed to `ttl` before
    /// the acquire returns. `None`: the grant got `ttl`.
    pub first_ttl: Option<Duration>,
}

impl Grant {
    /// The grant of `secret`'s entry `resource` under `name`, alive for its own TTL alone (no
    /// session carries it: every backend but etcd's).
    pub fn own_ttl(
        name: &LockName,
        resource: impl Into<Arc<str>>,
        (secret, holder): (OwnerSecret, HolderInfo),
        token: Option<FencingToken>,
        ttl: Duration,
        sent_at: Instant,
    ) -> Grant {
        Grant {
            key: GrantKey {
                name: name.clone(),
                resource: resource.into(),
                secret,
                holder,
            },
            token,
            ttl,
            sent_at,
            session: None,
            first_ttl: None,
        }
    }

    /// This grant, given only `first` (shorter than its TTL) by the server: see
    /// [`Grant::first_ttl`].
    pub fn with_first_ttl(mut self, first: Duration) -> Grant {
        if first < self.ttl {
            self.first_ttl = Some(first);
        }
        self
    }
}

/// What a backend holds for one lock name, read without touching it ([`LockBackend::inspect`]):
/// for status pages and operators' tools. A snapshot: it may have changed by the time it is read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockStatus {
    /// Every live holder, in queue order: one for a lock or a writer, up to N for a semaphore of
    /// N, every admitted reader of a read-write lock.
    pub holders: Vec<HolderStatus>,
    /// How many entries wait behind the holders (live ones, where the backend can tell).
    pub waiters: usize,
}

impl LockStatus {
    /// The first holder (a lock's only one), if any.
    pub fn holder(&self) -> Option<&HolderStatus> {
        self.holders.first()
    }
}

/// One holder of a name as [`LockBackend::inspect`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderStatus {
    /// Its fencing token, where the backend has tokens.
    pub token: Option<FencingToken>,
    /// How long the server keeps it if nothing renews it, where the server can say (Redis
    /// `PTTL`, etcd's lease time-to-live, memory; not ZooKeeper, whose session timeouts are
    /// the holder's own).
    pub expires_in: Option<Duration>,
    /// What it holds: a lock or a writer ([`Admission::Exclusive`]), a permit of N, or a read.
    pub admission: Admission,
    /// Who holds it (host, process, command, since when), as the holder wrote it; `None` for
    /// an entry that records none (another language's recipe, an older version).
    pub holder: Option<HolderInfo>,
}

/// Result of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lock is ours for `ttl` more, counted from the moment the renewal was sent: exactly
    /// what the server applied (a shorter TTL than before shortens the lease; etcd and ZooKeeper
    /// answer their session's TTL whatever was asked).
    Renewed {
        /// The TTL the server applied.
        ttl: Duration,
    },
    /// The lock is no longer ours (expired, taken, or released). Nothing was created.
    NotHeld,
}

/// One lock store. Dyn-compatible: the facade holds `Arc<dyn LockBackend>` built from
/// configuration. Implementations keep these promises, which the conformance suite checks:
///
/// * acquire is atomic: the lock, its TTL and its fencing token are set in one step;
/// * renew and release compare the owner secret first; renew never re-creates a missing lock and
///   release never deletes another owner's lock;
/// * a waiter is woken by a notification, not by a fixed poll, and leaves nothing queued when it
///   times out, fails or its future is dropped;
/// * a grant whose future is dropped after the server granted it is released, not leaked;
/// * a renewal reports the TTL the server applied, and is proven by the server that decides
///   (never answered from a replica's possibly stale copy).
///
/// Users call these through [`crate::LockClient`], which validates names and options, adds the
/// watchdog, re-entrancy and the lost signal.
///
/// # Wrappers
/// A backend that wraps another (to count, trace or inject faults) forwards every method,
/// default ones included: a forgotten `renew_batch` turns one batched call per tick into one
/// call per lease. Put `#[deny(clippy::missing_trait_methods)]` on such an `impl`.
#[async_trait]
pub trait LockBackend: Debug + Send + Sync + 'static {
    /// The backend kind (`memory`, `redis`, `etcd`, `zk`, `redlock`), used in errors and logs.
    fn kind(&self) -> &'static str;

    /// What this backend declares it can do.
    fn capabilities(&self) -> &Capabilities;

    /// The TTL a grant asked for `requested` gets, before any I/O: `requested` rounded by
    /// [`Capabilities::effective_ttl`], unless the backend's leases live on a session whose TTL
    /// they all share (etcd, ZooKeeper), which then answers that. Options are checked against it.
    fn lease_ttl(&self, requested: Duration) -> Duration {
        self.capabilities().effective_ttl(requested)
    }

    /// Takes the lock if it is free, else fails with [`crate::LockError::Busy`] at once, leaving
    /// nothing queued in the backend. `ttl` is already rounded by
    /// [`Capabilities::effective_ttl`].
    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Grant>;

    /// Takes the lock, waiting until `deadline` at most, then fails with
    /// [`crate::LockError::Timeout`] leaving nothing queued.
    ///
    /// # Cancel safety
    /// Dropping the future leaves no lock held and nothing queued.
    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant>;

    /// Queues an entry admitted by `admission` ([`crate::admission`]: a semaphore's permit, a
    /// read-write lock's reader or writer) and returns its grant once admitted. Without a
    /// deadline it is a try: `Busy` at once, nothing left queued, unless admitted at once. Same
    /// promises as [`LockBackend::acquire`] otherwise: one queue per name, entries admitted in
    /// arrival order, a permit whose limit differs from one ahead refused with
    /// [`crate::LockError::LimitMismatch`] and nothing left queued. Renew and release take its
    /// [`GrantKey`] as a lock's.
    ///
    /// The default serves [`Admission::Exclusive`] with `try_acquire` / `acquire` and refuses
    /// the other policies; a backend that admits by policy declares
    /// [`Capabilities::policies`].
    ///
    /// # Cancel safety
    /// As `acquire`.
    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        match (admission, deadline) {
            (Admission::Exclusive, None) => self.try_acquire(name, ttl).await,
            (Admission::Exclusive, Some(d)) => self.acquire(name, ttl, d).await,
            _ => Err(LockError::Unsupported {
                backend: self.kind(),
                what: "semaphores and read-write locks".to_string(),
            }),
        }
    }

    /// Resets the TTL of a grant we still hold; never re-creates it.
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal>;

    /// Renews many grants, each to its own TTL, with the fewest server calls the store allows
    /// (the watchdog calls this once per tick for every lease that is due). Returns one outcome
    /// per item, in order, by `deadline`: an item whose server did not answer by then is an
    /// error, while the items other servers answered keep their outcome (one hung node of a
    /// cluster must not cost the leases on healthy ones). A missing outcome counts as a failure
    /// to retry. Same promises as [`LockBackend::renew`] for each item.
    ///
    /// The default renews each item with [`LockBackend::renew`], concurrently, each cut off at
    /// `deadline` on its own.
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        futures_util::future::join_all(batch.iter().map(|(key, ttl)| async move {
            tokio::time::timeout_at(deadline, self.renew(key, *ttl))
                .await
                .unwrap_or_else(|_| {
                    Err(LockError::backend(
                        self.kind(),
                        true,
                        "no answer by the renewal deadline",
                    ))
                })
        }))
        .await
    }

    /// Releases a grant; returns whether we still held it. Never touches another owner's lock.
    /// A failed release is retried by the caller ([`crate::Lease`] does so in the background).
    async fn release(&self, key: &GrantKey) -> Result<bool>;

    /// Gives up what keeps `key`'s lock alive on the server, after releasing it failed for as
    /// long as the lease could be renewed: the server then frees it within its TTL, whatever
    /// else stays unreachable. For a lock with its own TTL that is nothing (renewals stopped at
    /// release); etcd stops keeping its session lease alive and ZooKeeper closes its session,
    /// which fires the lost signal of every other lease on that session (correct: their holder
    /// cannot prove them any more). Never touches another client's locks.
    async fn abandon(&self, key: &GrantKey) {
        let _ = key;
    }

    /// A new client of the same servers with the same settings, made on the caller's runtime.
    /// A lease whose runtime shut down before its background release ran (dropped at the end
    /// of `#[tokio::main]`, say) is released through one, from a thread of the library: this
    /// client's connections went with that runtime. The default refuses (`Unsupported`): such a
    /// lease then stays until its TTL or session timeout.
    async fn reconnect(&self) -> Result<Arc<dyn LockBackend>> {
        Err(LockError::Unsupported {
            backend: self.kind(),
            what: "a new client for a release after its runtime ended".to_string(),
        })
    }

    /// The holder and the waiters of `name`, read from the server without changing anything
    /// (no key, node or queue entry is written). The default refuses.
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.kind(),
            what: "lock inspection".to_string(),
        })
    }

    /// Writes `value` into the grant's own queue entry, where [`LockBackend::leader`] reads it,
    /// only while the grant (whose fencing token is `token`) still holds: one atomic
    /// check-and-write, `Ok(false)` with nothing written when it does not. The value goes with
    /// the grant (released, expired, session dead). Used by leader election; the default refuses.
    async fn announce(&self, key: &GrantKey, token: FencingToken, value: &str) -> Result<bool> {
        let _ = (key, token, value);
        Err(no_election(self.kind()))
    }

    /// The holder of `name` and the value it announced, read from the server that decides:
    /// `None` when nobody holds it or the holder announced nothing yet. Never another name's,
    /// never a released or expired grant's. The default refuses.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let _ = name;
        Err(no_election(self.kind()))
    }

    /// A stream that yields after the holder of `name`, or its announced value, may have
    /// changed: hints (spurious ones allowed, several changes may give one hint) for observers,
    /// which read [`LockBackend::leader`] again. Every change after this returns is hinted while
    /// the backend's connection holds; the stream ends if it cannot go on (the observer
    /// subscribes again). The default refuses.
    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        let _ = name;
        Err(no_election(self.kind()))
    }
}

fn no_election(backend: &'static str) -> LockError {
    LockError::Unsupported {
        backend,
        what: "leader election".to_string(),
    }
}

/// [`LockBackend::renew`] for a backend whose batched renewal is the primitive: a batch of one.
/// A batch that answers nothing counts as "not held", never as renewed.
pub async fn renew_as_batch<B: LockBackend + ?Sized>(
    backend: &B,
    key: &GrantKey,
    ttl: Duration,
    deadline: Instant,
) -> Result<Renewal> {
    backend
        .renew_batch(&[(key, ttl)], deadline)
        .await
        .pop()
        .unwrap_or(Ok(Renewal::NotHeld))
}
