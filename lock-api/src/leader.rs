//! The leader of an election as observers read it: a contract type the backends return.

use crate::fencing::FencingToken;

/// The leader of an election as observers read it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leader {
    /// The leader's term: its lease's fencing token. Strictly increasing across the leaders of one
    /// election wherever the backend's tokens are ([`crate::Fencing::ClusterWide`]: etcd, ZooKeeper,
    /// memory; Redis while the server keeps its data). Two leaders never share a term.
    pub term: FencingToken,
    /// What the leader announced (at its campaign, or at its last [`crate::Leadership::proclaim`]).
    pub value: String,
}
