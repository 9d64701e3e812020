//! The generic watchdog: one task per grant that renews it and fires its lost signal.
//!
//! It runs for every lease, with or without auto-renewal, because the lost signal must fire at
//! the validity deadline even when nobody renews. Rules:
//! * renewal every `renew_every` (TTL / 3 by default), measured from the last renewal *sent*;
//! * a renewal answered "not yours" fires the lost signal at once and stops;
//! * a failed renewal is retried (period / 4) until the validity deadline, where the signal
//!   fires; each attempt is cut off at the deadline so a hung server cannot delay it;
//! * a backend session death (etcd lease, ZooKeeper session) fires it at once;
//! * release aborts the task before it touches the backend (see `Lease::release`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::Renewal;
use crate::error::LostReason;
use crate::lease::LeaseShared;
use crate::signal::LostSignal;

/// The shortest pause between two failed renewal attempts.
const MIN_RETRY: Duration = Duration::from_millis(10);

pub(crate) async fn supervise(
    shared: Arc<LeaseShared>,
    sent_at: Instant,
    session: Option<LostSignal>,
) {
    let first_period = shared.renew_period(shared.state().ttl);
    let mut next_renew = first_period.map(|p| sent_at + p);
    loop {
        let (deadline, ttl) = {
            let st = shared.state();
            (st.deadline, st.ttl)
        };
        let session_lost = async {
            match &session {
                Some(s) => s.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep_until(deadline) => {
                if shared.state().deadline > deadline {
                    continue; // a manual renewal moved the deadline
                }
                let reason = if next_renew.is_some() {
                    LostReason::RenewalFailed
                } else {
                    LostReason::Expired
                };
                shared.mark_lost(reason);
                return;
            }
            reason = session_lost => {
                shared.mark_lost(reason);
                return;
            }
            _ = sleep_until(next_renew.unwrap_or(deadline)), if next_renew.is_some() => {
                let period = shared.renew_period(ttl).unwrap_or(ttl / 3);
                let sent = Instant::now();
                let outcome = {
                    let _gate = shared.renew_gate.lock().await;
                    if shared.state().released {
                        return;
                    }
                    timeout_at(deadline, shared.backend.renew(&shared.key, ttl)).await
                };
                match outcome {
                    Ok(Ok(Renewal::Renewed)) => {
                        shared.extend(sent, ttl);
                        next_renew = Some(sent + period);
                    }
                    Ok(Ok(Renewal::NotHeld)) => {
                        shared.mark_lost(LostReason::RenewalRefused);
                        return;
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(lock = %shared.key.name, backend = shared.backend.kind(), %error, "distlock renewal failed, retrying");
                        next_renew = Some(Instant::now() + (period / 4).max(MIN_RETRY));
                    }
                    // The deadline came while the renewal hung: the next turn fires the signal.
                    Err(_elapsed) => {}
                }
            }
        }
    }
}
