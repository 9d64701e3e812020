//! The checker: what a merged history shows, counted, for every workload.
//!
//! * **Exclusion** ([`holding`]): a client holds from its grant until the first of its release,
//!   its lost signal and its death (a `kill-client` fault); a paused client holds through its
//!   pause, as it believes it does. Counted: pairs of overlapping intervals of different clients
//!   where one is exclusive (a lock, a writer, a leader), and grants that made more shared
//!   holders than the limit (a semaphore's N).
//! * **The resource's view** ([`resource`]): acknowledged lock-set elements missing at the end
//!   (two writers overlapped), reads that saw the register change under a live read lease, and
//!   permit holders registered beyond N.
//! * **Tokens** ([`tokens`]): register writes accepted below an accepted token or with another
//!   client's token; grants whose token is not above every token granted before they were asked
//!   for; a token (a term) granted to two clients.
//! * **Observers** ([`observers`]): an observer told of an older term after a newer one, and a
//!   reported leader no candidate was elected as (a value under another term, or no one's).
//! * **Waits**: the longest time some client waited and none held; a writer's longest wait.
//! * **Lost-signal latency**: from the start of a cut to the cut holder's lost signal.
//!
//! What was left on the servers once every client stopped is counted by the campaign.

mod holding;
mod observers;
mod resource;
mod tokens;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::history::{Entry, Event};

/// What one history shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Findings {
    /// What the clients asked of the servers: acquire attempts (granted or not), releases,
    /// proclamations, and observers' reports.
    pub operations: usize,
    /// Grants.
    pub acquisitions: usize,
    /// Overlapping holding intervals of different clients where one is exclusive, and shared
    /// grants beyond the limit.
    pub overlaps: usize,
    /// Register writes accepted out of token order or with another holder's token.
    pub fenced_violations: usize,
    /// Acknowledged lock-set elements missing at the end.
    pub lost_elements: usize,
    /// Reads that saw the register change while their read lease was live.
    pub torn_reads: usize,
    /// Permit holders registered at the resource beyond the limit.
    pub crowded: usize,
    /// Grants whose token is not above every token granted before they were asked for.
    pub token_order_violations: usize,
    /// Tokens granted to two different clients.
    pub duplicate_tokens: usize,
    /// Observers told of an older term after a newer one.
    pub observers_back: usize,
    /// Reported leaders that no candidate was elected as.
    pub foreign_reports: usize,
    /// Entries, keys or nodes left on the servers at the end (set by the campaign).
    pub leftovers: usize,
    /// From the last client's kill to the servers holding nothing under the name, in ns (set by
    /// the campaign).
    pub clean_after: u64,
    /// The longest time with a client waiting and none holding, in ns.
    pub worst_unavailability: u64,
    /// The longest wait of a writer that was granted, in ns (read-write locks).
    pub worst_writer_wait: u64,
    /// Lost-signal latencies after cuts of a holder, in ns.
    pub lost_latencies: Vec<u64>,
}

impl Findings {
    /// Violations that break a lease's promise (two holders): the known hazard of some faults.
    pub fn lease_violations(&self) -> usize {
        self.overlaps + self.lost_elements + self.torn_reads + self.crowded
    }

    /// Violations of token order (tokens, terms, what observers report): the known hazard of a
    /// store that forgets.
    pub fn token_violations(&self) -> usize {
        self.token_order_violations
            + self.fenced_violations
            + self.duplicate_tokens
            + self.observers_back
            + self.foreign_reports
    }
}

/// Checks `history` (time-ordered) of a run that ended at `end`, whose shared holders may be
/// at most `shared_limit` at once (`None`: any number, a read-write lock's readers).
pub fn check(history: &[Entry], end: u64, shared_limit: Option<usize>) -> Findings {
    let h = holding::Holding::of(history, end);
    Findings {
        operations: history
            .iter()
            .filter(|e| {
                matches!(
                    e.ev,
                    Event::AcquireInvoke { .. }
                        | Event::ReleaseInvoke
                        | Event::Proclaim { .. }
                        | Event::Observed { .. }
                        | Event::ObserveError { .. }
                )
            })
            .count(),
        acquisitions: h.acquisitions,
        overlaps: holding::exclusion_violations(&h.held, shared_limit),
        fenced_violations: tokens::fenced_violations(history),
        lost_elements: resource::lost_elements(history),
        torn_reads: resource::torn_reads(history),
        crowded: shared_limit.map_or(0, |n| resource::crowded(history, n)),
        token_order_violations: tokens::order_violations(&h.grants),
        duplicate_tokens: tokens::duplicates(&h.grants),
        observers_back: observers::going_back(history),
        foreign_reports: observers::foreign_reports(history),
        leftovers: 0,
        clean_after: 0,
        worst_unavailability: holding::worst_unavailability(&h.waiting, &h.held, end),
        worst_writer_wait: h.worst_writer_wait,
        lost_latencies: holding::lost_latencies(history, &h.held),
    }
}
