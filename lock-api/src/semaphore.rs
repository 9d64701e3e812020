//! Counting semaphores and read-write locks: the backend's one admission queue with another
//! policy ([`crate::admission`]). A permit, a read lease and a write lease are [`Lease`]s like a
//! lock's: TTL, watchdog, lost signal, release, release on drop, a fencing token where the
//! backend has tokens.

use std::time::Duration;

use tokio::time::Instant;

use crate::admission::Admission;
use crate::client::LockClient;
use crate::deadline::deadline_in;
use crate::error::{LockError, Result};
use crate::lease::Lease;
use crate::name::LockName;
use crate::options::AcquireOptions;
use crate::run::{Held, Ran};

/// A semaphore named `n` queues on the lock name `semaphore/n`: its own namespace, so a lock, an
/// election and a semaphore of the same name never meet.
pub const SEMAPHORE_LOCK_PREFIX: &str = "semaphore/";

/// A read-write lock named `n` queues on the lock name `rwlock/n`.
pub const RWLOCK_LOCK_PREFIX: &str = "rwlock/";

/// The lock name `<prefix><name>`; an invalid one is reported with the name as the caller gave it.
pub(crate) fn namespaced(prefix: &str, name: &str) -> Result<LockName> {
    LockName::new(format!("{prefix}{name}")).map_err(|e| match e {
        LockError::InvalidName { reason, .. } => LockError::InvalidName {
            name: name.to_string(),
            reason,
        },
        other => other,
    })
}

/// Refuses a backend whose queue admits only locks, before any I/O.
/// What [`check_policies`] names for a semaphore, which needs permits too.
const SEMAPHORES: &str = "semaphores";

fn check_policies(client: &LockClient, what: &str) -> Result<()> {
    let caps = client.capabilities();
    if caps.policies && (caps.permits || what != SEMAPHORES) {
        return Ok(());
    }
    Err(LockError::Unsupported {
        backend: client.backend().kind(),
        what: what.to_string(),
    })
}

/// Gives the errors that name the queue's lock name (`semaphore/n`) the caller's name (`n`).
fn renamed(e: LockError, name: &str) -> LockError {
    match e {
        LockError::Busy { .. } => LockError::Busy {
            name: name.to_string(),
        },
        LockError::Timeout { waited, .. } => LockError::Timeout {
            name: name.to_string(),
            waited,
        },
        LockError::LimitMismatch { ours, theirs, .. } => LockError::LimitMismatch {
            name: name.to_string(),
            ours,
            theirs,
        },
        other => other,
    }
}

/// A named counting semaphore over a [`LockClient`]'s backend: at most `permits` leases of it
/// are held at once, across processes and hosts, including across a holder's crash (its permit
/// returns after its TTL or session) and a waiter's cancellation (nothing left queued). Waiters
/// are admitted in arrival order where the backend declares FIFO. Cheap to clone.
///
/// # Examples
/// ```
/// use std::{sync::Arc, time::Duration};
/// use distlock_api::{AcquireOptions, LockClient, LockError, memory::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
/// let store = MemoryStore::new();
/// let replica = || LockClient::new(Arc::new(store.client()));
/// let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
/// let pool = replica().semaphore("db-migrations", 2)?.options(opts.clone());
/// let first = pool.acquire(Duration::from_secs(1)).await?;
/// let second = pool.acquire(Duration::from_secs(1)).await?;
/// assert!(matches!(pool.try_acquire().await, Err(LockError::Busy { .. })));
/// // Every user must agree on the number of permits.
/// let other = replica().semaphore("db-migrations", 3)?.options(opts);
/// assert!(matches!(other.try_acquire().await, Err(LockError::LimitMismatch { ours: 3, theirs: 2, .. })));
/// first.release().await?;
/// let third = pool.try_acquire().await?; // a permit came back
/// # drop((second, third)); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: LockClient,
    name: String,
    lock: LockName,
    permits: u32,
    opts: AcquireOptions,
}

impl LockClient {
    /// The semaphore `name` with `permits` permits, on this client's backend, with default
    /// lease options ([`Semaphore::options`]). No I/O.
    ///
    /// # Errors
    /// `InvalidConfig` for zero permits; `InvalidName` when `semaphore/<name>` breaks the
    /// lock-name rule; `Unsupported` when the backend's queue admits no permits
    /// ([`crate::Capabilities::permits`]).
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        if permits == 0 {
            return Err(LockError::invalid_config(
                "permits",
                permits,
                "a semaphore needs at least 1 permit",
            ));
        }
        let lock = namespaced(SEMAPHORE_LOCK_PREFIX, name)?;
        check_policies(self, SEMAPHORES)?;
        Ok(Semaphore {
            client: self.clone(),
            name: name.to_string(),
            lock,
            permits,
            opts: AcquireOptions::default(),
        })
    }

    /// The read-write lock `name` on this client's backend, with default lease options
    /// ([`RwLock::options`]). No I/O.
    ///
    /// # Errors
    /// `InvalidName` when `rwlock/<name>` breaks the lock-name rule; `Unsupported` when the
    /// backend's queue admits only locks ([`crate::Capabilities::policies`]).
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        let lock = namespaced(RWLOCK_LOCK_PREFIX, name)?;
        check_policies(self, "read-write locks")?;
        Ok(RwLock {
            client: self.clone(),
            name: name.to_string(),
            lock,
            opts: AcquireOptions::default(),
        })
    }

    async fn admit(
        &self,
        lock: &LockName,
        shown: &str,
        opts: &AcquireOptions,
        admission: Admission,
        deadline: Option<Instant>,
    ) -> Result<Lease> {
        self.acquire_inner(lock.as_str(), opts, deadline, Some(admission))
            .await
            .map_err(|e| renamed(e, shown))
    }
}

