//! The client: the session epochs, requests with their timeouts and error mapping, the root and
//! directories, and what this client tracks of its grants.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use distlock_api::{LockError, LockName, Reconnect, RepeatGrant, Result};
use tokio::time::timeout;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, SessionState};

use crate::config::{NodeAcl, ZkOptions};
use crate::paths::{Layout, lock_dir};
use crate::probe::closing_server;
use crate::session::Epoch;

/// A lock client over a ZooKeeper ensemble: one session, shared by all its locks. Cheap to clone.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) connect: String,
    pub(crate) options: ZkOptions,
    pub(crate) epoch: tokio::sync::Mutex<Option<Arc<Epoch>>>,
    /// The session timeout the server negotiated for the latest session, in ms: every lease's TTL.
    pub(crate) negotiated_ms: AtomicU64,
    /// The session each granted node lives on, until its release went through: what
    /// [`distlock_api::LockBackend::abandon`] gives up (never another session's).
    pub(crate) granted: Mutex<HashMap<Arc<str>, i64>>,
    /// ZooKeeper gives every write of the ensemble the next zxid (a session's start and end
    /// too), so a czxid gap of 2 proves a repeat grant (see [`RepeatGrant`]).
    pub(crate) repeat: RepeatGrant,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend")
            .field("connect", &self.inner.connect)
            .field("options", &self.inner.options)
            .finish()
    }
}

impl ZkBackend {
    /// Connects to `connect` (`host:port,host:port[/chroot]`).
    ///
    /// # Errors
    /// `InvalidConfig` for an empty connect string or a root that is not an absolute path; a
    /// retryable backend error when no server answers within `connect_timeout`.
    pub async fn connect(connect: &str, options: ZkOptions) -> Result<Self> {
        if connect.trim().is_empty() {
            return Err(LockError::invalid_config(
                "connect",
                connect,
                "at least one ZooKeeper server is needed",
            ));
        }
        if !options.root.starts_with('/') || options.root.ends_with('/') {
            return Err(LockError::invalid_config(
                "root",
                &options.root,
                "must be an absolute path without a trailing /",
            ));
        }
        let backend = ZkBackend {
            inner: Arc::new(Inner {
                connect: connect.to_string(),
                options: options.clone(),
                epoch: tokio::sync::Mutex::new(None),
                negotiated_ms: AtomicU64::new(options.session_timeout.as_millis() as u64),
                granted: Mutex::new(HashMap::new()),
                repeat: RepeatGrant::default(),
            }),
        };
        backend.ensure_chroot().await?;
        backend.epoch().await?;
        Ok(backend)
    }

    /// A chroot (`host:port/app`) must exist before a client rooted in it can create anything:
    /// create it, as Curator does for its namespace, from a client without the chroot.
    async fn ensure_chroot(&self) -> Result<()> {
        let Some((hosts, chroot)) = self.inner.connect.split_once('/') else {
            return Ok(());
        };
        if chroot.trim_matches('/').is_empty() {
            return Ok(());
        }
        let client = self.new_session(hosts).await?;
        let chroot = format!("/{}", chroot.trim_matches('/'));
        self.create_path(&client, &chroot, CreateMode::Persistent)
            .await
    }

    /// A new session on `connect`. When none is made in time, says why if a server closes new
    /// connections at once (see `probe.rs`) rather than only that none answered.
    async fn new_session(&self, connect: &str) -> Result<Client> {
        let e = match self.call(self.connector().connect(connect)).await {
            Ok(client) => return Ok(client),
            Err(e) if e.is_retryable() => e,
            Err(e) => return Err(e),
        };
        let hosts = connect.split('/').next().unwrap_or(connect);
        match closing_server(hosts).await {
            Some(why) => Err(LockError::backend(
                self.label(),
                true,
                format!(
                    "no session within {:?}: {why}",
                    self.inner.options.op_timeout
                ),
            )),
            None => Err(e),
        }
    }

    fn connector(&self) -> zookeeper_client::Connector {
        let o = &self.inner.options;
        let mut connector = Client::connector()
            .with_session_timeout(o.session_timeout)
            .with_connection_timeout(o.connect_timeout);
        if let Some(digest) = &o.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        connector
    }

