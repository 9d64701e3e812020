//! Leader election on a lock's queue: the candidates are the waiters of one lock, the leader is
//! its holder, the term is the holder's fencing token, and the value observers read is written
//! into the holder's own queue entry (so it goes when the lease goes: nothing can outlive its
//! leader, nothing is left to clean up).
//!
//! Each backend adds two things to its lock queue: [`LockBackend::announce`] (write the value into
//! our entry, only while it still holds) and [`LockBackend::leader`] (read the head's term and
//! value), plus change hints for observers ([`LockBackend::leader_changes`]). Everything else,
//! campaign, lost signal, resign, the callback form and the observers' ordering rules, is here,
//! once.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::client::LockClient;
use crate::deadline::{FOREVER, deadline_in};
use crate::error::{LockError, LostReason, Result};
use crate::fencing::FencingToken;
use crate::guarantee::Fencing;
use crate::leader::Leader;
use crate::lease::Lease;
use crate::name::LockName;
use crate::options::AcquireOptions;
use crate::run::{Held, Ran};
use crate::signal::LostSignal;

/// The longest value a leader may announce, in bytes (values are an identity or an address,
/// and every observer reads them on every change).
pub const MAX_VALUE_BYTES: usize = 4096;

/// An election named `n` queues on the lock named `election/n`: its own namespace, so a lock
/// and an election of the same name never meet (do not lock `election/...` names by hand).
pub const ELECTION_LOCK_PREFIX: &str = "election/";

/// An observer that got no change hint for this long reads the leader anyway: a hint lost with a
/// connection (a Redis message during a reconnect, a ZooKeeper watch across a session move)
/// delays an observer by this much at most.
const BACKSTOP: Duration = Duration::from_secs(2);

/// How long an observer waits before reading again after a failed read.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// A queue entry's data once its holder announced `value`, for backends whose entry holds the
/// owner secret (etcd's attempt key, ZooKeeper's node): `<secret><holder>:<value>`, `holder`
/// being the grant's [`crate::HolderInfo::segment`]. The secret stays first, so the entry still
/// names its writer ([`entry_written_by`]).
pub fn announced_entry(secret_hex: &str, holder: &crate::HolderInfo, value: &str) -> String {
    format!("{secret_hex}{}:{value}", holder.segment())
}

/// Whether entry data was written by the attempt owning `secret_hex`, announced or not, with
/// its limit and holder or not ([`crate::Admission::entry_suffix`], [`crate::HolderInfo`]).
pub fn entry_written_by(entry: &[u8], secret_hex: &str) -> bool {
    entry
        .strip_prefix(secret_hex.as_bytes())
        .is_some_and(|rest| rest.first().is_none_or(|b| matches!(b, b':' | b'#' | b'~')))
}

/// The value announced in entry data ([`announced_entry`]), if any.
pub fn announced_value(entry: &[u8]) -> Option<String> {
    let at = entry.iter().position(|b| *b == b':')?;
    String::from_utf8(entry[at + 1..].to_vec()).ok()
}

/// The leader value a queue's head entry shows observers: ours once announced (`None` before:
/// a candidate that has not announced is nobody's leader yet), or, for an entry another
/// language's recipe wrote in the same queue (Curator's `LeaderSelector`, kazoo's `Election`,
/// whose node data is their participant's id), that data, as their own observers read it.
pub fn leader_value(entry: &[u8]) -> Option<String> {
    let ours = entry.len() >= 32
        && entry[..32].iter().all(u8::is_ascii_hexdigit)
        && entry
            .get(32)
            .is_none_or(|b| matches!(b, b':' | b'#' | b'~'));
    if ours {
        announced_value(entry)
    } else {
        Some(String::from_utf8_lossy(entry).into_owned())
    }
}

