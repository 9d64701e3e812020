//! The user-facing entry point over any backend.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::admission::Admission;
use crate::backend::{Grant, LockBackend, LockStatus};
use crate::deadline::deadline_in;
use crate::error::{LockError, Result};
use crate::guarantee::{Capabilities, Guarantee};
use crate::lease::{Lease, LeaseShared, LeaseState};
use crate::margins::LeaseMode;
use crate::name::LockName;
use crate::options::AcquireOptions;
use crate::owner::HoldKey;
use crate::signal::lost_signal;
use crate::watchdog::Watchdog;

/// Acquires leases from one backend. Cheap to clone; all clones share the backend client.
///
/// Every acquire validates the name and options before any I/O, refuses a `Correctness` request
/// the backend cannot give, handles re-entrancy through [`crate::Owner`], and starts the lease's
/// watchdog before returning.
#[derive(Debug, Clone)]
pub struct LockClient {
    backend: Arc<dyn LockBackend>,
    watchdog: Arc<Watchdog>,
}

impl LockClient {
    /// Wraps a backend.
    pub fn new(backend: Arc<dyn LockBackend>) -> Self {
        LockClient {
            watchdog: Watchdog::new(backend.clone()),
            backend,
        }
    }

    #[cfg(test)]
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// The backend behind this client.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// What the backend declares it can do.
    pub fn capabilities(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// The holder (token, time to live) and the waiters of the lock `name`, read from the server
    /// without changing anything: for status pages and operators' tools.
    ///
    /// # Errors
    /// `InvalidName` before any I/O; `Unsupported` where the backend cannot tell; backend
    /// failures.
    pub async fn inspect(&self, name: &str) -> Result<LockStatus> {
        self.backend.inspect(&LockName::new(name)?).await
    }

    /// Checks that this backend can give `guarantee`, without any I/O.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] naming the backend and the missing capability.
    pub fn check_guarantee(&self, guarantee: Guarantee) -> Result<()> {
        match self.capabilities().refusal(guarantee) {
            Some(why) => Err(LockError::unsupported_guarantee(
                self.backend.kind(),
                guarantee,
                why,
            )),
            None => Ok(()),
        }
    }

    /// Takes the lock if it is free; otherwise fails at once with [`LockError::Busy`] and leaves
    /// nothing behind in the backend.
    ///
    /// # Errors
    /// `Busy`; `InvalidName` / `InvalidConfig` / `Unsupported` before any I/O; `Lost` when
    /// re-entering a lease that was lost; backend failures.
    ///
    /// # Examples
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use distlock_api::{AcquireOptions, LockClient, LockError, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
    /// let store = MemoryStore::new();
    /// let (a, b) = (LockClient::new(Arc::new(store.client())), LockClient::new(Arc::new(store.client())));
    /// let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
    /// let held = a.try_acquire("cron:nightly", &opts).await?;
    /// assert!(matches!(b.try_acquire("cron:nightly", &opts).await, Err(LockError::Busy { .. })));
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self, name: &str, opts: &AcquireOptions) -> Result<Lease> {
        self.acquire_inner(name, opts, None, None).await
    }

    /// Takes the lock, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out (nothing is left queued), and the errors of
    /// [`LockClient::try_acquire`] other than `Busy`.
    ///
    /// # Cancel safety
    /// Dropping the future at any point leaves no lock held, nothing queued and nothing renewing.
    ///
    /// # Examples
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use distlock_api::{AcquireOptions, LockClient, memory::MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
    /// let locks = LockClient::new(Arc::new(MemoryBackend::default()));
    /// let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
    /// let lease = locks.acquire("stock:sku-42", &opts, Duration::from_secs(5)).await?;
    /// // ... work while `lease.remaining()` is above zero, or select on `lease.lost()` ...
    /// assert!(lease.release().await?);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(
        &self,
        name: &str,
        opts: &AcquireOptions,
        timeout: Duration,
    ) -> Result<Lease> {
        self.acquire_inner(name, opts, Some(deadline_in(timeout)), None)
            .await
    }

    /// Like [`LockClient::acquire`], with an absolute deadline on tokio's clock.
    pub async fn acquire_until(
        &self,
        name: &str,
        opts: &AcquireOptions,
        deadline: Instant,
    ) -> Result<Lease> {
        self.acquire_inner(name, opts, Some(deadline), None).await
    }

    /// The one acquire path. `admission` is the policy of a semaphore's or read-write lock's entry
    /// ([`LockBackend::acquire_admitted`]); `None` for a lock (`try_acquire` / `acquire`, each
    /// backend's fastest path).
    #[tracing::instrument(name = "distlock.acquire", skip_all, fields(lock = name, backend = self.backend.kind(), waiting = deadline.is_some()))]
    pub(crate) async fn acquire_inner(
        &self,
        name: &str,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
        admission: Option<Admission>,
    ) -> Result<Lease> {
        let started = Instant::now();
        let result = self.acquire_checked(name, opts, deadline, admission).await;
        crate::metrics::acquire(
            self.backend.kind(),
            opts.guarantee,
            deadline.is_some(),
            &result,
            started.elapsed(),
        );
        result
    }

    /// The TTL a lease taken with `opts` gets here (a session's, on etcd and ZooKeeper), once
    /// `opts` are checked against it: the renewal period must fit that TTL's validity window,
    /// not only the asked TTL's. No I/O; every acquire checks this first.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the option, as [`AcquireOptions::validate`].
    pub fn checked_ttl(&self, opts: &AcquireOptions) -> Result<Duration> {
        opts.validate()?;
        let ttl = self.backend.lease_ttl(opts.ttl);
        opts.validate_for(ttl)?;
        Ok(ttl)
    }

    async fn acquire_checked(
        &self,
        name: &str,
        opts: &AcquireOptions,
        deadline: Option<Instant>,
        admission: Option<Admission>,
    ) -> Result<Lease> {
        let name = LockName::new(name)?;
        let ttl = self.checked_ttl(opts)?;
        self.check_guarantee(opts.guarantee)?;
        let runtime = Handle::try_current().map_err(|_| LockError::Unsupported {
            backend: self.backend.kind(),
            what: "use outside a tokio runtime".to_string(),
        })?;
        let hold_key = (
            Arc::as_ptr(&self.backend) as *const () as usize,
            name.clone(),
            admission.unwrap_or(Admission::Exclusive),
        );
        if let Some(owner) = &opts.owner
            && let Some(shared) = owner
                .held(&hold_key)
                .and_then(|held| held.downcast::<LeaseShared>().ok())
            && let Some(lease) = reenter(shared)?
        {
            return Ok(lease);
        }
        let grant = match (admission, deadline) {
            (Some(admission), _) => {
                self.backend
                    .acquire_admitted(&name, admission, ttl, deadline)
                    .await?
            }
            (None, None) => self.backend.try_acquire(&name, ttl).await?,
            (None, Some(d)) => self.backend.acquire(&name, ttl, d).await?,
        };
        // From here to the return there is no await but the confirmation below: a dropped
        // future cannot leak the grant, because the lease (whose Drop releases) exists before
        // any suspension point.
        let fixed_first = grant.first_ttl.is_some() && opts.mode == LeaseMode::Fixed;
        let lease = self.wrap(grant, opts, runtime, hold_key);
        if fixed_first {
            // No watchdog will move a short first window to the TTL this lease was asked for.
            lease.renew(ttl).await?;
        }
        if opts.guarantee == Guarantee::Correctness && lease.fencing_token().is_none() {
            return Err(LockError::unsupported_guarantee(
                self.backend.kind(),
                Guarantee::Correctness,
                "the grant carried no fencing token",
            ));
        }
        tracing::debug!(token = ?lease.fencing_token(), ttl = ?lease.ttl(), "distlock acquired");
        Ok(lease)
    }

    fn wrap(
        &self,
        grant: Grant,
        opts: &AcquireOptions,
        runtime: Handle,
        hold_key: HoldKey,
    ) -> Lease {
        let (trigger, _) = lost_signal();
        let member = self.watchdog.next_id();
        let shared = Arc::new(LeaseShared {
            backend: self.backend.clone(),
            key: grant.key,
            token: grant.token,
            guarantee: opts.guarantee,
            mode: opts.mode,
            margins: opts.margins(),
            lost: trigger,
            renew_gate: tokio::sync::Mutex::new(()),
            runtime: runtime.clone(),
            owner: opts.owner.clone().map(|o| Box::new((o, hold_key.clone()))),
            watchdog: self.watchdog.clone(),
            member,
            loss_handled: Default::default(),
            granted: grant.sent_at,
            ended: Default::default(),
            state: Mutex::new(LeaseState {
                ttl: grant.ttl,
                deadline: grant.sent_at,
                expires: grant.sent_at,
                holds: 1,
                released: false,
            }),
        });
        let first = grant.first_ttl.unwrap_or(grant.ttl);
        shared.extend(grant.sent_at, first);
        // Renewals ask for the TTL the lease was granted for, not the shorter first one.
        shared.state().ttl = grant.ttl;
        crate::metrics::lease_started(self.backend.kind());
        self.watchdog
            .join(member, &shared, (grant.sent_at, first), grant.session);
        if let Some(owner) = &opts.owner {
            owner.insert(hold_key, shared.clone());
        }
        Lease::new(shared)
    }
}

/// Adds a hold to a lease this owner already has; `None` when it was released meanwhile (then
/// the caller acquires anew).
fn reenter(shared: Arc<LeaseShared>) -> Result<Option<Lease>> {
    if let Some(reason) = shared.lost.fired() {
        return Err(LockError::Lost {
            name: shared.key.name.to_string(),
            reason,
        });
    }
    {
        let mut st = shared.state();
        if st.released {
            return Ok(None);
        }
        st.holds += 1;
    }
    tracing::debug!(lock = %shared.key.name, token = ?shared.token, "distlock re-entered");
    Ok(Some(Lease::new(shared)))
}
