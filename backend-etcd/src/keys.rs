//! The etcd key layout: the one place that decides where a lock lives.
//!
//! A lock name `n` (encoded by the shared naming rule) under prefix `p` is the key range
//! `p/<encoded n>/`. Each acquire attempt puts one key in it:
//! `p/<encoded n>/<session lease id, 16 hex>.<attempt id, 16 hex>`, attached to the client's
//! session lease. The key with the lowest create revision holds the lock; the others are the
//! queue, in arrival order (revision order). The trailing `/` keeps `p/a/` from matching
//! `p/ab/`, and encoded names never contain `/`.
//!
//! The attempt id makes keys unique per acquire even when one session acquires a name twice
//! (two owners in one process); it is random, not a secret: etcd access control, not the key
//! name, decides who may delete.

use distlock_api::LockName;

/// The range of all keys (holder and queue) of `name`.
pub fn name_prefix(prefix: &str, name: &LockName) -> String {
    format!("{prefix}/{}/", name.encoded())
}

/// The key of one acquire attempt.
pub fn attempt_key(prefix: &str, name: &LockName, lease: i64, attempt: u64) -> String {
    format!("{}{lease:016x}.{attempt:016x}", name_prefix(prefix, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_keys_live_under_their_name_only() {
        let a = LockName::new("a").expect("valid");
        let ab = LockName::new("ab").expect("valid");
        let k = attempt_key("distlock", &a, 0x1f, 7);
        assert_eq!(k, "distlock/a/000000000000001f.0000000000000007");
        assert!(k.starts_with(&name_prefix("distlock", &a)));
        assert!(!k.starts_with(&name_prefix("distlock", &ab)));
    }
}
