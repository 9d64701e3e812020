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
