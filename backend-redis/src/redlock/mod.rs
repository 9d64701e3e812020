//! Redlock over N independent Redis masters, on the single-instance scripts.
//!
//! * **Acquire**: a plain `SET <lock> <secret>:0 NX PX <ttl>` on every node in parallel (no
//!   token; on the name's arbiter, the same `SET` inside the queue's script, which refuses while
//!   a live waiter heads its queue and the lock there is free or that head's, and then the round
//!   gives back what the others granted, a majority included: the queue decides who is next, so
//!   a releaser's next round cannot pass the head its release told), each with a short timeout;
//!   success iff a majority (N/2 + 1) granted *and* the validity `TTL - elapsed - (TTL x
//!   drift_factor + 2 ms)` is still positive, with `elapsed` measured on the monotonic clock
//!   from before the first request was sent. The lease's local deadline is exactly that
//!   validity.
//! * **Failure**: release on *all* nodes, including those that did not answer (they may have
//!   granted after their timeout), then wait in the name's queue on its *arbiter* (one node
//!   chosen by the name's key slot, which keeps the waiters' queue with the single-instance
//!   script) and retry when told our turn there or after a random delay, up to the caller's
//!   deadline and `retry_count` rounds. A retry asks the arbiter first (joining the queue or
//!   keeping our place) and the others only once it granted, so waiters never split the votes;
//!   the waiter told its turn asks every node at once (a newcomer's first round can take the
//!   other nodes first; the arbiter's refusal makes it give them back).
//!   The grant still needs the same majority and validity (counted from before the arbiter's
//!   request); a waiter the arbiter granted asks the nodes that refused again a few times,
//!   briefly, before it lets go, and keeps the head of the queue until its release (or its
//!   lock's expiry, so a crashed holder does not hold the queue up longer). Once the
//!   arbiter fails to answer, that round is decided by the other nodes and the acquire goes
//!   back to parallel rounds, woken by the others' release announcements (spread by how many
//!   listen), until a round finds the arbiter answering again: the next one queues there again
//!   (while a live waiter heads that queue, a parallel round gives way to it).
//! * **Wake-ups**: one message per release, from the arbiter to the head of its queue: a
//!   holder's release always (leaving the queue; by leaving it alone when the arbiter held no
//!   key of ours), a failed attempt's clean-up when it freed the arbiter, and not a waiter's
//!   that other nodes still refused (it keeps its turn; their owner's release tells it). When
//!   the arbiter does not answer a holder's release, the others announce it on the name's
//!   channel, to every waiter.
//! * **Renew / release**: on all nodes; renew succeeds iff a majority extended, release iff a
//!   majority deleted. A renewal that reaches no majority is retried by the watchdog only until
//!   the validity deadline (bounded extension: unbounded retries would break liveness), then the
//!   lost signal fires.
//! * **No fencing token**: per-node counters would not be one sequence, so nothing monotonic can
//!   be promised; no counter is kept, leases carry no token and `Correctness` is refused.
//!
//! # Known hazards (asserted in the tests, not hidden)
//! A node that crashes and restarts empty before the TTL ran out forgets its key, so a second
//! client can reach a majority while the first still holds: two holders. Restart crashed nodes
//! only after the longest TTL (or run them with `appendfsync always`). Redis expires keys by the
//! wall clock, so a clock jump on a node shortens the lease there.

use std::any::Any;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, Grant, GrantKey, Guarantee, HolderInfo, HolderStatus,
    LockBackend, LockError, LockName, LockStatus, OwnerSecret, Reconnect, Reentrancy, Renewal,
    Result, Wakeup,
};
use futures_util::future::{join_all, try_join_all};
use tokio::time::Instant;

use crate::client::RedisBackend;
use crate::config::{RedisOptions, RedlockOptions};
use crate::keys::{LockKeys, slot};
use crate::queue::{QueueGuard, queue_member};

mod queue;
mod vote;

/// What Redlock declares: efficiency grade, no fencing token, not FIFO (waiters queue on the
/// name's arbiter, which a newcomer's first round does not pass while it answers, but while it
/// is silent the other nodes decide by majority alone), client-side
/// re-entrancy, millisecond TTLs, release messages (from the name's arbiter to the head of its
/// queue; from the others to every waiter while it is down; a random back-off as the fallback).
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Efficiency,
    fencing: Fencing::None,
    fifo: false,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(10),
    wakeup: Wakeup::PubSub,
    policies: false,
    permits: false,
    listed_waiters: true,
};

/// Whom a Redlock release wakes (through the name's arbiter; see `release_all`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waking {
    /// A holder's release: the head of the arbiter's queue, always, once the holder left it
    /// (if the arbiter held no key of ours, leaving its queue tells the head; if it does not
    /// answer, the others announce the release to every waiter).
    Holder,
    /// A failed attempt's clean-up: the head if it freed the arbiter (the head may have found
    /// it taken by us).
    Attempt,
    /// A waiter that held the arbiter while nodes another owner holds refused it, or that the
    /// arbiter refused: nobody (it keeps its turn).
    Nobody,
    /// A round the arbiter refused for the live head of its queue, once the other nodes gave
    /// back what they granted: the head, whether the arbiter is free or the head's own (it may
    /// have asked those nodes while they were ours, and let go of the arbiter after, and would
    /// otherwise wait for its retry delay).
    Promised,
}

