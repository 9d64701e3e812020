//! The one error type every backend returns.

use std::time::Duration;

use crate::guarantee::Guarantee;

/// Why a lease is known or presumed lost. Carried by the lost signal and by [`LockError::Lost`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The backend answered a renewal with "not yours": the lock expired or was taken.
    RenewalRefused,
    /// Renewals failed (network, server) until the local validity deadline came.
    RenewalFailed,
    /// The validity deadline passed without a successful renewal (fixed lease time, no watchdog).
    Expired,
    /// The backend session (etcd lease, ZooKeeper session, connection) carrying the lock died.
    SessionLost,
    /// The connection to the backend was interrupted and the lease is presumed lost (suspect).
    Disconnected,
}

impl LostReason {
    /// A short, stable label (metrics, logs): `renewal_refused`, `renewal_failed`, `expired`,
    /// `session_lost`, `disconnected`.
    pub fn label(self) -> &'static str {
        match self {
            LostReason::RenewalRefused => "renewal_refused",
            LostReason::RenewalFailed => "renewal_failed",
            LostReason::Expired => "expired",
            LostReason::SessionLost => "session_lost",
            LostReason::Disconnected => "disconnected",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::RenewalRefused => "renewal refused: the lock is no longer ours",
            LostReason::RenewalFailed => "renewals failed until the validity deadline",
            LostReason::Expired => "the validity deadline passed without a renewal",
            LostReason::SessionLost => "the backend session holding the lock died",
            LostReason::Disconnected => "the connection to the backend was interrupted",
        })
    }
}

