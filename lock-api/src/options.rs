//! Per-call options of an acquire.

use std::time::Duration;

use crate::error::{LockError, Result};
use crate::guarantee::Guarantee;
use crate::owner::Owner;

/// How a lease is kept alive after it is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// The generic watchdog renews the lease to its TTL every `renew_every` (default TTL / 3)
    /// until release, and fires the lost signal if renewals fail up to the validity deadline.
    Watchdog {
        /// Renewal period; `None` means TTL / 3. Must be below the TTL minus the drift margin.
        renew_every: Option<Duration>,
    },
    /// No renewals: the lease holds for the TTL, then the lost signal fires with
    /// [`crate::LostReason::Expired`] unless the holder called `renew()` or released it.
    Fixed,
}

/// Options of one acquire. `AcquireOptions::default()` is a 30 s TTL kept alive by the watchdog,
/// efficiency grade, no owner (not re-entrant).
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

    /// The drift margin subtracted from a validity window of `ttl`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + self.drift_floor
    }

    /// The watchdog period for a lease of `ttl`, or `None` when the lease is fixed.
    pub fn renew_period(&self, ttl: Duration) -> Option<Duration> {
        match self.mode {
            LeaseMode::Watchdog { renew_every } => Some(renew_every.unwrap_or(ttl / 3)),
            LeaseMode::Fixed => None,
        }
    }

    /// Checks the options before any I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the option when the TTL is zero, the drift factor is
    /// outside `[0, 0.5)`, the drift margin eats the whole TTL, or the renewal period is zero or
    /// not below the validity window.
    pub fn validate(&self) -> Result<()> {
        if self.ttl.is_zero() {
            return Err(LockError::invalid_config(
                "ttl",
                self.ttl,
                "must be above zero",
            ));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(LockError::invalid_config(
                "drift_factor",
                self.drift_factor,
                "must be in [0, 0.5)",
            ));
        }
        let validity = self.ttl.saturating_sub(self.drift(self.ttl));
        if validity.is_zero() {
            return Err(LockError::invalid_config(
                "drift_floor",
                self.drift_floor,
                format!("leaves no validity window inside the ttl of {:?}", self.ttl),
            ));
        }
        if let Some(every) = self.renew_period(self.ttl)
            && (every.is_zero() || every >= validity)
        {
            return Err(LockError::invalid_config(
                "renew_every",
                every,
                format!("must be above zero and below the validity window {validity:?}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_name_the_key() {
        let cases = [
            (AcquireOptions::with_ttl(Duration::ZERO), "ttl"),
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
            .validate()
            .unwrap();
    }

    #[test]
    fn default_renews_at_a_third() {
        let o = AcquireOptions::with_ttl(Duration::from_secs(3));
        assert_eq!(o.renew_period(o.ttl), Some(Duration::from_secs(1)));
        assert_eq!(o.clone().fixed().renew_period(o.ttl), None);
    }
}
