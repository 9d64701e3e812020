//! The wait for admission: what a waiter knows of the keys ahead of its own, and how it
//! follows them (the name's shared watch near the head, the nearest keys on a watch of the
//! wait's own further back).

use std::collections::VecDeque;
use std::time::Duration;

use distlock_api::{Admission, LockError, Result};
use etcd_client::{GetOptions, SortOrder, SortTarget, WatchFilterType, WatchOptions, WatchStream};
use tokio::time::Instant;

use crate::client::EtcdBackend;
use crate::client::{RETRY_PAUSE, transient};
use crate::session::Session;
use crate::watches::{Note, WatchSource, deletes};

/// How many of the keys ahead an exclusive entry reads, nearest first. With at most this many
/// ahead it waits on the name's shared watch ([`crate::watches`]), which each client near the
/// head keeps open, so its grant needs nothing made or read on the hand-over's path; but every
/// delete of the name is then a message to every such client, and at 64 clients that fan-out
/// was the member's CPU: 3.3 ms per hand-over against 1.5 ms at 8, where etcd's own lock, which
/// wakes one waiter per delete, made twice our hand-overs. With more ahead it follows only the
/// [`FOLLOWED`] nearest on a watch of its own, made as it queues (far from its turn, so in step
/// by then), and a delete wakes the two waiters right behind its key.
const NEAR: usize = 16;

/// How many of the nearest keys ahead a waiter further back than [`NEAR`] follows: the one it
/// is granted after, and the one before it, whose delete is the cue to read again while the
/// nearest still holds (off the hand-over's path).
const FOLLOWED: usize = 2;

/// How long after its watches were made a waiter that was further back than [`NEAR`] still
/// makes second watches for those that were behind the member: etcd's catch-up loop comes round
/// every 100 ms (more under load), so by then they are in step. A first watch behind the member
/// costs the member a read of its buffered writes on creation, as every watch does, and a
/// second one another: such a waiter makes them only on the read its turn's approach brings
/// (the key two ahead gone), and only if that comes sooner than this.
const CATCH_UP: Duration = Duration::from_millis(150);

/// What a waiter knows of the keys ahead of its own, true as of revision `at`.
pub(crate) struct Ahead {
    /// How our entry is admitted.
    admission: Admission,
    /// The nearest keys created before ours, nearest first, with their limits. An exclusive
    /// entry reads at most [`NEAR`] (it waits for them all, so a full list may be cut short:
    /// more keys may be further ahead), and keeps the [`FOLLOWED`] nearest when it follows
    /// keys; any other reads them all (it counts them).
    pub(crate) keys: Vec<(Vec<u8>, u32)>,
    /// `keys` holds every key ahead of ours.
    whole: bool,
    /// The wait follows `keys` on a watch of its own rather than the name's shared watch.
    keyed: bool,
    /// More than [`NEAR`] keys were ahead when this view was read: the turn is at least that
    /// many hand-overs away.
    far: bool,
    /// Our own key still exists (with our create revision).
    pub(crate) alive: bool,
    /// The revision this view is true at (only events after it change it); `None` once it may
    /// be stale (a watch ended, or a key of a list cut short went): read again before deciding.
    at: Option<i64>,
}

impl Ahead {
    /// A view as read at `at`; an exclusive entry with more than [`NEAR`] keys ahead (the list
    /// cut short) follows the nearest keys.
    pub(crate) fn new(
        admission: Admission,
        keys: Vec<(Vec<u8>, u32)>,
        whole: bool,
        at: i64,
    ) -> Self {
        let ahead = Ahead {
            admission,
            keys,
            whole,
            keyed: false,
            far: !whole,
            alive: true,
            at: Some(at),
        };
        if whole { ahead } else { ahead.keyed() }
    }

    /// This view, for a wait that follows the [`FOLLOWED`] nearest keys.
    fn keyed(mut self) -> Self {
        if self.keys.len() > FOLLOWED {
            self.keys.truncate(FOLLOWED);
            self.whole = false;
        }
        self.keyed = true;
        self
    }

    /// The policy admits our entry behind the keys ahead (none left out).
    pub(crate) fn admitted(&self) -> bool {
        self.whole
            && self
                .admission
                .admitted(self.keys.iter().map(|(_, limit)| *limit))
    }

    /// The keys a wait that follows keys watches: `ours`, then those in the view.
    fn followed<'a>(&'a self, ours: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
        std::iter::once(ours).chain(self.keys.iter().map(|(k, _)| k.as_slice()))
    }

    /// Nothing left to wait for: our key is gone, or it is admitted.
    fn done(&self) -> bool {
        !self.alive || self.admitted()
    }

    /// Applies the deletes that come after this view; a key not in the list was behind ours
    /// (the list is whole) or is not followed. A key of a list cut short going leaves the view
    /// stale: what was beyond it is unknown.
    fn apply(&mut self, deletes: &[(Vec<u8>, i64)], ours: &[u8]) {
        let mut stale = false;
        for (key, _) in deletes
            .iter()
            .filter(|(_, rev)| self.at.is_none_or(|at| *rev > at))
        {
            if key == ours {
                self.alive = false;
            } else if let Some(i) = self.keys.iter().position(|(k, _)| k == key) {
                self.keys.remove(i);
                stale |= !self.whole;
            }
        }
        if stale {
            self.at = None;
        }
    }
}

