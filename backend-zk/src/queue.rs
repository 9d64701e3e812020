//! The admission queue: our sequential node's create (with the listing sent behind it), the
//! wait for admission (watches on the nodes ahead), and the node's removal on every path that
//! ends without a grant.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    Admission, FencingToken, Grant, GrantKey, HolderInfo, LastChance, LockError, LockName,
    OwnerSecret, Result,
};
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use crate::client::{ZkBackend, is_local_timeout, is_zk};
use crate::session::Epoch;
use crate::wait::Turn;

/// How many times cleanup of our own node is tried before the session is left to remove it.
const CLEANUP_TRIES: u32 = 3;
/// How many times a create is retried when its container parent vanished meanwhile.
const CREATE_TRIES: u32 = 5;

impl ZkBackend {
    /// Creates our ephemeral sequential node; returns its path, its Stat (czxid) and the queue
    /// as it stood just after the create. The listing is sent right behind the create without
    /// waiting (requests of one session run in order, so it sees our node): an uncontended
    /// acquire costs one round trip, not two. A repeat acquire on an idle ensemble may skip the
    /// listing (see [`RepeatGrant`]). After a connection loss during create, finds the node by
    /// its protected prefix *and* our session id before creating another. The node's data is
    /// the secret and who holds it ([`HolderInfo::segment`]). A listing that shows a node of
    /// another layout refuses (see [`crate::paths::Layout::in_order`]); the caller removes ours.
    async fn create_node(
        &self,
        epoch: &Epoch,
        (dir, name): (&str, &LockName),
        secret: &OwnerSecret,
        admission: Admission,
        holder: &HolderInfo,
    ) -> Result<(String, Stat, Option<Vec<String>>)> {
        let prefix = self.layout().node_prefix(dir, secret, admission)?;
        let mode = CreateMode::EphemeralSequential.with_acls(self.acls());
        let data = format!("{}{}", secret.expose_hex(), holder.segment());
        // The repeat grant's proof holds for an exclusive entry only (one admitted with nothing
        // ahead); a shared one could have been admitted beside holders still there.
        let prior = if admission == Admission::Exclusive {
            self.inner.repeat.take(dir)
        } else {
            None
        };
        for _ in 0..CREATE_TRIES {
            let create = epoch.client.create(&prefix, data.as_bytes(), &mode);
            let (created, listed) = if prior.as_ref().is_some_and(|p| p.send_alone()) {
                (self.call(create).await, None)
            } else {
                let list = epoch.client.list_children(dir);
                let (created, listed) = tokio::join!(self.call(create), self.call(list));
                (created, listed.ok())
            };
            match created {
                Ok((stat, seq)) => {
                    let path = format!("{prefix}{seq}");
                    let listed = match &prior {
                        Some(p) if self.inner.repeat.proves_alone(p, stat.czxid) => {
                            path.rsplit('/').next().map(|node| vec![node.to_string()])
                        }
                        _ => listed
                            .map(|children| self.layout().in_order(children, &path, name))
                            .transpose()?,
                    };
                    return Ok((path, stat, listed));
                }
                Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => {
                    self.ensure_dir(&epoch.client, dir).await?
                }
                Err(e)
                    if is_zk(&e, |z| matches!(z, ZkError::ConnectionLoss))
                        || is_local_timeout(&e) =>
                {
                    let found = self
                        .find_own_node(&epoch.client, epoch.session_id(), dir, secret)
                        .await?;
                    if let Some((path, stat)) = found {
                        return Ok((path, stat, None));
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(LockError::backend(
            self.label(),
            true,
            format!("{dir} kept vanishing while creating our node"),
        ))
    }

    /// The node in `dir` with our attempt's protected name that session `owner` created, read
    /// through `client` (the owner's own, or a new session's at a process's end).
    async fn find_own_node(
        &self,
        client: &Client,
        owner: i64,
        dir: &str,
        secret: &OwnerSecret,
    ) -> Result<Option<(String, Stat)>> {
        let children = match self.call(client.list_children(dir)).await {
            Ok(c) => c,
            Err(e) if is_zk(&e, |z| matches!(z, ZkError::NoNode)) => return Ok(None),
            Err(e) => return Err(e),
        };
        for child in children
            .iter()
            .filter(|c| self.layout().owned_by(c, secret))
        {
            let path = format!("{dir}/{child}");
            if let Some(stat) = self.call(client.check_stat(&path)).await?
                && stat.ephemeral_owner == owner
            {
                return Ok(Some((path, stat)));
            }
        }
        Ok(None)
    }

    /// The queue of lock `name` (directory `dir`) in creation order as seen from our node
    /// `path`, as node names; a node of another layout refuses (see [`crate::paths::Layout::in_order`]).
    pub(crate) async fn queue(
        &self,
        client: &Client,
        (dir, name): (&str, &LockName),
        path: &str,
    ) -> Result<Vec<String>> {
        self.layout()
            .in_order(self.call(client.list_children(dir)).await?, path, name)
    }

    /// Proves our node `path` alive now, through the ensemble's leader: a `sync` (which a
    /// follower cut off from the leader cannot complete, and the leader refuses for an expired
    /// session), then a read of the node, sent right behind it (one round trip). Returns the
    /// send time, from which the session counts at least its timeout again.
    async fn prove_alive(&self, epoch: &Epoch, path: &str) -> Result<Instant> {
        let sent = Instant::now();
        let (synced, stat) = tokio::join!(
            self.call(epoch.client.sync(path)),
            self.call(epoch.client.check_stat(path))
        );
        synced?;
        match stat? {
            Some(stat) if stat.ephemeral_owner == epoch.session_id() => Ok(sent),
            _ => Err(LockError::backend(
                self.label(),
                true,
                "our queue node vanished (session lost?)",
            )),
        }
    }

    /// Creates our queue node, recording `admission`'s limit in its name, and waits until the
    /// policy admits it (a try, without `deadline`).
    pub(crate) async fn acquire_inner(
        &self,
        name: &LockName,
        admission: Admission,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        let started = Instant::now();
        let epoch = self.epoch().await?;
        let dir = self.lock_dir(name);
        // A try writes nothing where it is not admitted (see `try_acquire.rs`).
        if deadline.is_none()
            && !(admission == Admission::Exclusive && self.inner.repeat.released_in(&dir))
        {
            self.admits_now(&epoch, &dir, name, admission).await?;
        }
        let secret = OwnerSecret::random()?;
        let holder = HolderInfo::now();
        let sent = Instant::now();
        // Armed before the create is sent: if this future is dropped mid-create, the cleanup
        // finds the node by its protected prefix (requests of one session run in order, so the
        // lookup sees a create sent before it).
        let mut queued = QueuedNode {
            backend: self.clone(),
            epoch: epoch.clone(),
            dir: dir.clone(),
            secret: secret.clone(),
            path: None,
            armed: true,
        };
        let created = self
            .create_node(&epoch, (&dir, name), &secret, admission, &holder)
            .await;
        let (path, stat, listed) = match created {
            Ok(c) => c,
            Err(e) => {
                queued.remove().await;
                return Err(e);
            }
        };
        queued.path = Some(path.clone());
        let outcome = self
            .wait_turn(
                Turn {
                    epoch: &epoch,
                    dir: &dir,
                    path: &path,
                    name,
                    admission,
                },
                listed,
                sent,
                deadline,
            )
            .await;
        // The session counts its timeout from the last request of ours it answered. After a
        // long wait that may be far back (a waiter that waited longer than the session timeout
        // would get a lease already lost): prove the node alive again, through the leader.
        let session = epoch.client.session_timeout();
        let outcome = match outcome {
            Ok(confirmed) if confirmed + session / 3 < Instant::now() => {
                self.prove_alive(&epoch, &path).await
            }
            other => other,
        };
        let sent = match outcome {
            Ok(confirmed) => confirmed,
            Err(LockError::Timeout { .. }) => {
                queued.remove().await;
                return Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: started.elapsed(),
                });
            }
            Err(LockError::Busy { .. }) => {
                queued.remove().await;
                return Err(LockError::Busy {
                    name: name.to_string(),
                });
            }
            Err(e) => {
                queued.remove().await;
                return Err(e);
            }
        };
        queued.armed = false;
        if admission == Admission::Exclusive {
            self.inner.repeat.granted(&dir, &path, stat.czxid);
        }
        let path: Arc<str> = path.into();
        self.inner
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.clone(), epoch.session_id());
        Ok(Grant {
            key: GrantKey {
                name: name.clone(),
                resource: path,
                secret,
                holder,
            },
            token: Some(FencingToken(stat.czxid as u64)),
            ttl: session,
            sent_at: sent,
            session: Some(epoch.lost_signal()),
            first_ttl: None,
        })
    }
}

/// Our queue node while we do not hold the lock: deleted inline on busy / timeout / error, and
/// in the background (retried, bounded) if the acquire future is dropped, even mid-create; the
/// session is the fallback.
struct QueuedNode {
    backend: ZkBackend,
    epoch: Arc<Epoch>,
    dir: String,
    secret: OwnerSecret,
    path: Option<String>,
    armed: bool,
}

impl QueuedNode {
    /// Deletes our node now (the caller waits). It stays armed until the delete is done: a
    /// caller dropped meanwhile leaves it to the background.
    async fn remove(mut self) {
        cleanup(
            (&self.backend, &self.epoch.client),
            self.epoch.session_id(),
            &self.dir,
            &self.secret,
            self.path.clone(),
        )
        .await;
        self.armed = false;
    }
}

/// Deletes our node through `client`: `path` if the create returned, else whatever session
/// `owner` created with our protected prefix; whether it is gone.
async fn cleanup(
    (backend, client): (&ZkBackend, &Client),
    owner: i64,
    dir: &str,
    secret: &OwnerSecret,
    path: Option<String>,
) -> bool {
    for attempt in 0..CLEANUP_TRIES {
        let target = match &path {
            Some(p) => Ok(Some(p.clone())),
            None => backend
                .find_own_node(client, owner, dir, secret)
                .await
                .map(|f| f.map(|(p, _)| p)),
        };
        let done = match target {
            Ok(None) => true,
            Ok(Some(p)) => match backend.call(client.delete(&p, None)).await {
                Ok(()) => true,
                Err(e) => is_zk(&e, |z| matches!(z, ZkError::NoNode)),
            },
            Err(_) => false,
        };
        if done {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
    }
    tracing::warn!(
        dir,
        "distlock zookeeper: could not delete a queue node; the session will"
    );
    false
}

impl Drop for QueuedNode {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (backend, epoch, dir, secret, path) = (
            self.backend.clone(),
            self.epoch.clone(),
            self.dir.clone(),
            self.secret.clone(),
            self.path.take(),
        );
        // A new session finds a node whose create got no answer by its protected name and its
        // owner, our session.
        let owner = epoch.session_id();
        let now = {
            let (backend, dir, secret, path) =
                (backend.clone(), dir.clone(), secret.clone(), path.clone());
            async move { cleanup((&backend, &epoch.client), owner, &dir, &secret, path).await }
        };
        LastChance::spawn(now, backend, move |fresh| async move {
            let Ok(epoch) = fresh.epoch().await else {
                return false;
            };
            cleanup((&fresh, &epoch.client), owner, &dir, &secret, path).await
        });
    }
}
