//! The etcd key layout: the one place that decides where a lock lives.
//!
//! A lock name `n` (encoded by the shared naming rule) under prefix `p` is the key range
//! `p/<encoded n>/`. Each acquire attempt puts one key in it:
//! `p/<encoded n>/<session lease id, 16 hex>.<slot, 16 hex>`, attached to the client's session
//! lease. The key with the lowest create revision holds the lock; the others are the queue, in
//! arrival order (revision order). The trailing `/` keeps `p/a/` from matching `p/ab/`, and
//! encoded names never contain `/`.
//!
//! The slot keeps keys apart when one session holds or waits on a name twice at once (two owners
//! in one process): it is the lowest number the session has not handed out for that name, and
//! comes back only once its key is known deleted. So a sequence of acquires reuses one key
//! instead of creating a new one each time, which matters: etcd keeps an index entry for every
//! key ever created until a compaction (off by default), and a fresh key per acquire measured
//! ~100 us slower per acquire + release; 100 000 such dead keys made every request on the
//! member several times dearer (the guide's Operations section). No other session writes keys
//! with our lease id, but a slot's key is reused, so a release compares the key's value too
//! (`EtcdBackend::delete_ours`): a late delete finds the next attempt's value and leaves it. Not
//! a secret: etcd access control decides who may delete.
//!
//! An attempt key's value is the attempt's secret, its limit and its holder
//! (`<secret>[#<limit>]~<holder>`, [`distlock_api::HolderInfo`]); once its holder announces
//! itself as an election's leader, `:<value>` after that ([`distlock_api::announced_entry`]). The value lives in the holder's own
//! key so it goes with it (release, session expiry) and observers read it with the head.

use distlock_api::LockName;

/// The range of all keys (holder and queue) of `name`.
pub fn name_prefix(prefix: &str, name: &LockName) -> String {
    format!("{prefix}/{}/", name.encoded())
}

/// The key of one acquire attempt.
pub fn attempt_key(prefix: &str, name: &LockName, lease: i64, slot: u64) -> String {
    format!("{}{lease:016x}.{slot:016x}", name_prefix(prefix, name))
}

/// The session lease id and slot of an attempt key.
pub fn parse_attempt_key(key: &str) -> Option<(i64, u64)> {
    let (lease, slot) = key.rsplit('/').next()?.split_once('.')?;
    Some((
        u64::from_str_radix(lease, 16).ok()? as i64,
        u64::from_str_radix(slot, 16).ok()?,
    ))
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
        assert_eq!(parse_attempt_key(&k), Some((0x1f, 7)));
        assert_eq!(parse_attempt_key("distlock/a/zz"), None);
    }
}
