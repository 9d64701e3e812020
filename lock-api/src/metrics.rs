//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade: recorded only when the
//! application installs a recorder (a Prometheus exporter, say); free otherwise. Names and
//! labels follow the Prometheus conventions (base units, `_total` counters).
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `distlock_acquire_duration_seconds` | histogram | `backend`, `grade`, `mode` (`try`, `wait`), `outcome` (`granted`, `busy`, `timeout`, `error`) | one acquire call, waiting included |
//! | `distlock_lease_held_duration_seconds` | histogram | `backend`, `grade` | from the grant to the release (or the loss) |
//! | `distlock_leases_held` | gauge | `backend` | leases this process holds now |
//! | `distlock_leases_lost_total` | counter | `backend`, `reason` ([`crate::LostReason::label`]) | leases lost |
//! | `distlock_renewals_total` | counter | `backend`, `outcome` (`renewed`, `refused`, `failed`) | renewals, by the watchdog or by hand |

use std::time::Duration;

use crate::error::{LockError, LostReason};
use crate::guarantee::Guarantee;

/// Acquire calls, waiting included (histogram, seconds).
pub const ACQUIRE_DURATION: &str = "distlock_acquire_duration_seconds";
/// Time from grant to release or loss (histogram, seconds).
pub const HELD_DURATION: &str = "distlock_lease_held_duration_seconds";
/// Leases held now (gauge).
pub const LEASES_HELD: &str = "distlock_leases_held";
/// Leases lost, by reason (counter).
pub const LEASES_LOST: &str = "distlock_leases_lost_total";
/// Renewals, by outcome (counter).
pub const RENEWALS: &str = "distlock_renewals_total";

fn grade(g: Guarantee) -> &'static str {
    match g {
        Guarantee::Efficiency => "efficiency",
        Guarantee::Correctness => "correctness",
    }
}

/// One acquire call ended with `result` after `took`.
pub(crate) fn acquire<T>(
    backend: &'static str,
    g: Guarantee,
    waiting: bool,
    result: &Result<T, LockError>,
    took: Duration,
) {
    let outcome = match result {
        Ok(_) => "granted",
        Err(LockError::Busy { .. }) => "busy",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(_) => "error",
    };
    let mode = if waiting { "wait" } else { "try" };
    metrics::histogram!(ACQUIRE_DURATION, "backend" => backend, "grade" => grade(g), "mode" => mode, "outcome" => outcome)
        .record(took.as_secs_f64());
}

/// A new lease (not a re-entrant hold).
pub(crate) fn lease_started(backend: &'static str) {
    metrics::gauge!(LEASES_HELD, "backend" => backend).increment(1.0);
}

/// A lease ended (released or lost) after being held `held`.
pub(crate) fn lease_ended(backend: &'static str, g: Guarantee, held: Duration) {
    metrics::gauge!(LEASES_HELD, "backend" => backend).decrement(1.0);
    metrics::histogram!(HELD_DURATION, "backend" => backend, "grade" => grade(g))
        .record(held.as_secs_f64());
}

/// A lease was lost.
pub(crate) fn lost(backend: &'static str, reason: LostReason) {
    metrics::counter!(LEASES_LOST, "backend" => backend, "reason" => reason.label()).increment(1);
}

/// One renewal's outcome: `renewed`, `refused` (not held) or `failed`.
pub(crate) fn renewal(backend: &'static str, outcome: &'static str) {
    metrics::counter!(RENEWALS, "backend" => backend, "outcome" => outcome).increment(1);
}
