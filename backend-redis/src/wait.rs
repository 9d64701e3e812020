//! The wait for admission: a waiter's first try goes out alone; not admitted, it listens on
//! its turn channel and re-checks when told, when the holder's TTL runs out, and every second.

use std::time::Duration;

use distlock_api::{
    Admission, FencingToken, Grant, HolderInfo, LockError, LockName, OwnerSecret, Result,
};
use rand::Rng;
use tokio::time::{Instant, sleep_until};

use crate::client::RedisBackend;
use crate::keys::LockKeys;
use crate::queue::{Ask, Attempt, QueueGuard, WAITER_TTL, queue_member};

/// A waiter re-checks at least this often, which also keeps its place in the queue.
const RECHECK: Duration = Duration::from_secs(1);

impl RedisBackend {
    /// The one queue: a lock's entry (`admission` `None`: [`scripts::ACQUIRE`]) or one admitted
    /// by a policy ([`scripts::ADMIT`]). Without a deadline, one try: `Busy` unless granted,
    /// nothing queued. Else it waits in the name's queue: it listens on its client's turn
    /// channel (subscribed once per client) before its first try, which goes out alone (an
    /// uncontended acquire is one script call). Then it is woken only when its turn comes (a
    /// connection drop too), and re-checks then, when the first holder's TTL runs out, and at
    /// least every second (which keeps its place). A waiter is granted by the release itself (a
    /// Redlock arbiter's waiter is only told) and holds on the message, sending nothing. Leaves the queue on timeout, error or
    /// cancellation.
    pub(crate) async fn queued(
        &self,
        name: &LockName,
        ttl: Duration,
        deadline: Option<Instant>,
        admission: Option<Admission>,
    ) -> Result<Grant> {
        let keys = self.keys(name);
        let secret = OwnerSecret::random()?;
        let holder = HolderInfo::now();
        let started = Instant::now();
        let waiting = deadline.is_some();
        let mut turn = if waiting {
            Some(self.turn(&secret).await?)
        } else {
            None
        };
        let ask = match admission {
            None => Ask::Fenced { waiting },
            Some(admission) => Ask::Admitted { admission, waiting },
        };
        // A try joins nothing, so it has nothing to leave.
        let queued =
            waiting.then(|| QueueGuard::new(self, &keys, queue_member(&secret, admission)));
        loop {
            let sent = Instant::now();
            let pttl_ms = match self.attempt(&keys, (&secret, &holder), ttl, ask).await {
                Ok(Attempt::Granted(token)) => {
                    // The script took us out of the queue with the grant.
                    QueueGuard::keep_if_any(queued);
                    let token = Some(FencingToken(token));
                    return Ok(Grant::own_ttl(
                        name,
                        granted(keys, ask),
                        (secret, holder),
                        token,
                        ttl,
                        sent,
                    ));
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
                Ok(Attempt::Foreign) => {
                    if let Some(q) = queued {
                        q.leave().await;
                    }
                    return Err(LockError::ForeignEntry {
                        name: name.to_string(),
                        entry: keys.lock.clone(),
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
            // A try (no deadline) listens for nothing.
            let (Some(deadline), Some(sub)) = (deadline, turn.as_mut()) else {
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
            // Negative: the lock is free but promised to the waiter ahead of us.
            let wait =
                u64::try_from(pttl_ms).map_or(RECHECK, |ms| Duration::from_millis(ms).min(RECHECK));
            let jitter = Duration::from_micros(rand::rng().random_range(0..2_000));
            tokio::select! {
                _ = sub.released() => {}
                _ = sleep_until((now + wait + jitter).min(deadline)) => {}
            }
            if let Some(token) = sub.granted() {
                // A release granted us the lock, a permit or a read or write lease for at most
                // our liveness,
                // which our last re-check (sent at `sent`, answered "busy") set to its arrival +
                // WAITER_TTL: the grant came later, so it is valid until at least `sent` +
                // `first`. Held on receipt, unless that leaves too little of the window or
                // replicas must acknowledge it (`WAIT` needs a write of our own): then the
                // re-check finds it ours and renews it to the TTL.
                let first = ttl.min(WAITER_TTL);
                if self.options.min_replicas == 0 && sent.elapsed() <= first / 4 {
                    QueueGuard::keep_if_any(queued);
                    let grant = Grant::own_ttl(
                        name,
                        granted(keys, ask),
                        (secret, holder),
                        Some(FencingToken(token)),
                        ttl,
                        sent,
                    );
                    return Ok(grant.with_first_ttl(first));
                }
            }
        }
    }
}

/// What a grant of `ask` is: a field of the shared hash (a permit, a reader) or the lock key.
fn granted(keys: LockKeys, ask: Ask) -> String {
    if ask.shared() {
        keys.shared().to_string()
    } else {
        keys.lock
    }
}
