//! Semaphores and read-write locks, each client its own connection or session.
//!
//! * Semaphore: `clients` contenders on one semaphore of `permits`; each takes a permit, yields
//!   once (the work) and gives it back, in a loop. Measured: permits granted per second, and the
//!   hand-over: from the return of the release that freed a permit to the grant of that permit
//!   to a waiter that asked before the release began (one that asked later found the permit
//!   free, or took its own: its time is an uncontended acquire's). With `permits` permits the
//!   (k + permits)-th grant in time is the first that needs the k-th release, so they are paired
//!   after the run, as the lock's hand-over pairs each grant with the release before it; a
//!   grant seen before its release returned counts 0. (The latest release before a grant is not
//!   its release when releases overlap: that one may have admitted the waiter ahead, while this
//!   waiter's was still in flight.)
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

/// Each grant: when it came and when its acquire began; each release: when it began and when it
/// returned.
type Turns = (Vec<(Instant, Instant)>, Vec<(Instant, Instant)>);

/// The semaphore run's grants per second and hand-over latency.
pub async fn semaphore(
    clients: Vec<Arc<dyn LockBackend>>,
    name: &str,
    permits: u32,
    grants: usize,
    budget: Duration,
) -> Stats {
    let events: Arc<Mutex<Turns>> = Arc::default();
    let (stop, granted) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for backend in clients {
        let s = LockClient::new(backend)
            .semaphore(name, permits)
            .expect("semaphore")
            .options(opts());
        let (events, stop, granted) = (events.clone(), stop.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let permit = s.acquire(WAIT).await.expect("permit");
                events.lock().await.0.push((Instant::now(), asked));
                tokio::task::yield_now().await;
                let releasing = Instant::now();
                permit.release().await.expect("release");
                events.lock().await.1.push((releasing, Instant::now()));
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
    let (mut grants_at, mut releases_at) = std::mem::take(&mut *events.lock().await);
    grants_at.sort();
    releases_at.sort_by_key(|(_, returned)| *returned);
    let samples = grants_at
        .iter()
        .skip(permits as usize)
        .zip(&releases_at)
        .filter(|((_, asked), (releasing, _))| asked < releasing)
        .map(|((at, _), (_, returned))| at.saturating_duration_since(*returned))
        .collect();
    let mut out = stats(samples, elapsed);
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
