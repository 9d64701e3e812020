//! Deadlines from timeouts: any `Duration` a caller gives is a valid wait, however long.

use std::time::Duration;

use tokio::time::Instant;

/// A wait this long is for ever in practice; longer timeouts are cut to it.
pub(crate) const FOREVER: Duration = Duration::from_secs(30 * 365 * 86_400);

/// The deadline `timeout` from now, at most [`FOREVER`] away: `Instant + Duration` panics past
/// the clock's range, and a timeout of `u64::MAX` seconds is a caller's way to say "no limit".
pub(crate) fn deadline_in(timeout: Duration) -> Instant {
    Instant::now() + timeout.min(FOREVER)
}
