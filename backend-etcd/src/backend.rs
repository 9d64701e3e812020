//! [`EtcdBackend`]: the lock contract over an etcd cluster.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee, LockBackend, LockError,
    LockName, OwnerSecret, Reentrancy, Renewal, Result, Wakeup,
};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp,
    TxnOpResponse,
};
use futures_util::future::join_all;
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::EtcdOptions;
use crate::keys::{attempt_key, name_prefix, parse_attempt_key};
use crate::session::Session;

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
};

/// Pause between tries of a request that met an unavailable member.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// How many times cleanup of our own key is tried before the session TTL is left to do it.
const CLEANUP_TRIES: u32 = 3;

/// A lock client over an etcd cluster, with one session lease shared by all its locks. Cheap to
/// clone (clones share the connection and the session).
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    options: EtcdOptions,
    endpoints: String,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Sessions by lease id, so renew / release find the session a grant lives on.
    sessions: Mutex<Vec<std::sync::Weak<Session>>>,
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
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.op_timeout)
            .with_keep_alive(Duration::from_secs(1), options.op_timeout)
            .with_keep_alive_while_idle(true);
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
                client,
                options,
                endpoints: label,
                session: tokio::sync::Mutex::new(None),
                sessions: Mutex::new(Vec::new()),
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

    fn err(&self, e: etcd_client::Error) -> LockError {
        etcd_error(&self.inner.endpoints, e)
    }

    /// Runs `op` on a client, cut off after `op_timeout` in total. An `Unavailable` answer (a
    /// member that is down or has no leader) is retried meanwhile, so a request that the client
    /// routed to a dead member goes to a live one; every operation here is safe to repeat.
    async fn call<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.inner.options.op_timeout;
        loop {
            match timeout_at(deadline, op(self.inner.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if unavailable(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                    tokio::time::sleep(RETRY_PAUSE).await;
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
            .call(|c| Session::start(c, self.inner.options.session_ttl_secs()))
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

    fn session_of(&self, lease: i64) -> Option<Arc<Session>> {
        let all = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.iter()
            .filter_map(std::sync::Weak::upgrade)
            .find(|s| s.lease == lease)
    }

    /// Puts our attempt key and reports our create revision and whether we are first.
    async fn enqueue(
        &self,
        prefix: &str,
        key: &str,
        lease: i64,
        secret: &OwnerSecret,
    ) -> Result<(i64, bool)> {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key,
                    secret.expose_hex(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(prefix, Some(first.clone())),
            ])
            // A retry whose first try was applied (reply lost) finds our own key here.
            .or_else([TxnOp::get(key, None), TxnOp::get(prefix, Some(first))]);
        let resp = self
            .call(|mut c| {
                let t = txn.clone();
                async move { c.txn(t).await }
            })
            .await?;
        let gets: Vec<Option<(i64, Vec<u8>)>> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(
                    g.kvs()
                        .first()
                        .map(|kv| (kv.create_revision(), kv.value().to_vec())),
                ),
                _ => None,
            })
            .collect();
        let (my_rev, owner) = if resp.succeeded() {
            let my_rev = resp.header().map(|h| h.revision()).unwrap_or_default();
            (my_rev, gets.first().cloned().flatten().map(|(rev, _)| rev))
        } else {
            match gets.first().cloned().flatten() {
                Some((rev, value)) if value == secret.expose_hex().as_bytes() => {
                    (rev, gets.get(1).cloned().flatten().map(|(rev, _)| rev))
                }
                _ => {
                    return Err(LockError::backend(
                        self.inner.endpoints.clone(),
                        false,
                        format!("attempt key {key} exists and is not ours"),
                    ));
                }
            }
        };
        Ok((my_rev, owner == Some(my_rev)))
    }

    /// Waits until no key of `prefix` was created before `my_rev`, watching only the nearest
    /// predecessor each time and re-checking all of them after every event. Returns whether our
    /// key (`key`, created at `my_rev`) and our session are still alive at that point (etcd
    /// #11456: never grant a lock whose waiter's lease died while it waited); that check rides
    /// in the same read txn, so a hand-over costs one read after the wake-up, not two.
    async fn wait_turn(
        &self,
        prefix: &str,
        key: &str,
        my_rev: i64,
        session: &Session,
        deadline: Instant,
    ) -> Result<bool> {
        let session_lost = session.lost_signal();
        loop {
            let before = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(my_rev - 1)
                .with_limit(1)
                .with_keys_only();
            let read = Txn::new().and_then([
                TxnOp::get(prefix, Some(before)),
                TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
            ]);
            let resp = self
                .call(|mut c| {
                    let t = read.clone();
                    async move { c.txn(t).await }
                })
                .await?;
            let rev = resp.header().map(|h| h.revision()).unwrap_or_default();
            let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            });
            let (Some(preds), Some(ours)) = (gets.next(), gets.next()) else {
                return Err(LockError::backend(
                    self.inner.endpoints.clone(),
                    true,
                    "a read txn answered without its reads",
                ));
            };
            let Some(pred) = preds.kvs().first() else {
                let alive = ours
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == my_rev);
                return Ok(alive && !session.is_lost());
            };
            let pred_rev = pred.create_revision();
            let pred = pred.key().to_vec();
            // From "now", not from `rev + 1`: a watch that starts behind the current revision
            // (other clients wrote meanwhile) is "unsynced" and etcd serves it from a loop that
            // runs every 100 ms, which stalled hand-overs. What happened between our read and the
            // watch's creation is checked once the watch reports where it started.
            let mut watch = self
                .call(|mut c| {
                    let k = pred.clone();
                    async move { c.watch(k, None).await }
                })
                .await?;
            loop {
                tokio::select! {
                    msg = watch.message() => match msg {
                        Ok(Some(w)) if w.created() => {
                            let from = w.header().map_or(i64::MAX, |h| h.revision());
                            if from > rev && !self.still_there(&pred, pred_rev).await? {
                                break;
                            }
                        }
                        Ok(Some(w)) if w.events().iter().any(|e| e.event_type() == EventType::Delete) => break,
                        // Compacted or cancelled: re-read from scratch.
                        Ok(Some(w)) if w.canceled() || w.compact_revision() > 0 => break,
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => return Err(self.err(e)),
                    },
                    _ = session_lost.wait() => {
                        return Err(LockError::backend(self.inner.endpoints.clone(), true, "the session lease died while waiting"));
                    }
                    _ = tokio::time::sleep_until(deadline) => {
                        return Err(LockError::Timeout { name: String::new(), waited: Duration::ZERO });
                    }
                }
            }
        }
    }

    /// `key` still exists with create revision `rev`.
    async fn still_there(&self, key: &[u8], rev: i64) -> Result<bool> {
        let resp = self
            .call(|mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == rev))
    }

    async fn acquire_inner(&self, name: &LockName, deadline: Option<Instant>) -> Result<Grant> {
        let started = Instant::now();
        let session = self.session().await?;
        let prefix = self.name_prefix(name);
        let secret = OwnerSecret::random()?;
        let slot = session.take_slot(&prefix, &secret.expose_hex());
        let key = attempt_key(&self.inner.options.prefix, name, session.lease, slot);
        let mut queued = QueuedKey {
            backend: self.clone(),
            session: session.clone(),
            prefix: prefix.clone(),
            slot,
            key: Some(key.clone()),
        };
        let (my_rev, first) = self.enqueue(&prefix, &key, session.lease, &secret).await?;
        if !first {
            let Some(deadline) = deadline else {
                queued.remove().await;
                return Err(LockError::Busy {
                    name: name.to_string(),
                });
            };
            let waited = self
                .wait_turn(&prefix, &key, my_rev, &session, deadline)
                .await;
            let outcome = match waited {
                Ok(true) => Ok(()),
                Ok(false) => Err(LockError::backend(
                    self.inner.endpoints.clone(),
                    true,
                    "our queue key or session died while waiting",
                )),
                Err(LockError::Timeout { .. }) => Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: started.elapsed(),
                }),
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                queued.remove().await;
                return Err(e);
            }
        }
        queued.key = None;
        Ok(Grant {
            key: GrantKey {
                name: name.clone(),
                resource: key,
                secret,
            },
            token: Some(FencingToken(my_rev as u64)),
            ttl: session.ttl,
            sent_at: session.refreshed(),
            session: Some(session.lost_signal()),
        })
    }
}

