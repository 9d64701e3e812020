//! The wait: a waiter queues on the name's arbiter node, holds its place there while its rounds
//! run, and is woken by releases (the arbiter's turn message, the others' announcements, a
//! spread back-off).

use std::time::Duration;

use distlock_api::{LockName, Result};
use futures_util::future::{join_all, select_all};
use rand::Rng;
use tokio::time::Instant;

use crate::keys::LockKeys;
use crate::notify::Subscription;
use crate::queue::{Ask, Attempt, WAITER_TTL, Who};

use super::vote::{RoundGuard, Tally};
use super::{RedlockBackend, Waking, timed_out, validity};

/// How far apart, per listening waiter, the waiters an announcement wakes together (while the
/// arbiter is silent) start their next round. Too close and they split the votes; too far and
/// the earliest starts late. On 3 local masters, 8 clients on one name made 1 200-1 400
/// hand-overs/s with the wake-ups spread over 5 ms and ~380/s over 50 ms.
const SPREAD_PER_WAITER: Duration = Duration::from_micros(700);

/// How many more times a waiter holding the arbiter asks the nodes that refused, each ask as
/// soon as the last one answered (a round trip apart: a timer would wait at least tokio's 1 ms
/// tick, which traced as the hand-over's p50 when a newcomer had to give the nodes back): enough
/// for a release sent to every node at once, or a newcomer's round and its give-back (two round
/// trips), to have landed everywhere; few enough that a real holder of those nodes costs only a
/// few round trips.
const ARBITER_HOLD_RETRIES: usize = 3;

impl RedlockBackend {
    /// A waiter's round through the name's arbiter, which keeps the waiters' queue: the arbiter
    /// first (joining the queue or keeping our place) and the others only once it granted, so
    /// waiters that retry together do not split the votes; or, `told` our turn by the arbiter,
    /// every node at once (the other waiters wait for their turn, so only a newcomer competes).
    /// The flag says whether the arbiter answered; when it did not, the other nodes decide this
    /// round without it (its attempt guard is releasing whatever it may have set, and a `SET` of
    /// ours sent there now could land before that release and be deleted by it).
    pub(super) async fn queued_round(
        &self,
        keys: &LockKeys,
        who: Who<'_>,
        ttl: Duration,
        told: bool,
    ) -> (Result<(bool, Instant)>, bool) {
        let start = Instant::now();
        let guard = RoundGuard::arm(self, keys, who.0);
        let outcome = self.queued_round_inner(keys, who, ttl, told, start).await;
        guard.disarm();
        outcome
    }

    pub(super) async fn queued_round_inner(
        &self,
        keys: &LockKeys,
        who: Who<'_>,
        ttl: Duration,
        told: bool,
        start: Instant,
    ) -> (Result<(bool, Instant)>, bool) {
        let arbiter = self.arbiter_of(keys);
        let queue = Ask::Arbiter {
            waiter_ttl: self.waiter_ttl(),
            waiting: true,
        };
        let ask_arbiter = self.nodes[arbiter].attempt(keys, who, ttl, queue);
        let (answer, others) = if told {
            let others = self.ask(keys, who, ttl, self.others(arbiter));
            let (answer, others) = tokio::join!(ask_arbiter, others);
            (answer, Some(others))
        } else {
            (ask_arbiter.await, None)
        };
        match answer {
            // Held (told our turn: by a newcomer) or promised to a waiter ahead of us: whatever
            // the others granted goes back, waking nobody (we keep our place; the holder's
            // release tells the head). (A limit mismatch needs a permit, which Redlock never
            // asks; the arbiter's script counts a foreign value as a holder: neither comes.)
            Ok(Attempt::Busy { .. } | Attempt::Mismatch { .. } | Attempt::Foreign) => {
                match others {
                    Some(t) if t.granted + t.silent.len() > 0 => (
                        self.refused(keys, who.0, start, &t.silent, Waking::Nobody)
                            .await,
                        true,
                    ),
                    _ => (Ok((false, start)), true),
                }
            }
            Ok(Attempt::Granted(_)) => (
                self.hold_arbiter(keys, who, ttl, start, arbiter, others)
                    .await,
                true,
            ),
            Err(_) => {
                let rest = match others {
                    Some(tally) => self.decide(keys, who.0, ttl, start, tally).await,
                    None => self.vote_without(keys, who, ttl, start, arbiter).await,
                };
                (rest, false)
            }
        }
    }