/// Every failure of the lock API.
///
/// Variants separate what a caller does next: `Busy` / `Timeout` (try later), `NotHeld` / `Lost`
/// (stop acting as the holder), `Unsupported` / `InvalidName` / `InvalidConfig` (fix the code or
/// configuration, a retry cannot help) and `Backend` (look at [`LockError::is_retryable`]).
/// No variant ever carries the owner secret of a lease.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A try-acquire found the lock held by someone else. Nothing was left behind in the backend.
    #[error("lock {} is held by another owner", shown(name))]
    Busy {
        /// The lock name as the caller gave it.
        name: String,
    },
    /// Waiting for the lock ran past the caller's deadline. Nothing was left queued.
    #[error("timed out after {waited:?} waiting for lock {}", shown(name))]
    Timeout {
        /// The lock name as the caller gave it.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The operation needed a held lock, but we no longer hold it (expired, released, or taken).
    #[error("lock {} is not held by this lease any more", shown(name))]
    NotHeld {
        /// The lock name.
        name: String,
    },
    /// The lease was lost (see [`LostReason`]); the holder must stop acting as the owner.
    #[error("lock {} was lost: {reason}", shown(name))]
    Lost {
        /// The lock name.
        name: String,
        /// Why the lease was lost.
        reason: LostReason,
    },
    /// The backend cannot give what was asked for (for example `Correctness` from Redis).
    #[error("backend {backend} cannot provide {what}")]
    Unsupported {
        /// The backend kind (`memory`, `redis`, ...).
        backend: &'static str,
        /// What was asked for and is missing.
        what: String,
    },
    /// The lock name breaks the naming rule; checked before any I/O.
    #[error("invalid lock name {}: {reason}", shown(name))]
    InvalidName {
        /// The offending name, quoted in the message.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// An option or configuration value is out of range or malformed.
    #[error("invalid configuration {key} = {}: {reason}", shown(value))]
    InvalidConfig {
        /// The option or configuration key.
        key: String,
        /// The offending value, printed (never a secret).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A semaphore was asked for with another number of permits than its current users hold
    /// or wait with: every user of one name must agree on it. Nothing was left queued.
    #[error(
        "semaphore {} is in use with {theirs} permits, not {ours}",
        shown(name)
    )]
    LimitMismatch {
        /// The semaphore name.
        name: String,
        /// The number of permits this call asked for.
        ours: u32,
        /// The number the semaphore's current holders or waiters use.
        theirs: u32,
    },
    /// The name's queue holds an entry of a lock recipe this backend cannot share a queue with
    /// (on ZooKeeper, a node of kazoo's `Lock`, which counts only its own nodes as contenders
    /// and so never sees ours): taking the lock beside it could make two holders. Nothing was
    /// left queued.
    #[error(
        "lock {} is queued by another lock recipe (its entry {}), whose holders cannot see distlock's: refused",
        shown(name),
        shown(entry)
    )]
    ForeignEntry {
        /// The lock name.
        name: String,
        /// The foreign entry (a node name, a key).
        entry: String,
    },
    /// The backend failed (network, server error, protocol).
    #[error("{backend} backend failed{}: {source}", if *.retryable { " (retryable)" } else { "" })]
    Backend {
        /// The backend kind (`memory`, `redis`, ...), with the server address where known.
        backend: String,
        /// Whether retrying the same operation can succeed: true on every backend for a link
        /// that failed, a server that cannot serve now, and a server out of room (etcd's
        /// `NOSPACE`, Redis's `OOM`, PostgreSQL's class 53), which takes the call once freed.
        retryable: bool,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl LockError {
    /// Whether retrying the same call may succeed: true for `Busy`, `Timeout` and retryable
    /// backend failures; false for everything a retry cannot fix.
    pub fn is_retryable(&self) -> bool {
        match self {
            LockError::Busy { .. } | LockError::Timeout { .. } => true,
            LockError::Backend { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// A backend failure wrapping any error.
    pub fn backend(
        backend: impl Into<String>,
        retryable: bool,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        LockError::Backend {
            backend: backend.into(),
            retryable,
            source: source.into(),
        }
    }

    /// A backend failure that struck a whole batch, once per item: the same backend, retryable
    /// flag and message (the source chain becomes text).
    pub fn for_each_item(&self) -> Self {
        match self {
            LockError::Backend {
                backend,
                retryable,
                source,
            } => LockError::backend(backend.clone(), *retryable, source.to_string()),
            other => LockError::backend("batch", other.is_retryable(), other.to_string()),
        }
    }

    /// The error for a call site that asked for a guarantee the backend cannot give.
    pub fn unsupported_guarantee(backend: &'static str, wanted: Guarantee, why: &str) -> Self {
        LockError::Unsupported {
            backend,
            what: format!("the {wanted} guarantee ({why})"),
        }
    }

    /// An invalid option value.
    pub fn invalid_config(
        key: impl Into<String>,
        value: impl std::fmt::Debug,
        reason: impl Into<String>,
    ) -> Self {
        LockError::InvalidConfig {
            key: key.into(),
            value: format!("{value:?}"),
            reason: reason.into(),
        }
    }
}

/// How long a name or value shown in a message may be before it is cut.
const SHOWN_MAX: usize = 120;

/// `text` quoted for a message, cut after 120 characters with its full size said: a
/// 100 KB name gives a line, not 100 KB.
pub fn shown(text: &str) -> impl std::fmt::Display + '_ {
    struct Shown<'a>(&'a str);
    impl std::fmt::Display for Shown<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.0.char_indices().nth(SHOWN_MAX) {
                None => write!(f, "{:?}", self.0),
                Some((cut, _)) => write!(f, "{:?}... ({} bytes)", &self.0[..cut], self.0.len()),
            }
        }
    }
    Shown(text)
}

/// Result alias for the lock API.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_cut_in_messages() {
        let long = "n".repeat(100_000);
        let e = LockError::InvalidName {
            name: long.clone(),
            reason: "too long",
        };
        let said = e.to_string();
        assert!(said.len() < 300, "{} bytes", said.len());
        assert!(said.contains("(100000 bytes)"), "{said}");
        let short = LockError::Busy {
            name: "job".to_string(),
        };
        assert_eq!(short.to_string(), "lock \"job\" is held by another owner");
    }
}
