//! The lost signal: a watch a holder can select on.

use tokio::sync::watch;

use crate::error::LostReason;

/// Fires once, with the reason, as soon as a lease (or a backend session that carries leases) is
/// known or presumed lost. Clones observe the same signal; it can be moved into other tasks.
///
/// Guarantee: for a lease, the signal fires no later than the lease's local validity deadline,
/// which is itself before the server-side expiry. It never fires after a successful release.
#[derive(Debug, Clone)]
pub struct LostSignal {
    rx: watch::Receiver<Option<LostReason>>,
}

/// The firing side of a [`LostSignal`], held by the watchdog or by a backend session.
#[derive(Debug)]
pub struct LostTrigger {
    tx: watch::Sender<Option<LostReason>>,
}

/// A new signal pair that has not fired.
pub fn lost_signal() -> (LostTrigger, LostSignal) {
    let (tx, rx) = watch::channel(None);
    (LostTrigger { tx }, LostSignal { rx })
}

impl LostTrigger {
    /// Fires the signal. Only the first reason is kept; returns whether this call fired it.
    pub fn fire(&self, reason: LostReason) -> bool {
        self.tx.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(reason);
                true
            } else {
                false
            }
        })
    }

    /// The reason, if fired.
    pub fn fired(&self) -> Option<LostReason> {
        *self.tx.borrow()
    }

    /// Another receiver of this signal.
    pub fn subscribe(&self) -> LostSignal {
        LostSignal {
            rx: self.tx.subscribe(),
        }
    }
}

impl LostSignal {
    /// Whether `other` observes the same signal (one backend session shared by many leases).
    pub(crate) fn same_as(&self, other: &LostSignal) -> bool {
        self.rx.same_channel(&other.rx)
    }

    /// Resolves with the reason when the signal fires, or with `None` once its trigger is gone
    /// without firing (nothing can fire it any more).
    pub(crate) async fn fired_or_closed(&self) -> Option<LostReason> {
        let mut rx = self.rx.clone();
        rx.wait_for(Option::is_some).await.ok().and_then(|r| *r)
    }

    /// The reason, if the signal has fired.
    pub fn get(&self) -> Option<LostReason> {
        *self.rx.borrow()
    }

    /// Resolves when the signal fires. Pending forever if the trigger is dropped without firing
    /// (the lease was released).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call again to keep waiting.
    pub async fn wait(&self) -> LostReason {
        let mut rx = self.rx.clone();
        let fired = match rx.wait_for(Option::is_some).await {
            Ok(r) => *r,
            Err(_) => None,
        };
        match fired {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}