impl Semaphore {
    /// The semaphore's name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The lease options of its permits (TTL, watchdog or fixed, grade, owner: an owner's second
    /// acquire re-enters the permit it holds instead of taking another).
    pub fn options(mut self, opts: AcquireOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The lease options its permits are taken with.
    pub fn lease_options(&self) -> &AcquireOptions {
        &self.opts
    }

    /// Takes a permit if one is free and nobody waits ahead, else fails at once with `Busy`,
    /// leaving nothing queued.
    ///
    /// # Errors
    /// `Busy`; `LimitMismatch` when the semaphore is in use with another number of permits;
    /// the errors of [`LockClient::try_acquire`].
    pub async fn try_acquire(&self) -> Result<Lease> {
        self.take(None).await
    }

    /// Takes a permit, waiting up to `timeout` in arrival order.
    ///
    /// # Errors
    /// `Timeout` (nothing left queued), `LimitMismatch`, and the errors of
    /// [`LockClient::acquire`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves no permit held and nothing queued.
    pub async fn acquire(&self, timeout: Duration) -> Result<Lease> {
        self.take(Some(timeout)).await
    }

    async fn take(&self, timeout: Option<Duration>) -> Result<Lease> {
        let deadline = timeout.map(deadline_in);
        let permit = Admission::Permit(self.permits);
        self.client
            .admit(&self.lock, &self.name, &self.opts, permit, deadline)
            .await
    }

    /// Takes a permit (waiting up to `timeout`) and runs `f` under it, as
    /// [`LockClient::run`] does under a lock: released on every path, cut short if lost.
    ///
    /// # Errors
    /// Those of [`Semaphore::acquire`].
    pub async fn run<F, Fut, T>(&self, timeout: Duration, f: F) -> Result<Ran<T>>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(timeout).await?;
        Ok(crate::run::under(lease, f).await)
    }
}

/// A named read-write lock over a [`LockClient`]'s backend: any number of read leases at once,
/// or one write lease alone. One queue in arrival order serves both, so a waiting writer is
/// admitted before every reader that arrived after it (writers are not starved by a stream of
/// readers), and readers queued behind a writer are admitted together once it leaves. A write
/// lease's fencing token is above every earlier lease's of the name; read leases carry tokens
/// too where the backend has them. Cheap to clone.
///
/// # Examples
/// ```
/// use std::{sync::Arc, time::Duration};
/// use distlock_api::{AcquireOptions, LockClient, LockError, memory::MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
/// let locks = LockClient::new(Arc::new(MemoryBackend::default()));
/// let config = locks.rwlock("routing-table")?.options(AcquireOptions::with_ttl(Duration::from_secs(10)));
/// let a = config.read(Duration::from_secs(1)).await?;
/// let b = config.read(Duration::from_secs(1)).await?; // readers share
/// assert!(matches!(config.try_write().await, Err(LockError::Busy { .. })));
/// let read_token = a.fencing_token();
/// a.release().await?;
/// b.release().await?;
/// let w = config.write(Duration::from_secs(1)).await?;
/// assert!(w.fencing_token() > read_token);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    client: LockClient,
    name: String,
    lock: LockName,
    opts: AcquireOptions,
}

impl RwLock {
    /// The lock's name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease options of its read and write leases (an owner re-enters the lease of the same
    /// kind it holds; holding a read lease, its write waits like anyone's).
    pub fn options(mut self, opts: AcquireOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The lease options its leases are taken with.
    pub fn lease_options(&self) -> &AcquireOptions {
        &self.opts
    }

    async fn take(&self, admission: Admission, timeout: Option<Duration>) -> Result<Lease> {
        let deadline = timeout.map(deadline_in);
        self.client
            .admit(&self.lock, &self.name, &self.opts, admission, deadline)
            .await
    }

    /// A read lease if no writer holds or waits, else `Busy` at once (nothing left queued).
    ///
    /// # Errors
    /// `Busy`, and the errors of [`LockClient::try_acquire`].
    pub async fn try_read(&self) -> Result<Lease> {
        self.take(Admission::Shared, None).await
    }

    /// A read lease, waiting up to `timeout` behind the writers that arrived before.
    ///
    /// # Errors
    /// `Timeout` (nothing left queued), and the errors of [`LockClient::acquire`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing held or queued.
    pub async fn read(&self, timeout: Duration) -> Result<Lease> {
        self.take(Admission::Shared, Some(timeout)).await
    }

    /// The write lease if nobody holds or waits, else `Busy` at once (nothing left queued).
    ///
    /// # Errors
    /// `Busy`, and the errors of [`LockClient::try_acquire`].
    pub async fn try_write(&self) -> Result<Lease> {
        self.take(Admission::Exclusive, None).await
    }

    /// The write lease, waiting up to `timeout` for the readers and writers ahead of it.
    ///
    /// # Errors
    /// `Timeout` (nothing left queued), and the errors of [`LockClient::acquire`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing held or queued.
    pub async fn write(&self, timeout: Duration) -> Result<Lease> {
        self.take(Admission::Exclusive, Some(timeout)).await
    }
}
