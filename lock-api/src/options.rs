//! Per-call options of an acquire.

use std::time::Duration;

use crate::error::{LockError, Result};
use crate::guarantee::Guarantee;
use crate::margins::{LeaseMode, Margins};
use crate::owner::Owner;

/// Options of one acquire. `AcquireOptions::default()` is a 30 s TTL kept alive by the watchdog,
/// efficiency grade, no owner (not re-entrant), a lost signal that fires 10 % of the TTL (at
/// least 50 ms) before the server could give the lock to anyone else.
///
/// # The validity window
/// A lease is valid from the moment its granting (or last renewing) request was sent, for the
/// TTL the server applied minus two margins, both subtracted on the holder's monotonic clock:
/// * the **drift** allowance (`ttl x drift_factor + drift_floor`), for clocks that run at
///   slightly different rates on the holder and the server;
/// * the **lead** (`max(ttl x lead_factor, lead_floor)`), the time the application has between
///   its lost signal and the earliest moment the server could grant the lock to another holder:
///   time to stop writing, on a machine whose timers may be late.
///
/// [`crate::Lease::valid_until`] is the end of that window, and the lost signal fires there.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    /// The lease time asked of the server (rounded up to the backend's TTL granularity).
    pub ttl: Duration,
    /// Watchdog renewal or a fixed lease time.
    pub mode: LeaseMode,
    /// The grade this call site needs; `Correctness` on a backend that cannot give it fails.
    pub guarantee: Guarantee,
    /// The re-entrancy owner: a second acquire of the same name with the same owner is granted at
    /// once with the same fencing token and counted.
    pub owner: Option<Owner>,
    /// Relative clock drift allowance, subtracted from every validity window (default 1 %).
    pub drift_factor: f64,
    /// Fixed drift allowance added to the relative one (default 2 ms).
    pub drift_floor: Duration,
    /// The lost signal's lead, as a fraction of the TTL (default 0.1): it fires this much before
    /// the server's own expiry (on top of the drift allowance).
    pub lead_factor: f64,
    /// The smallest lead, whatever the TTL (default 50 ms).
    pub lead_floor: Duration,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            ttl: Duration::from_secs(30),
            mode: LeaseMode::Watchdog { renew_every: None },
            guarantee: Guarantee::Efficiency,
            owner: None,
            drift_factor: 0.01,
            drift_floor: Duration::from_millis(2),
            lead_factor: 0.1,
            lead_floor: Duration::from_millis(50),
        }
    }
}

impl AcquireOptions {
    /// Default options with this TTL.
    pub fn with_ttl(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            ..Self::default()
        }
    }

    /// Sets the grade this call site needs.
    pub fn guarantee(mut self, guarantee: Guarantee) -> Self {
        self.guarantee = guarantee;
        self
    }

    /// Turns the watchdog off: the lease holds for exactly the TTL unless renewed by hand.
    pub fn fixed(mut self) -> Self {
        self.mode = LeaseMode::Fixed;
        self
    }

    /// Keeps the watchdog on with this renewal period.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.mode = LeaseMode::Watchdog {
            renew_every: Some(every),
        };
        self
    }

    /// Makes the acquire re-entrant for `owner`.
    pub fn owner(mut self, owner: &Owner) -> Self {
        self.owner = Some(owner.clone());
        self
    }

    /// Sets the lost signal's lead: `max(ttl x factor, floor)` before the server's expiry.
    pub fn lead(mut self, factor: f64, floor: Duration) -> Self {
        self.lead_factor = factor;
        self.lead_floor = floor;
        self
    }

    /// The drift margin subtracted from a validity window of `ttl`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        self.margins().drift(ttl)
    }

    /// The lost signal's lead for a lease of `ttl`.
    pub fn lead_for(&self, ttl: Duration) -> Duration {
        self.margins().lead(ttl)
    }

    /// The validity window of a lease of `ttl`: the TTL minus the drift allowance and the lead
    /// (zero when they eat it all).
    pub fn window(&self, ttl: Duration) -> Duration {
        self.margins().window(ttl)
    }

    /// The two margins alone, as a lease keeps them.
    pub fn margins(&self) -> Margins {
        Margins {
            drift_factor: self.drift_factor,
            drift_floor: self.drift_floor,
            lead_factor: self.lead_factor,
            lead_floor: self.lead_floor,
        }
    }

    /// The watchdog period for a lease of `ttl`, or `None` when the lease is fixed.
    pub fn renew_period(&self, ttl: Duration) -> Option<Duration> {
        self.mode.period(ttl)
    }

    /// Checks the options before any I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the option when the TTL is zero or past what a lease
    /// counts (`Duration::from_nanos(u64::MAX)`, about 584 years), the drift or lead
    /// factor is outside `[0, 0.5)`, the margins eat the whole TTL, or the renewal period is zero
    /// or not below the validity window.
    pub fn validate(&self) -> Result<()> {
        check_ttl(self.ttl)?;
        for (key, factor) in [
            ("drift_factor", self.drift_factor),
            ("lead_factor", self.lead_factor),
        ] {
            if !(0.0..0.5).contains(&factor) {
                return Err(LockError::invalid_config(
                    key,
                    factor,
                    "must be in [0, 0.5)",
                ));
            }
        }
        self.validate_for(self.ttl)
    }

    /// Checks the options against the TTL a lease will actually get (see
    /// [`crate::LockBackend::lease_ttl`]: etcd and ZooKeeper leases run on their session's), so
    /// a renewal period that fits the asked TTL but not the applied one is refused before I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the option, as [`AcquireOptions::validate`].
    pub fn validate_for(&self, ttl: Duration) -> Result<()> {
        self.margins().check(self.mode, ttl)
    }
}

