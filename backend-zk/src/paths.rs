//! The znode layout: the one place that decides where a lock lives.
//!
//! | znode | mode | why |
//! |---|---|---|
//! | `<root>` | persistent | created once, holds nothing |
//! | `<root>/<encoded name>` | container | the lock's queue; ZooKeeper deletes an empty container by itself, so names do not leak znodes |
//! | `<root>/<encoded name>/_c_<attempt>[#<limit>]-lock-<seq>` | ephemeral sequential | one per acquire attempt, the queue entry; data = owner secret and holder (`<secret>~<holder>`, [`distlock_api::HolderInfo`]), then `:<value>` once an election's leader announced; the lowest sequence holds a lock |
//!
//! That is Curator's `InterProcessMutex` naming, the default [`Layout`]. With `layout=kazoo`
//! the entry is `_c_<attempt>__lock__<seq>` (a lock, a writer) or `_c_<attempt>__rlock__<seq>`
//! (a reader), the names kazoo's `Lock`, `WriteLock` and `ReadLock` count as contenders; no
//! semaphores there. A queue holds one layout: a node of the other is refused, never skipped.
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

/// The queue directory of `name`.
pub fn lock_dir(root: &str, name: &LockName) -> String {
    format!("{root}/{}", name.encoded())
}

/// The protected prefix of the attempt owned by `secret`.
pub fn attempt_id(secret: &OwnerSecret) -> String {
    let digest = Sha256::digest(secret.expose_hex().as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Which recipe's node names a queue uses: one name cannot sort for both Curator and kazoo, so
/// a backend writes one and refuses nodes of any other (`LockError::ForeignEntry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Curator's `InterProcessMutex` names, `_c_<attempt>[#<limit>]-lock-<seq>` (the default).
    #[default]
    Curator,
    /// kazoo's names: `_c_<attempt>__lock__<seq>` for a lock or a writer,
    /// `_c_<attempt>__rlock__<seq>` for a reader (kazoo's `ReadLock`); no permits.
    Kazoo,
}

/// Curator's marker between the protected prefix and the sequence number.
const CURATOR: &str = "-lock-";
/// kazoo's markers: an exclusive contender's, a reader's.
const KAZOO: &str = "__lock__";
const KAZOO_READ: &str = "__rlock__";

impl Layout {
    /// The path given to the sequential create (the server appends the sequence number).
    ///
    /// # Errors
    /// `Unsupported` for a permit on the kazoo layout (kazoo's semaphore is another recipe).
    pub fn node_prefix(
        self,
        dir: &str,
        secret: &OwnerSecret,
        admission: Admission,
    ) -> Result<String> {
        let id = attempt_id(secret);
        Ok(match (self, admission) {
            (Layout::Curator, _) => format!("{dir}/_c_{id}{}{CURATOR}", admission.entry_suffix()),
            (Layout::Kazoo, Admission::Exclusive) => format!("{dir}/_c_{id}{KAZOO}"),
            (Layout::Kazoo, Admission::Shared) => format!("{dir}/_c_{id}{KAZOO_READ}"),
            (Layout::Kazoo, Admission::Permit(_)) => {
                return Err(LockError::Unsupported {
                    backend: "zk",
                    what: "semaphores on the kazoo layout (layout=kazoo)".to_string(),
                });
            }
        })
    }

    /// The node's marker and sequence: `None` when the name is not of this layout.
    fn split(self, node: &str) -> Option<(&str, &'static str, &str)> {
        let markers: &[&'static str] = match self {
            Layout::Curator => &[CURATOR],
            Layout::Kazoo => &[KAZOO_READ, KAZOO],
        };
        markers.iter().find_map(|m| {
            let (head, seq) = node.rsplit_once(m)?;
            Some((head, *m, seq))
        })
    }

    /// Whether `path` is a node created with `secret` (no server call).
    pub fn owned_by(self, path: &str, secret: &OwnerSecret) -> bool {
        let Some(node) = path.rsplit('/').next() else {
            return false;
        };
        self.split(node).is_some_and(|(head, _, _)| {
            head.strip_prefix(&format!("_c_{}", attempt_id(secret)))
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('#'))
        })
    }

    /// The admission limit a node's name records (1 when it records none; a kazoo reader's is
    /// unbounded).
    pub fn node_limit(self, node: &str) -> u32 {
        match self.split(node) {
            Some((_, KAZOO_READ, _)) => Admission::Shared.limit(),
            Some((head, _, _)) => head
                .split_once('#')
                .and_then(|(_, limit)| limit.parse().ok())
                .unwrap_or(1),
            None => 1,
        }
    }

    /// The sequence number of a queue node's name, as the server wrote it (signed 32-bit; see
    /// the module docs for its wrap); `None` for a node of another layout.
    pub fn sequence(self, node: &str) -> Option<i32> {
        self.split(node)?.2.parse().ok()
    }

    /// The queue nodes of lock `name` (its directory's `children`: ours, other clients' of the
    /// same layout) in creation order, as seen from our own node `path` (see [`queue_order`]:
    /// the sequence suffix wraps).
    ///
    /// # Errors
    /// [`LockError::ForeignEntry`] naming the first child of another layout (kazoo's
    /// `<id>__lock__<seq>` on the Curator layout, say): its recipe does not count our nodes, so
    /// queueing beside it could make two holders. Never skipped silently.
    pub(crate) fn in_order(
        self,
        children: Vec<String>,
        path: &str,
        name: &LockName,
    ) -> Result<Vec<String>> {
        self.refuse_foreign(&children, name)?;
        Ok(self.known_in_order(children, path))
    }

    /// [`LockError::ForeignEntry`] for the first of lock `name`'s `children` that is not a
    /// queue node of this layout (see [`Layout::in_order`]).
    pub(crate) fn refuse_foreign(self, children: &[String], name: &LockName) -> Result<()> {
        match children.iter().find(|c| self.sequence(c).is_none()) {
            Some(foreign) => Err(LockError::ForeignEntry {
                name: name.to_string(),
                entry: foreign.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The children of this layout in creation order, as seen from `path` (others left out:
    /// for hints, where [`Layout::in_order`]'s refusal comes with the read that follows).
    pub(crate) fn known_in_order(self, children: Vec<String>, path: &str) -> Vec<String> {
        let reference = path
            .rsplit('/')
            .next()
            .and_then(|n| self.sequence(n))
            .unwrap_or_default();
        let mut queue: Vec<(u32, String)> = children
            .into_iter()
            .filter_map(|c| Some((queue_order(self.sequence(&c)?, reference), c)))
            .collect();
        queue.sort_unstable_by_key(|(key, _)| *key);
        queue.into_iter().map(|(_, c)| c).collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_found_by_their_secret_only() {
        let s = OwnerSecret::random().expect("rng");
        let other = OwnerSecret::random().expect("rng");
        let dir = lock_dir("/distlock", &LockName::new("a/b").expect("valid"));
        assert_eq!(dir, "/distlock/a%2Fb");
        let node = format!(
            "{}0000000042",
            Layout::Curator
                .node_prefix(&dir, &s, Admission::Exclusive)
                .expect("prefix")
        );
        assert!(Layout::Curator.owned_by(&node, &s));
        assert!(!Layout::Curator.owned_by(&node, &other));
        assert_eq!(
            Layout::Curator.node_limit(node.rsplit('/').next().expect("name")),
            1
        );
        let permit = format!(
            "{}-000000007",
            Layout::Curator
                .node_prefix(&dir, &s, Admission::Permit(4))
                .expect("prefix")
        );
        assert!(Layout::Curator.owned_by(&permit, &s));
        assert!(!Layout::Curator.owned_by(&permit, &other));
        let permit = permit.rsplit('/').next().expect("name");
        assert_eq!(Layout::Curator.node_limit(permit), 4);
        assert_eq!(Layout::Curator.sequence(permit), Some(-7));
        assert_eq!(
            Layout::Curator.sequence(node.rsplit('/').next().expect("name")),
            Some(42)
        );
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
        let seqs: Vec<i32> = names
            .iter()
            .map(|n| Layout::Curator.sequence(n).expect("parses"))
            .collect();
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

    #[test]
    fn kazoo_names_are_counted_by_kazoo_and_refused_by_curator() {
        let s = OwnerSecret::random().expect("rng");
        let name = LockName::new("job").expect("valid");
        let k = Layout::Kazoo;
        let lock = format!(
            "{}0000000003",
            k.node_prefix("/r/job", &s, Admission::Exclusive)
                .expect("lock")
        );
        let read = format!(
            "{}0000000004",
            k.node_prefix("/r/job", &s, Admission::Shared)
                .expect("read")
        );
        assert!(lock.ends_with("__lock__0000000003") && read.ends_with("__rlock__0000000004"));
        assert!(k.owned_by(&lock, &s) && k.owned_by(&read, &s));
        assert!(k.node_prefix("/r/job", &s, Admission::Permit(3)).is_err());
        let node = |p: &str| p.rsplit('/').next().expect("name").to_string();
        assert_eq!(k.node_limit(&node(&lock)), 1);
        assert_eq!(k.node_limit(&node(&read)), u32::MAX);
        // kazoo's own node (`<uuid hex>__lock__<seq>`) sorts in one queue with ours.
        let theirs = "5f1e2d3c4b5a69788796a5b4c3d2e1f0__lock__0000000001".to_string();
        let queue = k
            .in_order(vec![node(&read), node(&lock), theirs.clone()], &lock, &name)
            .expect("one layout");
        assert_eq!(queue, vec![theirs.clone(), node(&lock), node(&read)]);
        // Each layout refuses the other's nodes.
        let curator = format!(
            "{}0000000005",
            Layout::Curator
                .node_prefix("/r/job", &s, Admission::Exclusive)
                .expect("lock")
        );
        assert!(matches!(
            k.in_order(vec![node(&lock), node(&curator)], &lock, &name),
            Err(LockError::ForeignEntry { .. })
        ));
        assert!(matches!(
            Layout::Curator.in_order(vec![node(&curator), theirs], &curator, &name),
            Err(LockError::ForeignEntry { entry, .. }) if entry.contains("__lock__")
        ));
    }
}
