//! Semaphores and read-write locks, each client its own connection or session.
//!
//! * Semaphore: `clients` contenders on one semaphore of `permits`; each takes a permit, yields
//!   once (the work) and gives it back, in a loop. Measured: permits granted per second, and the
//!   hand-over: from the latest release's return to the grant of a waiter that asked while every
//!   permit was held or owed to those who asked before it (one that found a permit free was
//!   admitted by its own enqueue, not handed anything: its time is an uncontended acquire's).
//! * Read-write mix: `clients` clients on one read-write lock, each taking a read lease 9 times in
//!   10 and the write lease once, yielding once under it. Measured: leases per second, the time
//!   to take a read and a write lease, and the hand-over: from the latest release's return to the
//!   grant of a lease asked for while a lease it cannot share was held or asked for before it (a
//!   read behind a write, a write behind any).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use distlock::{AcquireOptions, LockBackend, LockClient};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::stats::{Stats, stats};

/// How long one acquire may wait in these runs.
const WAIT: Duration = Duration::from_secs(120);

fn opts() -> AcquireOptions {
    AcquireOptions::with_ttl(Duration::from_secs(10))
}

/// The semaphore run's grants per second and hand-over latency.
pub async fn semaphore(
    clients: Vec<Arc<dyn LockBackend>>,
    name: &str,
    permits: u32,
    grants: usize,
    budget: Duration,
) -> Stats {
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let (stop, granted) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    // Permits held (granted, release not yet returned), and acquires under way.
    let (held, asking) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for backend in clients {
        let s = LockClient::new(backend)
            .semaphore(name, permits)
            .expect("semaphore")
            .options(opts());
        let (last_release, samples) = (last_release.clone(), samples.clone());
        let (stop, granted) = (stop.clone(), granted.clone());
        let (held, asking) = (held.clone(), asking.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let ahead = asking.fetch_add(1, Ordering::SeqCst) + held.load(Ordering::SeqCst);
                let queued = ahead >= permits as usize;
                let permit = s.acquire(WAIT).await.expect("permit");
                held.fetch_add(1, Ordering::SeqCst);
                asking.fetch_sub(1, Ordering::SeqCst);
                let now = Instant::now();
                // A grant that waited for a release: the hand-over from that release.
                if let Some(r) = *last_release.lock().await
                    && queued
                    && r > asked
                {
                    samples.lock().await.push(now - r);
                }
                tokio::task::yield_now().await;
                permit.release().await.expect("release");
                held.fetch_sub(1, Ordering::SeqCst);
                *last_release.lock().await = Some(Instant::now());
                if granted.fetch_add(1, Ordering::Relaxed) + 1 >= grants || start.elapsed() > budget
                {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("contender");
    }
    let elapsed = start.elapsed();
    let mut out = stats(std::mem::take(&mut *samples.lock().await), elapsed);
    out.per_sec = granted.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
    out
}

/// The read-write mix's leases per second, the time to take each kind, and its hand-over.
pub struct Mix {
    pub per_sec: f64,
    pub read: Stats,
    pub write: Stats,
    pub handover: Stats,
}

/// The read-write mix (every tenth lease a write).
pub async fn read_write(
    clients: Vec<Arc<dyn LockBackend>>,
    name: &str,
    leases: usize,
    budget: Duration,
) -> Mix {
    let reads: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let writes: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handovers: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let (stop, taken) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    // Leases held (granted, release not yet returned), and acquires under way: reads, writes.
    let (held, asking): (Arc<[AtomicUsize; 2]>, Arc<[AtomicUsize; 2]>) = Default::default();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (id, backend) in clients.into_iter().enumerate() {
        let rw = LockClient::new(backend)
            .rwlock(name)
            .expect("rwlock")
            .options(opts());
        let (reads, writes) = (reads.clone(), writes.clone());
        let (last_release, handovers) = (last_release.clone(), handovers.clone());
        let (stop, taken) = (stop.clone(), taken.clone());
        let (held, asking) = (held.clone(), asking.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = id;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let write = n % 10 == 0;
                let asked = Instant::now();
                let [reading, writing] = [0, 1].map(|i| {
                    held[i].load(Ordering::SeqCst)
                        + asking[i]
                            .fetch_add(usize::from(i == usize::from(write)), Ordering::SeqCst)
                });
                let queued = writing > 0 || (write && reading > 0);
                let lease = if write {
                    rw.write(WAIT).await
                } else {
                    rw.read(WAIT).await
                }
                .expect("lease");
                held[usize::from(write)].fetch_add(1, Ordering::SeqCst);
                asking[usize::from(write)].fetch_sub(1, Ordering::SeqCst);
                let now = Instant::now();
                if write { &writes } else { &reads }
                    .lock()
                    .await
                    .push(now - asked);
                if let Some(r) = *last_release.lock().await
                    && queued
                    && r > asked
                {
                    handovers.lock().await.push(now - r);
                }
                tokio::task::yield_now().await;
                lease.release().await.expect("release");
                held[usize::from(write)].fetch_sub(1, Ordering::SeqCst);
                *last_release.lock().await = Some(Instant::now());
                if taken.fetch_add(1, Ordering::Relaxed) + 1 >= leases || start.elapsed() > budget {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let elapsed = start.elapsed();
    Mix {
        per_sec: taken.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        read: stats(std::mem::take(&mut *reads.lock().await), elapsed),
        write: stats(std::mem::take(&mut *writes.lock().await), elapsed),
        handover: stats(std::mem::take(&mut *handovers.lock().await), elapsed),
    }
}