    /// With the arbiter granted: asks the others (unless `first` holds their answers already),
    /// and asks the ones that refused again, a few times and briefly, while holding it. The
    /// release that woke us was told by the arbiter alone, so the others may not have processed
    /// their part of it yet, and a newcomer's round may have taken them first (the arbiter's
    /// refusal makes it give them back); no other waiter can win the arbiter meanwhile. A
    /// newcomer whose ask the arbiter did not answer in time can still take a majority without
    /// it (we then release everything).
    pub(super) async fn hold_arbiter(
        &self,
        keys: &LockKeys,
        who: Who<'_>,
        ttl: Duration,
        start: Instant,
        arbiter: usize,
        first: Option<Tally>,
    ) -> Result<(bool, Instant)> {
        let mut granted = 1;
        let mut silent = Vec::new();
        let mut ask: Vec<usize> = self.others(arbiter).collect();
        let mut answered = first;
        for _ in 0..=ARBITER_HOLD_RETRIES {
            let tally = match answered.take() {
                Some(tally) => tally,
                None => self.ask(keys, who, ttl, ask.iter().copied()).await,
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
        self.refused(keys, who.0, start, &silent, waking).await
    }

    /// Every node but `arbiter`.
    pub(super) fn others(&self, arbiter: usize) -> impl Iterator<Item = usize> + use<> {
        (0..self.nodes.len()).filter(move |i| *i != arbiter)
    }

    /// How long the arbiter keeps a waiter in its queue without hearing from it: a waiter asks
    /// again at least every `retry_delay.1`, so it keeps its place unless it crashed.
    pub(super) fn waiter_ttl(&self) -> Duration {
        WAITER_TTL.max(self.options.retry_delay.1.saturating_mul(2))
    }

    /// How far apart the waiters woken by one announcement start: [`SPREAD_PER_WAITER`] per
    /// listener on the first node other than the arbiter that answers (the arbiter announces
    /// nothing), within 1 ms and `max` (the retry delay's minimum, also what is used when no
    /// node answers).
    pub(super) async fn wake_spread(&self, keys: &LockKeys, max: Duration) -> Duration {
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
    pub(super) async fn wait(
        &self,
        name: &LockName,
        keys: &LockKeys,
        who: Who<'_>,
        ttl: Duration,
        deadline: Instant,
        started: Instant,
    ) -> Result<Instant> {
        // The first round counts (see `acquire`).
        let mut rounds = 1;
        let arbiter = self.arbiter_of(keys);
        // Listening on the arbiter's node (its client's turn channel, subscribed once) before
        // the next round (at once) joins the queue, so a turn told since the first round is
        // kept. A node that cannot subscribe just does not wake us.
        let mut turn = self.nodes[arbiter].turn(who.0).await.ok();
        // The other nodes' announcements, listened to only once the arbiter is silent.
        let mut subs: Vec<Subscription> = Vec::new();
        let mut arbiter_answers = true;
        let mut told = false;
        // Learned at the first announcement, which only comes while the arbiter is silent.
        let mut spread = None;
        loop {
            // What was told or announced before this round is answered by it.
            if let Some(t) = turn.as_mut() {
                t.mark_seen();
            }
            for s in &mut subs {
                s.mark_seen();
            }
            // A round whose arbiter answered again brings the next back to its queue: there a
            // live head makes our parallel rounds give way, and we would never get a place.
            let (outcome, answered) = if arbiter_answers {
                self.queued_round(keys, who, ttl, told).await
            } else {
                self.round(keys, who, ttl).await
            };
            arbiter_answers = answered;
            if let (true, start) = outcome? {
                return Ok(start);
            }
            rounds += 1;
            if self.out_of_time(rounds, deadline) {
                return Err(timed_out(name, started));
            }
            if !arbiter_answers && subs.is_empty() {
                subs = join_all(
                    self.others(arbiter)
                        .map(|i| self.nodes[i].subscribe_releases(keys)),
                )
                .await
                .into_iter()
                .filter_map(Result::ok)
                .collect();
                // A release announced before these subscriptions is seen by the next round,
                // sent at once.
                if !subs.is_empty() {
                    continue;
                }
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
    pub(super) fn out_of_time(&self, rounds: u32, deadline: Instant) -> bool {
        Instant::now() >= deadline || self.options.retry_count.is_some_and(|n| rounds >= n.max(1))
    }
}
