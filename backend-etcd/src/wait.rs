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
/// nearest still holds (off the hand-over's path). Our own key is not watched before the
/// [`Cover`] made with that read (each watch costs the member a copy of its buffered writes):
/// a delete of it before then shows on the read. Both nearest are: with the cue alone, the
/// slowest hand-overs at 64 clients took 90-100 ms, the period of the member's catch-up loop
/// for watches behind it (10-30 ms with both).
const FOLLOWED: usize = 2;

/// How long after its watches were made a waiter that was further back than [`NEAR`] still
/// makes second watches for those that were behind the member: etcd's catch-up loop comes round
/// every 100 ms (more under load), so by then they are in step. A first watch behind the member
/// costs the member a read of its buffered writes on creation, as every watch does, and a
/// second one another: such a waiter makes them only on the read its turn's approach brings
/// (the key two ahead gone), and only if that comes sooner than this.
const CATCH_UP: Duration = Duration::from_millis(150);

/// How long a delete told through a key's own watch waits for the [`Cover`] that holds the key
/// to tell it too: an in-step watch's events of one revision are sent together, so the cover's
/// comes at once unless it is behind the member (then up to 100 ms late: the turn reads our
/// key instead).
const TOLD_TOGETHER: Duration = Duration::from_millis(2);

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
    /// More than [`NEAR`] keys were ahead when this view was read, and the turn is not expected
    /// before etcd's catch-up loop comes round ([`Pace`](crate::pace::Pace)): watches behind
    /// the member may wait for it.
    pub(crate) far: bool,
    /// How many keys the read counted ahead of ours: all of them at an enqueue (nothing is
    /// behind a key just put), at most that many later.
    pub(crate) counted: usize,
    /// Our own key still exists (with our create revision).
    pub(crate) alive: bool,
    /// The newest revision at which a key left the view through a watch that may not have
    /// reported our own key's deletes up to it (a watch of another key, or one that started
    /// after this view): that our key lived until then is unknown until read, so a turn
    /// decided on it reads our key first.
    unsure: Option<i64>,
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
        let counted = keys.len();
        let ahead = Ahead {
            admission,
            keys,
            whole,
            keyed: false,
            far: !whole,
            counted,
            alive: true,
            unsure: None,
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

    /// The keys a wait that follows keys watches: those in the view (our own key is told by the
    /// [`Cover`] and the reads).
    fn followed(&self) -> impl Iterator<Item = &[u8]> {
        self.keys.iter().map(|(k, _)| k.as_slice())
    }

    /// Nothing left to wait for: our key is gone, or it is admitted.
    fn done(&self) -> bool {
        !self.alive || self.admitted()
    }

    /// Applies the deletes that come after this view; a key not in the list was behind ours
    /// (the list is whole) or is not followed. A key of a list cut short going leaves the view
    /// stale: what was beyond it is unknown. `covers`: the watch they came through reports
    /// every delete of our own key after this view, in revision order with these (the name's
    /// watch, or the [`Cover`], started no later than the view); else a key they remove leaves
    /// the view [`Ahead::unsure`].
    fn apply(&mut self, deletes: &[(Vec<u8>, i64)], ours: &[u8], covers: bool) {
        let mut stale = false;
        // A watch that tells our key's deletes in order with these passed our key alive up to
        // the newest of them.
        let newest = deletes.iter().map(|(_, rev)| *rev).max();
        if covers && self.unsure.is_some_and(|gone| newest >= Some(gone)) {
            self.unsure = None;
        }
        for (key, rev) in deletes
            .iter()
            .filter(|(_, rev)| self.at.is_none_or(|at| *rev > at))
        {
            if key == ours {
                self.alive = false;
            } else if let Some(i) = self.keys.iter().position(|(k, _)| k == key) {
                self.keys.remove(i);
                stale |= !self.whole;
                if !covers {
                    self.unsure = self.unsure.max(Some(*rev));
                }
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
    /// The watch of the range from our key to the nearest key ahead ([`Cover`]).
    Cover,
}

/// The watch of the range from our key to the nearest key ahead: one watch, so it tells our
/// key's delete before any delete after it, and a turn decided on its events needs no read of
/// our key (a key between is behind ours, so its delete changes nothing, or in the view). Made
/// from the present when the key two ahead goes (the turn's approach, off the hand-over's path)
/// just before the read that follows, so it is in step, and in place by that read's revision
/// (its created answer says; if not, the view is read again).
struct Cover {
    /// The range: its first key, and the key just past its last.
    lo: Vec<u8>,
    end: Vec<u8>,
    /// Its id and the revision it started after, once its created answer came.
    made: Option<(i64, i64)>,
}

impl Cover {
    fn new(ours: &[u8], nearest: &[u8]) -> Self {
        let (lo, hi) = (ours.min(nearest), ours.max(nearest));
        Cover {
            lo: lo.to_vec(),
            end: [hi, &[0]].concat(),
            made: None,
        }
    }

    /// `key` is in the range.
    fn holds(&self, key: &[u8]) -> bool {
        self.lo.as_slice() <= key && key < self.end.as_slice()
    }

    /// Its events tell every delete in the range after a view read at `at`: it started no later.
    fn proven(&self, at: Option<i64>) -> bool {
        matches!((self.made, at), (Some((_, since)), Some(at)) if since <= at)
    }

    /// `w` came through it, and it is proven for the view read at `at`.
    fn told(&self, w: &etcd_client::WatchResponse, at: Option<i64>) -> bool {
        self.made.is_some_and(|(id, _)| id == w.watch_id()) && self.proven(at)
    }
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
                if let Some(gone) = ahead.unsure.filter(|_| ahead.alive) {
                    tokio::select! {
                        alive = self.still_queued(key, my_rev, gone) => ahead.alive = alive?,
                        _ = tokio::time::sleep_until(deadline) => return Err(timeout()),
                    }
                }
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
                Some(Note::Deletes { since, deletes }) => {
                    let covers = ahead.at.is_some_and(|at| *since <= at);
                    ahead.apply(deletes, key.as_bytes(), covers);
                }
                _ => return Ok(false),
            }
        }
    }

    /// [`EtcdBackend::wait_turn`] for a waiter further back than [`NEAR`]: one watch stream of
    /// its own follows the [`FOLLOWED`] nearest ahead, each watch made from just after the view
    /// it follows (so none misses a delete), and the view is read again when a key of a list
    /// cut short goes; when that leaves one key ahead, the [`Cover`] of our key and it is made
    /// just before the read. Our key is watched by nothing else: its delete before then is on
    /// that read. Returns `Ok(true)` when done, `Ok(false)` when the watch was refused or ended.
    ///
    /// A watch that names a start revision behind the member's is served by its catch-up loop,
    /// up to 100 ms late: when writes landed since the view, a second watch of the key is made
    /// too, from now (in step unless a write lands while it is registered), and a delete seen
    /// twice changes nothing the second time. For a view read more than [`NEAR`] from the head
    /// whose turn is expected after the catch-up loop ([`Pace`](crate::pace::Pace)), the
    /// second watches wait for the next read, and are not made after [`CATCH_UP`].
    async fn follow_keys(&self, entry: Entry<'_>, ahead: &mut Ahead) -> Result<bool> {
        let Entry { prefix, key, rev } = entry;
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut stream: Option<WatchStream> = None;
        // Keys watched from a view; the created answers still due, in request order.
        let mut watched: Vec<Vec<u8>> = Vec::new();
        let mut due: VecDeque<(Vec<u8>, Due)> = VecDeque::new();
        // Keys whose first watch, made from a far view, was behind the member, with when.
        let mut deferred: Vec<(Vec<u8>, Instant)> = Vec::new();
        let mut cover: Option<Cover> = None;
        loop {
            // A view left stale (a delete of a list cut short, a watch that ended) is read again.
            let at = match ahead.at {
                Some(at) => at,
                None => {
                    if let ([(nearest, _)], None, Some(s)) =
                        (ahead.keys.as_slice(), &cover, stream.as_mut())
                    {
                        let c = Cover::new(key.as_bytes(), nearest);
                        let range = options.clone().with_range(c.end.clone());
                        // Best effort: without it, the turn reads our key.
                        if s.watch(c.lo.clone(), Some(range)).await.is_ok() {
                            due.push_back((c.lo.clone(), Due::Cover));
                            cover = Some(c);
                        }
                    }
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
            // catch-up loop may not have come round (best effort, as on a creation below); the
            // cover, in step, tells those it holds.
            let young = std::mem::take(&mut deferred)
                .into_iter()
                .filter(|(k, made)| {
                    made.elapsed() < CATCH_UP
                        && !cover.as_ref().is_some_and(|c| c.holds(k))
                        && ahead.followed().any(|f| f == k)
                });
            for (k, _) in young {
                let Some(s) = stream.as_mut() else { break };
                if s.watch(k.clone(), Some(options.clone())).await.is_ok() {
                    due.push_back((k, Due::Second));
                }
            }
            let fresh: Vec<Vec<u8>> = ahead
                .followed()
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
            // Deletes the cover holds, told first through their own watches: applied only if
            // the cover has not told them by the deadline (it is then behind the member).
            let mut pending: Vec<(Vec<u8>, i64)> = Vec::new();
            let mut pending_until: Option<Instant> = None;
            while ahead.at.is_some() && !ahead.done() {
                let message = match pending_until {
                    None => watch.message().await,
                    Some(until) => tokio::select! {
                        m = watch.message() => m,
                        _ = tokio::time::sleep_until(until) => {
                            ahead.apply(&std::mem::take(&mut pending), key.as_bytes(), false);
                            pending_until = None;
                            continue;
                        }
                    },
                };
                match message {
                    Ok(Some(w)) if w.canceled() || w.compact_revision() > 0 => return Ok(false),
                    Ok(Some(w)) if w.created() => {
                        let now = w.header().map_or(i64::MAX, |h| h.revision());
                        let (k, view, far) = match due.pop_front() {
                            Some((k, Due::First { view, far })) => (k, view, far),
                            Some((_, Due::Cover)) => {
                                if let Some(c) = cover.as_mut() {
                                    c.made = Some((w.watch_id(), now));
                                }
                                // A view read before it was in place is read again.
                                if ahead.at.is_some_and(|at| now > at) {
                                    ahead.at = None;
                                }
                                continue;
                            }
                            _ => continue,
                        };
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
                    Ok(Some(w)) => {
                        let mut deletes = deletes(&w);
                        let covers = cover.as_ref().is_some_and(|c| c.told(&w, ahead.at));
                        if let Some(c) = cover.as_ref().filter(|c| !covers && c.proven(ahead.at)) {
                            let (held, rest) = deletes.into_iter().partition(|(k, _)| c.holds(k));
                            deletes = rest;
                            pending.extend::<Vec<_>>(held);
                            if !pending.is_empty() && pending_until.is_none() {
                                pending_until = Some(Instant::now() + TOLD_TOGETHER);
                            }
                        }
                        ahead.apply(&deletes, key.as_bytes(), covers);
                        if covers {
                            // What the cover told needs no deadline.
                            pending.retain(|(k, rev)| {
                                !deletes.iter().any(|(d, r)| d == k && r == rev)
                            });
                            if pending.is_empty() {
                                pending_until = None;
                            }
                        }
                    }
                    Ok(None) => return Ok(false),
                    Err(e) if transient(&e) => return Ok(false),
                    Err(e) => return Err(self.err(e)),
                }
            }
        }
    }

    /// Whether our key (created at `my_rev`) lived until at least revision `gone`: read before
    /// a turn decided on a delete (at `gone`) that came through a watch that may not have told
    /// our key's delete first. etcd keeps one watch's events in order, not one watch's against
    /// another's when one is behind the member, so a late delete of our key would come after
    /// the grant. The member's own state answers (a serializable read: no round of consensus
    /// on the hand-over's path) when it has applied `gone`, as the one that sent it has; a
    /// member further behind is asked again through consensus.
    async fn still_queued(&self, key: &str, my_rev: i64, gone: i64) -> Result<bool> {
        let read = GetOptions::new().with_keys_only();
        let local =
            WatchSource::get(self, key.to_string(), read.clone().with_serializable()).await?;
        let ours = if local.header().is_some_and(|h| h.revision() >= gone) {
            local
        } else {
            WatchSource::get(self, key.to_string(), read).await?
        };
        Ok(is_ours(ours.kvs(), my_rev))
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

/// Our key as read (`kvs`) is the one created at `my_rev`: not deleted and put again since.
pub(crate) fn is_ours(kvs: &[etcd_client::KeyValue], my_rev: i64) -> bool {
    kvs.first().is_some_and(|kv| kv.create_revision() == my_rev)
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
            false,
        );
        assert_eq!((far.keys.len(), far.at), (FOLLOWED, Some(10)));
        // The farther one going leaves what was beyond it unknown: read again, never granted.
        far.apply(&[(keys(2)[1].0.clone(), 12)], b"ours", false);
        assert_eq!(far.at, None);
        assert!(!far.admitted());
    }

    #[test]
    fn a_waiter_near_the_head_is_granted_on_the_delete_that_empties_its_list() {
        let mut near = Ahead::new(Admission::Exclusive, keys(2), true, 10);
        assert!(!near.keyed, "a whole list waits on the name's shared watch");
        near.apply(&[(keys(2)[1].0.clone(), 11)], b"ours", true);
        assert!(!near.done());
        near.apply(&[(keys(1)[0].0.clone(), 12)], b"ours", true);
        assert_eq!((near.at, near.done(), near.alive), (Some(10), true, true));
        assert_eq!(
            near.unsure, None,
            "the name's watch told our key's delete first"
        );
        // Our own key's delete ends the wait, granted nothing.
        let mut gone = Ahead::new(Admission::Exclusive, keys(1), true, 10).keyed();
        gone.apply(&[(b"ours".to_vec(), 11)], b"ours", false);
        assert!(gone.done() && !gone.alive);
    }

    /// Our key deleted after the view (an operator, its lease revoked) reaches us late when the
    /// watch that follows it is behind the member, while the delete ahead came through another
    /// watch in step: the wait that is done through such a watch is unsure of our key.
    #[test]
    fn a_turn_decided_through_a_watch_that_may_not_have_told_our_keys_delete_is_unsure() {
        // Read again by a keyed wait, a whole list of two stays whole; its deletes come through
        // watches of their own keys.
        let mut keyed = Ahead::new(Admission::Exclusive, keys(2), true, 10).keyed();
        keyed.apply(
            &[(keys(2)[1].0.clone(), 11), (keys(1)[0].0.clone(), 12)],
            b"ours",
            false,
        );
        assert!(keyed.done() && keyed.alive && keyed.at.is_some());
        assert_eq!(
            keyed.unsure,
            Some(12),
            "granted once our key is read as of then"
        );
        // Near the head, through the name's second watch (it started after the view).
        let mut near = Ahead::new(Admission::Exclusive, keys(1), true, 10);
        near.apply(&[(keys(1)[0].0.clone(), 12)], b"ours", false);
        assert!(near.done() && near.unsure == Some(12));
        // A read of the view again knows our key as of then.
        let again = Ahead::new(Admission::Exclusive, Vec::new(), true, 13);
        assert!(again.done() && again.unsure.is_none());
    }
}
