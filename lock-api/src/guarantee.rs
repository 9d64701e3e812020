//! What a call site asks for ([`Guarantee`]) and what a backend declares it can give
//! ([`Capabilities`]).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The grade of mutual exclusion a call site needs.
///
/// Ordered: `Efficiency < Correctness`. A backend that declares `Efficiency` as its strongest
/// grade refuses a `Correctness` request with [`crate::LockError::Unsupported`]; it never
/// silently downgrades.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Guarantee {
    /// A rare double run only wastes work (cron de-duplication, cache rebuild).
    #[default]
    Efficiency,
    /// A double run loses money: the lease comes from a consensus store (or the in-process
    /// reference backend) and always carries a monotonic [`crate::FencingToken`] that the
    /// protected resource must check.
    Correctness,
}

impl fmt::Display for Guarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Guarantee::Efficiency => "efficiency",
            Guarantee::Correctness => "correctness",
        })
    }
}

/// How far the fencing tokens of a backend can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fencing {
    /// No ordered token (Redlock): leases carry no fencing token at all.
    None,
    /// Strictly increasing per lock name while the server keeps its data; can go backwards after
    /// a restart without persistence or a failover (Redis).
    PerNameWhileServerKeepsData,
    /// Strictly increasing across the whole deployment, survives leader changes (etcd revision,
    /// ZooKeeper czxid, the in-process memory store).
    ClusterWide,
}

impl Fencing {
    /// Whether tokens are strictly increasing across successive holders of a name.
    pub fn is_monotonic(self) -> bool {
        !matches!(self, Fencing::None)
    }
}

/// Where reentrancy is counted, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reentrancy {
    /// A second acquire by the same owner blocks like any other.
    None,
    /// Counted in the [`crate::Owner`] handle of this process.
    ClientSide,
    /// Counted by the server (Redis hash of owner to count).
    ServerSide,
}

/// How a waiter learns that the lock became free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wakeup {
    /// In-process notification (memory backend).
    InProcess,
    /// A published message on release (Redis pub/sub), with a re-check at the holder's TTL.
    PubSub,
    /// A watch on the predecessor's key or node (etcd, ZooKeeper).
    Watch,
    /// Periodic retries with jittered back-off.
    Polling,
}

/// What a backend declares it can do. The conformance suite runs every scenario these
/// declarations promise, and a declared capability whose scenario fails is a failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The strongest grade the backend gives.
    pub guarantee: Guarantee,
    /// Fencing token quality.
    pub fencing: Fencing,
    /// Whether waiters are granted in arrival order.
    pub fifo: bool,
    /// Reentrancy through an owner handle.
    pub reentrancy: Reentrancy,
    /// TTLs are rounded up to a multiple of this (1 ms for Redis, 1 s for etcd leases).
    pub ttl_granularity: Duration,
    /// The smallest TTL the backend accepts.
    pub min_ttl: Duration,
    /// How waiters are woken.
    pub wakeup: Wakeup,
    /// Whether the queue admits by policy ([`crate::Admission`]): read-write locks, and
    /// semaphores where [`Capabilities::permits`] too ([`crate::LockBackend::acquire_admitted`]).
    pub policies: bool,
    /// Whether the queue admits permits ([`crate::Admission::Permit`]): semaphores. `false` on
    /// ZooKeeper's kazoo layout, whose node names have no room for a limit.
    pub permits: bool,
    /// Whether a waiter keeps an entry on the server while it waits, so
    /// [`crate::LockBackend::inspect`] counts it ([`crate::LockStatus::waiters`]); `false` where
    /// waiters only retry (the Redis plain layout), whose count is always 0.
    pub listed_waiters: bool,
}

impl Capabilities {
    /// Why this backend cannot give `wanted`, or `None` when it can.
    pub fn refusal(&self, wanted: Guarantee) -> Option<&'static str> {
        match wanted {
            Guarantee::Efficiency => None,
            Guarantee::Correctness if self.guarantee < Guarantee::Correctness => {
                Some("its strongest grade is efficiency: no consensus store")
            }
            Guarantee::Correctness if !self.fencing.is_monotonic() => {
                Some("it has no monotonic fencing token")
            }
            Guarantee::Correctness => None,
        }
    }

    /// Rounds a requested TTL up to the backend's granularity and minimum.
    pub fn effective_ttl(&self, ttl: Duration) -> Duration {
        let g = self.ttl_granularity.as_nanos().max(1);
        let rounded = ttl.as_nanos().div_ceil(g) * g;
        Duration::from_nanos(rounded.min(u64::MAX as u128) as u64).max(self.min_ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(guarantee: Guarantee, fencing: Fencing) -> Capabilities {
        Capabilities {
            guarantee,
            fencing,
            fifo: false,
            reentrancy: Reentrancy::None,
            ttl_granularity: Duration::from_secs(1),
            min_ttl: Duration::from_secs(2),
            wakeup: Wakeup::Polling,
            policies: false,
            permits: false,
            listed_waiters: false,
        }
    }

    #[test]
    fn correctness_needs_grade_and_fencing() {
        assert!(
            caps(Guarantee::Efficiency, Fencing::PerNameWhileServerKeepsData)
                .refusal(Guarantee::Correctness)
                .is_some()
        );
        assert!(
            caps(Guarantee::Correctness, Fencing::None)
                .refusal(Guarantee::Correctness)
                .is_some()
        );
        assert!(
            caps(Guarantee::Correctness, Fencing::ClusterWide)
                .refusal(Guarantee::Correctness)
                .is_none()
        );
        assert!(
            caps(Guarantee::Efficiency, Fencing::None)
                .refusal(Guarantee::Efficiency)
                .is_none()
        );
    }

    #[test]
    fn ttl_rounds_up_to_granularity_and_minimum() {
        let c = caps(Guarantee::Correctness, Fencing::ClusterWide);
        assert_eq!(
            c.effective_ttl(Duration::from_millis(2500)),
            Duration::from_secs(3)
        );
        assert_eq!(
            c.effective_ttl(Duration::from_millis(100)),
            Duration::from_secs(2)
        );
        assert_eq!(
            c.effective_ttl(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }
}
