//! The session: one etcd lease per client, shared by all its lock keys, kept alive every TTL / 3
//! (by the watchdog's renewals while locks are held; by its own keeper otherwise).
//!
//! The session tracks its own validity on the monotonic clock, from the *send* time of the last
//! keep-alive that etcd answered, minus a drift margin. It fires its lost signal when etcd says
//! the lease is gone or when that validity runs out without a successful keep-alive, so every
//! lock of the session is told before etcd can have expired the lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{LostReason, LostSignal, LostTrigger, entry_written_by, lost_signal};
use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

/// Drift allowance on the session's validity: 1 % of the TTL plus 5 ms.
fn drift(ttl: Duration) -> Duration {
    ttl.mul_f64(0.01) + Duration::from_millis(5)
}

/// The value of `slot`'s key among a name's slots in use.
fn find(used: &[(u64, String)], slot: u64) -> Option<&String> {
    used.iter().find(|(s, _)| *s == slot).map(|(_, e)| e)
}

pub(crate) struct Session {
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
    lost: LostTrigger,
    /// Send time of the last keep-alive (or grant) etcd confirmed.
    refreshed: Mutex<Instant>,
    keeper: Mutex<Option<AbortHandle>>,
    client: Client,
    /// The lease's keep-alive stream, kept open between refreshes: opening one costs a round trip
    /// of its own (the client sends a keep-alive and waits for it before handing the stream out).
    stream: tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// Attempt-key slots in use, per name prefix, with the value of the attempt's key (its
    /// secret, and an election's announced value after it; see [`crate::keys`]): a slot is taken
    /// for an attempt and given back only once its key is known deleted, so a live key is never
    /// reused, and only the holder's secret releases it. A list, not a map: a name has one slot
    /// in use but for overlapping attempts, and a map's node would cost 368 bytes per held lock.
    slots: Mutex<HashMap<String, Vec<(u64, String)>>>,
}