/// A watch of [`EtcdBackend::follow_keys`] whose created answer is still due.
enum Due {
    /// A first watch, from just after the view read at `view`; `far`: more than [`NEAR`] keys
    /// were ahead in it.
    First { view: i64, far: bool },
    /// A second watch, from the present.
    Second,
}

/// Our entry in the queue: the name's prefix, our key and its create revision.
#[derive(Clone, Copy)]
struct Entry<'a> {
    prefix: &'a str,
    key: &'a str,
    rev: i64,
}

impl EtcdBackend {
    /// Waits until the policy admits our key (`key`, created at `my_rev`; for an exclusive entry:
    /// until no key of `prefix` created before it is left), and returns whether our key and our
    /// session are still alive then (etcd #11456: never grant a lock whose waiter's lease died
    /// while it waited).
    ///
    /// Only events after the revision a view was read at change it, and a watch reports every
    /// delete after it is in place, in order. Within [`NEAR`] of the head the waiter applies the
    /// name's delete events (the client's shared watch) to its view; further back it follows
    /// the nearest keys and its own on a watch of its own. Either way it is granted on the event
    /// that empties a whole view, with no read after it (committed history: the same facts a
    /// linearizable read would return, and our own key's delete would have come first). A view
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
                w = async {
                    let entry = Entry { prefix, key, rev: my_rev };
                    if ahead.keyed {
                        self.follow_keys(entry, &mut ahead).await
                    } else {
                        self.follow(entry, &mut ahead).await
                    }
                } => w,
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

    /// One shared watch's worth of [`EtcdBackend::wait_turn`]: returns `Ok(true)` when `ahead` is
    /// to be decided on (done, or to be followed by keys), `Ok(false)` when the watch was refused
    /// or ended.
    async fn follow(&self, entry: Entry<'_>, ahead: &mut Ahead) -> Result<bool> {
        let Entry { prefix, key, rev } = entry;
        let mut watch = self.inner.watches.subscribe(self, prefix, ahead.admission);
        let Some(live) = watch.live().await else {
            return Ok(false);
        };
        loop {
            // What came before the watch is read now; what comes after arrives as events.
            if ahead.at.is_none_or(|at| at < live) {
                *ahead = self.read_ahead(prefix, key, rev, ahead.admission).await?;
            }
            if ahead.done() || ahead.keyed {
                return Ok(true);
            }
            match watch.next().await.as_deref() {
                Some(Note::Deletes(d)) => ahead.apply(d, key.as_bytes()),
                _ => return Ok(false),
            }
        }
    }

    /// [`EtcdBackend::wait_turn`] for a waiter further back than [`NEAR`]: one watch stream of
    /// its own follows our key and the [`FOLLOWED`] nearest ahead, each watch made from just
    /// after the view it follows (so none misses a delete), and the view is read again when a
    /// key of a list cut short goes. Returns `Ok(true)` when done, `Ok(false)` when the watch
    /// was refused or ended.
    ///
    /// A watch that names a start revision behind the member's is served by its catch-up loop,
    /// up to 100 ms late: when writes landed since the view, a second watch of the key is made
    /// too, from now (in step unless a write lands while it is registered), and a delete seen
    /// twice changes nothing the second time. For a view read more than [`NEAR`] from the head,
    /// the second watches wait for the next read, and are not made after [`CATCH_UP`].
    async fn follow_keys(&self, entry: Entry<'_>, ahead: &mut Ahead) -> Result<bool> {
        let Entry { prefix, key, rev } = entry;
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut stream: Option<WatchStream> = None;
        // Keys watched from a view; the created answers still due, in request order.
        let mut watched: Vec<Vec<u8>> = Vec::new();
        let mut due: VecDeque<(Vec<u8>, Due)> = VecDeque::new();
        // Keys whose first watch, made from a far view, was behind the member, with when.
        let mut deferred: Vec<(Vec<u8>, Instant)> = Vec::new();
        loop {
            // A view left stale (a delete of a list cut short, a watch that ended) is read again.
            let at = match ahead.at {
                Some(at) => at,
                None => {
                    *ahead = self
                        .read_ahead(prefix, key, rev, ahead.admission)
                        .await?
                        .keyed();
                    ahead.at.unwrap_or_default()
                }
            };
            if ahead.done() {
                return Ok(true);
            }
            // On that read, the deferred second watches of the keys still followed, while the
            // catch-up loop may not have come round (best effort, as on a creation below).
            let young = std::mem::take(&mut deferred)
                .into_iter()
                .filter(|(k, made)| {
                    made.elapsed() < CATCH_UP && ahead.followed(key.as_bytes()).any(|f| f == k)
                });
            for (k, _) in young {
                let Some(s) = stream.as_mut() else { break };
                if s.watch(k.clone(), Some(options.clone())).await.is_ok() {
                    due.push_back((k, Due::Second));
                }
            }
            let fresh: Vec<Vec<u8>> = ahead
                .followed(key.as_bytes())
                .filter(|k| !watched.iter().any(|w| w == k))
                .map(<[u8]>::to_vec)
                .collect();
            for k in fresh {
                let from = options.clone().with_start_revision(at + 1);
                if !self.add_watch(&mut stream, &k, from).await? {
                    return Ok(false);
                }
                due.push_back((
                    k.clone(),
                    Due::First {
                        view: at,
                        far: ahead.far,
                    },
                ));
                watched.push(k);
            }
            let Some(watch) = stream.as_mut() else {
                return Ok(false);
            };
            while ahead.at.is_some() && !ahead.done() {
                match watch.message().await {
                    Ok(Some(w)) if w.canceled() || w.compact_revision() > 0 => return Ok(false),
                    Ok(Some(w)) if w.created() => {
                        let Some((k, Due::First { view, far })) = due.pop_front() else {
                            continue;
                        };
                        let now = w.header().map_or(i64::MAX, |h| h.revision());
                        if now <= view {
                            continue;
                        }
                        if far {
                            deferred.push((k, Instant::now()));
                            continue;
                        }
                        // Best effort: the first watch alone is complete, only maybe late.
                        if watch.watch(k.clone(), Some(options.clone())).await.is_ok() {
                            due.push_back((k, Due::Second));
                        }
                    }
                    Ok(Some(w)) => ahead.apply(&deletes(&w), key.as_bytes()),
                    Ok(None) => return Ok(false),
                    Err(e) if transient(&e) => return Ok(false),
                    Err(e) => return Err(self.err(e)),
                }
            }
        }
    }