/// One named election over a [`LockClient`]'s backend, with the lease options its campaigns
/// use (TTL, watchdog, grade). Cheap to clone.
///
/// # Examples
/// ```
/// use std::{sync::Arc, time::Duration};
/// use distlock_api::{AcquireOptions, LockClient, Ran, StreamExt, memory::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
/// let store = MemoryStore::new(); // each replica would have its own client of one store
/// let replica = |store: &MemoryStore| LockClient::new(Arc::new(store.client()));
/// let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
/// let a = replica(&store).election("scheduler")?.options(opts.clone());
/// let b = replica(&store).election("scheduler")?.options(opts);
///
/// let mut leaders = replica(&store).election("scheduler")?.observe();
/// let leading = a.campaign("a:8080").await?;
/// assert_eq!(leaders.next().await.expect("endless")?.value, "a:8080");
///
/// // The callback form: b waits, runs while leader, resigns when done.
/// let waiting = tokio::spawn(async move {
///     b.lead("b:8080", |held| async move { held.fencing_token() }).await
/// });
/// let first_term = leading.term();
/// leading.resign().await?; // b is elected at once
/// let Ok(Ok(Ran::Completed(Some(term)))) = waiting.await else { panic!("b did not lead") };
/// assert!(term > first_term);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: LockClient,
    name: String,
    lock: LockName,
    opts: AcquireOptions,
}

impl LockClient {
    /// The election named `name`, on this client's backend, campaigning with default options
    /// ([`Election::options`] changes them). No I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] when `election/<name>` breaks the lock-name rule;
    /// [`LockError::Unsupported`] when the backend has no strictly increasing fencing tokens to
    /// make terms of (Redlock).
    pub fn election(&self, name: &str) -> Result<Election> {
        let lock = crate::semaphore::namespaced(ELECTION_LOCK_PREFIX, name)?;
        if self.capabilities().fencing == Fencing::None {
            return Err(LockError::Unsupported {
                backend: self.backend().kind(),
                what: "leader election (terms are fencing tokens, and this backend has none)"
                    .to_string(),
            });
        }
        Ok(Election {
            client: self.clone(),
            name: name.to_string(),
            lock,
            opts: AcquireOptions::default(),
        })
    }
}

impl Election {
    /// The election's name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease options of this election's campaigns: the TTL (a session's, on etcd and
    /// ZooKeeper), watchdog or fixed, and the grade ([`crate::Guarantee::Correctness`] only where
    /// the backend gives it, checked at each campaign). Options with an `owner` are refused
    /// there: a leadership is not re-entrant.
    pub fn options(mut self, opts: AcquireOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The lease options campaigns use now.
    pub fn lease_options(&self) -> &AcquireOptions {
        &self.opts
    }

    /// Stands as a candidate with `value` and waits until elected. Candidates are elected in
    /// arrival order where the backend declares FIFO (`Capabilities::fifo`); the
    /// leadership lasts while its lease does (the watchdog renews it; its lost signal fires
    /// before any other candidate can be elected).
    ///
    /// # Errors
    /// `InvalidConfig` for a value over [`MAX_VALUE_BYTES`] or options with an `owner` (a
    /// leadership is not re-entrant), and the errors of [`LockClient::acquire`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves no candidate behind; a leadership granted meanwhile is
    /// resigned in the background, and the next candidate is elected at once.
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        self.campaign_until(value, deadline_in(FOREVER)).await
    }

    /// Like [`Election::campaign`], giving up after `timeout` with [`LockError::Timeout`]
    /// (nothing left queued).
    pub async fn campaign_for(&self, value: &str, timeout: Duration) -> Result<Leadership> {
        self.campaign_until(value, deadline_in(timeout)).await
    }

    #[tracing::instrument(name = "distlock.campaign", skip_all, fields(election = %self.name))]
    async fn campaign_until(&self, value: &str, deadline: Instant) -> Result<Leadership> {
        check_value(value)?;
        if self.opts.owner.is_some() {
            return Err(LockError::invalid_config(
                "owner",
                "Some(..)",
                "a leadership is not re-entrant: campaign without an owner",
            ));
        }
        // The entry carries no value until its candidate knows it leads, so observers never
        // report a candidate that cannot know it leads (one cut off, or cancelled as it reached
        // the head). The price: the announcement's write after the grant.
        let lease = self
            .client
            .acquire_inner(self.lock.as_str(), &self.opts, Some(deadline), None)
            .await?;
        let Some(term) = lease.fencing_token() else {
            return Err(LockError::Unsupported {
                backend: self.client.backend().kind(),
                what: "leader election (the grant carried no fencing token)".to_string(),
            });
        };
        // Dropped on any error below, the lease is released in the background: the next
        // candidate is elected, and no value of ours stays readable.
        let leadership = Leadership {
            lease,
            term,
            value: value.to_string(),
            election: self.name.clone(),
        };
        leadership.announce(value).await?;
        tracing::debug!(term = term.0, "distlock elected");
        Ok(leadership)
    }

