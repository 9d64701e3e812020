//! The client: the connection to the cluster, requests with their retries and error mapping,
//! and the session every lease of this client lives on.

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_api::{LockError, LockName, Reconnect, RepeatGrant, Result};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, GetResponse, Identity,
    KvClient, LeaseClient, TlsOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchClient,
    WatchOptions, WatchStream,
};
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::EtcdOptions;
use crate::keys::name_prefix;
use crate::pace::Pace;
use crate::session::Session;
use crate::watches::{NameWatches, WatchSource};

/// Pause between tries of a request that met an unavailable member.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(50);

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

/// A lock client over an etcd cluster, with one session lease shared by all its locks. Cheap to
/// clone (clones share the connection and the session).
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    client: Client,
    /// The client's services, cloned per request instead of the whole client: a `Client` clone
    /// copies eight service clients and the connect options (~5 us measured), one service ~0.5 us.
    pub(crate) kv: KvClient,
    pub(crate) watch: WatchClient,
    pub(crate) lease: LeaseClient,
    pub(crate) options: EtcdOptions,
    pub(crate) endpoints: String,
    /// The endpoints as given, to put back into the client's balancer after transport errors.
    members: Vec<String>,
    /// When they were last put back (at most once per [`READD_EVERY`]).
    readded: Mutex<Option<Instant>>,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Sessions by lease id, so renew / release find the session a grant lives on.
    sessions: Mutex<Vec<std::sync::Weak<Session>>>,
    /// The name watches its waits share.
    pub(crate) watches: NameWatches,
    /// etcd gives every txn that changes a key the next revision (a lease expiry that deletes
    /// keys too; one that changes nothing keeps it), so a gap of 2 between our released key's
    /// create revision and our new one proves a repeat grant (see [`RepeatGrant`]).
    pub(crate) repeat: RepeatGrant,
    /// How fast this client's far waits came to their turn.
    pub(crate) pace: Pace,
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
        // etcd's auth token lapses (a stock member's after 300 s unused, a JWT at its TTL) while
        // a lock is held or a client idles: authenticate again when etcd refuses it, or the
        // release of a lock held that long is refused and the lock stays held.
        if let Some((user, password)) = &options.credentials {
            connect = connect
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
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
                pace: Pace::default(),
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

    pub(crate) fn err(&self, e: etcd_client::Error) -> LockError {
        etcd_error(&self.inner.endpoints, e)
    }

    /// Runs `op` on a clone of `client` (one of ours), cut off after `op_timeout` in total. A
    /// transport failure (a member that is down, has no leader, reset the connection or timed
    /// out a proposal: [`transient`]) is retried meanwhile, so a request that the client routed
    /// to a dead member goes to a live one; a token etcd refuses as issued before its auth store
    /// changed is replaced, once. Every operation sent through here is safe to repeat:
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
        let mut authenticated_again = false;
        // The last transient failure: when the time runs out in a retry, it says more than "no
        // answer" (an unreachable member's "connection refused", say).
        let mut last = None;
        loop {
            match timeout_at(deadline, op(client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                // etcd-client authenticates again on a lapsed token by itself, not on one issued
                // before the auth store changed (JWTs carry its revision): once, here.
                Ok(Err(e))
                    if issued_before_auth_change(&e)
                        && self.inner.options.credentials.is_some()
                        && !authenticated_again =>
                {
                    authenticated_again = true;
                    match timeout_at(deadline, self.inner.client.refresh_token()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(self.err(e)),
                        Err(_) => return Err(self.err(e)),
                    }
                }
                Ok(Err(e)) if transient(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                    last = Some(e);
                    self.readd_members().await;
                    if at_once > 0 {
                        at_once -= 1;
                    } else {
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
                Ok(Err(e)) => return Err(self.err(e)),
                Err(_) => {
                    return Err(match last {
                        Some(e) => self.err(e),
                        None => LockError::backend(
                            self.inner.endpoints.clone(),
                            true,
                            format!("no answer within {:?}", self.inner.options.op_timeout),
                        ),
                    });
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
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
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

    /// A retryable backend error with a fixed text.
    pub(crate) fn err_text(&self, text: &'static str) -> LockError {
        LockError::backend(self.inner.endpoints.clone(), true, text)
    }
}

impl Reconnect for EtcdBackend {
    fn identity(&self) -> Weak<dyn Any + Send + Sync> {
        Arc::downgrade(&self.inner) as Weak<Inner>
    }

    /// A new client of the same servers with the same options (see
    /// [`distlock_api::LockBackend::reconnect`]).
    async fn reconnected(&self) -> Result<Self> {
        EtcdBackend::connect(&self.inner.members, self.inner.options.clone()).await
    }
}

/// The request met a transport failure or a member that cannot serve it now, so another try
/// (on another member, or after a reconnect) may succeed: gRPC UNAVAILABLE (down, no leader),
/// UNKNOWN and INTERNAL (how a reset or broken HTTP/2 connection surfaces: "transport error",
/// "h2 protocol error"), CANCELLED (a stream cut with its connection) and DEADLINE_EXCEEDED
/// (etcd's "request timed out" while a proposal waits for a leader).
pub(crate) fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(s.code() as i32, 1 | 2 | 4 | 13 | 14),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// etcd refused a token issued before its auth store last changed (a user or role added,
/// a password changed): a new token is accepted.
fn issued_before_auth_change(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() as i32 == 3 && s.message() == "etcdserver: revision of auth store is old")
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

impl WatchSource for EtcdBackend {
    async fn watch(&self, key: Vec<u8>, options: WatchOptions) -> Result<WatchStream> {
        self.call(&self.inner.watch, |mut c| {
            let (k, o) = (key.clone(), options.clone());
            async move { c.watch(k, Some(o)).await }
        })
        .await
    }

    async fn get(&self, prefix: String, options: GetOptions) -> Result<GetResponse> {
        self.call(&self.inner.kv, |mut c| {
            let (k, o) = (prefix.clone(), options.clone());
            async move { c.get(k, Some(o)).await }
        })
        .await
    }
}
