//! The znode layout: the one place that decides where a lock lives.
//!
//! | znode | mode | why |
//! |---|---|---|
//! | `<root>` | persistent | created once, holds nothing |
//! | `<root>/<encoded name>` | container | the lock's queue; ZooKeeper deletes an empty container by itself, so names do not leak znodes |
//! | `<root>/<encoded name>/_c_<attempt>-lock-<seq>` | ephemeral sequential | one per acquire attempt; data = owner secret; the lowest sequence holds |
//!
//! `<attempt>` is the first 32 hex characters of SHA-256 of the attempt's owner secret: it is
//! the protected prefix that finds our node again after a connection loss during create (checked
//! against our session id too, CURATOR-498), and it lets release refuse a secret that does not
//! match the path without asking the server. The sequence suffix only orders the queue; the
//! fencing token is the node's czxid (cluster-wide), never the suffix (per parent, 32-bit, reset
//! when a container is re-created).

use distlock_api::{LockName, OwnerSecret};
use sha2::{Digest, Sha256};

/// The marker between the protected prefix and the sequence number.
pub const LOCK_MARKER: &str = "-lock-";

/// The queue directory of `name`.
pub fn lock_dir(root: &str, name: &LockName) -> String {
    format!("{root}/{}", name.encoded())
}

/// The protected prefix of the attempt owned by `secret`.
pub fn attempt_id(secret: &OwnerSecret) -> String {
    let digest = Sha256::digest(secret.expose_hex().as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The path given to the sequential create (the server appends the sequence number).
pub fn node_prefix(dir: &str, secret: &OwnerSecret) -> String {
    format!("{dir}/_c_{}{LOCK_MARKER}", attempt_id(secret))
}

/// Whether `path` is a node created with `secret` (no server call).
pub fn owned_by(path: &str, secret: &OwnerSecret) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|node| node.starts_with(&format!("_c_{}{LOCK_MARKER}", attempt_id(secret))))
}

/// The sequence number of a queue node's name, for ordering.
pub fn sequence(node: &str) -> Option<i64> {
    node.rsplit_once(LOCK_MARKER)?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_found_by_their_secret_only() {
        let s = OwnerSecret::random().expect("rng");
        let other = OwnerSecret::random().expect("rng");
        let dir = lock_dir("/distlock", &LockName::new("a/b").expect("valid"));
        assert_eq!(dir, "/distlock/a%2Fb");
        let node = format!("{}0000000042", node_prefix(&dir, &s));
        assert!(owned_by(&node, &s));
        assert!(!owned_by(&node, &other));
        assert_eq!(sequence(node.rsplit('/').next().expect("name")), Some(42));
    }
}
