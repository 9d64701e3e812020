//! Redlock over N independent Redis masters, on the single-instance scripts.
//!
//! * **Acquire**: a plain `SET <lock> <secret>:0 NX PX <ttl>` on every node in parallel (no
//!   script: no token, no queue), each with a short timeout; success iff a majority (N/2 + 1) granted *and* the validity
//!   `TTL - elapsed - (TTL x drift_factor + 2 ms)` is still positive, with `elapsed` measured on
//!   the monotonic clock from before the first request was sent. The lease's local deadline is
//!   exactly that validity.
//! * **Failure**: release on *all* nodes, including those that did not answer (they may have
//!   granted after their timeout), then wait in the name's queue on its *arbiter* (one node
//!   chosen by the name's key slot, which keeps the waiters' queue with the single-instance
//!   script) and retry when told our turn there or after a random delay, up to the caller's
//!   deadline and `retry_count` rounds. A retry asks the arbiter first (joining the queue or
//!   keeping our place) and the others only once it granted, so waiters never split the votes;
//!   the waiter told its turn asks every node at once (only a newcomer's first round competes).
//!   The grant still needs the same majority and validity (counted from before the arbiter's
//!   request); a waiter the arbiter granted asks the nodes that refused again a few times,
//!   briefly, before it lets go, and keeps the head of the queue until its release (or its
//!   lock's expiry, so a crashed holder does not hold the queue up longer). Once the
//!   arbiter fails to answer, that round is decided by the other nodes and the acquire goes
//!   back to parallel rounds, woken by the others' release announcements (spread by how many
//!   listen).
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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, Grant, GrantKey, Guarantee, HolderStatus, LockBackend,
    LockError, LockName, LockStatus, OwnerSecret, Reentrancy, Renewal, Result, Wakeup,
};
use futures_util::future::{join_all, select_all};
use rand::Rng;
use tokio::time::Instant;

use crate::client::RedisBackend;
use crate::config::{RedisOptions, RedlockOptions};
use crate::keys::{LockKeys, slot};
use crate::notify::Subscription;
use crate::queue::{Ask, Attempt, QueueGuard, WAITER_TTL, queue_member};
use crate::release::{Sent, Tell};

/// What Redlock declares: efficiency grade, no fencing token, not FIFO (waiters queue on the
/// name's arbiter, but a newcomer's first round can win before the head), client-side
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
};

/// How far apart, per listening waiter, the waiters an announcement wakes together (while the
/// arbiter is silent) start their next round. Too close and they split the votes; too far and
/// the earliest starts late. On 3 local masters, 8 clients on one name made 1 200-1 400
/// hand-overs/s with the wake-ups spread over 5 ms and ~380/s over 50 ms.
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
}

/// The answers of the nodes one round asked.
#[derive(Default)]
struct Tally {
    granted: usize,
    /// The nodes that answered "held by another owner".
    refused: Vec<usize>,
    /// The nodes that did not answer in time (their `SET` may still land).
    silent: Vec<usize>,
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

/// The acquire of `name`, started at `started`, ran out of time or rounds.
fn timed_out(name: &LockName, started: Instant) -> LockError {
    LockError::Timeout {
        name: name.to_string(),
        waited: started.elapsed(),
    }
}

/// Armed while a round is in flight: each node's own guard disarms as soon as that node
/// answered, so an acquire dropped after some nodes granted (and before the round released or
/// returned them) would leave their keys for the whole TTL, the lock taken by nobody. Dropped
/// armed, it releases on every node in the background (compare-and-delete: harmless where
/// nothing of ours is left).
struct RoundGuard<'a> {
    backend: &'a RedlockBackend,
    keys: &'a LockKeys,
    secret: &'a OwnerSecret,
    armed: bool,
}

impl<'a> RoundGuard<'a> {
    fn arm(backend: &'a RedlockBackend, keys: &'a LockKeys, secret: &'a OwnerSecret) -> Self {
        RoundGuard {
            backend,
            keys,
            secret,
            armed: true,
        }
    }

