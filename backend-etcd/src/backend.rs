//! [`EtcdBackend`]: the lock contract over an etcd cluster.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Admission, Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, Leader,
    LockBackend, LockError, LockName, LockStatus, OwnerSecret, Reentrancy, Renewal, RepeatGrant,
    RepeatPrior, Result, Wakeup,
};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    KvClient, LeaseClient, LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, TlsOptions,
    Txn, TxnOp, TxnOpResponse, TxnResponse, WatchClient, WatchFilterType, WatchOptions,
};
use futures_util::future::join_all;
use futures_util::stream::BoxStream;
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::EtcdOptions;
use crate::keys::{attempt_key, name_prefix, parse_attempt_key};
use crate::session::Session;
use crate::try_acquire::Tried;
use crate::watches::{NameWatches, Note};

/// What the etcd backend declares: correctness grade, cluster-wide monotonic fencing (create
/// revisions), FIFO by revision, client-side re-entrancy, whole-second TTLs (the session lease),
/// watch wake-ups.
pub const CAPABILITIES: Capabilities = Capabilities {
    guarantee: Guarantee::Correctness,
    fencing: Fencing::ClusterWide,
    fifo: true,
    reentrancy: Reentrancy::ClientSide,
    ttl_granularity: Duration::from_secs(1),
    min_ttl: Duration::from_secs(2),
    wakeup: Wakeup::Watch,
    policies: true,
};

/// Pause between tries of a request that met an unavailable member.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// How many tries after a transient failure go out at once, before the pause: a member that is
/// down fails a request at once and keeps its place in the client's balancer (it reconnects on
/// its next turn), so the next try most likely goes to a live member. With a pause after every
/// failure, one member of three down cut one client's pairs per 3 s from ~1 100 to 87.
const RETRIES_AT_ONCE: u32 = 2;

/// How often at most the endpoints are put back into the client's balancer after transport
/// errors: its load balancer drops an endpoint whose connection failed and never takes it back
/// by itself, so a member that was down would stay unused after it returns (seen: throughput
/// halved after one member of three was killed and restarted).
const READD_EVERY: Duration = Duration::from_secs(1);

/// How many times cleanup of our own key is tried before the session TTL is left to do it.
const CLEANUP_TRIES: u32 = 3;

/// How many of the keys ahead an exclusive entry reads, nearest first. With more ahead it
/// follows the farthest of them alone (one watch of one key: a release wakes one far waiter);
/// within it, it applies the name's shared watch ([`crate::watches`]), which only clients
/// near the head keep open. 8: every waiter of a queue of up to 9 clients waits on its shared
/// watch with nothing to make on its turn (8 clients, 0.5 ms RTT: 462 hand-overs/s against 359
/// with 4), and in a long queue a waiter reaches it seven hand-overs before its turn.
const WINDOW: usize = 8;

/// What a waiter knows of the keys ahead of its own, true as of revision `at`.
struct Ahead {
    /// How our entry is admitted.
    admission: Admission,
    /// The nearest keys created before ours, nearest first, with their limits. An exclusive
    /// entry reads at most [`WINDOW`] (it waits for them all, so a full list may be cut short:
    /// more keys may be further ahead); any other reads them all (it counts them).
    keys: Vec<(Vec<u8>, u32)>,
    /// `keys` holds every key ahead of ours.
    whole: bool,
    /// Our own key still exists (with our create revision).
    alive: bool,
    /// The revision this view is true at (only events after it change it); `None` once it may
    /// be stale (a watch ended, or the key followed went): read again before deciding.
    at: Option<i64>,
}

impl Ahead {
    fn new(admission: Admission, keys: Vec<(Vec<u8>, u32)>, whole: bool, at: i64) -> Self {
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
    fn admitted(&self) -> bool {
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

/// A lock client over an etcd cluster, with one session lease shared by all its locks. Cheap to
/// clone (clones share the connection and the session).
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// The client's services, cloned per request instead of the whole client: a `Client` clone
    /// copies eight service clients and the connect options (~5 us measured), one service ~0.5 us.
    kv: KvClient,
    watch: WatchClient,
    lease: LeaseClient,
    options: EtcdOptions,
    endpoints: String,
    /// The endpoints as given, to put back into the client's balancer after transport errors.
    members: Vec<String>,
    /// When they were last put back (at most once per [`READD_EVERY`]).
    readded: Mutex<Option<Instant>>,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Sessions by lease id, so renew / release find the session a grant lives on.
    sessions: Mutex<Vec<std::sync::Weak<Session>>>,
    /// The name watches its waits share.
    watches: NameWatches,
    /// etcd gives every txn that changes a key the next revision (a lease expiry that deletes
    /// keys too; one that changes nothing keeps it), so a gap of 2 between our released key's
    /// create revision and our new one proves a repeat grant (see [`RepeatGrant`]).
    repeat: RepeatGrant,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.inner.endpoints)
            .field("options", &self.inner.options)
            .finish()
    }
}

