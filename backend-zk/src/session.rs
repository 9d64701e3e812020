//! Session epochs: the ZooKeeper session as the locks see it.
//!
//! An epoch is one stretch of trusted connectivity of one ZooKeeper session. It ends (its lost
//! signal fires, and every lease acquired in it is lost) when the connection drops (by default
//! at once: SUSPENDED is not safe to act on; or after [`crate::OnDisconnect::WaitUpTo`]), or when
//! the session expires or closes. Later acquires get a new epoch: on the same session once it is
//! connected again, or on a new session after an expiry; nodes are never reused across epochs.

use std::sync::{Arc, Weak};
use std::time::Duration;

use distlock_api::{LostReason, LostSignal, LostTrigger, lost_signal};
use zookeeper_client::{Client, SessionState, StateWatcher};

use crate::config::OnDisconnect;

pub(crate) struct Epoch {
    pub(crate) client: Client,
    lost: LostTrigger,
}

impl Epoch {
    /// Starts an epoch on `client`, watching its state.
    pub(crate) fn start(client: Client, on_disconnect: OnDisconnect) -> Arc<Self> {
        let (lost, _) = lost_signal();
        // The watcher consumes the state it starts from and then waits for the next change:
        // a disconnect between the caller's check and here would never be seen, so the task
        // looks at the starting state first.
        let watcher = client.state_watcher();
        let timeout = client.session_timeout();
        let epoch = Arc::new(Epoch { client, lost });
        tokio::spawn(watch_state(
            Arc::downgrade(&epoch),
            watcher,
            on_disconnect,
            timeout,
        ));
        epoch
    }

    pub(crate) fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    pub(crate) fn lost_signal(&self) -> LostSignal {
        self.lost.subscribe()
    }

    pub(crate) fn is_live(&self) -> bool {
        self.lost.fired().is_none()
    }

    pub(crate) fn end(&self, reason: LostReason) {
        if self.lost.fire(reason) {
            tracing::warn!(session = self.session_id(), %reason, "distlock zookeeper session epoch ended");
        }
    }
}

async fn watch_state(
    epoch: Weak<Epoch>,
    mut watcher: StateWatcher,
    on_disconnect: OnDisconnect,
    session_timeout: Duration,
) {
    // The watcher holds no client, so this task does not keep the session open.
    let mut state = watcher.peek_state();
    loop {
        let Some(e) = epoch.upgrade() else { return };
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => drop(e),
            SessionState::Disconnected => match on_disconnect {
                OnDisconnect::Lose => return e.end(LostReason::Disconnected),
                OnDisconnect::WaitUpTo(wait) => {
                    drop(e);
                    let back = tokio::time::timeout(wait.min(session_timeout), async {
                        loop {
                            if watcher.changed().await == SessionState::SyncConnected {
                                return;
                            }
                        }
                    })
                    .await;
                    if back.is_err()
                        && let Some(e) = epoch.upgrade()
                    {
                        return e.end(LostReason::Disconnected);
                    }
                }
            },
            _ => return e.end(LostReason::SessionLost),
        }
        state = watcher.changed().await;
    }
}