/// The longest TTL a lease counts, in `u64` nanoseconds (about 584 years): a longer one would be
/// cut to it without a word.
const MAX_TTL: Duration = Duration::from_nanos(u64::MAX);

/// A TTL a lease can be asked for: above zero, at most [`MAX_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(LockError::invalid_config("ttl", ttl, "must be above zero"));
    }
    if ttl > MAX_TTL {
        return Err(LockError::invalid_config(
            "ttl",
            ttl,
            format!("must be at most {MAX_TTL:?} (about 584 years)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_name_the_key() {
        let cases = [
            (AcquireOptions::with_ttl(Duration::ZERO), "ttl"),
            (
                AcquireOptions::with_ttl(MAX_TTL + Duration::from_nanos(1)),
                "ttl",
            ),
            (
                AcquireOptions::with_ttl(Duration::from_secs(3))
                    .renew_every(Duration::from_secs(3)),
                "renew_every",
            ),
            (
                AcquireOptions::with_ttl(Duration::from_secs(3)).renew_every(Duration::ZERO),
                "renew_every",
            ),
            (
                AcquireOptions {
                    drift_factor: 0.9,
                    ..AcquireOptions::default()
                },
                "drift_factor",
            ),
            (
                AcquireOptions {
                    drift_floor: Duration::from_secs(60),
                    ..AcquireOptions::default()
                },
                "drift_floor",
            ),
            (
                AcquireOptions::with_ttl(Duration::from_millis(40)),
                "lead_floor",
            ),
            (
                AcquireOptions::default().lead(0.7, Duration::ZERO),
                "lead_factor",
            ),
        ];
        for (opts, key) in cases {
            match opts.validate() {
                Err(LockError::InvalidConfig { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}: expected InvalidConfig, got {other:?}"),
            }
        }
        AcquireOptions::default().validate().unwrap();
        AcquireOptions::with_ttl(Duration::from_millis(10))
            .fixed()
            .lead(0.1, Duration::ZERO)
            .validate()
            .unwrap();
    }

    #[test]
    fn the_window_leaves_drift_and_lead() {
        let o = AcquireOptions::with_ttl(Duration::from_secs(10));
        // 1 % + 2 ms of drift, 10 % of lead.
        assert_eq!(o.window(o.ttl), Duration::from_millis(10_000 - 102 - 1_000));
        // Below 500 ms the lead's 50 ms floor applies.
        assert_eq!(
            o.window(Duration::from_millis(200)),
            Duration::from_millis(200 - 4 - 50)
        );
    }

    #[test]
    fn a_renewal_period_that_fits_the_asked_ttl_but_not_the_applied_one_is_refused() {
        let o =
            AcquireOptions::with_ttl(Duration::from_secs(30)).renew_every(Duration::from_secs(10));
        o.validate().unwrap();
        match o.validate_for(Duration::from_secs(3)) {
            Err(LockError::InvalidConfig { key, .. }) => assert_eq!(key, "renew_every"),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn default_renews_at_a_third() {
        let o = AcquireOptions::with_ttl(Duration::from_secs(3));
        assert_eq!(o.renew_period(o.ttl), Some(Duration::from_secs(1)));
        assert_eq!(o.clone().fixed().renew_period(o.ttl), None);
    }
}