impl EtcdBackend {
    /// Connects to the cluster at `endpoints` (`host:port` each).
    ///
    /// # Errors
    /// `InvalidConfig` for an empty endpoint list; a retryable backend error when no endpoint
    /// answers within `connect_timeout`.
    pub async fn connect(endpoints: &[String], options: EtcdOptions) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(LockError::invalid_config(
                "endpoints",
                endpoints,
                "at least one etcd endpoint is needed",
            ));
        }
        let label = format!("etcd {}", endpoints.join(","));
        // Pings only while a request or stream is open, and no more often than a stock etcd
        // accepts (see `EtcdOptions::keepalive`); every request (watches included) needs the
        // member to have a leader, so a member cut off from the quorum fails fast instead of
        // holding a silent watch open. (No test shows the silent watch: a waiter behind a
        // leaderless member times out either way, and once the member rejoins, its watch
        // catches up; the refusal is what `wait_turn` now handles.)
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.op_timeout)
            .with_keep_alive(options.keepalive, options.op_timeout)
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        if let Some((user, password)) = &options.credentials {
            connect = connect.with_user(user.clone(), password.clone());
        }
        if let Some(tls) = &options.tls {
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.client_identity {
                t = t.identity(Identity::from_pem(cert, key));
            }
            if let Some(domain) = &tls.domain {
                t = t.domain_name(domain.clone());
            }
            connect = connect.with_tls(t);
        }
        let client = timeout(
            options.connect_timeout,
            Client::connect(endpoints, Some(connect)),
        )
        .await
        .map_err(|_| LockError::backend(label.clone(), true, "connect timed out"))?
        .map_err(|e| etcd_error(&label, e))?;
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                kv: client.kv_client(),
                watch: client.watch_client(),
                lease: client.lease_client(),
                client,
                options,
                endpoints: label,
                members: endpoints.to_vec(),
                readded: Mutex::new(None),
                session: tokio::sync::Mutex::new(None),
                sessions: Mutex::new(Vec::new()),
                repeat: RepeatGrant::default(),
                watches: NameWatches::default(),
            }),
        })
    }

    /// The range holding `name`'s holder and queue keys (see [`crate::keys`]).
    pub fn name_prefix(&self, name: &LockName) -> String {
        name_prefix(&self.inner.options.prefix, name)
    }

    /// The raw etcd client, for the caller's own guarded transactions.
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    pub(crate) fn kv(&self) -> KvClient {
        self.inner.kv.clone()
    }

    pub(crate) fn lease_client(&self) -> LeaseClient {
        self.inner.lease.clone()
    }

    pub(crate) fn watch_client(&self) -> WatchClient {
        self.inner.watch.clone()
    }

    fn err(&self, e: etcd_client::Error) -> LockError {
        etcd_error(&self.inner.endpoints, e)
    }

    /// Runs `op` on a clone of `client` (one of ours), cut off after `op_timeout` in total. A
    /// transport failure (a member that is down, has no leader, reset the connection or timed
    /// out a proposal: [`transient`]) is retried meanwhile, so a request that the client routed
    /// to a dead member goes to a live one. Every operation sent through here is safe to repeat:
    /// reads, keep-alives, watches, and writes that are conditional on their own outcome (the
    /// enqueue finds its own key, a delete compares the key's value). The one exception, a lease
    /// grant, leaves at worst an unused lease that expires after its TTL.
    pub(crate) async fn call<C, T, F, Fut>(&self, client: &C, mut op: F) -> Result<T>
    where
        C: Clone,
        F: FnMut(C) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.inner.options.op_timeout;
        let mut at_once = RETRIES_AT_ONCE;
        loop {
            match timeout_at(deadline, op(client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if transient(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                    self.readd_members().await;
                    if at_once > 0 {
                        at_once -= 1;
                    } else {
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
                Ok(Err(e)) => return Err(self.err(e)),
                Err(_) => {
                    return Err(LockError::backend(
                        self.inner.endpoints.clone(),
                        true,
                        format!("no answer within {:?}", self.inner.options.op_timeout),
                    ));
                }
            }
        }
    }

    /// Deletes `key` if its value is `entry` (what the attempt wrote: its secret, or the secret
    /// and an announced value), or another value the same attempt wrote
    /// ([`distlock_api::entry_written_by`]: a proclaim this client did not see answered); returns
    /// whether it did. A key path is reused by the session's next attempt on the name once freed,
    /// so a plain delete that arrives late (a timed-out try that etcd still applies, a background
    /// clean-up racing the next acquire) could delete the next grant's key: the compare makes a
    /// late delete find nothing. Safe to repeat; one round trip when `entry` is current (etcd
    /// compares whole values, so another value of ours is read first). (No test shows the late
    /// delete: it needs etcd to apply a request after a later one of the same client, which the
    /// harness's proxy, delaying a whole connection in order, cannot arrange.)
    pub(crate) async fn delete_ours(&self, key: &str, entry: &str) -> Result<bool> {
        let secret = entry.split(':').next().unwrap_or(entry);
        let mut expected = entry.as_bytes().to_vec();
        // A value changes only by a proclaim of the same holder, so two reads settle it.
        for _ in 0..3 {
            let txn = Txn::new()
                .when([Compare::value(key, CompareOp::Equal, expected.clone())])
                .and_then([TxnOp::delete(key, None)])
                .or_else([TxnOp::get(key, None)]);
            let resp = self.txn(txn).await?;
            if resp.succeeded() {
                return Ok(true);
            }
            let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().next() else {
                return Err(self.err_text("a delete txn answered without its read"));
            };
            match got.kvs().first() {
                Some(kv) if distlock_api::entry_written_by(kv.value(), secret) => {
                    expected = kv.value().to_vec();
                }
                _ => return Ok(false),
            }
        }
        Err(LockError::backend(
            self.inner.endpoints.clone(),
            true,
            format!("the value of {key} kept changing during its delete"),
        ))
    }

    /// Puts every endpoint back into the client's balancer (see [`READD_EVERY`]).
    async fn readd_members(&self) {
        {
            let mut last = self.inner.readded.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < READD_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        for member in &self.inner.members {
            if let Err(e) = self.inner.client.add_endpoint(member).await {
                tracing::debug!(member, error = %e, "distlock etcd: could not put an endpoint back");
            }
        }
    }

    /// One txn through [`Self::call`] (every txn here is safe to repeat).
    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call(&self.inner.kv, |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    /// The live session, or a new one if there is none or it was lost (a new lease: no acquire
    /// ever reuses keys of a dead session).
    async fn session(&self) -> Result<Arc<Session>> {
        let mut current = self.inner.session.lock().await;
        if let Some(s) = current.as_ref()
            && !s.is_lost()
        {
            return Ok(s.clone());
        }
        let s = self
            .call(&self.inner.client, |c| {
                Session::start(c, self.inner.options.session_ttl_secs())
            })
            .await?;
        let mut all = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&s));
        *current = Some(s.clone());
        Ok(s)
    }

    pub(crate) fn session_of(&self, lease: i64) -> Option<Arc<Session>> {
        let all = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.iter()
            .filter_map(std::sync::Weak::upgrade)
            .find(|s| s.lease == lease)
    }

    /// Puts our attempt key; returns our create revision and what is ahead of it. The read of
    /// the keys ahead rides in the same txn, unless `prior` says to leave it out (a repeat
    /// acquire, see [`RepeatGrant`]): then a revision gap of 2 grants with no read, and any other
    /// gap reads after the put.
    async fn enqueue(
        &self,
        prefix: &str,
        key: &str,
        lease: i64,
        entry: &str,
        admission: Admission,
        prior: Option<RepeatPrior>,
    ) -> Result<(i64, Ahead)> {
        let alone = prior.as_ref().is_some_and(RepeatPrior::send_alone);
        // Our fresh key, then (unless sent alone) its nearest predecessors.
        let mut ops = vec![TxnOp::put(
            key,
            entry,
            Some(PutOptions::new().with_lease(lease)),
        )];
        if !alone {
            ops.push(TxnOp::get(prefix, Some(keys_ahead(admission, None))));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(ops)
            // A retry whose first try was applied (reply lost) finds our own key here.
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(txn).await?;
        let at = resp.header().map(|h| h.revision()).unwrap_or_default();
        if resp.succeeded() {
            if prior
                .as_ref()
                .is_some_and(|p| self.inner.repeat.proves_alone(p, at))
            {
                return Ok((at, Ahead::new(admission, Vec::new(), true, at)));
            }
            if alone {
                return Ok((at, self.read_ahead(prefix, key, at, admission).await?));
            }
        }
        let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().last() else {
            return Err(self.err_text("the enqueue txn answered without its read"));
        };
        if resp.succeeded() {
            let keys: Vec<_> = got
                .kvs()
                .iter()
                .filter(|kv| kv.create_revision() < at)
                .map(limited)
                .take(window(admission))
                .collect();
            // Nothing is behind a key just put: the count less ours is what is ahead.
            let whole = usize::try_from(got.count()).unwrap_or(0) <= keys.len() + 1;
            return Ok((at, Ahead::new(admission, keys, whole, at)));
        }
        match got.kvs().first() {
            Some(kv) if kv.value() == entry.as_bytes() => {
                let my_rev = kv.create_revision();
                Ok((
                    my_rev,
                    self.read_ahead(prefix, key, my_rev, admission).await?,
                ))
            }
            _ => Err(LockError::backend(
                self.inner.endpoints.clone(),
                false,
                format!("attempt key {key} exists and is not ours"),
            )),
        }
    }

    /// Reads what is ahead of our key (created at `my_rev`) now, and whether it still exists.
    async fn read_ahead(
        &self,
        prefix: &str,
        key: &str,
        my_rev: i64,
        admission: Admission,
    ) -> Result<Ahead> {
        let nearest = keys_ahead(admission, Some(my_rev));
        let read = Txn::new().and_then([
            TxnOp::get(prefix, Some(nearest)),
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
        ]);
        let resp = self.txn(read).await?;
        let at = resp.header().map(|h| h.revision()).unwrap_or_default();
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (Some(preds), Some(ours)) = (gets.next(), gets.next()) else {
            return Err(self.err_text("a read txn answered without its reads"));
        };
        let keys: Vec<_> = preds.kvs().iter().map(limited).collect();
        // `more`: the limit cut the keys ahead short (etcd's count is of the whole name).
        let mut ahead = Ahead::new(admission, keys, !preds.more(), at);
        ahead.alive = ours
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == my_rev);
        Ok(ahead)
    }

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
    async fn wait_turn(
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
        let mut watch = self.inner.watches.subscribe(self, prefix);
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

    /// A retryable backend error with a fixed text.
    pub(crate) fn err_text(&self, text: &'static str) -> LockError {
        LockError::backend(self.inner.endpoints.clone(), true, text)
    }

    /// [`EtcdBackend::queue_once`] on the client's session. A wait whose session died under it
    /// (a stall longer than the session TTL) queues again on a new session, at the back of the
    /// queue, for as long as its deadline allows, and rides out a server that cannot make one
    /// yet the same way; a try is one attempt.
    async fn acquire_inner(
        &self,
        name: &LockName,
        admission: Admission,
        deadline: Option<Instant>,
        value: Option<&str>,
    ) -> Result<Grant> {
        let started = Instant::now();
        let time_left = || deadline.is_some_and(|d| Instant::now() < d);
        let mut riding_out = false;
        loop {
            let session = match self.session().await {
                Ok(s) => s,
                Err(e) if riding_out && e.is_retryable() && time_left() => {
                    tracing::debug!(lock = %name, error = %e, "distlock etcd: no new session yet");
                    self.pause_until(deadline).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match self
                .queue_once(name, admission, deadline, value, &session, started)
                .await
            {
                Err(e)
                    if session.is_lost()
                        && e.is_retryable()
                        && !matches!(e, LockError::Timeout { .. })
                        && time_left() =>
                {
                    tracing::warn!(lock = %name, error = %e, "distlock etcd: the session died while waiting; queueing again on a new one");
                    riding_out = true;
                }
                other => return other,
            }
        }
    }

    /// Sleeps [`RETRY_PAUSE`], or until `deadline` if sooner.
    async fn pause_until(&self, deadline: Option<Instant>) {
        let pause = Instant::now() + RETRY_PAUSE;
        tokio::time::sleep_until(deadline.map_or(pause, |d| d.min(pause))).await;
    }

    /// Enqueues an attempt key whose value is the secret with its limit
    /// ([`Admission::entry_suffix`]), or with `value` the secret and that announced value
    /// ([`distlock_api::announced_entry`]), on `session`, and waits until `admission` admits it;
    /// a try (no `deadline`) puts its key only if admitted at once (see `try_acquire.rs`).
    async fn queue_once(
        &self,
        name: &LockName,
        admission: Admission,
        deadline: Option<Instant>,
        value: Option<&str>,
        session: &Arc<Session>,
        started: Instant,
    ) -> Result<Grant> {
        let session = session.clone();
        let prefix = self.name_prefix(name);
        let secret = OwnerSecret::random()?;
        let own = format!("{}{}", secret.expose_hex(), admission.entry_suffix());
        let entry = match value {
            Some(v) => distlock_api::announced_entry(&own, v),
            None => own,
        };
        let slot = session.take_slot(&prefix, &entry);
        let key = attempt_key(&self.inner.options.prefix, name, session.lease, slot);
        let mut queued = QueuedKey {
            backend: self.clone(),
            session: session.clone(),
            prefix: prefix.clone(),
            slot,
            key: Some(key.clone()),
            entry: entry.clone(),
            unsure: false,
        };
        // The put is polled right here (a task of its own cost ~30 us of thread hops per
        // acquire on 2 cores); if the caller gives up while it is in flight, `InFlight` moves it
        // into a task that finishes it before the armed key is dropped and deleted (see there).
        let (this, k, lease) = (self.clone(), key.clone(), session.lease);
        let Some(deadline) = deadline else {
            let shown = name.to_string();
            let put = InFlight::new(async move {
                let tried = this
                    .try_enqueue(&shown, &queued.prefix, &k, lease, &queued.entry, admission)
                    .await;
                queued.unsure = tried.is_err();
                (queued, tried)
            });
            let (queued, tried) = put
                .finish()
                .await
                .ok_or_else(|| self.err_text("the try ended without an answer"))?;
            return match tried {
                Ok(Tried::Put(my_rev)) => {
                    Ok(self.granted(queued, &secret, name, admission, my_rev))
                }
                Ok(Tried::Refused(e)) => {
                    queued.unused();
                    Err(e)
                }
                Err(e) => {
                    queued.remove().await;
                    Err(e)
                }
            };
        };
        // The repeat grant's proof holds for an exclusive entry only (one admitted with nothing
        // ahead); a shared one could have been admitted beside holders still there.
        let prior = if admission == Admission::Exclusive {
            self.inner.repeat.take(&prefix)
        } else {
            None
        };
        let put = InFlight::new(async move {
            let enqueued = this
                .enqueue(&queued.prefix, &k, lease, &queued.entry, admission, prior)
                .await;
            queued.unsure = enqueued.is_err();
            (queued, enqueued)
        });
        let (queued, enqueued) = put
            .finish()
            .await
            .ok_or_else(|| self.err_text("the enqueue ended without an answer"))?;
        let (my_rev, ahead) = enqueued?;
        if let Err(e) = admission.check_ahead(name.as_str(), ahead.keys.iter().map(|(_, l)| *l)) {
            queued.remove().await;
            return Err(e);
        }
        if !ahead.admitted() {
            let waited = self
                .wait_turn(&prefix, &key, my_rev, ahead, &session, deadline)
                .await;
            let outcome = match waited {
                Ok(true) => Ok(()),
                Ok(false) => Err(self.err_text("our queue key or session died while waiting")),
                Err(LockError::Timeout { .. }) => Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: started.elapsed(),
                }),
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                // A dead session's keys go with its lease on the server: the delete is left to
                // the background (bounded retries) rather than waited for through a link that
                // may still be down, so a wait that rides out the stall queues again at once.
                if session.is_lost() {
                    drop(queued);
                } else {
                    queued.remove().await;
                }
                return Err(e);
            }
        }
        Ok(self.granted(queued, &secret, name, admission, my_rev))
    }

    /// The grant of our queued key, admitted at `my_rev` (its fencing token): no longer ours to
    /// delete on drop.
    fn granted(
        &self,
        mut queued: QueuedKey,
        secret: &OwnerSecret,
        name: &LockName,
        admission: Admission,
        my_rev: i64,
    ) -> Grant {
        let key = queued.key.take().unwrap_or_default();
        if admission == Admission::Exclusive {
            self.inner.repeat.granted(&queued.prefix, &key, my_rev);
        }
        Grant {
            key: GrantKey {
                name: name.clone(),
                resource: key,
                secret: secret.clone(),
            },
            token: Some(FencingToken(my_rev as u64)),
            ttl: queued.session.ttl,
            sent_at: queued.session.refreshed(),
            session: Some(queued.session.lost_signal()),
        }
    }
}

/// Our attempt key while we are not (yet) its holder: dropped armed (try-acquire lost, timeout,
/// error, or the acquire future was dropped, also while [`QueuedKey::remove`] was deleting it),
/// it deletes the key in the background, retried and bounded, and gives its slot back once the
/// delete went through; the session TTL is the fallback (and the slot then stays taken, so the
/// key is never reused while it may exist).
struct QueuedKey {
    backend: EtcdBackend,
    session: Arc<Session>,
    prefix: String,
    slot: u64,
    key: Option<String>,
    /// The key's value (the attempt's secret, and an announced value), which the delete
    /// compares (see [`EtcdBackend::delete_ours`]).
    entry: String,
    /// The put got no answer (error or timeout), so it may still land: a delete that finds
    /// nothing looks once more after `op_timeout`.
    unsure: bool,
}

impl QueuedKey {
    /// The key was never put (a try refused before writing): its slot is free again.
    fn unused(mut self) {
        self.key = None;
        self.session.free_slot(&self.prefix, self.slot);
    }

    /// Deletes the key now (the caller waits), so a failed acquire returns with nothing left.
    /// The key stays armed until the delete is done: a caller dropped meanwhile leaves it to
    /// the background.
    async fn remove(mut self) {
        if let Some(key) = self.key.clone() {
            self.delete(&key).await;
            self.key = None;
        }
    }

    async fn delete(&self, key: &str) {
        let mut unsure = self.unsure;
        let mut attempt = 0;
        while attempt < CLEANUP_TRIES {
            match self.backend.delete_ours(key, &self.entry).await {
                Ok(false) if unsure => {
                    unsure = false;
                    tokio::time::sleep(self.backend.inner.options.op_timeout).await;
                }
                Ok(_) => {
                    self.session.free_slot(&self.prefix, self.slot);
                    return;
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    attempt += 1;
                }
            }
        }
        tracing::warn!(
            key,
            "distlock etcd: could not delete a queue key; the session TTL will"
        );
    }
}

/// A write that must reach its answer even if its caller gives up: polled inline by the
/// caller, moved into a task of its own when dropped unfinished. Used for the enqueue put, whose
/// output carries the armed key: a cleanup delete sent while the put is still in flight could
/// land first and let the put leave a key queued for good (seen under load); finished in a
/// task, the put answers first and only then is the key dropped, which deletes it.
struct InFlight<T: Send + 'static>(Option<Pin<Box<dyn Future<Output = T> + Send>>>);

impl<T: Send + 'static> InFlight<T> {
    fn new(write: impl Future<Output = T> + Send + 'static) -> Self {
        InFlight(Some(Box::pin(write)))
    }

    /// The write's answer (`None` only if it was already taken, which `finish` never does).
    async fn finish(mut self) -> Option<T> {
        let answer = self.0.as_mut()?.as_mut().await;
        self.0 = None;
        Some(answer)
    }
}

impl<T: Send + 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        if let (Some(write), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(write);
        }
    }
}