    /// Campaigns with `value`, then runs `f` while leader: `f` gets the term (as the fencing
    /// token) and the lost signal, and is dropped at its next await if the leadership is lost.
    /// Resigns on every path, so the next candidate is elected at once. To stand again after a
    /// loss, call it in a loop.
    ///
    /// # Errors
    /// Those of [`Election::campaign`]. Once elected, nothing is an error: [`Ran`] says whether
    /// `f` completed, was cut short by the loss, or panicked.
    ///
    /// # Cancel safety
    /// Dropping the future drops `f` and resigns in the background.
    pub async fn lead<F, Fut, T>(&self, value: &str, f: F) -> Result<Ran<T>>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        let leadership = self.campaign(value).await?;
        Ok(crate::run::under(leadership.lease, f).await)
    }

    /// The leader now, read from the server that decides (never a stale replica): `None` while
    /// nobody leads (also between a leader's loss and its successor's announcement).
    ///
    /// # Errors
    /// Backend failures.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.client.backend().leader(&self.lock).await
    }

    /// A stream of the leaders of this election: the current one first (if any), then every
    /// leader and every proclaimed value as observers can read them, in order. It never reports
    /// two leaders for one term, never a term below one it reported (except on a backend whose
    /// tokens restart when the server loses its data, Redis, where a lower term is the new
    /// leader after that loss), and never the same leader and value twice. Changes that follow
    /// each other faster than one read can coalesce into the latest. A failed read is reported
    /// as an `Err` item and the stream goes on; it ends only when dropped.
    pub fn observe(&self) -> BoxStream<'static, Result<Leader>> {
        let state = Observing {
            backend: self.client.backend().clone(),
            lock: self.lock.clone(),
            hints: None,
            last: None,
            failed: false,
        };
        futures_util::stream::unfold(state, |mut st| async move {
            let item = st.next().await;
            Some((item, st))
        })
        .boxed()
    }
}

fn check_value(value: &str) -> Result<()> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(LockError::invalid_config(
            "value",
            format!("{} bytes", value.len()),
            format!("a leader's value is at most {MAX_VALUE_BYTES} bytes"),
        ));
    }
    Ok(())
}

struct Observing {
    backend: std::sync::Arc<dyn LockBackend>,
    lock: LockName,
    hints: Option<BoxStream<'static, ()>>,
    last: Option<Leader>,
    failed: bool,
}

impl Observing {
    async fn next(&mut self) -> Result<Leader> {
        loop {
            if std::mem::take(&mut self.failed) {
                tokio::time::sleep(RETRY_AFTER).await;
            }
            // Hints first, then the read: a change after the read is always hinted.
            if self.hints.is_none() {
                match self.backend.leader_changes(&self.lock).await {
                    Ok(h) => self.hints = Some(h),
                    Err(e) => {
                        self.failed = true;
                        return Err(e);
                    }
                }
            }
            match self.backend.leader(&self.lock).await {
                Ok(Some(l)) if self.reports(&l) => {
                    self.last = Some(l.clone());
                    return Ok(l);
                }
                Ok(_) => {}
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            }
            // Set above; a stream that is gone is subscribed again.
            let Some(hints) = self.hints.as_mut() else {
                continue;
            };
            tokio::select! {
                // The hints ended (a refused watch, a session gone): subscribe again, after a
                // pause so a store that keeps refusing is not hammered.
                hint = hints.next() => if hint.is_none() {
                    self.hints = None;
                    self.failed = true;
                },
                _ = tokio::time::sleep(BACKSTOP) => {}
            }
        }
    }

    fn reports(&self, l: &Leader) -> bool {
        match &self.last {
            None => true,
            Some(last) if l.term == last.term => l.value != last.value,
            Some(last) => {
                l.term > last.term || self.backend.capabilities().fencing != Fencing::ClusterWide
            }
        }
    }
}

