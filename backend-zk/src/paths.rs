//! The znode layout: the one place that decides where a lock lives.
//!
//! | znode | mode | why |
//! |---|---|---|
//! | `<root>` | persistent | created once, holds nothing |
//! | `<root>/<encoded name>` | container | the lock's queue; ZooKeeper deletes an empty container by itself, so names do not leak znodes |
//! | `<root>/<encoded name>/_c_<attempt>[#<limit>]-lock-<seq>` | ephemeral sequential | one per acquire attempt, the queue entry; data = owner secret and holder (`<secret>~<holder>`, [`distlock_api::HolderInfo`]), then `:<value>` once an election's leader announced; the lowest sequence holds a lock |
//!
//! `#<limit>` is the entry's admission limit ([`distlock_api::Admission::entry_suffix`]; none
//! for a lock's or a writer's entry, whose limit is 1): in the name, so one listing tells a
//! waiter every limit ahead of it.
//!
//! `<attempt>` is the first 32 hex characters of SHA-256 of the attempt's owner secret: it is
//! the protected prefix that finds our node again after a connection loss during create (checked
//! against our session id too, CURATOR-498), and it lets release refuse a secret that does not
//! match the path without asking the server. The sequence suffix only orders the queue; the
//! fencing token is the node's czxid (cluster-wide), never the suffix (per parent, 32-bit, reset
//! when a container is re-created).
//!
//! The suffix is the parent's signed 32-bit child version, which every create *and* delete
//! under it steps: a name that is never idle (its container never removed) passes 2^31 after
//! about a billion acquire + release pairs, and the suffix turns negative
//! (`-2147483648`). Queue order therefore compares suffixes on the circle of 2^32 values
//! ([`queue_order`], serial-number arithmetic): correct whenever the live nodes of one queue
//! span less than 2^31 steps, which a queue of fewer than a billion waiters always does.

use distlock_api::{Admission, LockError, LockName, OwnerSecret, Result};
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
pub fn node_prefix(dir: &str, secret: &OwnerSecret, admission: Admission) -> String {
    format!(
        "{dir}/_c_{}{}{LOCK_MARKER}",
        attempt_id(secret),
        admission.entry_suffix()
    )
}

/// Whether `path` is a node created with `secret` (no server call).
pub fn owned_by(path: &str, secret: &OwnerSecret) -> bool {
    path.rsplit('/').next().is_some_and(|node| {
        node.strip_prefix(&format!("_c_{}", attempt_id(secret)))
            .is_some_and(|rest| rest.starts_with('#') || rest.starts_with(LOCK_MARKER))
    })
}

/// The admission limit a node's name records (1 when it records none).
pub fn node_limit(node: &str) -> u32 {
    node.rsplit_once(LOCK_MARKER)
        .and_then(|(head, _)| head.split_once('#'))
        .and_then(|(_, limit)| limit.parse().ok())
        .unwrap_or(1)
}

/// The sequence number of a queue node's name, as the server wrote it (signed 32-bit; see the
/// module docs for its wrap).
pub fn sequence(node: &str) -> Option<i32> {
    node.rsplit_once(LOCK_MARKER)?.1.parse().ok()
}

/// A sort key for `seq` that orders a queue's nodes by creation across the suffix's wrap: the
/// distance from a point 2^30 steps before `reference` (any node of the queue), on the circle
/// of 2^32 values. Every node within 2^30 steps of `reference`, before or after, gets a key in
/// creation order.
pub fn queue_order(seq: i32, reference: i32) -> u32 {
    (seq as u32)
        .wrapping_sub(reference as u32)
        .wrapping_add(1 << 30)
}

/// The queue nodes of lock `name` (its directory's `children`: ours, other distlock clients',
/// Curator's, which share the layout) in creation order, as seen from our own node `path` (see
/// [`queue_order`]: the sequence suffix wraps).
///
/// # Errors
/// [`LockError::ForeignEntry`] naming the first child of another layout (kazoo's
/// `<id>__lock__<seq>`, say): its recipe does not count our nodes, so queueing beside it could
/// make two holders. Never skipped silently.
pub(crate) fn in_order(children: Vec<String>, path: &str, name: &LockName) -> Result<Vec<String>> {
    refuse_foreign(&children, name)?;
    Ok(known_in_order(children, path))
}

/// [`LockError::ForeignEntry`] for the first of lock `name`'s `children` that is not a queue
/// node of our layout (see [`in_order`]).
pub(crate) fn refuse_foreign(children: &[String], name: &LockName) -> Result<()> {
    match children.iter().find(|c| sequence(c).is_none()) {
        Some(foreign) => Err(LockError::ForeignEntry {
            name: name.to_string(),
            entry: foreign.clone(),
        }),
        None => Ok(()),
    }
}

/// The children of our layout in creation order, as seen from `path` (others left out: for
/// hints, where [`in_order`]'s refusal comes with the read that follows).
pub(crate) fn known_in_order(children: Vec<String>, path: &str) -> Vec<String> {
    let reference = path
        .rsplit('/')
        .next()
        .and_then(sequence)
        .unwrap_or_default();
    let mut queue: Vec<(u32, String)> = children
        .into_iter()
        .filter_map(|c| Some((queue_order(sequence(&c)?, reference), c)))
        .collect();
    queue.sort_unstable_by_key(|(key, _)| *key);
    queue.into_iter().map(|(_, c)| c).collect()
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
        let node = format!("{}0000000042", node_prefix(&dir, &s, Admission::Exclusive));
        assert!(owned_by(&node, &s));
        assert!(!owned_by(&node, &other));
        assert_eq!(node_limit(node.rsplit('/').next().expect("name")), 1);
        let permit = format!("{}-000000007", node_prefix(&dir, &s, Admission::Permit(4)));
        assert!(owned_by(&permit, &s));
        assert!(!owned_by(&permit, &other));
        let permit = permit.rsplit('/').next().expect("name");
        assert_eq!(node_limit(permit), 4);
        assert_eq!(sequence(permit), Some(-7));
        assert_eq!(sequence(node.rsplit('/').next().expect("name")), Some(42));
    }

    #[test]
    fn queue_order_survives_the_suffix_wrap() {
        // The server formats the parent's cversion with %010d: past i32::MAX it turns negative.
        let names = [
            "_c_x-lock-2147483646",
            "_c_x-lock-2147483647",
            "_c_x-lock--2147483648",
            "_c_x-lock--2147483647",
            "_c_x-lock--000000001",
            "_c_x-lock-0000000000",
        ];
        let seqs: Vec<i32> = names.iter().map(|n| sequence(n).expect("parses")).collect();
        assert_eq!(seqs[2], i32::MIN);
        // A queue holding the four nodes around the signed wrap, seen from any of them.
        for reference in &seqs[..4] {
            let keys: Vec<u32> = seqs[..4]
                .iter()
                .map(|s| queue_order(*s, *reference))
                .collect();
            assert!(keys.is_sorted(), "seen from {reference}: {keys:?}");
        }
        // Around the unsigned wrap too (-1 then 0).
        assert!(queue_order(-1, -1) < queue_order(0, -1));
        assert!(queue_order(-1, 0) < queue_order(0, 0));
        // A plain parse sorts the wrapped suffix first, beside the holder: the defect.
        assert!(seqs[2] < seqs[0]);
    }
}
