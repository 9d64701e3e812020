//! The wait for admission: what a waiter knows of the keys ahead of its own, and how it
//! follows them (the name's shared watch near the head, the farthest key read further back).

use std::time::Duration;

use distlock_api::{Admission, LockError, Result};
use etcd_client::{EventType, GetOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions};
use tokio::time::Instant;

use crate::client::EtcdBackend;
use crate::client::{RETRY_PAUSE, transient};
use crate::session::Session;
use crate::watches::Note;

/// How many of the keys ahead an exclusive entry reads, nearest first. With more ahead it
/// follows the farthest of them alone (one watch of one key: a release wakes one far waiter);
/// within it, it applies the name's shared watch ([`crate::watches`]), which only clients
/// near the head keep open. A waiter moving within reach reads again and makes its client's
/// watch of the name, some 5 requests, and in a queue longer than the window one moves up at
/// every hand-over; a waiter within it costs a watch message per delete. 64: a queue of up to
/// 65 clients hands over with nothing made or read on the way (24 clients: 2.8 messages per
/// hand-over at the member, 7.8 with 8; 64 clients: 4.6 against 9.5 in the bench).
const WINDOW: usize = 64;

/// What a waiter knows of the keys ahead of its own, true as of revision `at`.
pub(crate) struct Ahead {
    /// How our entry is admitted.
    admission: Admission,
    /// The nearest keys created before ours, nearest first, with their limits. An exclusive
    /// entry reads at most [`WINDOW`] (it waits for them all, so a full list may be cut short:
    /// more keys may be further ahead); any other reads them all (it counts them).
    pub(crate) keys: Vec<(Vec<u8>, u32)>,
    /// `keys` holds every key ahead of ours.
    whole: bool,
    /// Our own key still exists (with our create revision).
    pub(crate) alive: bool,
    /// The revision this view is true at (only events after it change it); `None` once it may
    /// be stale (a watch ended, or the key followed went): read again before deciding.
    at: Option<i64>,
}

impl Ahead {
    pub(crate) fn new(
        admission: Admission,
        keys: Vec<(Vec<u8>, u32)>,
        whole: bool,
        at: i64,
    ) -> Self {
        Ahead {
            admission,
            keys,
            whole,
            alive: true,
            at: Some(at),
        }
    }

    /// `None`: the list is whole, so every delete under the name is applied; else the one key
    /// to follow, the farthest read.
    fn follows(&self) -> Option<&[u8]> {
        match self.keys.last() {
            Some((k, _)) if !self.whole => Some(k),
            _ => None,
        }
    }

    /// The policy admits our entry behind the keys ahead (none left out).
    pub(crate) fn admitted(&self) -> bool {
        self.whole
            && self
                .admission
                .admitted(self.keys.iter().map(|(_, limit)| *limit))
    }

    /// Nothing left to wait for: our key is gone, or it is admitted.
    fn done(&self) -> bool {
        !self.alive || self.admitted()
    }

    /// Applies the deletes that come after this view; a key not in the list was behind ours
    /// (the list is whole) and changes nothing.
    fn apply(&mut self, deletes: &[(Vec<u8>, i64)], ours: &[u8]) {
        for (key, _) in deletes
            .iter()
            .filter(|(_, rev)| self.at.is_none_or(|at| *rev > at))
        {
            if key == ours {
                self.alive = false;
            } else if let Some(i) = self.keys.iter().position(|(k, _)| k == key) {
                self.keys.remove(i);
            }
        }
    }
}