impl Session {
    /// Grants the lease and starts keeping it alive.
    pub(crate) async fn start(
        mut client: Client,
        ttl_secs: i64,
    ) -> Result<Arc<Self>, etcd_client::Error> {
        let sent = Instant::now();
        let grant = client.lease_grant(ttl_secs, None).await?;
        let (lost, _) = lost_signal();
        let session = Arc::new(Session {
            lease: grant.id(),
            ttl: Duration::from_secs(grant.ttl().max(1) as u64),
            lost,
            refreshed: Mutex::new(sent),
            keeper: Mutex::new(None),
            client,
            stream: tokio::sync::Mutex::new(None),
            slots: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(keep_alive(Arc::downgrade(&session)));
        *session.keeper.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
        Ok(session)
    }

    /// The lowest attempt slot of `prefix` not in use, now taken by the attempt whose key's
    /// value is `entry`.
    pub(crate) fn take_slot(&self, prefix: &str, entry: &str) -> u64 {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let used = slots
            .entry(prefix.to_string())
            .or_insert_with(|| Vec::with_capacity(1));
        let free = (0..)
            .find(|n| used.iter().all(|(s, _)| s != n))
            .unwrap_or_default();
        used.push((free, entry.to_string()));
        free
    }

    /// The value of the key of `slot` of `prefix`, if the attempt with `secret` holds the slot.
    pub(crate) fn slot_entry(&self, prefix: &str, slot: u64, secret: &str) -> Option<String> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .get(prefix)
            .and_then(|used| find(used, slot))
            .filter(|entry| entry_written_by(entry.as_bytes(), secret))
            .cloned()
    }

    /// Whether `slot` of `prefix` is taken by the attempt with `secret`.
    pub(crate) fn holds_slot(&self, prefix: &str, slot: u64, secret: &str) -> bool {
        self.slot_entry(prefix, slot, secret).is_some()
    }

    /// Records a new value of the key of `slot` (an announcement), if it is still taken.
    pub(crate) fn set_slot_entry(&self, prefix: &str, slot: u64, entry: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, e)) = slots
            .get_mut(prefix)
            .and_then(|used| used.iter_mut().find(|(s, _)| *s == slot))
        {
            *e = entry.to_string();
        }
    }

    /// About how many bytes a listing of the session's keys takes (each key's path and its
    /// framing): what a renewal's `LeaseTimeToLive` with keys would answer.
    pub(crate) fn listed_bytes(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        // A key is its name's prefix, 16 hex, `.`, 16 hex; 3 bytes of protobuf framing.
        slots
            .iter()
            .map(|(prefix, used)| (prefix.len() + 33 + 3) * used.len())
            .sum()
    }

    /// Gives a slot back once its key is deleted (or never written).
    pub(crate) fn free_slot(&self, prefix: &str, slot: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(used) = slots.get_mut(prefix) {
            used.retain(|(s, _)| *s != slot);
            if used.is_empty() {
                slots.remove(prefix);
            }
        }
    }

    /// Fires when the session is lost.
    pub(crate) fn lost_signal(&self) -> LostSignal {
        self.lost.subscribe()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.fired().is_some()
    }

    pub(crate) fn mark_lost(&self) {
        if self.lost.fire(LostReason::SessionLost) {
            tracing::warn!(lease = self.lease, "distlock etcd session lost");
        }
    }

    /// Gives the session up: lost from now on (every lease on it is told), never kept alive
    /// again, and revoked if etcd can be reached, so its keys go within its TTL at the latest.
    pub(crate) fn abandon(&self) {
        self.mark_lost();
        if let Some(task) = self.keeper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
        self.revoke_in_background();
    }

    fn revoke_in_background(&self) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (mut client, lease) = (self.client.clone(), self.lease);
            rt.spawn(async move {
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(lease)).await;
            });
        }
    }

    /// The send time of the last confirmed refresh: lock validity counts from here.
    pub(crate) fn refreshed(&self) -> Instant {
        *self.refreshed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Until when the lease is surely alive on the server.
    fn valid_until(&self) -> Instant {
        self.refreshed() + self.ttl.saturating_sub(drift(self.ttl))
    }

    fn record(&self, sent: Instant) {
        let mut r = self.refreshed.lock().unwrap_or_else(|p| p.into_inner());
        *r = (*r).max(sent);
    }

    /// One keep-alive round trip now, on the open stream (or opening one, which is itself the
    /// keep-alive). `Ok(true)`: refreshed; `Ok(false)`: the lease is gone (and the session is
    /// marked lost).
    pub(crate) async fn refresh(&self) -> Result<bool, etcd_client::Error> {
        let sent = Instant::now();
        let mut open = self.stream.lock().await;
        // Taken out while in use: a refresh cut short leaves no half-read stream behind.
        let alive = match open.take() {
            Some((mut keeper, mut stream)) => {
                keeper.keep_alive().await?;
                let Some(resp) = stream.message().await? else {
                    return Err(etcd_client::Error::LeaseKeepAliveError(
                        "keep-alive stream closed".into(),
                    ));
                };
                *open = Some((keeper, stream));
                resp.ttl() > 0
            }
            None => match self.client.clone().lease_keep_alive(self.lease).await {
                Ok(pair) => {
                    *open = Some(pair);
                    true
                }
                // What the client answers when etcd replies with TTL 0.
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m == "lease not found" => false,
                Err(e) => return Err(e),
            },
        };
        if alive {
            self.record(sent);
        } else {
            self.mark_lost();
        }
        Ok(alive)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = self.keeper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
        // Revoking frees every key of the session at once; if it fails, the TTL does it.
        self.revoke_in_background();
    }
}

async fn keep_alive(session: std::sync::Weak<Session>) {
    let Some(s) = session.upgrade() else { return };
    let period = s.ttl / 3;
    // While locks are held, the watchdog's renewal refreshes the session every TTL / 3; the keeper
    // waits a quarter period longer, so it only speaks for a session nobody else kept alive (one
    // keep-alive per tick, not two). Its retries still run until the validity ends.
    let idle_after = period + period / 4;
    let mut next = s.refreshed() + idle_after;
    drop(s);
    loop {
        let Some(deadline) = session.upgrade().map(|s| s.valid_until()) else {
            return;
        };
        sleep_until(next.min(deadline)).await;
        let Some(s) = session.upgrade() else { return };
        if Instant::now() >= s.valid_until() {
            s.mark_lost();
            return;
        }
        let due = s.refreshed() + idle_after;
        if Instant::now() < due {
            next = due;
            continue;
        }
        match timeout_at(s.valid_until(), s.refresh()).await {
            Ok(Ok(true)) => next = s.refreshed() + idle_after,
            Ok(Ok(false)) => return,
            Ok(Err(e)) => {
                tracing::debug!(lease = s.lease, error = %e, "distlock etcd keep-alive failed, retrying");
                next = Instant::now() + (period / 4).max(Duration::from_millis(50));
            }
            // The validity ran out during the attempt: the next turn marks the session lost.
            Err(_) => next = Instant::now(),
        }
    }
}
