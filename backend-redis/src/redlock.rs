//! Redlock over N independent Redis masters, on the single-instance scripts.
//!
//! * **Acquire**: a plain `SET <lock> <secret>:0 NX PX <ttl>` on every node in parallel (no
//!   script: no token, no queue), each with a short timeout; success iff a majority (N/2 + 1) granted *and* the validity
//!   `TTL - elapsed - (TTL x drift_factor + 2 ms)` is still positive, with `elapsed` measured on
//!   the monotonic clock from before the first request was sent. The lease's local deadline is
//!   exactly that validity.
//! * **Failure**: release on *all* nodes, including those that did not answer (they may have
//!   granted after their timeout), then retry after a random delay or at a release message
//!   (the woken waiters' starts spread by how many listen), up to the caller's deadline
//!   and `retry_count` rounds. A retry asks the name's *arbiter* node first (one node chosen by
//!   the name's key slot) and the others only once it granted: of the waiters one release wakes,
//!   one wins the arbiter, so they no longer split the votes and go round again together. The
//!   grant still needs the same majority and validity (counted from before the arbiter's
//!   request); the arbiter's winner asks the nodes that refused again a few times, briefly,
//!   before it lets go. Once the arbiter fails to answer, that round is decided by the other
//!   nodes and the acquire goes back to parallel rounds.
//! * **Wake-ups**: only the arbiter announces a release (one message per waiter, not one per
//!   node): a holder's release always, a failed attempt's clean-up only when it freed the
//!   arbiter, and not a winner's that other nodes still refused (their owner will).
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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Capabilities, Fencing, Grant, GrantKey, Guarantee, LockBackend, LockError, LockName,
    OwnerSecret, Reentrancy, Renewal, Result, Wakeup,
};
use futures_util::future::{join_all, select_all};
use rand::Rng;
use tokio::time::Instant;

use crate::backend::{Ask, Attempt, RedisBackend, Tell};
use crate::config::{RedisOptions, RedlockOptions};
use crate::keys::{LockKeys, slot};

/// What Redlock declares: efficiency grade, no fencing token, not FIFO, client-side
/// re-entrancy, millisecond TTLs, release messages (from the name's arbiter node, from the
/// others when it is down; a random back-off as the fallback).
pub const REDLOCK_CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Efficiency,
    fencing: Fencing::None,
    fifo: false,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_millis(1),
    min_ttl: Duration::from_millis(10),
    wakeup: Wakeup::PubSub,
};

/// How far apart, per competing waiter, the waiters a release wakes together start their next
/// round. Too close and they reach the arbiter all at once (64 woken waiters cost the 2-core
/// bench machine ~0.4 ms before the winner's answer) or, when it does not answer, split the
/// votes; too far and the earliest starts late. On 3 local masters, 8 clients on one name made
/// 1 200-1 400 hand-overs/s with the wake-ups spread over 5 ms and ~380/s over 50 ms (before
/// the arbiter). With the arbiter, 64 clients measured no better p50 at 0-0.1 ms per waiter
/// than at this value.
const SPREAD_PER_WAITER: Duration = Duration::from_micros(700);

/// How many more times a waiter holding the arbiter asks the nodes that refused: enough for a
/// release sent to every node at once to have landed everywhere (3 local masters on 2 cores),
/// few enough that a real holder of those nodes costs ~1 ms.
const ARBITER_HOLD_RETRIES: usize = 3;
/// The pause before each of those asks: a few round trips, short against any lock's TTL.
const ARBITER_HOLD_PAUSE: Duration = Duration::from_micros(300);

/// Whom a Redlock release wakes (through the name's arbiter; see `release_all`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waking {
    /// A holder's release: the waiters, always (if the arbiter held no key of ours it is
    /// told to announce all the same; if it does not answer, the others announce it).
    Holder,
    /// A failed attempt's clean-up: the waiters if it freed the arbiter (they may have found
    /// it taken by us).
    Attempt,
    /// A waiter that held the arbiter while nodes another owner holds refused it: nobody.
    Nobody,
}

/// The answers of the nodes one round asked.
#[derive(Default)]
struct Tally {
    granted: usize,
    /// The nodes that answered "held by another owner".
    refused: Vec<usize>,
    /// The nodes that did not answer in time.
    errors: usize,
}

