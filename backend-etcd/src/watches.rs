//! One watch of a name's deletes per client, shared by every wait on that name in the client.
//!
//! Why: a watch made on a waiter's turn puts a new gRPC stream and a read on the hand-over's
//! path, and etcd serves a watch made while writes land through its 100 ms catch-up loop. A
//! watch made once per name and kept while the client waits there (and for [`LINGER`] after)
//! is in step long before any waiter's turn, so the next waiter is granted on the holder's
//! delete event.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_api::{Admission, Result};
use etcd_client::{
    EventType, GetOptions, GetResponse, WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use tokio::sync::broadcast;

/// What a name's watch asks of the client (the backend, with its retries): kept to these two
/// requests, so this file needs nothing of the client's.
pub(crate) trait WatchSource: Clone + Send + Sync + 'static {
    /// Opens a watch of `key` with `options` (which say whether it is a prefix).
    fn watch(
        &self,
        key: Vec<u8>,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream>> + Send;
    /// Reads `prefix` with `options`.
    fn get(
        &self,
        prefix: String,
        options: GetOptions,
    ) -> impl Future<Output = Result<GetResponse>> + Send;
}

/// How long a name's watch stays after its last wait ended, at least (it is checked every
/// `LINGER`, so it goes between one and two of them later): a client that takes the same lock
/// again soon finds it in step.
const LINGER: Duration = Duration::from_secs(1);

/// How many deletes (each counted once) a name's watch passes on with nobody waiting before it
/// ends, on a name only exclusive entries waited on: a client whose waits come back within a
/// few hand-overs (a small queue) keeps it; in a long queue a client is far back most of the
/// time (following the nearest keys on a watch of its own), and its watch would only cost every
/// delete a message. A name a permit or a reader waited on keeps its watch for [`LINGER`]
/// whatever passes: such a client is admitted at once most times and waits now and then, always
/// on this watch, and a watch made on its wait was the read-write mix's tail (16 clients:
/// hand-over p99 36 ms, 1.1 to 1.7 ms kept).
const IDLE_DELETES: usize = 4;

/// How many messages a slow wait may fall behind before it is told to read again.
const BACKLOG: usize = 1024;

/// What a name's watch says to its waits.
#[derive(Debug)]
pub(crate) enum Note {
    /// The watch is in place: every delete after this revision comes through.
    Live(i64),
    /// Deleted keys with their revisions, in revision order per watch (with a second watch, a
    /// delete may come twice, and late ones after newer ones).
    Deletes {
        /// The watch they came through reported every delete of the name after this revision,
        /// in order: a delete after it and before these was passed on before them. A wait whose
        /// view is older cannot tell from these that its own key outlived the view.
        since: i64,
        /// The deletes.
        deletes: Vec<(Vec<u8>, i64)>,
    },
    /// The watch ended (refused, compacted, cut): what came after it is unknown.
    Ended,
}

/// Where a name's watch stands, for a wait that subscribes after it started: `Live` carries the
/// newest revision it passed on, after which a new subscriber misses nothing.
#[derive(Clone, Copy)]
enum State {
    Starting,
    Live(i64),
    Ended,
}

struct Hub {
    notes: broadcast::Sender<Arc<Note>>,
    state: Mutex<State>,
    /// A permit or a reader waited here: no end on [`IDLE_DELETES`].
    shared: AtomicBool,
}

/// The client's watches by name prefix.
#[derive(Default)]
pub(crate) struct NameWatches {
    hubs: Arc<Mutex<HashMap<String, Arc<Hub>>>>,
}

/// A wait's view of its name's watch: notes from the moment it subscribed.
pub(crate) struct Subscription {
    notes: broadcast::Receiver<Arc<Note>>,
    state: State,
}

impl Subscription {
    /// Waits until the watch is in place; `Some(revision)`: every delete after it comes through
    /// [`Subscription::next`] (a view as of an older revision must be read again); `None`: the
    /// watch ended before it was in place.
    pub(crate) async fn live(&mut self) -> Option<i64> {
        loop {
            match self.state {
                State::Live(at) => return Some(at),
                State::Ended => return None,
                State::Starting => match self.notes.recv().await.ok().as_deref() {
                    Some(Note::Live(at)) => self.state = State::Live(*at),
                    Some(Note::Deletes { .. }) => {}
                    Some(Note::Ended) | None => self.state = State::Ended,
                },
            }
        }
    }

    /// The next delete events; `None` once the watch ended or this wait fell behind it (the
    /// caller reads again, on a new subscription).
    pub(crate) async fn next(&mut self) -> Option<Arc<Note>> {
        loop {
            let note = self.notes.recv().await.ok()?;
            match &*note {
                Note::Deletes { .. } => return Some(note),
                Note::Live(_) => {}
                Note::Ended => return None,
            }
        }
    }
}

impl NameWatches {
    /// Subscribes to the watch of `prefix`, starting it if the client has none, for a wait of
    /// `admission`.
    pub(crate) fn subscribe(
        &self,
        backend: &impl WatchSource,
        prefix: &str,
        admission: Admission,
    ) -> Subscription {
        let mut hubs = self.hubs.lock().unwrap_or_else(|p| p.into_inner());
        let hub = hubs
            .entry(prefix.to_string())
            .or_insert_with(|| {
                let hub = Arc::new(Hub {
                    notes: broadcast::channel(BACKLOG).0,
                    state: Mutex::new(State::Starting),
                    shared: AtomicBool::new(false),
                });
                tokio::spawn(run(
                    backend.clone(),
                    prefix.to_string(),
                    hub.clone(),
                    Arc::downgrade(&self.hubs),
                ));
                hub
            })
            .clone();
        if admission != Admission::Exclusive {
            hub.shared.store(true, Ordering::Relaxed);
        }
        // Subscribed before the state is read: a change after the read is a note received.
        let notes = hub.notes.subscribe();
        let state = *hub.state.lock().unwrap_or_else(|p| p.into_inner());
        Subscription { notes, state }
    }
}

/// Keeps `prefix`'s watch, passing its notes on, until it ends or nobody waited for [`LINGER`]
/// (or [`IDLE_DELETES`] on a name only exclusive entries waited on).
///
/// etcd starts a watch that names no start revision just after the revision it read before
/// registering it; a write committed in between leaves the watch behind ("unsynced"), and the
/// server's catch-up loop delivers its events up to 100 ms late (seen: 3 % of the hand-overs
/// with 8 clients took 30 to 100 ms, each on a watch made just before). A read answered at the
/// revision of the watch's creation proves no write came in between; when it does not, a second
/// watch of the name is made on the same stream, and the deletes of both are passed on, so a
/// wait is late only when both fell behind, until the first passes on a delete after the
/// second's start (in step from then: the second is cancelled). A delete passed on twice
/// changes nothing the second time: a wait removes a key once, and ignores deletes older than
/// its view.
async fn run(
    backend: impl WatchSource,
    prefix: String,
    hub: Arc<Hub>,
    hubs: Weak<Mutex<HashMap<String, Arc<Hub>>>>,
) {
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut]);
    let opened = backend
        .watch(prefix.clone().into_bytes(), options.clone())
        .await;
    let mut backend = Some(backend);
    let mut ticks = tokio::time::interval(LINGER);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Deletes are counted once each, by revision: with a second watch every delete comes twice,
    // and counted twice, two deletes ended the watch (most watches made while writes land need
    // the second one, so with 8 clients a client's watch ended and was made again every few
    // hand-overs). A delete at or below the newest revision seen is such a repeat, or a late
    // one, which only keeps the watch a little longer.
    let (mut idle, mut idle_deletes, mut newest) = (false, 0, 0);
    // The first watch's id; the second's with the revision it starts after, while it stays; the
    // second's id once cancelled (its answer says so, and ends nothing). The revision each
    // watch starts after, by id, for its deletes' `since`.
    let (mut first, mut second, mut dropped) = (None, None, None);
    let mut starts: Vec<(i64, i64)> = Vec::with_capacity(2);
    if let Ok(mut watch) = opened {
        loop {
            tokio::select! {
                msg = watch.message() => match msg {
                    Ok(Some(w)) if w.canceled() && Some(w.watch_id()) == dropped => {}
                    Ok(Some(w)) if w.canceled() || w.compact_revision() > 0 => break,
                    Ok(Some(w)) if w.created() => {
                        // The first creation is proven; the second watch's needs nothing. The
                        // client is let go after the proof, so a lingering watch does not keep a
                        // dropped client (its session, its other streams) alive.
                        let Some(backend) = backend.take() else {
                            let from = w.header().map_or(i64::MAX, |h| h.revision());
                            second = Some((w.watch_id(), from));
                            starts.push((w.watch_id(), from));
                            continue;
                        };
                        first = Some(w.watch_id());
                        let at = w.header().map_or(i64::MAX, |h| h.revision());
                        starts.push((w.watch_id(), at));
                        *hub.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Live(at);
                        let _ = hub.notes.send(Arc::new(Note::Live(at)));
                        let proof = GetOptions::new().with_count_only();
                        let read = backend.get(prefix.clone(), proof).await;
                        let proven = read.is_ok_and(|r| r.header().is_some_and(|h| h.revision() == at));
                        // Best effort: the first watch alone is complete, only maybe late.
                        if !proven && watch.watch(prefix.clone(), Some(options.clone())).await.is_err() {
                            break;
                        }
                    }
                    Ok(Some(w)) => {
                        let deletes = deletes(&w);
                        if deletes.is_empty() {
                            continue;
                        }
                        // The first watch passed on a delete after the second's start: etcd's
                        // catch-up hands a late watch everything up to the current revision
                        // before it counts it in step, so the first is in step now, and the
                        // second only doubles every event (twice the messages to the client).
                        if let Some((id, from)) = second
                            && Some(w.watch_id()) == first
                            && deletes.iter().any(|(_, rev)| *rev > from)
                        {
                            second = None;
                            dropped = Some(id);
                            if watch.cancel(id).await.is_err() {
                                break;
                            }
                        }
                        let new = deletes.iter().filter(|(_, rev)| *rev > newest).count();
                        newest = deletes.iter().fold(newest, |n, (_, rev)| n.max(*rev));
                        if hub.notes.receiver_count() == 0 {
                            idle_deletes += new;
                            if idle_deletes >= IDLE_DELETES
                                && !hub.shared.load(Ordering::Relaxed)
                                && close_if_idle(&hubs, &prefix, &hub)
                            {
                                return;
                            }
                        } else {
                            idle_deletes = 0;
                        }
                        // A wait that subscribes from now on may have missed these deletes: it
                        // reads at their revision or later.
                        if let Some(h) = w.header() {
                            let mut state = hub.state.lock().unwrap_or_else(|p| p.into_inner());
                            if let State::Live(at) = *state {
                                *state = State::Live(at.max(h.revision()));
                            }
                        }
                        let since = starts
                            .iter()
                            .find(|(id, _)| *id == w.watch_id())
                            .map_or(i64::MAX, |(_, from)| *from);
                        let _ = hub.notes.send(Arc::new(Note::Deletes { since, deletes }));
                    }
                    Ok(None) | Err(_) => break,
                },
                _ = ticks.tick() => {
                    if hub.notes.receiver_count() > 0 {
                        idle = false;
                    } else if std::mem::replace(&mut idle, true) && close_if_idle(&hubs, &prefix, &hub) {
                        return;
                    }
                }
            }
        }
    }
    if let Some(hubs) = hubs.upgrade() {
        let mut hubs = hubs.lock().unwrap_or_else(|p| p.into_inner());
        if hubs.get(&prefix).is_some_and(|h| Arc::ptr_eq(h, &hub)) {
            hubs.remove(&prefix);
        }
    }
    *hub.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Ended;
    let _ = hub.notes.send(Arc::new(Note::Ended));
}

/// The deletes `w` reports, with their revisions.
pub(crate) fn deletes(w: &WatchResponse) -> Vec<(Vec<u8>, i64)> {
    w.events()
        .iter()
        .filter(|e| e.event_type() == EventType::Delete)
        .filter_map(|e| e.kv())
        .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
        .collect()
}

/// Forgets `hub` if nobody subscribed to it; checked under the map's lock, which a subscriber
/// takes too, so none can join it after. A map gone (the client dropped) leaves nothing to keep.
fn close_if_idle(
    hubs: &Weak<Mutex<HashMap<String, Arc<Hub>>>>,
    prefix: &str,
    hub: &Arc<Hub>,
) -> bool {
    let Some(hubs) = hubs.upgrade() else {
        return true;
    };
    let mut hubs = hubs.lock().unwrap_or_else(|p| p.into_inner());
    if hub.notes.receiver_count() > 0 {
        return false;
    }
    if hubs.get(prefix).is_some_and(|h| Arc::ptr_eq(h, hub)) {
        hubs.remove(prefix);
    }
    true
}
