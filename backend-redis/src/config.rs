//! Options of the Redis backend.

use std::time::Duration;

/// How a [`crate::RedisBackend`] talks to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Namespace of every key (see [`crate::keys`]). Default `distlock`.
    pub prefix: String,
    /// Every command is cut off after this and reported as a retryable error. Default 5 s.
    pub op_timeout: Duration,
    /// Connecting (and reconnecting) is cut off after this. Default 5 s.
    pub connect_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "distlock".to_string(),
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// How a [`crate::RedlockBackend`] runs the Redlock algorithm over independent masters.
#[derive(Debug, Clone, PartialEq)]
pub struct RedlockOptions {
    /// Key namespace on every node (see [`crate::keys`]). Default `distlock`.
    pub prefix: String,
    /// Each node's answer is waited for this long at most; keep it small against the TTL (the
    /// time spent waiting is subtracted from the lease's validity). Default 50 ms.
    pub node_timeout: Duration,
    /// Clock drift allowance as a fraction of the TTL (plus 2 ms). Default 0.01.
    pub drift_factor: f64,
    /// A failed round is retried after a random delay in this range. Default 50..250 ms.
    pub retry_delay: (Duration, Duration),
    /// How many rounds a waiting acquire tries at most (the deadline may end it sooner).
    /// Default 32.
    pub retry_count: u32,
    /// Connecting to each node is cut off after this. Default 2 s.
    pub connect_timeout: Duration,
}

impl Default for RedlockOptions {
    fn default() -> Self {
        RedlockOptions {
            prefix: "distlock".to_string(),
            node_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            retry_delay: (Duration::from_millis(50), Duration::from_millis(250)),
            retry_count: 32,
            connect_timeout: Duration::from_secs(2),
        }
    }
}