    /// Adds a watch of `key` to `stream`, opening it if there is none yet; `Ok(false)`: the
    /// stream is broken.
    async fn add_watch(
        &self,
        stream: &mut Option<WatchStream>,
        key: &[u8],
        options: WatchOptions,
    ) -> Result<bool> {
        match stream {
            Some(s) => Ok(s.watch(key.to_vec(), Some(options)).await.is_ok()),
            None => {
                *stream = Some(WatchSource::watch(self, key.to_vec(), options).await?);
                Ok(true)
            }
        }
    }
}

/// How many keys ahead an entry reads: an exclusive one the nearest [`NEAR`]; any other
/// counts them, so it reads them all.
pub(crate) fn window(admission: Admission) -> usize {
    match admission {
        Admission::Exclusive => NEAR,
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
        let newest = (NEAR + usize::from(my_rev.is_none())) as i64;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<(Vec<u8>, u32)> {
        (0..n).map(|i| (vec![b'k', i as u8], 1)).collect()
    }

    #[test]
    fn a_waiter_past_near_follows_the_two_nearest_and_reads_again_when_one_goes() {
        let mut far = Ahead::new(Admission::Exclusive, keys(NEAR), false, 10);
        assert!(far.keyed, "a list cut short is followed by keys");
        assert_eq!(far.keys, keys(FOLLOWED), "only the nearest are followed");
        // A delete behind the view, or of a key not followed, changes nothing.
        far.apply(
            &[(keys(3)[2].0.clone(), 11), (keys(1)[0].0.clone(), 9)],
            b"ours",
        );
        assert_eq!((far.keys.len(), far.at), (FOLLOWED, Some(10)));
        // The farther one going leaves what was beyond it unknown: read again, never granted.
        far.apply(&[(keys(2)[1].0.clone(), 12)], b"ours");
        assert_eq!(far.at, None);
        assert!(!far.admitted());
    }

    #[test]
    fn a_waiter_near_the_head_is_granted_on_the_delete_that_empties_its_list() {
        let mut near = Ahead::new(Admission::Exclusive, keys(2), true, 10);
        assert!(!near.keyed, "a whole list waits on the name's shared watch");
        near.apply(&[(keys(2)[1].0.clone(), 11)], b"ours");
        assert!(!near.done());
        near.apply(&[(keys(1)[0].0.clone(), 12)], b"ours");
        assert_eq!((near.at, near.done(), near.alive), (Some(10), true, true));
        // Read again by a keyed wait, a whole list of two stays whole: granted with no read.
        let mut keyed = Ahead::new(Admission::Exclusive, keys(2), true, 10).keyed();
        keyed.apply(
            &[(keys(2)[1].0.clone(), 11), (keys(1)[0].0.clone(), 12)],
            b"ours",
        );
        assert!(keyed.done() && keyed.at.is_some());
        // Our own key's delete ends the wait, granted nothing.
        let mut gone = Ahead::new(Admission::Exclusive, keys(1), true, 10).keyed();
        gone.apply(&[(b"ours".to_vec(), 11)], b"ours");
        assert!(gone.done() && !gone.alive);
    }
}
