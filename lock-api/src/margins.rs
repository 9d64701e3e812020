//! How a lease is kept and how much of its TTL it may use: the renewal mode and the margins,
//! which the lease and the options share.

use std::time::Duration;

use crate::error::{LockError, Result};

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

impl LeaseMode {
    /// The watchdog period for a lease of `ttl`, or `None` when the lease is fixed.
    pub fn period(self, ttl: Duration) -> Option<Duration> {
        match self {
            LeaseMode::Watchdog { renew_every } => Some(renew_every.unwrap_or(ttl / 3)),
            LeaseMode::Fixed => None,
        }
    }
}

/// The drift allowance and the lead of a lease (see [`crate::AcquireOptions`]), which every validity
/// window it ever gets is shortened by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margins {
    /// See [`crate::AcquireOptions::drift_factor`].
    pub drift_factor: f64,
    /// See [`crate::AcquireOptions::drift_floor`].
    pub drift_floor: Duration,
    /// See [`crate::AcquireOptions::lead_factor`].
    pub lead_factor: f64,
    /// See [`crate::AcquireOptions::lead_floor`].
    pub lead_floor: Duration,
}

impl Margins {
    /// The drift allowance for a lease of `ttl`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + self.drift_floor
    }

    /// The lost signal's lead for a lease of `ttl`.
    pub fn lead(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.lead_factor).max(self.lead_floor)
    }

    /// `ttl` minus both margins (zero when they eat it all).
    pub fn window(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.drift(ttl) + self.lead(ttl))
    }
}

impl Margins {
    /// Checks that a lease of `ttl` kept as `mode` says has a validity window, and that its
    /// renewal period (if any) falls inside it.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the floor that leaves no window, or `renew_every`.
    pub fn check(&self, mode: LeaseMode, ttl: Duration) -> Result<()> {
        let window = self.window(ttl);
        if window.is_zero() {
            let (key, value) = if self.lead(ttl) >= self.drift(ttl) {
                ("lead_floor", self.lead_floor)
            } else {
                ("drift_floor", self.drift_floor)
            };
            return Err(LockError::invalid_config(
                key,
                value,
                format!(
                    "with the other margins, leaves no validity window inside the ttl of {ttl:?}"
                ),
            ));
        }
        if let Some(every) = mode.period(ttl)
            && (every.is_zero() || every >= window)
        {
            return Err(LockError::invalid_config(
                "renew_every",
                every,
                format!(
                    "must be above zero and below the validity window {window:?} of the {ttl:?} ttl the lease gets"
                ),
            ));
        }
        Ok(())
    }
}
