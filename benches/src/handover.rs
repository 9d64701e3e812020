//! N clients (each its own connection or session) on ONE name: each acquires, runs a short
//! critical section, releases. Measured: holder changes per second and the hand-over latency,
//! from the moment one client's release call returned to another client's grant.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::stats::{Stats, stats};
use crate::uncontended::{Pair, Peer, etcd_lock_pair, zk_lock_pair};

/// One waiting client.
pub enum Waiter {
    /// Ours: waits by notification.
    Ours(LockClient),
    /// rslock: retries after a random pause (its default, 0-200 ms), as its users run it.
    Rslock(rslock::LockManager),
    /// etcd's lock service: the server holds the call until the lock is ours.
    EtcdLock(Box<etcd_client::Client>, i64),
    /// `zookeeper_client`'s lock recipe: a predecessor watch.
    ZkLock(zookeeper_client::Client),
}

impl Waiter {
    pub fn ours(backend: Arc<dyn LockBackend>) -> Self {
        Waiter::Ours(LockClient::new(backend))
    }

    /// A client of the peer library `peer`.
    pub async fn peer(peer: &Peer) -> Self {
        match Pair::peer(peer).await {
            Pair::Rslock(m) => Waiter::Rslock(m),
            Pair::EtcdLock(c, lease) => Waiter::EtcdLock(c, lease),
            Pair::ZkLock(c) => Waiter::ZkLock(c),
            _ => unreachable!("a peer pair is a peer library"),
        }
    }

    /// Holds the lock on `name` while `critical` runs; returns when the release returned.
    async fn hold(&self, name: &str, critical: impl Future<Output = ()>) -> Instant {
        match self {
            Waiter::Ours(locks) => {
                let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
                // A retryable failure (a Redlock round whose nodes answered too late under this
                // load) is tried again, as a caller would; anything else ends the run.
                let lease = loop {
                    match locks.acquire(name, &opts, Duration::from_secs(120)).await {
                        Ok(lease) => break lease,
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => panic!("acquire: {e}"),
                    }
                };
                critical.await;
                lease.release().await.expect("release");
                Instant::now()
            }
            Waiter::Rslock(m) => {
                let lock = loop {
                    if let Ok(l) = m.lock(name, Duration::from_secs(10)).await {
                        break l;
                    }
                };
                critical.await;
                m.unlock(&lock).await;
                Instant::now()
            }
            Waiter::EtcdLock(c, lease) => {
                etcd_lock_pair(c, *lease, name, critical).await;
                Instant::now()
            }
            Waiter::ZkLock(c) => {
                zk_lock_pair(c, critical).await;
                Instant::now()
            }
        }
    }
}

/// When each client was granted the lock, and when its release returned.
type Events = (Vec<(Instant, usize)>, Vec<(Instant, usize)>);

/// Runs the waiters until `grants` grants happened or `budget` passed.
/// See [`counted_handover`].
pub async fn handover(waiters: Vec<Waiter>, name: &str, grants: usize, budget: Duration) -> Stats {
    counted_handover(waiters, name, grants, budget).await.0
}

/// Runs the waiters until `grants` grants happened or `budget` passed; also returns how many
/// grants there were.
///
/// Holds are strictly sequential (that is the lock's job), so the k-th grant in time follows the
/// (k-1)-th release in time: latencies pair them up after the run, which stays right when a
/// grant is handed over before the releasing call has even returned (in-process store).
pub async fn counted_handover(
    waiters: Vec<Waiter>,
    name: &str,
    grants: usize,
    budget: Duration,
) -> (Stats, usize) {
    let events: Arc<Mutex<Events>> = Arc::default();
    let granted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (id, waiter) in waiters.into_iter().enumerate() {
        let (events, granted, stop) = (events.clone(), granted.clone(), stop.clone());
        let name = name.to_string();
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let events = &events;
                let released = waiter
                    .hold(&name, async {
                        events.lock().await.0.push((Instant::now(), id));
                        tokio::task::yield_now().await; // the critical section
                    })
                    .await;
                events.lock().await.1.push((released, id));
                if granted.fetch_add(1, Ordering::Relaxed) + 1 >= grants || start.elapsed() > budget
                {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let elapsed = start.elapsed();
    let (mut grants_at, mut releases_at) = std::mem::take(&mut *events.lock().await);
    grants_at.sort();
    releases_at.sort();
    let samples = grants_at
        .iter()
        .skip(1)
        .zip(&releases_at)
        .filter(|((_, to), (_, from))| to != from)
        .map(|((at, _), (released, _))| at.saturating_duration_since(*released))
        .collect();
    (stats(samples, elapsed), grants_at.len())
}
