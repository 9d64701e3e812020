//! Leader hand-over: candidates (each its own client) campaign, lead for a moment and resign, in
//! turn, while an observer on a client of its own follows the leaders. Measured: from the return
//! of one leader's resign to the next leader's elected campaign, and to the observer's report of
//! it; next to the lock hand-over of the same backend with as many clients.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use distlock::{AcquireOptions, FencingToken, LockBackend, LockClient, StreamExt};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::stats::{Stats, stats};

/// The leader hand-over and the observer's lag, over one run.
pub struct ElectionStats {
    pub handover: Stats,
    pub observed: Stats,
}

/// Each term's election time and its leader's resign time.
#[derive(Default)]
struct Terms {
    elected: Vec<(Instant, FencingToken)>,
    resigned: HashMap<FencingToken, Instant>,
}

/// Runs `candidates` until `terms` leaders were elected or `budget` passed.
pub async fn election(
    candidates: Vec<Arc<dyn LockBackend>>,
    observer: Arc<dyn LockBackend>,
    name: &str,
    terms: usize,
    budget: Duration,
) -> ElectionStats {
    let opts = AcquireOptions::with_ttl(Duration::from_secs(10));
    let log: Arc<Mutex<Terms>> = Arc::default();
    let seen: Arc<Mutex<Vec<(Instant, FencingToken)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let elected = Arc::new(AtomicUsize::new(0));
    let mut leaders = LockClient::new(observer)
        .election(name)
        .expect("election")
        .observe();
    let watching = {
        let (seen, stop) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match tokio::time::timeout(Duration::from_millis(200), leaders.next()).await {
                    Ok(Some(Ok(l))) => seen.lock().await.push((Instant::now(), l.term)),
                    Ok(Some(Err(e))) => panic!("observer: {e}"),
                    _ => {}
                }
            }
        })
    };
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (id, backend) in candidates.into_iter().enumerate() {
        let (log, stop, elected) = (log.clone(), stop.clone(), elected.clone());
        let e = LockClient::new(backend)
            .election(name)
            .expect("election")
            .options(opts.clone());
        tasks.push(tokio::spawn(async move {
            let value = format!("candidate-{id}");
            while !stop.load(Ordering::Relaxed) {
                let leading = e.campaign(&value).await.expect("campaign");
                let term = leading.term();
                log.lock().await.elected.push((Instant::now(), term));
                tokio::task::yield_now().await; // the leader's work
                leading.resign().await.expect("resign");
                log.lock().await.resigned.insert(term, Instant::now());
                if elected.fetch_add(1, Ordering::Relaxed) + 1 >= terms || start.elapsed() > budget
                {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("candidate");
    }
    let elapsed = start.elapsed();
    watching.await.expect("observer");
    let mut log = std::mem::take(&mut *log.lock().await);
    log.elected.sort();
    // The leader before each term, and when it resigned.
    let before: HashMap<FencingToken, Instant> = log
        .elected
        .windows(2)
        .filter_map(|w| Some((w[1].1, *log.resigned.get(&w[0].1)?)))
        .collect();
    let lag = |(at, term): &(Instant, FencingToken)| {
        before.get(term).map(|r| at.saturating_duration_since(*r))
    };
    let handover = log.elected.iter().filter_map(lag).collect();
    let observed = seen.lock().await.iter().filter_map(lag).collect();
    ElectionStats {
        handover: stats(handover, elapsed),
        observed: stats(observed, elapsed),
    }
}
