//! Options of the ZooKeeper backend.

use std::time::Duration;

use crate::paths::Layout;

/// What a lease does when the client loses its connection (ZooKeeper's SUSPENDED state: the
/// session may still live, but nothing we hold can be trusted until it is back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDisconnect {
    /// Fire the lost signal at once (the default: what Curator recommends for a lock holder).
    Lose,
    /// Wait up to this long for the same session to reconnect before firing; capped at the
    /// session timeout, after which the session may have expired on the server.
    WaitUpTo(Duration),
}

/// Who may touch the lock nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAcl {
    /// `world:anyone` with all permissions (ZooKeeper's open ACL).
    Open,
    /// Only the authenticated creator (needs [`ZkOptions::digest`]).
    CreatorOnly,
}

/// How a [`crate::ZkBackend`] talks to ZooKeeper.
#[derive(Clone, PartialEq, Eq)]
pub struct ZkOptions {
    /// Path under which every lock lives (see [`crate::paths`]). Default `/distlock`.
    pub root: String,
    /// Session timeout asked of the server; it is every lease's TTL. Default 10 s.
    pub session_timeout: Duration,
    /// Connecting is cut off after this. Default 5 s.
    pub connect_timeout: Duration,
    /// Every request is cut off after this and reported as a retryable error. Default 5 s.
    pub op_timeout: Duration,
    /// See [`OnDisconnect`]. Default [`OnDisconnect::Lose`].
    pub on_disconnect: OnDisconnect,
    /// `user:password` for ZooKeeper's digest authentication.
    pub digest: Option<String>,
    /// ACL of the lock nodes. Default [`NodeAcl::Open`].
    pub acl: NodeAcl,
    /// Whose node names the queues use: Curator's (the default) or kazoo's, to share locks with
    /// that recipe (see [`Layout`]).
    pub layout: Layout,
}

impl std::fmt::Debug for ZkOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkOptions")
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("op_timeout", &self.op_timeout)
            .field("on_disconnect", &self.on_disconnect)
            .field(
                "digest",
                &self
                    .digest
                    .as_ref()
                    .map(|d| d.split(':').next().unwrap_or_default().to_string() + ":<redacted>"),
            )
            .field("acl", &self.acl)
            .field("layout", &self.layout)
            .finish()
    }
}

impl Default for ZkOptions {
    fn default() -> Self {
        ZkOptions {
            root: "/distlock".to_string(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(5),
            on_disconnect: OnDisconnect::Lose,
            digest: None,
            acl: NodeAcl::Open,
            layout: Layout::Curator,
        }
    }
}
