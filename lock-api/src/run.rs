//! Running a future under a lock: the lost signal wired in, the release on every path.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;

use crate::client::LockClient;
use crate::error::{LostReason, Result};
use crate::fencing::FencingToken;
use crate::lease::Lease;
use crate::name::LockName;
use crate::options::AcquireOptions;
use crate::signal::LostSignal;

/// What a future run under a lock is given: the lease's fencing token, to check at the
/// resource, and its lost signal, for work that must notice the loss between two awaits (the
/// future is dropped at its next await anyway). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Held {
    token: Option<FencingToken>,
    name: LockName,
    lost: LostSignal,
}

impl Held {
    /// The lease's fencing token (`None` only on Redlock).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.token
    }

    /// The lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The lease's lost signal.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }
}

/// How a run under a lock ended. In every case the lock was released (or, if the server could
/// not be reached, is being released in the background) before this was returned.
#[non_exhaustive]
pub enum Ran<T> {
    /// The future completed while the lease was held, with this output.
    Completed(T),
    /// The lease was lost first: the future was dropped at its next await and never resumed.
    Lost(LostReason),
    /// The future panicked; the payload can go to [`std::panic::resume_unwind`].
    Panicked(Box<dyn Any + Send + 'static>),
}

impl<T: fmt::Debug> fmt::Debug for Ran<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ran::Completed(v) => f.debug_tuple("Completed").field(v).finish(),
            Ran::Lost(r) => f.debug_tuple("Lost").field(r).finish(),
            Ran::Panicked(_) => f.write_str("Panicked(..)"),
        }
    }
}

impl<T> Ran<T> {
    /// The output, if the future completed under the lock.
    pub fn completed(self) -> Option<T> {
        match self {
            Ran::Completed(v) => Some(v),
            _ => None,
        }
    }
}

/// Runs `f` under `lease` until it completes, panics, or the lease is lost (whichever comes
/// first), then releases the lease. Dropping this future drops the lease, which releases it in
/// the background.
pub(crate) async fn under<F, Fut, T>(lease: Lease, f: F) -> Ran<T>
where
    F: FnOnce(Held) -> Fut,
    Fut: Future<Output = T>,
{
    let held = Held {
        token: lease.fencing_token(),
        name: lease.name().clone(),
        lost: lease.lost_signal(),
    };
    let work = AssertUnwindSafe(f(held)).catch_unwind();
    let ran = tokio::select! {
        // A lease lost before the work starts never runs it.
        biased;
        reason = lease.lost() => Ran::Lost(reason),
        out = work => match out {
            Ok(v) => Ran::Completed(v),
            Err(payload) => Ran::Panicked(payload),
        },
    };
    // A failed release goes on in the background (see `Lease::release`).
    let _ = lease.release().await;
    ran
}

impl LockClient {
    /// Takes the lock if it is free (else fails with [`crate::LockError::Busy`] at once) and runs `f`
    /// under it: `f` gets the fencing token and the lost signal ([`Held`]); it is dropped at its
    /// next await if the lease is lost first; the lock is released on every path.
    ///
    /// # Errors
    /// Those of [`LockClient::try_acquire`]. Once the lock is held, nothing is an error: the
    /// outcome ([`Ran`]) says whether `f` completed, was cut short by the loss, or panicked.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `f` and the lease, which is released in the
    /// background.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use distlock_api::{AcquireOptions, LockClient, Ran, memory::MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
    /// let locks = LockClient::new(Arc::new(MemoryBackend::default()));
    /// let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
    /// let ran = locks
    ///     .try_run("cron:nightly", &opts, |held| async move {
    ///         // ... the work, writing with `held.fencing_token()` ...
    ///         held.fencing_token().is_some()
    ///     })
    ///     .await?;
    /// assert!(matches!(ran, Ran::Completed(true)));
    /// # Ok(()) }
    /// ```
    pub async fn try_run<F, Fut, T>(
        &self,
        name: &str,
        opts: &AcquireOptions,
        f: F,
    ) -> Result<Ran<T>>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.try_acquire(name, opts).await?;
        Ok(under(lease, f).await)
    }

    /// Like [`LockClient::try_run`], waiting up to `timeout` for the lock.
    ///
    /// # Errors
    /// Those of [`LockClient::acquire`].
    ///
    /// # Cancel safety
    /// As [`LockClient::try_run`]; a caller dropped while waiting leaves nothing queued.
    pub async fn run<F, Fut, T>(
        &self,
        name: &str,
        opts: &AcquireOptions,
        timeout: Duration,
        f: F,
    ) -> Result<Ran<T>>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(name, opts, timeout).await?;
        Ok(under(lease, f).await)
    }
}
