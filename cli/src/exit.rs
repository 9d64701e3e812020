//! Exit statuses: the child's own, or one of these (sysexits where one fits), so scripts can
//! tell "try later" from "fix the configuration".

/// The command line is wrong, a lock name included (EX_USAGE).
pub const USAGE: u8 = 64;
/// The backend could not be reached or failed (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// The lock is held (`--no-wait`) or the wait ran out (EX_TEMPFAIL): try again later.
pub const BUSY: u8 = 75;
/// The lock was lost while the command ran: it was terminated. No sysexits code fits.
pub const LOST: u8 = 76;
/// The configuration or the backend URL is invalid, or `--limit` differs from the one the
/// name's other users give (EX_CONFIG).
pub const CONFIG: u8 = 78;

/// What a shell reports for a process ended by `signal`.
pub fn signalled(signal: i32) -> u8 {
    (128 + signal).clamp(0, 255) as u8
}

/// The exit status for a lock error.
pub fn for_error(e: &distlock::LockError) -> u8 {
    use distlock::LockError as E;
    match e {
        E::Busy { .. } | E::Timeout { .. } => BUSY,
        // A name is the command line's own input.
        E::InvalidName { .. } => USAGE,
        E::InvalidConfig { .. }
        | E::Unsupported { .. }
        | E::LimitMismatch { .. }
        | E::ForeignEntry { .. } => CONFIG,
        E::Lost { .. } | E::NotHeld { .. } => LOST,
        _ => UNAVAILABLE,
    }
}

/// What to print for `e`, met on lock `name`: the error alone when it names the lock itself,
/// else the name (cut, as errors cut it) before it.
pub fn said(name: &str, e: &distlock::LockError) -> String {
    use distlock::LockError as E;
    match e {
        E::Backend { .. } | E::Unsupported { .. } | E::InvalidConfig { .. } => {
            format!("{}: {e}", distlock::shown(name))
        }
        _ => e.to_string(),
    }
}
