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

/// One waiting client.
pub enum Waiter {
    /// Ours: waits by notification.
    Ours(LockClient),
    /// rslock: retries after a random pause (its default, 0-200 ms), as its users run it.
    Rslock(rslock::LockManager),
}

impl Waiter {
    pub fn ours(backend: Arc<dyn LockBackend>) -> Self {
        Waiter::Ours(LockClient::new(backend))
    }

    /// Holds the lock on `name` while `critical` runs; returns when the release returned.
    async fn hold(&self, name: &str, critical: impl Future<Output = ()>) -> Instant {
        match self {
            Waiter::Ours(locks) => {
                let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
                let lease = locks
                    .acquire(name, &opts, Duration::from_secs(120))
                    .await
                    .expect("acquire");
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
        }
    }
}

/// Runs the waiters until `grants` grants happened or `budget` passed.
pub async fn handover(waiters: Vec<Waiter>, name: &str, grants: usize, budget: Duration) -> Stats {
    let last: Arc<Mutex<Option<(usize, Instant)>>> = Arc::new(Mutex::new(None));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let granted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (id, waiter) in waiters.into_iter().enumerate() {
        let (last, samples, granted, stop) =
            (last.clone(), samples.clone(), granted.clone(), stop.clone());
        let name = name.to_string();
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (last, samples) = (&last, &samples);
                let released = waiter
                    .hold(&name, async {
                        let at = Instant::now();
                        if let Some((prev, released)) = *last.lock().await
                            && prev != id
                        {
                            samples
                                .lock()
                                .await
                                .push(at.saturating_duration_since(released));
                        }
                        tokio::task::yield_now().await; // the critical section
                    })
                    .await;
                *last.lock().await = Some((id, released));
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
    let samples = std::mem::take(&mut *samples.lock().await);
    stats(samples, start.elapsed())
}
