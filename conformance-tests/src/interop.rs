//! The interop matrix: each other language's lock recipe against what holds between it and
//! distlock on one server (exclusion both ways, wake-ups both ways, one queue in order,
//! comparable tokens), every claim backed by the interop test that checks it with the real peer.
//! `docs/interop-matrix.md` is rendered from here by the `interop-matrix` binary, which runs those
//! tests and marks a claim whose test fails; `tests/matrix.rs` checks that the file is current
//! and that every test named here exists.

use std::collections::HashMap;

/// Where the rendered matrix lives, from the workspace root.
pub const PATH: &str = "docs/interop-matrix.md";

/// One claim: what holds, and the test (`tests/<file>.rs`, function) that checks it; `None`
/// for a claim that something does not exist (no queue, no token), which no test can run.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    /// The claim, as the matrix shows it.
    pub says: &'static str,
    /// The checking test: file stem under `conformance-tests/tests/`, and function.
    pub test: Option<(&'static str, &'static str)>,
}

/// One peer recipe with one distlock layout.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// The peer's recipe (and language).
    pub peer: &'static str,
    /// The distlock URL that shares the lock (backend and layout).
    pub distlock: &'static str,
    /// Mutual exclusion, both ways.
    pub excludes: Cell,
    /// Each side's waiters woken by the other's release.
    pub wakes: Cell,
    /// One queue served in arrival order across both.
    pub order: Cell,
    /// Fencing tokens that increase in grant order across both.
    pub tokens: Cell,
}

const fn tested(says: &'static str, file: &'static str, test: &'static str) -> Cell {
    Cell {
        says,
        test: Some((file, test)),
    }
}

const fn untested(says: &'static str) -> Cell {
    Cell { says, test: None }
}

const ETCD: &str = "etcd_interop";
const ZK: &str = "zk_interop";
const REDIS: &str = "redis_interop";