    /// Creates `path` and its missing ancestors (persistent), the last one with `mode`.
    async fn create_path(&self, client: &Client, path: &str, mode: CreateMode) -> Result<()> {
        let acls = self.acls();
        let mut paths: Vec<(&str, CreateMode)> = path
            .match_indices('/')
            .skip(1)
            .map(|(i, _)| (&path[..i], CreateMode::Persistent))
            .collect();
        paths.push((path, mode));
        for (path, mode) in paths {
            match self
                .call(client.create(path, &[], &mode.with_acls(acls)))
                .await
            {
                Ok(_) => {}
                Err(e) if is_zk(&e, |z| matches!(z, ZkError::NodeExists)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) fn label(&self) -> String {
        format!("zookeeper {}", self.inner.connect)
    }

    pub(crate) fn err(&self, e: ZkError) -> LockError {
        let retryable = matches!(
            e,
            ZkError::ConnectionLoss
                | ZkError::Timeout
                | ZkError::NoHosts
                | ZkError::SessionExpired
                | ZkError::SessionMoved
                | ZkError::Throttled
                | ZkError::ClientClosed
                | ZkError::NotReadOnly
        ) || transport(&e);
        LockError::backend(self.label(), retryable, e)
    }

    /// Whose node names this client's queues use.
    pub(crate) fn layout(&self) -> Layout {
        self.options().layout
    }

    pub(crate) fn options(&self) -> &ZkOptions {
        &self.inner.options
    }

    pub(crate) async fn call<T>(
        &self,
        fut: impl Future<Output = std::result::Result<T, ZkError>>,
    ) -> Result<T> {
        match timeout(self.inner.options.op_timeout, fut).await {
            Ok(r) => r.map_err(|e| self.err(e)),
            Err(_) => Err(LockError::backend(
                self.label(),
                true,
                format!("no answer within {:?}", self.inner.options.op_timeout),
            )),
        }
    }

    /// The live epoch; a new one on the same session once it is connected again, or on a new
    /// session after it expired or closed.
    pub(crate) async fn epoch(&self) -> Result<Arc<Epoch>> {
        let mut current = self.inner.epoch.lock().await;
        if let Some(e) = current.as_ref() {
            if e.is_live() {
                return Ok(e.clone());
            }
            match e.client.state() {
                SessionState::SyncConnected => {
                    let next = Epoch::start(e.client.clone(), self.inner.options.on_disconnect);
                    *current = Some(next.clone());
                    return Ok(next);
                }
                SessionState::Disconnected | SessionState::ConnectedReadOnly => {
                    return Err(LockError::backend(
                        self.label(),
                        true,
                        "disconnected from ZooKeeper; the session may come back",
                    ));
                }
                _ => {}
            }
        }
        let client = self.new_session(&self.inner.connect).await?;
        self.inner.negotiated_ms.store(
            client.session_timeout().as_millis() as u64,
            Ordering::Relaxed,
        );
        let next = Epoch::start(client, self.inner.options.on_disconnect);
        *current = Some(next.clone());
        Ok(next)
    }

    /// The live epoch; while the connection is down, waits (up to `op_timeout`) for it to come
    /// back, or for the session to turn out expired or closed (`Ok(None)`: every node of that
    /// session is gone with it).
    pub(crate) async fn epoch_settled(&self) -> Result<Option<Arc<Epoch>>> {
        let waiting = match self.epoch().await {
            Ok(e) => return Ok(Some(e)),
            Err(e) => e,
        };
        let Some(client) = self
            .inner
            .epoch
            .lock()
            .await
            .as_ref()
            .map(|e| e.client.clone())
        else {
            return Err(waiting);
        };
        let mut states = client.state_watcher();
        let settled = timeout(self.inner.options.op_timeout, async {
            let mut state = client.state();
            loop {
                match state {
                    SessionState::Disconnected => state = states.changed().await,
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => return true,
                    _ => return false,
                }
            }
        })
        .await;
        match settled {
            Ok(true) => self.epoch().await.map(Some),
            Ok(false) => Ok(None),
            Err(_) => Err(waiting),
        }
    }

    pub(crate) fn acls(&self) -> Acls<'static> {
        match self.inner.options.acl {
            NodeAcl::Open => Acls::anyone_all(),
            NodeAcl::CreatorOnly => Acls::creator_all(),
        }
    }

    /// The queue directory of `name` (see [`crate::paths`]).
    pub fn lock_dir(&self, name: &LockName) -> String {
        lock_dir(&self.inner.options.root, name)
    }

    /// A client of the current session, for the caller's own reads and guarded writes.
    ///
    /// # Errors
    /// As for connecting, when no live session can be had.
    pub async fn client(&self) -> Result<Client> {
        Ok(self.epoch().await?.client.clone())
    }

    /// Creates the root and its ancestors (persistent) and the lock's container directory, where
    /// missing (a chroot was created at connect).
    pub(crate) async fn ensure_dir(&self, client: &Client, dir: &str) -> Result<()> {
        self.create_path(client, dir, CreateMode::Container).await
    }
}

impl Reconnect for ZkBackend {
    fn identity(&self) -> Weak<dyn Any + Send + Sync> {
        Arc::downgrade(&self.inner) as Weak<Inner>
    }

    /// A new client of the same servers with the same options (see
    /// [`distlock_api::LockBackend::reconnect`]).
    async fn reconnected(&self) -> Result<Self> {
        ZkBackend::connect(&self.inner.connect, self.inner.options.clone()).await
    }
}

pub(crate) fn is_zk(e: &LockError, pred: impl Fn(&ZkError) -> bool) -> bool {
    match e {
        LockError::Backend { source, .. } => source.downcast_ref::<ZkError>().is_some_and(pred),
        _ => false,
    }
}

/// A failure of the connection itself: the client reports a read or write on a server that just
/// died ("Broken pipe") and a server that stopped answering as custom errors (its TLS set-up
/// errors too, which only a connect can meet). Another server, or a reconnect, may answer.
pub(crate) fn transport(e: &ZkError) -> bool {
    matches!(e, ZkError::Custom(_))
}

/// Our own per-call timeout (the only backend error whose source is not a ZooKeeper error).
pub(crate) fn is_local_timeout(e: &LockError) -> bool {
    matches!(e, LockError::Backend { source, .. } if source.downcast_ref::<ZkError>().is_none())
}

impl ZkBackend {
    /// Stops tracking a node's session (released, or gone with it); returns that session.
    pub(crate) fn forget(&self, path: &str) -> Option<i64> {
        self.inner
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path)
    }
}