impl Drop for QueuedKey {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rest = QueuedKey {
            backend: self.backend.clone(),
            session: self.session.clone(),
            prefix: std::mem::take(&mut self.prefix),
            slot: self.slot,
            key: None,
            entry: std::mem::take(&mut self.entry),
            unsure: self.unsure,
        };
        rt.spawn(async move { rest.delete(&key).await });
    }
}

/// How many keys ahead an entry reads: an exclusive one the nearest [`WINDOW`]; any other
/// counts them, so it reads them all.
fn window(admission: Admission) -> usize {
    match admission {
        Admission::Exclusive => WINDOW,
        _ => usize::MAX,
    }
}

/// The read of the keys ahead of an entry created at `my_rev` (or, with `None`, of the newest
/// keys, which include the entry just put): newest first. An exclusive entry reads keys only
/// (it needs no limits); another reads their values, where the limits are.
fn keys_ahead(admission: Admission, my_rev: Option<i64>) -> GetOptions {
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
fn limited(kv: &etcd_client::KeyValue) -> (Vec<u8>, u32) {
    (kv.key().to_vec(), distlock_api::entry_limit(kv.value()))
}

/// The request met a transport failure or a member that cannot serve it now, so another try
/// (on another member, or after a reconnect) may succeed: gRPC UNAVAILABLE (down, no leader),
/// UNKNOWN and INTERNAL (how a reset or broken HTTP/2 connection surfaces: "transport error",
/// "h2 protocol error"), CANCELLED (a stream cut with its connection) and DEADLINE_EXCEEDED
/// (etcd's "request timed out" while a proposal waits for a leader).
fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(s.code() as i32, 1 | 2 | 4 | 13 | 14),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

fn etcd_error(endpoints: &str, e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    let retryable = match &e {
        E::InvalidArgs(_)
        | E::InvalidUri(_)
        | E::Utf8Error(_)
        | E::InvalidMetadataValue(_)
        | E::EndpointsNotManaged => false,
        // gRPC INVALID_ARGUMENT (3), PERMISSION_DENIED (7), UNAUTHENTICATED (16): a retry
        // cannot fix those.
        E::GRpcStatus(s) => !matches!(s.code() as i32, 3 | 7 | 16),
        _ => true,
    };
    // A transport failure comes as UNAVAILABLE (14), whose text is a debug dump of its whole
    // cause chain: say the status's message and the root cause alone, in one line.
    if let E::GRpcStatus(s) = &e
        && s.code() as i32 == 14
    {
        let mut root: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
        while let Some(next) = root.and_then(std::error::Error::source) {
            root = Some(next);
        }
        let text = match root {
            Some(cause) => format!("unreachable: {}: {cause}", s.message()),
            None => format!("unreachable: {}", s.message()),
        };
        return LockError::backend(endpoints.to_string(), retryable, text);
    }
    LockError::backend(endpoints.to_string(), retryable, e)
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    /// Every lock of a client lives on its session lease: the session TTL, whatever is asked.
    fn lease_ttl(&self, _requested: Duration) -> Duration {
        Duration::from_secs(self.inner.options.session_ttl_secs() as u64)
    }

    async fn try_acquire(&self, name: &LockName, _ttl: Duration) -> Result<Grant> {
        self.acquire_inner(name, Admission::Exclusive, None, None)
            .await
    }

    async fn acquire(&self, name: &LockName, _ttl: Duration, deadline: Instant) -> Result<Grant> {
        self.acquire_inner(name, Admission::Exclusive, Some(deadline), None)
            .await
    }

    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        _ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        self.acquire_inner(name, admission, deadline, None).await
    }

    async fn acquire_announced(
        &self,
        name: &LockName,
        _ttl: Duration,
        value: &str,
        deadline: Instant,
    ) -> Result<Option<Grant>> {
        self.acquire_inner(name, Admission::Exclusive, Some(deadline), Some(value))
            .await
            .map(Some)
    }

    /// A keep-alive of the session lease, then a check that our key is still there: the lease
    /// TTL counts from this renewal's send time; a missing key or lease is "not held".
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        let deadline = Instant::now() + self.inner.options.op_timeout;
        distlock_api::renew_as_batch(self, key, ttl, deadline).await
    }

    /// Session level: per session (a client has one), a keep-alive and a `LeaseTimeToLive` that
    /// lists the keys attached to the lease, sent together: one round trip per tick whatever the
    /// number of leases. A lease is renewed when its session answered the keep-alive and its key
    /// is still attached and its slot is held with the grant's secret (the path names our lease
    /// and that slot, so attached means ours; a key deleted by anyone else is "not held").
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<Result<Renewal>> {
        let mut sessions: Vec<(i64, Option<Arc<Session>>)> = Vec::new();
        for (key, _) in batch {
            if let Some(lease) = parse_attempt_key(&key.resource).map(|(l, _)| l)
                && !sessions.iter().any(|(l, _)| *l == lease)
            {
                sessions.push((lease, self.session_of(lease).filter(|s| !s.is_lost())));
            }
        }
        let deadline = deadline.min(Instant::now() + self.inner.options.op_timeout);
        let checks = join_all(sessions.iter().map(|(lease, session)| async move {
            let Some(session) = session else {
                return Ok(None);
            };
            let keys = self.call(&self.inner.lease, |mut c| async move {
                c.time_to_live(*lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
                    .await
            });
            let (alive, keys) = tokio::join!(
                timeout_at(deadline, session.refresh()),
                timeout_at(deadline, keys)
            );
            let late = || {
                LockError::backend(
                    self.inner.endpoints.clone(),
                    true,
                    "no answer by the renewal deadline",
                )
            };
            let alive = alive.map_err(|_| late())?.map_err(|e| self.err(e))?;
            let keys = keys.map_err(|_| late())??;
            Ok::<_, LockError>(
                (alive && keys.ttl() > 0).then(|| (keys.keys().to_vec(), session.ttl)),
            )
        }))
        .await;
        batch
            .iter()
            .map(|(key, _)| {
                // Ours only if the slot is held with this secret (a forged key is not).
                let at = parse_attempt_key(&key.resource).and_then(|(lease, slot)| {
                    let i = sessions.iter().position(|(l, _)| *l == lease)?;
                    let prefix = self.name_prefix(&key.name);
                    sessions[i]
                        .1
                        .as_ref()
                        .is_some_and(|s| s.holds_slot(&prefix, slot, &key.secret.expose_hex()))
                        .then_some(i)
                });
                match at.map(|i| &checks[i]) {
                    None | Some(Ok(None)) => Ok(Renewal::NotHeld),
                    Some(Err(e)) => Err(e.for_each_item()),
                    Some(Ok(Some((attached, ttl)))) => {
                        Ok(if attached.iter().any(|k| k == key.resource.as_bytes()) {
                            // The session's TTL, from the keep-alive sent with this renewal.
                            Renewal::Renewed { ttl: *ttl }
                        } else {
                            Renewal::NotHeld
                        })
                    }
                }
            })
            .collect()
    }

    /// Deletes our attempt key. On a session of this client (the usual case) the secret is
    /// checked against the slot's holder without a server call first; either way the delete is
    /// a compare-value txn (`delete_ours`: a delete that arrived late must not
    /// remove the path's next grant), and the slot is given back once it went through.
    async fn release(&self, key: &GrantKey) -> Result<bool> {
        let path = key.resource.as_str();
        let secret = key.secret.expose_hex();
        let Some((lease, slot)) = parse_attempt_key(path) else {
            return Ok(false);
        };
        let Some(session) = self.session_of(lease) else {
            return self.delete_ours(path, &secret).await;
        };
        let prefix = self.name_prefix(&key.name);
        let entry = match session.slot_entry(&prefix, slot, &secret) {
            Some(entry) if path.starts_with(&prefix) => entry,
            _ => return Ok(false),
        };
        let deleted = self.delete_ours(path, &entry).await?;
        // Recorded before the slot is given back: once it is, the next acquire of the name may
        // reuse the path, and a release recorded after that grant would mark it released
        // instead (and let a later acquire skip its queue read beside it). No test can force
        // a second acquire between these two lines, so the order is the guarantee.
        if deleted {
            self.inner.repeat.released(path);
        }
        session.free_slot(&prefix, slot);
        Ok(deleted)
    }

    /// Gives up the session `key`'s lock lives on: it is marked lost (every lease on it fires
    /// its lost signal), no keep-alive is sent for it any more, and a revoke is tried, so etcd
    /// frees its keys within the session TTL at the latest. Later acquires start a new session.
    async fn abandon(&self, key: &GrantKey) {
        if let Some(session) =
            parse_attempt_key(&key.resource).and_then(|(l, _)| self.session_of(l))
        {
            session.abandon();
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<LockStatus> {
        self.inspect_range(name).await
    }

    async fn announce(&self, key: &GrantKey, token: FencingToken, value: &str) -> Result<bool> {
        self.announce_entry(key, token, value).await
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.head_entry(name).await
    }

    async fn leader_changes(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        self.range_events(name).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_write_given_up_in_flight_still_reaches_its_answer() {
        let answered = Arc::new(AtomicBool::new(false));
        let flag = answered.clone();
        let write = InFlight::new(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        });
        // The caller gives up while the write is in flight...
        assert!(
            timeout(Duration::from_millis(10), write.finish())
                .await
                .is_err()
        );
        // ...and the write goes on in a task of its own (its deadline is the earlier timer).
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(answered.load(Ordering::SeqCst), "the write was dropped");
    }

    #[tokio::test]
    async fn a_write_waited_for_answers_inline() {
        assert_eq!(InFlight::new(async { 7 }).finish().await, Some(7));
    }
}