/// Every peer we share locks with, and the mixes we refuse.
pub const PEERS: &[Peer] = &[
    Peer {
        peer: "etcd `concurrency.Mutex` (Go; `etcdctl lock`, the v3lock service)",
        distlock: "`etcd://hosts/<etcd lock prefix>`",
        excludes: tested(
            "yes",
            ETCD,
            "etcdctl_and_distlock_exclude_and_wake_each_other_with_tokens_in_grant_order",
        ),
        wakes: tested(
            "yes",
            ETCD,
            "etcdctl_and_distlock_exclude_and_wake_each_other_with_tokens_in_grant_order",
        ),
        order: tested("yes", ETCD, "a_mixed_queue_is_served_in_arrival_order"),
        tokens: tested(
            "yes, when the Go side fences with its key's create revision",
            ETCD,
            "etcdctl_and_distlock_exclude_and_wake_each_other_with_tokens_in_grant_order",
        ),
    },
    Peer {
        peer: "etcd `concurrency.Election` (Go; `etcdctl elect`), with distlock's election",
        distlock: "`etcd://hosts/<etcd election prefix>`",
        excludes: tested(
            "yes: one leader; distlock's observers read the proposal as its value",
            ETCD,
            "etcdctl_elect_shares_the_election",
        ),
        wakes: tested("yes", ETCD, "etcdctl_elect_shares_the_election"),
        order: tested("yes", ETCD, "etcdctl_elect_shares_the_election"),
        tokens: tested(
            "yes: terms are create revisions on both sides",
            ETCD,
            "etcdctl_elect_shares_the_election",
        ),
    },
    Peer {
        peer: "kazoo `Lock`, `ReadLock`, `WriteLock` (Python)",
        distlock: "`zk://hosts?layout=kazoo`",
        excludes: tested(
            "yes (readers shared both ways)",
            ZK,
            "on_the_kazoo_layout_distlock_and_kazoo_share_one_queue",
        ),
        wakes: tested(
            "yes",
            ZK,
            "on_the_kazoo_layout_distlock_and_kazoo_share_one_queue",
        ),
        order: tested(
            "yes",
            ZK,
            "on_the_kazoo_layout_distlock_and_kazoo_share_one_queue",
        ),
        tokens: untested("no: kazoo hands out none"),
    },
    Peer {
        peer: "kazoo `Election` (Python), with distlock's election",
        distlock: "`zk://hosts?layout=kazoo`",
        excludes: tested(
            "yes: one leader; distlock's observers read kazoo's participant id as its value",
            ZK,
            "on_the_kazoo_layout_a_kazoo_election_shares_the_election",
        ),
        wakes: tested(
            "yes",
            ZK,
            "on_the_kazoo_layout_a_kazoo_election_shares_the_election",
        ),
        order: tested(
            "yes",
            ZK,
            "on_the_kazoo_layout_a_kazoo_election_shares_the_election",
        ),
        tokens: untested("terms: distlock's only (a kazoo leader's node czxid orders with them)"),
    },
    Peer {
        peer: "kazoo `Lock` (Python)",
        distlock: "`zk://hosts` (default layout)",
        excludes: tested(
            "**refused**: kazoo cannot see distlock's nodes, so distlock will not queue beside kazoo's (`ForeignEntry`)",
            ZK,
            "a_kazoo_lock_on_the_path_is_refused_by_name_and_leaves_nothing",
        ),
        wakes: untested("-"),
        order: untested("-"),
        tokens: untested("-"),
    },
    Peer {
        peer: "Curator `InterProcessMutex` (Java)",
        distlock: "`zk://hosts` (default layout)",
        excludes: tested("yes", ZK, "curator_and_distlock_share_one_queue"),
        wakes: tested("yes", ZK, "curator_and_distlock_share_one_queue"),
        order: tested("yes", ZK, "curator_and_distlock_share_one_queue"),
        tokens: untested("no: Curator hands out none"),
    },
    Peer {
        peer: "Curator `LeaderSelector` (Java), with distlock's election",
        distlock: "`zk://hosts` (default layout)",
        excludes: tested(
            "yes: one leader; distlock's observers read Curator's participant id as its value",
            ZK,
            "curator_leader_selector_shares_the_election_and_a_leader_latch_is_refused",
        ),
        wakes: tested(
            "yes",
            ZK,
            "curator_leader_selector_shares_the_election_and_a_leader_latch_is_refused",
        ),
        order: tested(
            "yes",
            ZK,
            "curator_leader_selector_shares_the_election_and_a_leader_latch_is_refused",
        ),
        tokens: untested("terms: distlock's only (a Curator leader's node czxid orders with them)"),
    },
    Peer {
        peer: "Curator `LeaderLatch` (Java), with distlock's election",
        distlock: "`zk://hosts` (default layout)",
        excludes: tested(
            "**refused**: its `latch-` nodes cannot be ordered against distlock's, so a campaign beside one is refused (`ForeignEntry`)",
            ZK,
            "curator_leader_selector_shares_the_election_and_a_leader_latch_is_refused",
        ),
        wakes: untested("-"),
        order: untested("-"),
        tokens: untested("-"),
    },
    Peer {
        peer: "redis-py `Lock` (Python; redsync, node-redlock and rslock take the same key)",
        distlock: "`redis://host?layout=plain`",
        excludes: tested(
            "yes",
            REDIS,
            "on_the_plain_layout_distlock_and_redis_py_exclude_and_wake_each_other",
        ),
        wakes: tested(
            "yes (ours by keyspace events where the server has them, else a 20-60 ms poll)",
            REDIS,
            "with_keyspace_events_a_plain_waiter_watches_the_key",
        ),
        order: untested("no: nobody queues"),
        tokens: tested(
            "no: none handed out, and correctness refused",
            REDIS,
            "on_the_plain_layout_distlock_and_redis_py_exclude_and_wake_each_other",
        ),
    },
    Peer {
        peer: "redis-py `Lock` (Python) on distlock's key",
        distlock: "`redis://host` (default layout)",
        excludes: tested(
            "**refused**: it would jump distlock's queue, so distlock will not take or wait for a lock held under a value it did not write (`ForeignEntry`)",
            REDIS,
            "a_redis_py_lock_on_distlocks_key_is_refused_by_name_and_leaves_nothing",
        ),
        wakes: untested("-"),
        order: untested("-"),
        tokens: untested("-"),
    },
];

/// Every (file, test) the matrix names, once each, in order.
pub fn tests() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    for p in PEERS {
        for c in [p.excludes, p.wakes, p.order, p.tokens] {
            if let Some(t) = c.test
                && !out.contains(&t)
            {
                out.push(t);
            }
        }
    }
    out
}

/// The matrix as markdown; `results` (by file and test) marks a claim whose test failed.
pub fn render(results: Option<&HashMap<(String, String), bool>>) -> String {
    let mut out = String::from(
        "# Interop matrix\n\nGenerated by `cargo run -p distlock-conformance --bin interop-matrix`, which runs each interop test named below against the real peer (Debian packages) and marks a claim whose test fails; a test fails when this file no longer matches `conformance-tests/src/interop.rs`. Prose and set-up: the guide's [Sharing a lock with other languages](guide.md#sharing-a-lock-with-other-languages).\n\n| peer | distlock | excludes both ways | wakes both ways | one queue, in order | tokens comparable |\n|---|---|---|---|---|---|\n",
    );
    for p in PEERS {
        out.push_str(&format!("| {} | {} |", p.peer, p.distlock));
        for c in [p.excludes, p.wakes, p.order, p.tokens] {
            let cell = match c.test {
                None => c.says.to_string(),
                Some((file, test)) => {
                    let failed = results
                        .and_then(|r| r.get(&(file.to_string(), test.to_string())))
                        .is_some_and(|ok| !ok);
                    let mark = if failed { "FAIL: " } else { "" };
                    format!("{mark}{} (`{file}::{test}`)", c.says)
                }
            };
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    out
}