    /// The round ended: it granted (the caller owns the keys now) or released what it got.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for RoundGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (b, k, s) = (self.backend.clone(), self.keys.clone(), self.secret.clone());
            rt.spawn(async move {
                b.release_all(&k, &s, Waking::Attempt, None).await;
            });
        }
    }
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

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// One round on all nodes. `Ok(true)`: granted with validity left; `Ok(false)`: refused
    /// (everything we got was released again).
    async fn round(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
    ) -> Result<(bool, Instant)> {
        let start = Instant::now();
        let guard = RoundGuard::arm(self, keys, secret);
        let outcome = self.vote(keys, secret, ttl, start, None).await;
        guard.disarm();
        outcome
    }

    /// A waiter's round through the name's arbiter, which keeps the waiters' queue: the arbiter
    /// first (joining the queue or keeping our place) and the others only once it granted, so
    /// waiters that retry together do not split the votes; or, `told` our turn by the arbiter,
    /// every node at once (the other waiters wait for their turn, so only a newcomer competes).
    /// The flag says whether the arbiter answered; when it did not, the other nodes decide this
    /// round without it (its attempt guard is releasing whatever it may have set, and a `SET` of
    /// ours sent there now could land before that release and be deleted by it).
    async fn queued_round(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        told: bool,
    ) -> (Result<(bool, Instant)>, bool) {
        let start = Instant::now();
        let guard = RoundGuard::arm(self, keys, secret);
        let outcome = self
            .queued_round_inner(keys, secret, ttl, told, start)
            .await;
        guard.disarm();
        outcome
    }

    async fn queued_round_inner(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        told: bool,
        start: Instant,
    ) -> (Result<(bool, Instant)>, bool) {
        let arbiter = self.arbiter_of(keys);
        let queue = Ask::Arbiter {
            waiter_ttl: self.waiter_ttl(),
        };
        let ask_arbiter = self.nodes[arbiter].attempt(keys, secret, ttl, queue);
        let (answer, others) = if told {
            let others = self.ask(keys, secret, ttl, self.others(arbiter));
            let (answer, others) = tokio::join!(ask_arbiter, others);
            (answer, Some(others))
        } else {
            (ask_arbiter.await, None)
        };
        match answer {
            // Held (told our turn: by a newcomer) or promised to a waiter ahead of us: whatever
            // the others granted goes back, waking nobody (we keep our place; the holder's
            // release tells the head). (A limit mismatch needs a permit: Redlock asks none.)
            Ok(Attempt::Busy { .. } | Attempt::Mismatch { .. }) => match others {
                Some(t) if t.granted + t.silent.len() > 0 => (
                    self.refused(keys, secret, start, &t.silent, Waking::Nobody)
                        .await,
                    true,
                ),
                _ => (Ok((false, start)), true),
            },
            Ok(Attempt::Granted(_)) => (
                self.hold_arbiter(keys, secret, ttl, start, arbiter, others)
                    .await,
                true,
            ),
            Err(_) => {
                let rest = match others {
                    Some(tally) => self.decide(keys, secret, ttl, start, tally).await,
                    None => self.vote(keys, secret, ttl, start, Some(arbiter)).await,
                };
                (rest, false)
            }
        }
    }

    /// With the arbiter granted: asks the others (unless `first` holds their answers already),
    /// and asks the ones that refused again, a few times and briefly, while holding it. The
    /// release that woke us was told by the arbiter alone, so the others may not have processed
    /// their part of it yet; no other waiter can win the arbiter meanwhile, and a newcomer that
    /// took a majority without it wins as it should (we then release everything).
    async fn hold_arbiter(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        start: Instant,
        arbiter: usize,
        first: Option<Tally>,
    ) -> Result<(bool, Instant)> {
        let mut granted = 1;
        let mut silent = Vec::new();
        let mut ask: Vec<usize> = self.others(arbiter).collect();
        let mut answered = first;
        for round in 0..=ARBITER_HOLD_RETRIES {
            let tally = match answered.take() {
                Some(tally) => tally,
                None => {
                    if round > 0 {
                        tokio::time::sleep(ARBITER_HOLD_PAUSE).await;
                    }
                    self.ask(keys, secret, ttl, ask.iter().copied()).await
                }
            };
            granted += tally.granted;
            silent.extend(tally.silent);
            let valid = validity(ttl, start.elapsed(), self.options.drift_factor).is_some();
            if granted >= self.quorum() && valid {
                return Ok((true, start));
            }
            ask = tally.refused;
            if !valid || ask.is_empty() || granted + ask.len() < self.quorum() {
                break;
            }
        }
        // Still refused by nodes another owner holds: that owner's release will tell the
        // arbiter's queue, at whose head we stay; telling it now would only wake us again
        // while that owner holds.
        let waking = if ask.is_empty() {
            Waking::Attempt
        } else {
            Waking::Nobody
        };
        self.refused(keys, secret, start, &silent, waking).await
    }

    /// Every node but `arbiter`.
    fn others(&self, arbiter: usize) -> impl Iterator<Item = usize> + use<> {
        (0..self.nodes.len()).filter(move |i| *i != arbiter)
    }

    /// How long the arbiter keeps a waiter in its queue without hearing from it: a waiter asks
    /// again at least every `retry_delay.1`, so it keeps its place unless it crashed.
    fn waiter_ttl(&self) -> Duration {
        WAITER_TTL.max(self.options.retry_delay.1.saturating_mul(2))
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

    /// Asks `nodes` at once for the lock of `keys` (a plain `SET NX PX` each) and counts their
    /// answers.
    async fn ask(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        nodes: impl Iterator<Item = usize>,
    ) -> Tally {
        let answers = join_all(nodes.map(|i| {
            let n = &self.nodes[i];
            async move { (i, n.attempt(keys, secret, ttl, Ask::Plain).await) }
        }))
        .await;
        let mut tally = Tally::default();
        for (i, answer) in answers {
            match answer {
                Ok(Attempt::Granted(_)) => tally.granted += 1,
                Ok(Attempt::Busy { .. } | Attempt::Mismatch { .. }) => tally.refused.push(i),
                Err(_) => tally.silent.push(i),
            }
        }
        tally
    }

    /// Asks every node but `except` at once, and releases everywhere unless that makes a
    /// majority with validity left since `start`.
    async fn vote(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        start: Instant,
        except: Option<usize>,
    ) -> Result<(bool, Instant)> {
        let asked = (0..self.nodes.len()).filter(|i| Some(*i) != except);
        let tally = self.ask(keys, secret, ttl, asked).await;
        self.decide(keys, secret, ttl, start, tally).await
    }

    /// Grants on a majority with validity left since `start`; else releases everywhere.
    async fn decide(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        start: Instant,
        tally: Tally,
    ) -> Result<(bool, Instant)> {
        let ok = tally.granted >= self.quorum()
            && validity(ttl, start.elapsed(), self.options.drift_factor).is_some();
        if ok {
            return Ok((true, start));
        }
        self.refused(keys, secret, start, &tally.silent, Waking::Attempt)
            .await
    }

    /// A round that did not grant: releases everywhere (waking as `waking` says); an error when
    /// a majority did not answer (nothing can grant then), else a plain refusal.
    async fn refused(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        start: Instant,
        silent: &[usize],
        waking: Waking,
    ) -> Result<(bool, Instant)> {
        self.release_all(keys, secret, waking, Some(silent)).await;
        if silent.len() >= self.quorum() {
            return Err(LockError::backend(
                "redlock",
                true,
                format!(
                    "{} of {} nodes failed to answer",
                    silent.len(),
                    self.nodes.len()
                ),
            ));
        }
        Ok((false, start))
    }

    /// Releases on every node; returns how many deleted our key. Waiters are told through the
    /// name's arbiter, whose queue holds them (one message to the head per release), as
    /// `waking` says. The release goes by hash, but with the script's source to the nodes in
    /// `unsure` (all of them when `None`): nodes whose `SET` of ours may still be in flight, so
    /// its clean-up must run behind it whenever the node gets to it, even with no caller left
    /// to resend it after a `NOSCRIPT`.
    async fn release_all(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        waking: Waking,
        unsure: Option<&[usize]>,
    ) -> usize {
        let arbiter = self.arbiter_of(keys);
        let released = join_all(self.nodes.iter().enumerate().map(|(i, n)| {
            let keys = &keys;
            let tell = match waking {
                _ if i != arbiter => Tell::Nobody,
                Waking::Holder => Tell::LeaveQueue,
                Waking::Attempt => Tell::QueueHead,
                Waking::Nobody => Tell::Nobody,
            };
            let sent = match unsure {
                Some(nodes) if !nodes.contains(&i) => Sent::Hash,
                _ => Sent::Source,
            };
            async move { n.release_telling(keys, secret, tell, sent).await }
        }))
        .await;
        if waking == Waking::Holder {
            match released[arbiter] {
                // The script told the queue's head.
                Ok(true) => {}
                // Granted without the arbiter: we may still be in its queue; leaving it tells
                // the head if the arbiter is free.
                Ok(false) => {
                    self.nodes[arbiter]
                        .leave_queue(keys, &queue_member(secret, None))
                        .await
                }
                // Silent arbiter: the others announce it to every waiter.
                Err(_) => {
                    join_all(
                        self.others(arbiter)
                            .map(|i| self.nodes[i].announce_release(keys)),
                    )
                    .await;
                }
            }
        }
        released.iter().filter(|r| matches!(r, Ok(true))).count()
    }

    /// One lease's renewal of `ttl` over all nodes: renewed on a majority, lost when a majority
    /// refused.
    fn tally<'a>(
        &self,
        ttl: Duration,
        answers: impl Iterator<Item = Option<&'a Result<Renewal>>>,
    ) -> Result<Renewal> {
        let (mut renewed, mut refused) = (0, 0);
        for answer in answers {
            match answer {
                Some(Ok(Renewal::Renewed { .. })) => renewed += 1,
                Some(Ok(Renewal::NotHeld)) => refused += 1,
                _ => {}
            }
        }
        if renewed >= self.quorum() {
            Ok(Renewal::Renewed { ttl })
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

    /// How far apart the waiters woken by one announcement start: [`SPREAD_PER_WAITER`] per
    /// listener on the first node other than the arbiter that answers (the arbiter announces
    /// nothing), within 1 ms and `max` (the retry delay's minimum, also what is used when no
    /// node answers).
    async fn wake_spread(&self, keys: &LockKeys, max: Duration) -> Duration {
        for i in self.others(self.arbiter_of(keys)) {
            if let Ok(listeners) = self.nodes[i].listeners(keys).await {
                let per =
                    SPREAD_PER_WAITER.saturating_mul(u32::try_from(listeners).unwrap_or(u32::MAX));
                return per.clamp(Duration::from_millis(1).min(max), max);
            }
        }
        max
    }

    /// An acquire's rounds after a refused first one, until one grants (its start returned),
    /// the deadline or `retry_count`. Between rounds the waiter sits in the arbiter's queue until
    /// told its turn there (or, while the arbiter is silent, a release is announced by the
    /// others), asking again at the latest after the random retry delay.
    async fn wait(
        &self,
        name: &LockName,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        deadline: Instant,
        started: Instant,
    ) -> Result<Instant> {
        // The first round counts (see `acquire`).
        let mut rounds = 1;
        let arbiter = self.arbiter_of(keys);
        // Subscribed before the next round (at once) joins the queue, so a turn told since the
        // first round is kept. A node that cannot subscribe just does not wake us.
        let (turn, announced) = tokio::join!(
            self.nodes[arbiter].subscribe_turn(keys, secret),
            join_all(
                self.others(arbiter)
                    .map(|i| self.nodes[i].subscribe_releases(keys))
            ),
        );
        let mut turn = turn.ok();
        let mut subs: Vec<Subscription> = announced.into_iter().filter_map(Result::ok).collect();
        let mut arbiter_answers = true;
        let mut told = false;
        // Learned at the first announcement, which only comes while the arbiter is silent.
        let mut spread = None;
        loop {
            // What was told or announced before this round is answered by it.
            for s in turn.iter_mut().chain(subs.iter_mut()) {
                s.mark_seen();
            }
            let outcome = if arbiter_answers {
                let (outcome, answered) = self.queued_round(keys, secret, ttl, told).await;
                arbiter_answers = answered;
                outcome
            } else {
                self.round(keys, secret, ttl).await
            };
            if let (true, start) = outcome? {
                return Ok(start);
            }
            rounds += 1;
            if self.out_of_time(rounds, deadline) {
                return Err(timed_out(name, started));
            }
            let (lo, hi) = self.options.retry_delay;
            let pause = rand::rng().random_range(lo..=hi);
            let my_turn = async {
                match turn.as_mut() {
                    Some(t) => t.released().await,
                    None => std::future::pending().await,
                }
            };
            let released = async {
                if subs.is_empty() {
                    std::future::pending::<()>().await;
                }
                select_all(subs.iter_mut().map(|s| Box::pin(s.released()))).await;
            };
            told = false;
            tokio::select! {
                _ = my_turn => told = true,
                _ = released => {
                    // Every waiter heard it: spread their starts, so fewer split the votes.
                    let spread = match spread {
                        Some(s) => s,
                        None => *spread.insert(self.wake_spread(keys, lo).await),
                    };
                    let jitter = rand::rng().random_range(Duration::ZERO..=spread);
                    tokio::time::sleep_until((Instant::now() + jitter).min(deadline)).await;
                }
                _ = tokio::time::sleep_until((Instant::now() + pause).min(deadline)) => {}
            }
        }
    }

    /// Whether an acquire that made `rounds` rounds stops: past its deadline or `retry_count`.
    fn out_of_time(&self, rounds: u32, deadline: Instant) -> bool {
        Instant::now() >= deadline || self.options.retry_count.is_some_and(|n| rounds >= n.max(1))
    }

    fn grant(
        &self,
        name: &LockName,
        keys: LockKeys,
        secret: OwnerSecret,
        ttl: Duration,
        start: Instant,
    ) -> Grant {
        Grant {
            key: GrantKey {
                name: name.clone(),
                resource: keys.lock,
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
        // Every node has the same key layout (one prefix for all): built once per acquire.
        let keys = self.nodes[0].keys(name);
        match self.round(&keys, &secret, ttl).await? {
            (true, start) => Ok(self.grant(name, keys, secret, ttl, start)),
            (false, _) => Err(LockError::Busy {
                name: name.to_string(),
            }),
        }
    }

    async fn acquire(&self, name: &LockName, ttl: Duration, deadline: Instant) -> Result<Grant> {
        let secret = OwnerSecret::random()?;
        let started = Instant::now();
        let keys = self.nodes[0].keys(name);
        // The first round goes to all nodes at once: an uncontended acquire is one round trip
        // and subscribes to nothing.
        if let (true, start) = self.round(&keys, &secret, ttl).await? {
            return Ok(self.grant(name, keys, secret, ttl, start));
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
            .wait(name, &keys, &secret, ttl, deadline, started)
            .await
        {
            Ok(start) => {
                // The release leaves the arbiter's queue (a waiter it granted stays at the head).
                queued.keep();
                Ok(self.grant(name, keys, secret, ttl, start))
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
                    resource: n.keys(&k.name).lock,
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

    /// Every node read at once: held while a majority holds (until the majority's shortest
    /// `PTTL` among the longest ones runs out), no token; the waiters queue on the arbiter.
    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        let answers = join_all(self.nodes.iter().map(|n| n.inspect_lock(name))).await;
        let arbiter = self.arbiter(name);
        let mut left: Vec<Duration> = Vec::new();
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
        Ok(LockStatus {
            holders: left
                .get(self.quorum() - 1)
                .map(|d| HolderStatus {
                    token: None,
                    expires_in: (*d != Duration::MAX).then_some(*d),
                    admission: Admission::Exclusive,
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