/// The validity left of a lease of `ttl` whose acquire took `elapsed` (from before the first
/// request to after the last answer and the quorum check), or `None` when nothing is left.
pub fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    let drift = ttl.mul_f64(drift_factor) + Duration::from_millis(2);
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
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
            nodes.push(
                RedisBackend::connect(url, node_options.clone())
                    .await?
                    .announcing_releases(),
            );
        }
        Ok(RedlockBackend {
            nodes: Arc::new(nodes),
            options,
        })
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// One round on all nodes. `Ok(true)`: granted with validity left; `Ok(false)`: refused
    /// (everything we got was released again).
    async fn round(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
        ttl: Duration,
    ) -> Result<(bool, Instant)> {
        let start = Instant::now();
        self.vote(name, secret, ttl, start, 0, None).await
    }

    /// A waiter's round: the name's arbiter node first, the others only once it granted. Of the
    /// waiters a release wakes together, exactly one wins the arbiter, so the others do not
    /// split the votes and it takes a majority unless a newcomer's parallel round got there
    /// first. The flag says whether the arbiter answered; when it did not, the other nodes
    /// decide this round without it (its attempt guard is releasing whatever it may have set,
    /// and a `SET` of ours sent there now could land before that release and be deleted by it).
    async fn arbitrated_round(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
        ttl: Duration,
    ) -> (Result<(bool, Instant)>, bool) {
        let start = Instant::now();
        let keys = self.nodes[0].keys(name);
        let arbiter = self.arbiter_of(&keys);
        match self.nodes[arbiter]
            .attempt(&keys, secret, ttl, Ask::Plain)
            .await
        {
            // Nothing was set anywhere: nothing to release.
            Ok(Attempt::Busy { .. }) => (Ok((false, start)), true),
            Ok(Attempt::Granted(_)) => (
                self.hold_arbiter(name, secret, ttl, start, arbiter).await,
                true,
            ),
            Err(_) => {
                let rest = self.vote(name, secret, ttl, start, 0, Some(arbiter)).await;
                (rest, false)
            }
        }
    }

    /// With the arbiter granted: asks the others, and asks the ones that refused again, a few
    /// times and briefly, while holding it. The release that woke us was announced by the
    /// arbiter alone, so the others may not have processed their part of it yet; no other
    /// waiter can win the arbiter meanwhile, and a newcomer that took a majority without it
    /// wins as it should (we then release everything).
    async fn hold_arbiter(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
        ttl: Duration,
        start: Instant,
        arbiter: usize,
    ) -> Result<(bool, Instant)> {
        let mut granted = 1;
        let mut errors = 0;
        let mut ask: Vec<usize> = (0..self.nodes.len()).filter(|i| *i != arbiter).collect();
        for round in 0..=ARBITER_HOLD_RETRIES {
            if round > 0 {
                tokio::time::sleep(ARBITER_HOLD_PAUSE).await;
            }
            let tally = self.ask(name, secret, ttl, ask.iter().copied()).await;
            granted += tally.granted;
            errors += tally.errors;
            let valid = validity(ttl, start.elapsed(), self.options.drift_factor).is_some();
            if granted >= self.quorum() && valid {
                return Ok((true, start));
            }
            ask = tally.refused;
            if !valid || ask.is_empty() || granted + ask.len() < self.quorum() {
                break;
            }
        }
        // Still refused by nodes another owner holds: that owner's release will wake the
        // waiters; waking them now (they found the arbiter taken by us) would only start them
        // round again while it holds.
        let waking = if ask.is_empty() {
            Waking::Attempt
        } else {
            Waking::Nobody
        };
        self.refused(name, secret, start, errors, waking).await
    }

    /// The index (in the order the nodes were given) of the node that orders `name`'s waiters:
    /// their retries ask it first (see the module docs). Chosen by the name's key slot, so no
    /// one node arbitrates every name; the same for every client with the same node list.
    pub fn arbiter(&self, name: &LockName) -> usize {
        self.arbiter_of(&self.nodes[0].keys(name))
    }

    fn arbiter_of(&self, keys: &LockKeys) -> usize {
        usize::from(slot(&keys.lock)) % self.nodes.len()
    }

    /// Asks `nodes` at once for `name` (a plain `SET NX PX` each) and counts their answers.
    async fn ask(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
        ttl: Duration,
        nodes: impl Iterator<Item = usize>,
    ) -> Tally {
        // Every node has the same key layout (one prefix for all): built once per round.
        let keys = self.nodes[0].keys(name);
        let answers = join_all(nodes.map(|i| {
            let (n, keys) = (&self.nodes[i], &keys);
            async move { (i, n.attempt(keys, secret, ttl, Ask::Plain).await) }
        }))
        .await;
        let mut tally = Tally::default();
        for (i, answer) in answers {
            match answer {
                Ok(Attempt::Granted(_)) => tally.granted += 1,
                Ok(Attempt::Busy { .. }) => tally.refused.push(i),
                Err(_) => tally.errors += 1,
            }
        }
        tally
    }

    /// Asks every node but `except` at once, counts them with the `granted` votes already won
    /// since `start`, and releases everywhere unless that makes a majority with validity left.
    async fn vote(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
        ttl: Duration,
        start: Instant,
        granted: usize,
        except: Option<usize>,
    ) -> Result<(bool, Instant)> {
        let asked = (0..self.nodes.len()).filter(|i| Some(*i) != except);
        let tally = self.ask(name, secret, ttl, asked).await;
        let ok = granted + tally.granted >= self.quorum()
            && validity(ttl, start.elapsed(), self.options.drift_factor).is_some();
        if ok {
            return Ok((true, start));
        }
        self.refused(name, secret, start, tally.errors, Waking::Attempt)
            .await
    }

    /// A round that did not grant: releases everywhere (waking as `waking` says); an error when
    /// a majority did not answer (nothing can grant then), else a plain refusal.
    async fn refused(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
        start: Instant,
        errors: usize,
        waking: Waking,
    ) -> Result<(bool, Instant)> {
        self.release_all(name, secret, waking).await;
        if errors >= self.quorum() {
            return Err(LockError::backend(
                "redlock",
                true,
                format!("{errors} of {} nodes failed to answer", self.nodes.len()),
            ));
        }
        Ok((false, start))
    }

    /// Releases on every node; returns how many deleted our key. Waiters are woken through the
    /// name's arbiter alone (one message per waiter, not one per node: their retries start
    /// there anyway), as `waking` says.
    async fn release_all(&self, name: &LockName, secret: &OwnerSecret, waking: Waking) -> usize {
        let keys = self.nodes[0].keys(name);
        let arbiter = self.arbiter_of(&keys);
        let released = join_all(self.nodes.iter().enumerate().map(|(i, n)| {
            let keys = &keys;
            let tell = if i == arbiter && waking != Waking::Nobody {
                Tell::Channel
            } else {
                Tell::Nobody
            };
            async move { n.release_telling(keys, secret, tell).await }
        }))
        .await;
        if waking == Waking::Holder {
            match released[arbiter] {
                // The script announced it.
                Ok(true) => {}
                // Granted without the arbiter: it announces all the same.
                Ok(false) => {
                    let _ = self.nodes[arbiter].announce_release(&keys).await;
                }
                // Silent arbiter: the others announce it.
                Err(_) => {
                    join_all(
                        self.nodes
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| *i != arbiter)
                            .map(|(_, n)| n.announce_release(&keys)),
                    )
                    .await;
                }
            }
        }
        released.iter().filter(|r| matches!(r, Ok(true))).count()
    }

    /// One lease's renewal over all nodes: renewed on a majority, lost when a majority refused.
    fn tally<'a>(
        &self,
        answers: impl Iterator<Item = Option<&'a Result<Renewal>>>,
    ) -> Result<Renewal> {
        let (mut renewed, mut refused) = (0, 0);
        for answer in answers {
            match answer {
                Some(Ok(Renewal::Renewed)) => renewed += 1,
                Some(Ok(Renewal::NotHeld)) => refused += 1,
                _ => {}
            }
        }
        if renewed >= self.quorum() {
            Ok(Renewal::Renewed)
        } else if refused > self.nodes.len() - self.quorum() {
            // A majority can no longer be ours: the lock is gone.
            Ok(Renewal::NotHeld)
        } else {
            Err(LockError::backend(
                "redlock",
                true,
                format!("only {renewed} of {} nodes extended", self.nodes.len()),
            ))
        }
    }

    /// How far apart the waiters woken by one release start: [`SPREAD_PER_WAITER`] per
    /// listener on the first node that answers, within 1 ms and `max` (the retry delay's
    /// minimum, also what is used when no node answers).
    async fn wake_spread(&self, name: &LockName, max: Duration) -> Duration {
        let first = self.arbiter(name);
        for i in 0..self.nodes.len() {
            let n = &self.nodes[(first + i) % self.nodes.len()];
            if let Ok(listeners) = n.listeners(&n.keys(name)).await {
                let per =
                    SPREAD_PER_WAITER.saturating_mul(u32::try_from(listeners).unwrap_or(u32::MAX));
                return per.clamp(Duration::from_millis(1).min(max), max);
            }
        }
        max
    }

    fn grant(&self, name: &LockName, secret: OwnerSecret, ttl: Duration, start: Instant) -> Grant {
        Grant {
            key: GrantKey {
                name: name.clone(),
                resource: self.nodes[0].keys(name).lock,
                secret,
            },
            // No token: per-node counters are not one sequence (see the module docs).
            token: None,
            ttl,
            sent_at: start,
            session: None,
        }
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
        let secret = OwnerSecret::random()?;
        match self.round(name, &secret, ttl).await? {
            (true, start) => Ok(self.grant(name, secret, ttl, start)),
            (false, _) => Err(LockError::Busy {
                name: name.to_string(),
            }),
        }
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        let secret = OwnerSecret::random()?;
        let started = Instant::now();
        // Release messages cut the random pause short; they come from the arbiter, or from the
        // others while it is down, so every node is listened to. A node that cannot subscribe
        // just does not wake us.
        let mut subs = Vec::new();
        for n in self.nodes.iter() {
            if let Ok(s) = n.subscribe_releases(&n.keys(name)).await {
                subs.push(s);
            }
        }
        let mut rounds = 0;
        // The first round goes to all nodes at once (an uncontended acquire is one round trip);
        // later ones go through the arbiter first, until it once fails to answer.
        let mut arbiter_answers = true;
        // Learned after the first refusal, so an uncontended acquire pays nothing for it.
        let mut spread = None;
        loop {
            // What was announced before this round is answered by it, so only a later release
            // may end the next wait (a release the others announced too adds no extra round).
            for s in &mut subs {
                s.mark_seen();
            }
            let outcome = if rounds > 0 && arbiter_answers {
                let (outcome, answered) = self.arbitrated_round(name, &secret, ttl).await;
                arbiter_answers = answered;
                outcome
            } else {
                self.round(name, &secret, ttl).await
            };
            if let (true, start) = outcome? {
                return Ok(self.grant(name, secret, ttl, start));
            }
            rounds += 1;
            if Instant::now() >= deadline || rounds >= self.options.retry_count.max(1) {
                break;
            }
            let (lo, hi) = self.options.retry_delay;
            let pause = rand::rng().random_range(lo..=hi);
            let spread = match spread {
                Some(s) => s,
                None => *spread.insert(self.wake_spread(name, lo).await),
            };
            let released = async {
                if subs.is_empty() {
                    std::future::pending::<()>().await;
                }
                select_all(subs.iter_mut().map(|s| Box::pin(s.released()))).await;
                // Spread the woken waiters: fewer reach the arbiter at once (and, without it,
                // fewer split the votes).
                let jitter = rand::rng().random_range(Duration::ZERO..=spread);
                tokio::time::sleep(jitter).await;
            };
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until((Instant::now() + pause).min(deadline)) => {}
            }
        }
        Err(LockError::Timeout {
            name: name.to_string(),
            waited: started.elapsed(),
        })
    }

    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        distlock_api::renew_as_batch(self, key, ttl).await
    }

    /// One batched renewal per node (concurrently), then a majority count per lease.
    async fn renew_batch(&self, batch: &[(&GrantKey, Duration)]) -> Vec<Result<Renewal>> {
        let per_node = join_all(self.nodes.iter().map(|n| async move {
            let keys: Vec<GrantKey> = batch
                .iter()
                .map(|(k, _)| GrantKey {
                    resource: n.keys(&k.name).lock,
                    ..(*k).clone()
                })
                .collect();
            let items: Vec<(&GrantKey, Duration)> = keys
                .iter()
                .zip(batch)
                .map(|(k, (_, ttl))| (k, *ttl))
                .collect();
            n.renew_batch(&items).await
        }))
        .await;
        (0..batch.len())
            .map(|i| self.tally(per_node.iter().map(|answers| answers.get(i))))
            .collect()
    }

    async fn release(&self, key: &GrantKey) -> Result<bool> {
        Ok(self
            .release_all(&key.name, &key.secret, Waking::Holder)
            .await
            >= self.quorum())
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