impl EtcdBackend {
    /// Waits until the policy admits our key (`key`, created at `my_rev`; for an exclusive entry:
    /// until no key of `prefix` created before it is left), and returns whether our key and our
    /// session are still alive then (etcd #11456: never grant a lock whose waiter's lease died
    /// while it waited).
    ///
    /// Only events after the revision a view was read at change it, and a watch reports every
    /// delete after it is in place, in order. Within [`WINDOW`] of the head the waiter applies
    /// the name's delete events (the client's shared watch) to its view and is granted on the
    /// event that empties it, with no read after it (committed history: the same facts a
    /// linearizable read would return, and our own key's delete would have come first). Further
    /// back it follows the farthest key it read alone, and reads again once it goes. A view
    /// older than the watch it waits on is read again once the watch is in place.
    pub(crate) async fn wait_turn(
        &self,
        prefix: &str,
        key: &str,
        my_rev: i64,
        mut ahead: Ahead,
        session: &Session,
        deadline: Instant,
    ) -> Result<bool> {
        let session_lost = session.lost_signal();
        let timeout = || LockError::Timeout {
            name: String::new(),
            waited: Duration::ZERO,
        };
        let mut refused = false;
        loop {
            if ahead.at.is_some() && ahead.done() {
                return Ok(ahead.alive && !session.is_lost());
            }
            // A watch refused or broken by the member (no leader, connection reset) is made
            // again after a pause, until the deadline: the member may recover or the client
            // reach another one.
            if std::mem::take(&mut refused) {
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_PAUSE) => {}
                    _ = tokio::time::sleep_until(deadline) => return Err(timeout()),
                }
            }
            let waited = tokio::select! {
                w = self.follow(prefix, key, my_rev, &mut ahead) => w,
                _ = session_lost.wait() => {
                    return Err(self.err_text("the session lease died while waiting"));
                }
                _ = tokio::time::sleep_until(deadline) => return Err(timeout()),
            };
            if !waited? {
                ahead.at = None;
                refused = true;
            }
        }
    }

    /// One watch's worth of [`EtcdBackend::wait_turn`]: returns `Ok(true)` when `ahead` is to be
    /// decided on (done, or stale: read again), `Ok(false)` when the watch was refused or ended.
    async fn follow(
        &self,
        prefix: &str,
        key: &str,
        my_rev: i64,
        ahead: &mut Ahead,
    ) -> Result<bool> {
        // A stale view is read on the shared watch: the read decides how far back it is.
        if let Some(far) = ahead.at.and(ahead.follows()).map(<[u8]>::to_vec) {
            let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
            let mut watch = self
                .call(&self.inner.watch, |mut c| {
                    let (k, o) = (far.clone(), options.clone());
                    async move { c.watch(k, Some(o)).await }
                })
                .await?;
            let mut proving = true;
            loop {
                match watch.message().await {
                    Ok(Some(w)) if w.canceled() || w.compact_revision() > 0 => return Ok(false),
                    // The first creation is proven by a read at its revision (see
                    // [`crate::watches`]); the key's second watch, made when it is not, covers
                    // the same key: nothing to read.
                    Ok(Some(w)) if w.created() && std::mem::take(&mut proving) => {
                        let from = w.header().map_or(i64::MAX, |h| h.revision());
                        *ahead = self
                            .read_ahead(prefix, key, my_rev, ahead.admission)
                            .await?;
                        if ahead.follows() != Some(far.as_slice()) || ahead.done() {
                            return Ok(true);
                        }
                        // Best effort: the first watch alone is complete, only maybe late.
                        if ahead.at != Some(from) {
                            let _ = watch.watch(far.clone(), Some(options.clone())).await;
                        }
                    }
                    // The followed key went: read what is left.
                    Ok(Some(w))
                        if w.events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete) =>
                    {
                        ahead.at = None;
                        return Ok(true);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(false),
                    Err(e) if transient(&e) => return Ok(false),
                    Err(e) => return Err(self.err(e)),
                }
            }
        }
        let mut watch = self.inner.watches.subscribe(self, prefix, ahead.admission);
        let Some(live) = watch.live().await else {
            return Ok(false);
        };
        loop {
            // What came before the watch is read now; what comes after arrives as events.
            if ahead.at.is_none_or(|at| at < live) {
                *ahead = self
                    .read_ahead(prefix, key, my_rev, ahead.admission)
                    .await?;
            }
            if ahead.done() || ahead.follows().is_some() {
                return Ok(true);
            }
            match watch.next().await.as_deref() {
                Some(Note::Deletes(d)) => ahead.apply(d, key.as_bytes()),
                _ => return Ok(false),
            }
        }
    }
}

/// How many keys ahead an entry reads: an exclusive one the nearest [`WINDOW`]; any other
/// counts them, so it reads them all.
pub(crate) fn window(admission: Admission) -> usize {
    match admission {
        Admission::Exclusive => WINDOW,
        _ => usize::MAX,
    }
}

/// The read of the keys ahead of an entry created at `my_rev` (or, with `None`, of the newest
/// keys, which include the entry just put): newest first. An exclusive entry reads keys only
/// (it needs no limits); another reads their values, where the limits are.
pub(crate) fn keys_ahead(admission: Admission, my_rev: Option<i64>) -> GetOptions {
    let mut get = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend);
    if admission == Admission::Exclusive {
        let newest = (WINDOW + usize::from(my_rev.is_none())) as i64;
        get = get.with_limit(newest).with_keys_only();
    }
    match my_rev {
        Some(rev) => get.with_max_create_revision(rev - 1),
        None => get,
    }
}

/// A key and the limit its value records (1 when read keys only: an exclusive entry needs none).
pub(crate) fn limited(kv: &etcd_client::KeyValue) -> (Vec<u8>, u32) {
    (kv.key().to_vec(), distlock_api::entry_limit(kv.value()))
}
