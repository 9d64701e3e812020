//! The environment `distlock run` gives its command. The configuration's own `DISTLOCK_*`
//! variables never include these names: a program started under `distlock run` (`distlock`
//! itself, or a service that calls [`crate::Locks::load`]) loads the configuration it would
//! load outside it.

/// `1` while the command runs under the lock.
pub const LOCK_HELD: &str = "DISTLOCK_LOCK_HELD";
/// The lock name.
pub const NAME: &str = "DISTLOCK_NAME";
/// The fencing token (absent where the backend has none).
pub const TOKEN: &str = "DISTLOCK_TOKEN";
/// The backend kind (`redis`, `etcd`, ...).
pub const BACKEND: &str = "DISTLOCK_BACKEND";
/// Every variable above.
pub const ALL: [&str; 4] = [LOCK_HELD, NAME, TOKEN, BACKEND];
