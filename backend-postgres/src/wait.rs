//! The wait for admission: one call writes the entry and settles it; a waiter not admitted
//! waits for its client's channel to name it (a release or an expiry that admits it), and
//! re-checks when the first entry ahead expires and at least every second, which also keeps
//! its entry alive.

use std::time::Duration;

use distlock_api::{
    Admission, FencingToken, Grant, HolderInfo, LockError, LockName, OwnerSecret, Result,
};
use tokio::time::{Instant, sleep_until};

use crate::client::PostgresBackend;
use crate::queue::{Attempt, EntryGuard};

/// A waiter re-checks at least this often, which keeps its entry alive.
const RECHECK: Duration = Duration::from_secs(1);

/// The soonest re-check on an expiry: an expired entry a guarded transaction holds stays until
/// that transaction ends, and must not make its waiters spin.
const MIN_RECHECK: Duration = Duration::from_millis(10);

impl PostgresBackend {
    /// One queue for every primitive: a lock is [`Admission::Exclusive`]. Without a deadline,
    /// one try: `Busy` unless admitted at once, nothing left queued. Else the entry waits its
    /// turn until `deadline`; it leaves the queue on timeout, error or cancellation.
    pub(crate) async fn queued(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        let secret = OwnerSecret::random()?;
        let holder = HolderInfo::now();
        // Listening before the entry exists: no message for it can come first.
        let mut turn = self.inner.notifier.turn(secret.expose_hex());
        let guard = EntryGuard::new(self, name, &secret);
        let started = Instant::now();
        let mut sent = Instant::now();
        let mut outcome = self
            .attempt(name, (&secret, &holder), admission, ttl, deadline.is_some())
            .await;
        loop {
            let expiry = match outcome {
                Ok(Attempt::Granted(token)) => {
                    guard.keep();
                    drop(turn);
                    let resource = format!("{}.entry/{token}", self.inner.options.schema);
                    let token = Some(FencingToken(token));
                    return Ok(Grant::own_ttl(
                        name,
                        resource,
                        (secret, holder),
                        token,
                        ttl,
                        sent,
                    ));
                }
                Ok(Attempt::Mismatch { theirs }) => {
                    guard.keep();
                    return Err(LockError::LimitMismatch {
                        name: name.to_string(),
                        ours: admission.limit(),
                        theirs,
                    });
                }
                Ok(Attempt::Gone) => {
                    // Our entry outlived its liveness unseen (a stall): join again at the back.
                    sent = Instant::now();
                    outcome = self
                        .attempt(name, (&secret, &holder), admission, ttl, true)
                        .await;
                    continue;
                }
                Ok(Attempt::Busy(expiry)) => expiry,
                Err(e) => {
                    guard.leave().await;
                    return Err(e);
                }
            };
            let Some(deadline) = deadline else {
                // The call deleted the try's entry.
                guard.keep();
                return Err(LockError::Busy {
                    name: name.to_string(),
                });
            };
            let now = Instant::now();
            if now >= deadline {
                guard.leave().await;
                return Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: now - started,
                });
            }
            let recheck = now + expiry.clamp(MIN_RECHECK, RECHECK);
            tokio::select! {
                _ = turn.told() => {}
                _ = sleep_until(recheck.min(deadline)) => {}
            }
            sent = Instant::now();
            outcome = self.readmit(name, &secret, ttl).await;
        }
    }
}
