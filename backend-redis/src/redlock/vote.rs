//! One round of votes: the ask to every node at once, the tally against the quorum and the
//! validity left, and the release of a round that did not win (or was dropped mid-way).

use std::time::Duration;

use distlock_api::{LastChance, LockError, OwnerSecret, Renewal, Result};
use futures_util::future::join_all;
use tokio::time::Instant;

use crate::keys::LockKeys;
use crate::queue::{Ask, Attempt, PROMISED, Who, queue_member};
use crate::release::{Sent, Tell};

use super::{RedlockBackend, Waking, validity};

/// The answers of the nodes one round asked.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) granted: usize,
    /// The nodes that answered "held by another owner".
    pub(super) refused: Vec<usize>,
    /// The nodes that did not answer in time (their `SET` may still land).
    pub(super) silent: Vec<usize>,
    /// The name's arbiter refused for the live waiter at the head of its queue (the lock there
    /// free or that waiter's): the round gives back whatever the others granted, a majority
    /// included (the queue decides who is next).
    pub(super) promised: bool,
}

/// Armed while a round is in flight: each node's own guard disarms as soon as that node
/// answered, so an acquire dropped after some nodes granted (and before the round released or
/// returned them) would leave their keys for the whole TTL, the lock taken by nobody. Dropped
/// armed, it releases on every node in the background (compare-and-delete: harmless where
/// nothing of ours is left), through new connections when its runtime ended first.
pub(super) struct RoundGuard<'a> {
    backend: &'a RedlockBackend,
    keys: &'a LockKeys,
    secret: &'a OwnerSecret,
    armed: bool,
}

impl<'a> RoundGuard<'a> {
    pub(super) fn arm(
        backend: &'a RedlockBackend,
        keys: &'a LockKeys,
        secret: &'a OwnerSecret,
    ) -> Self {
        RoundGuard {
            backend,
            keys,
            secret,
            armed: true,
        }
    }

    /// The round ended: it granted (the caller owns the keys now) or released what it got.
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for RoundGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (b, k, s) = (self.backend.clone(), self.keys.clone(), self.secret.clone());
        let now = {
            let (b, k, s) = (b.clone(), k.clone(), s.clone());
            async move { b.release_all(&k, &s, Waking::Attempt, None).await }
        };
        LastChance::spawn(now, b, move |fresh| async move {
            fresh.release_all(&k, &s, Waking::Attempt, None).await;
            true
        });
    }
}

impl RedlockBackend {
    pub(super) fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// One round on all nodes. `Ok(true)`: granted with validity left; `Ok(false)`: refused
    /// (everything we got was released again). The flag says whether the name's arbiter
    /// answered.
    pub(super) async fn round(
        &self,
        keys: &LockKeys,
        who: Who<'_>,
        ttl: Duration,
    ) -> (Result<(bool, Instant)>, bool) {
        let start = Instant::now();
        let guard = RoundGuard::arm(self, keys, who.0);
        let tally = self.ask(keys, who, ttl, 0..self.nodes.len()).await;
        let answered = !tally.silent.contains(&self.arbiter_of(keys));
        let outcome = self.decide(keys, who.0, ttl, start, tally).await;
        guard.disarm();
        (outcome, answered)
    }

    /// Asks `nodes` at once for the lock of `keys` (a plain `SET NX PX` each; on the name's
    /// arbiter, the acquire script without joining its queue) and counts their answers.
    pub(super) async fn ask(
        &self,
        keys: &LockKeys,
        who: Who<'_>,
        ttl: Duration,
        nodes: impl Iterator<Item = usize>,
    ) -> Tally {
        let arbiter = self.arbiter_of(keys);
        let answers = join_all(nodes.map(|i| {
            let n = &self.nodes[i];
            let ask = if i == arbiter {
                Ask::Arbiter {
                    waiter_ttl: self.waiter_ttl(),
                    waiting: false,
                }
            } else {
                Ask::Plain
            };
            async move { (i, n.attempt(keys, who, ttl, ask).await) }
        }))
        .await;
        let mut tally = Tally::default();
        for (i, answer) in answers {
            match answer {
                Ok(Attempt::Granted(_)) => tally.granted += 1,
                Ok(Attempt::Busy { pttl_ms: PROMISED }) => {
                    tally.promised = true;
                    tally.refused.push(i)
                }
                Ok(Attempt::Busy { .. } | Attempt::Mismatch { .. } | Attempt::Foreign) => {
                    tally.refused.push(i)
                }
                Err(_) => tally.silent.push(i),
            }
        }
        tally
    }

    /// Asks every node but the silent arbiter at once, and releases everywhere unless that
    /// makes a majority with validity left since `start`.
    pub(super) async fn vote_without(
        &self,
        keys: &LockKeys,
        who: Who<'_>,
        ttl: Duration,
        start: Instant,
        arbiter: usize,
    ) -> Result<(bool, Instant)> {
        let tally = self.ask(keys, who, ttl, self.others(arbiter)).await;
        self.decide(keys, who.0, ttl, start, tally).await
    }

    /// Grants on a majority with validity left since `start`, unless the arbiter's queue
    /// promised the lock to another waiter; else releases everywhere.
    pub(super) async fn decide(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        ttl: Duration,
        start: Instant,
        tally: Tally,
    ) -> Result<(bool, Instant)> {
        let ok = !tally.promised
            && tally.granted >= self.quorum()
            && validity(ttl, start.elapsed(), self.options.drift_factor).is_some();
        if ok {
            return Ok((true, start));
        }
        let waking = if tally.promised {
            Waking::Promised
        } else {
            Waking::Attempt
        };
        self.refused(keys, secret, start, &tally.silent, waking)
            .await
    }

    /// A round that did not grant: releases everywhere (waking as `waking` says); an error when
    /// a majority did not answer (nothing can grant then), else a plain refusal.
    pub(super) async fn refused(
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
    pub(super) async fn release_all(
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
                Waking::Nobody | Waking::Promised => Tell::Nobody,
            };
            let sent = match unsure {
                Some(nodes) if !nodes.contains(&i) => Sent::Hash,
                _ => Sent::Source,
            };
            async move {
                // Refused there for its queue's head: nothing of ours to delete (leaving its
                // queue, below, tells the head).
                if i == arbiter && waking == Waking::Promised {
                    return Ok(false);
                }
                n.release_telling(keys, secret, tell, sent).await
            }
        }))
        .await;
        if matches!(waking, Waking::Holder | Waking::Promised) {
            match released[arbiter] {
                // The script told the queue's head.
                Ok(true) => {}
                // Granted without the arbiter: we may still be in its queue; leaving it tells
                // the head if the arbiter is free. (Refused for its head: our keys elsewhere are
                // gone now, so it is told after them.)
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
    pub(super) fn tally<'a>(
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
}