/// Our attempt key while we are not (yet) its holder: dropped armed (try-acquire lost, timeout,
/// error, or the acquire future was dropped), it deletes the key in the background, retried and
/// bounded, and gives its slot back once the delete went through; the session TTL is the
/// fallback (and the slot then stays taken, so the key is never reused while it may exist).
struct QueuedKey {
    backend: EtcdBackend,
    session: Arc<Session>,
    prefix: String,
    slot: u64,
    key: Option<String>,
}

impl QueuedKey {
    /// Deletes the key now (the caller waits), so a failed acquire returns with nothing left.
    async fn remove(mut self) {
        if let Some(key) = self.key.take() {
            self.delete(&key).await;
        }
    }

    async fn delete(&self, key: &str) {
        for attempt in 0..CLEANUP_TRIES {
            let deleted = self
                .backend
                .call(|mut c| async move { c.delete(key, None).await })
                .await;
            if deleted.is_ok() {
                self.session.free_slot(&self.prefix, self.slot);
                return;
            }
            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        }
        tracing::warn!(
            key,
            "distlock etcd: could not delete a queue key; the session TTL will"
        );
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
        };
        rt.spawn(async move { rest.delete(&key).await });
    }
}

/// A member is down or has no leader: another member may answer.
fn unavailable(e: &etcd_client::Error) -> bool {
    match e {
        // gRPC UNAVAILABLE (14).
        etcd_client::Error::GRpcStatus(s) => s.code() as i32 == 14,
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

    async fn try_acquire(&self, name: &LockName, _ttl: Duration) -> Result<Grant> {
        self.acquire_inner(name, None).await
    }

    async fn acquire(&self, name: &LockName, _ttl: Duration, deadline: Instant) -> Result<Grant> {
        self.acquire_inner(name, Some(deadline)).await
    }

    /// A keep-alive of the session lease, then a check that our key is still there: the lease
    /// TTL counts from this renewal's send time; a missing key or lease is "not held".
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> Result<Renewal> {
        distlock_api::renew_as_batch(self, key, ttl).await
    }

    /// Session level: per session (a client has one), a keep-alive and a `LeaseTimeToLive` that
    /// lists the keys attached to the lease, sent together: one round trip per tick whatever the
    /// number of leases. A lease is renewed when its session answered the keep-alive and its key
    /// is still attached and its slot is held with the grant's secret (the path names our lease
    /// and that slot, so attached means ours; a key deleted by anyone else is "not held").
    async fn renew_batch(&self, batch: &[(&GrantKey, Duration)]) -> Vec<Result<Renewal>> {
        let mut sessions: Vec<(i64, Option<Arc<Session>>)> = Vec::new();
        for (key, _) in batch {
            if let Some(lease) = parse_attempt_key(&key.resource).map(|(l, _)| l)
                && !sessions.iter().any(|(l, _)| *l == lease)
            {
                sessions.push((lease, self.session_of(lease).filter(|s| !s.is_lost())));
            }
        }
        let deadline = Instant::now() + self.inner.options.op_timeout;
        let checks = join_all(sessions.iter().map(|(lease, session)| async move {
            let Some(session) = session else {
                return Ok(None);
            };
            let keys = self.call(|mut c| async move {
                c.lease_time_to_live(*lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
                    .await
            });
            let (alive, keys) = tokio::join!(timeout_at(deadline, session.refresh()), keys);
            let alive = alive
                .map_err(|_| {
                    LockError::backend(self.inner.endpoints.clone(), true, "keep-alive timed out")
                })?
                .map_err(|e| self.err(e))?;
            let keys = keys?;
            Ok::<_, LockError>((alive && keys.ttl() > 0).then(|| keys.keys().to_vec()))
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
                    Some(Ok(Some(attached))) => {
                        Ok(if attached.iter().any(|k| k == key.resource.as_bytes()) {
                            Renewal::Renewed
                        } else {
                            Renewal::NotHeld
                        })
                    }
                }
            })
            .collect()
    }

    /// Deletes our attempt key. On a session of this client (the usual case) the secret is
    /// checked against the slot's holder without a server call, then a plain delete goes out: the
    /// key path (our session lease, a slot this grant holds until now) names this grant alone
    /// (see [`crate::keys`]), and it was held if there was a key to delete; the slot is given
    /// back once the delete went through. A key of a session this client no longer tracks is
    /// deleted only if its value is the secret (a compare-and-delete txn).
    async fn release(&self, key: &GrantKey) -> Result<bool> {
        let path = key.resource.as_str();
        let secret = key.secret.expose_hex();
        let Some((lease, slot)) = parse_attempt_key(path) else {
            return Ok(false);
        };
        let Some(session) = self.session_of(lease) else {
            let txn = Txn::new()
                .when([Compare::value(path, CompareOp::Equal, secret)])
                .and_then([TxnOp::delete(path, None)]);
            return Ok(self
                .call(|mut c| {
                    let t = txn.clone();
                    async move { c.txn(t).await }
                })
                .await?
                .succeeded());
        };
        let prefix = self.name_prefix(&key.name);
        if !path.starts_with(&prefix) || !session.holds_slot(&prefix, slot, &secret) {
            return Ok(false);
        }
        let deleted = self
            .call(|mut c| async move { c.delete(path, None).await })
            .await?;
        session.free_slot(&prefix, slot);
        Ok(deleted.deleted() > 0)
    }
}