/// The acquire of `name`, started at `started`, ran out of time or rounds.
fn timed_out(name: &LockName, started: Instant) -> LockError {
    LockError::Timeout {
        name: name.to_string(),
        waited: started.elapsed(),
    }
}

/// The validity left of a lease of `ttl` whose acquire took `elapsed` (from before the first
/// request to after the last answer and the quorum check), or `None` when nothing is left.
pub fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    let drift = ttl.mul_f64(drift_factor) + Duration::from_millis(2);
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// The index of the node, of `nodes` given in one order, that arbitrates the lock key `lock`
/// (see [`RedlockBackend::arbiter`]): by the key's slot, the same for every client.
pub fn arbiter_index(lock: &str, nodes: usize) -> usize {
    usize::from(slot(lock)) % nodes
}

/// A lock client over N independent Redis masters (N odd, 3 or 5 recommended).
#[derive(Clone)]
pub struct RedlockBackend {
    nodes: Arc<Vec<RedisBackend>>,
    options: RedlockOptions,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("nodes", &self.nodes)
            .field("options", &self.options)
            .finish()
    }
}

impl RedlockBackend {
    /// Connects to every node (`redis://host:port` each).
    ///
    /// # Errors
    /// `InvalidConfig` for fewer than 3 nodes, an even count, or options out of range; a
    /// retryable backend error when a node cannot be reached (all must be up to start).
    pub async fn connect(urls: &[String], options: RedlockOptions) -> Result<Self> {
        if urls.len() < 3 || urls.len() % 2 == 0 {
            return Err(LockError::invalid_config(
                "nodes",
                urls,
                "Redlock needs an odd number of nodes, at least 3",
            ));
        }
        if !(0.0..0.5).contains(&options.drift_factor) {
            return Err(LockError::invalid_config(
                "drift_factor",
                options.drift_factor,
                "must be in [0, 0.5)",
            ));
        }
        if options.retry_delay.0 > options.retry_delay.1 {
            return Err(LockError::invalid_config(
                "retry_delay",
                options.retry_delay,
                "min above max",
            ));
        }
        let node_options = RedisOptions {
            prefix: options.prefix.clone(),
            op_timeout: options.node_timeout,
            connect_timeout: options.connect_timeout,
            ..RedisOptions::default()
        };
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            nodes.push(RedisBackend::connect(url, node_options.clone()).await?);
        }
        Ok(RedlockBackend {
            nodes: Arc::new(nodes),
            options,
        })
    }

    /// The index (in the order the nodes were given) of the node that orders `name`'s waiters:
    /// their retries ask it first (see the module docs). Chosen by the name's key slot, so no
    /// one node arbitrates every name; the same for every client with the same node list.
    pub fn arbiter(&self, name: &LockName) -> usize {
        self.arbiter_of(&self.nodes[0].keys(name))
    }

    fn arbiter_of(&self, keys: &LockKeys) -> usize {
        arbiter_index(&keys.lock, self.nodes.len())
    }

    fn grant(
        &self,
        name: &LockName,
        keys: LockKeys,
        (secret, holder): (OwnerSecret, HolderInfo),
        ttl: Duration,
        start: Instant,
    ) -> Grant {
        // No token: per-node counters are not one sequence (see the module docs).
        Grant::own_ttl(name, keys.lock, (secret, holder), None, ttl, start)
    }
}

impl Reconnect for RedlockBackend {
    fn identity(&self) -> Weak<dyn Any + Send + Sync> {
        Arc::downgrade(&self.nodes) as Weak<Vec<RedisBackend>>
    }

    /// A new client of the same nodes with the same options (see
    /// [`distlock_api::LockBackend::reconnect`]): every node at once, all must answer.
    async fn reconnected(&self) -> Result<Self> {
        let nodes = try_join_all(self.nodes.iter().map(RedisBackend::reconnected)).await?;
        Ok(RedlockBackend {
            nodes: Arc::new(nodes),
            options: self.options.clone(),
        })
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn kind(&self) -> &'static str {
        "redlock"
    }