/// This replica's leadership: a lease on the election's lock plus the value observers read.
/// Dropping it resigns in the background (the next candidate is elected at once).
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    term: FencingToken,
    value: String,
    election: String,
}

impl Leadership {
    /// The term: strictly above every earlier leader's of this election (see [`Leader::term`]).
    /// Pass it to the resources the leader writes, as a fencing token, so a deposed leader's late
    /// writes are refused.
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The value observers read now.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The election's name.
    pub fn election(&self) -> &str {
        &self.election
    }

    /// The lease that carries the leadership (validity, TTL, renew).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The leadership as its lease, for code that holds every primitive alike: the term is the
    /// lease's fencing token, observers read the value until the lease is released, and
    /// releasing (or dropping) it resigns, as [`Leadership::resign`] does.
    pub fn into_lease(self) -> Lease {
        self.lease
    }

    /// Resolves when the leadership is lost, before any other candidate can be elected (the
    /// lease's lost signal; see [`Lease::lost`]).
    pub async fn lost(&self) -> LostReason {
        self.lease.lost().await
    }

    /// The lost signal, to hand to tasks that act as the leader.
    pub fn lost_signal(&self) -> LostSignal {
        self.lease.lost_signal()
    }

    /// Changes the value observers read, keeping the leadership and the term.
    ///
    /// # Errors
    /// `InvalidConfig` for a value over [`MAX_VALUE_BYTES`]; [`LockError::Lost`] when the
    /// leadership is gone (nothing is written then); backend failures (the old or the new value
    /// may be readable: proclaim again).
    pub async fn proclaim(&mut self, value: &str) -> Result<()> {
        check_value(value)?;
        self.announce(value).await?;
        self.value = value.to_string();
        Ok(())
    }

    async fn announce(&self, value: &str) -> Result<()> {
        let lost = |reason| LockError::Lost {
            name: self.election.clone(),
            reason,
        };
        if let Some(reason) = self.lease.lost_reason() {
            return Err(lost(reason));
        }
        if self
            .lease
            .shared()
            .backend
            .announce(self.lease.key(), self.term, value)
            .await?
        {
            Ok(())
        } else {
            self.lease.shared().lose(LostReason::RenewalRefused);
            Err(lost(LostReason::RenewalRefused))
        }
    }

    /// Gives the leadership up: the next candidate is elected within a few round trips, not at a
    /// TTL. Returns whether it was still held. A failed resign goes on in the background as a
    /// failed release does ([`Lease::release`]).
    ///
    /// # Errors
    /// Backend failures.
    pub async fn resign(self) -> Result<bool> {
        self.lease.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announced_value_is_read_back_and_keeps_its_writer() {
        let holder = crate::HolderInfo::now();
        let entry = announced_entry("ab12", &holder, "http://10.0.0.7:8080");
        assert_eq!(crate::HolderInfo::in_entry(entry.as_bytes()), Some(holder));
        assert_eq!(
            announced_value(entry.as_bytes()).as_deref(),
            Some("http://10.0.0.7:8080")
        );
        assert_eq!(announced_value(b"ab12"), None);
        assert_eq!(announced_value(b"ab12:").as_deref(), Some(""));
        let secret = "0123456789abcdef0123456789abcdef";
        assert_eq!(leader_value(format!("{secret}~1,2,h,c").as_bytes()), None);
        assert_eq!(
            leader_value(format!("{secret}~1,2,h,c:v").as_bytes()).as_deref(),
            Some("v")
        );
        // Another recipe's participant id, whatever it holds.
        assert_eq!(leader_value(b"curator-1").as_deref(), Some("curator-1"));
        assert_eq!(leader_value(b"a:b").as_deref(), Some("a:b"));
        assert_eq!(leader_value(b"").as_deref(), Some(""));
        assert!(entry_written_by(entry.as_bytes(), "ab12"));
        assert!(entry_written_by(b"ab12", "ab12"));
        assert!(!entry_written_by(b"ab123", "ab12"));
        assert!(!entry_written_by(entry.as_bytes(), "ab1"));
    }
}