    fn capabilities(&self) -> &Capabilities {
        &REDLOCK_CAPABILITIES
    }

    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> Result<Grant> {
        let (secret, holder) = (OwnerSecret::random()?, HolderInfo::now());
        // Every node has the same key layout (one prefix for all): built once per acquire.
        let keys = self.nodes[0].keys(name);
        match self.round(&keys, (&secret, &holder), ttl).await.0? {
            (true, start) => Ok(self.grant(name, keys, (secret, holder), ttl, start)),
            (false, _) => Err(LockError::Busy {
                name: name.to_string(),
            }),
        }
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        let (secret, holder) = (OwnerSecret::random()?, HolderInfo::now());
        let started = Instant::now();
        let keys = self.nodes[0].keys(name);
        // The first round goes to all nodes at once: an uncontended acquire is one round trip
        // and subscribes to nothing.
        if let (true, start) = self.round(&keys, (&secret, &holder), ttl).await.0? {
            return Ok(self.grant(name, keys, (secret, holder), ttl, start));
        }
        // The first round counts: `retry_count` 1 is one round, and then nothing was queued.
        if self.out_of_time(1, deadline) {
            return Err(timed_out(name, started));
        }
        let queued = QueueGuard::new(
            &self.nodes[self.arbiter_of(&keys)],
            &keys,
            queue_member(&secret, None),
        );
        match self
            .wait(name, &keys, (&secret, &holder), ttl, deadline, started)
            .await
        {
            Ok(start) => {
                // The release leaves the arbiter's queue (a waiter it granted stays at the head).
                queued.keep();
                Ok(self.grant(name, keys, (secret, holder), ttl, start))
            }
            Err(e) => {
                queued.leave().await;
                Err(e)
            }
        }
    }

    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let deadline = Instant::now() + self.options.node_timeout;
        distlock_api::renew_as_batch(self, key, ttl, deadline).await
    }

    /// One batched renewal per node (concurrently, each node by `deadline` and its own
    /// timeout), then a majority count per lease.
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        let per_node = join_all(self.nodes.iter().map(|n| async move {
            let keys: Vec<GrantKey> = batch
                .iter()
                .map(|(k, _)| GrantKey {
                    resource: n.keys(&k.name).lock.into(),
                    ..(*k).clone()
                })
                .collect();
            let items: Vec<(&GrantKey, Duration)> = keys
                .iter()
                .zip(batch)
                .map(|(k, (_, ttl))| (k, *ttl))
                .collect();
            n.renew_batch(&items, deadline).await
        }))
        .await;
        (0..batch.len())
            .map(|i| self.tally(batch[i].1, per_node.iter().map(|answers| answers.get(i))))
            .collect()
    }

    async fn release(&self, key: &GrantKey) -> Result<bool> {
        Ok(self
            .release_all(
                &self.nodes[0].keys(&key.name),
                &key.secret,
                Waking::Holder,
                Some(&[]),
            )
            .await
            >= self.quorum())
    }

    /// Every node again, at once (all must answer, as at connect).
    async fn reconnect(&self) -> Result<Arc<dyn LockBackend>> {
        Ok(Arc::new(self.reconnected().await?))
    }

    /// Every node read at once: held while a majority holds (until the majority's shortest
    /// `PTTL` among the longest ones runs out), no token, by the holder a majority names (none
    /// when the nodes disagree, as in a split vote); the waiters queue on the arbiter.
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        let answers = join_all(self.nodes.iter().map(|n| n.inspect_lock(name))).await;
        let arbiter = self.arbiter(name);
        let mut left: Vec<Duration> = Vec::new();
        let mut named: Vec<HolderInfo> = Vec::new();
        let mut answered = 0;
        let mut waiters = 0;
        let mut failure = None;
        for (i, a) in answers.into_iter().enumerate() {
            match a {
                Ok(status) => {
                    answered += 1;
                    if i == arbiter {
                        waiters = status.waiters;
                    }
                    if let Some(h) = status.holder() {
                        left.push(h.expires_in.unwrap_or(Duration::MAX));
                        named.extend(h.holder.clone());
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        if answered < self.quorum()
            && let Some(e) = failure
        {
            return Err(e);
        }
        left.sort_unstable_by(|a, b| b.cmp(a));
        let holder = named
            .iter()
            .find(|h| named.iter().filter(|o| o == h).count() >= self.quorum())
            .cloned();
        Ok(LockStatus {
            holders: left
                .get(self.quorum() - 1)
                .map(|d| HolderStatus {
                    token: None,
                    expires_in: (*d != Duration::MAX).then_some(*d),
                    admission: Admission::Exclusive,
                    holder,
                })
                .into_iter()
                .collect(),
            waiters,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        // drift = 10 s x 0.01 + 2 ms = 102 ms
        assert_eq!(
            validity(TTL, Duration::from_millis(300), 0.01),
            Some(Duration::from_millis(9_598))
        );
        assert_eq!(
            validity(TTL, Duration::ZERO, 0.0),
            Some(Duration::from_millis(9_998))
        );
    }

    #[test]
    fn no_validity_once_elapsed_and_drift_eat_the_ttl() {
        assert_eq!(validity(TTL, Duration::from_millis(9_898), 0.01), None);
        assert_eq!(validity(TTL, Duration::from_secs(11), 0.01), None);
        assert!(validity(TTL, Duration::from_millis(9_897), 0.01).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_between_the_last_reply_and_the_check_shortens_or_voids_the_lease() {
        let start = Instant::now();
        // Replies came back after 40 ms, then the client was paused (GC, SIGSTOP) for 6 s
        // before it checked the quorum: the check must count the pause.
        tokio::time::advance(Duration::from_millis(40)).await;
        tokio::time::advance(Duration::from_secs(6)).await;
        let v = validity(TTL, start.elapsed(), 0.01).expect("some validity left");
        assert_eq!(v, Duration::from_millis(3_858));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            validity(TTL, start.elapsed(), 0.01),
            None,
            "a longer pause voids the lease"
        );
    }
}
