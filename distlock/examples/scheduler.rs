//! Three replicas of a small scheduler elect a leader; only the leader runs jobs, and every job
//! it writes is fenced by its term. The leader is killed (no resign: its lease must expire) and
//! replaced; the next one resigns (a clean shutdown) and hands over at once; a late write
//! carrying a deposed leader's term is refused.
//!
//! Runs on the embedded in-memory backend; no server needed. On a real server:
//!
//! ```sh
//! cargo run -p distlock --example scheduler -- --backend redis://127.0.0.1:6379
//! cargo run -p distlock --features etcd --example scheduler -- --backend 'etcd://127.0.0.1:2379/app?session_ttl=2s'
//! cargo run -p distlock --features zk --example scheduler -- --backend 'zk://127.0.0.1:2181/app?session_timeout=4s'
//! ```
//!
//! A killed replica is its own tokio runtime shut down at once: its tasks, connections and
//! renewals stop as a killed process's would, and nothing is released. On etcd and ZooKeeper the
//! lease is the client's session, so the replacement comes after the session's TTL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{AcquireOptions, Fence, FencingToken, Leader, LockClient, StreamExt};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

const REPLICAS: usize = 3;
const TTL: Duration = Duration::from_secs(2);
/// How long each leader runs jobs before the next step.
const LEADING: Duration = Duration::from_millis(600);
const JOB_EVERY: Duration = Duration::from_millis(50);

/// The resource the leaders write: a job log behind a fence, as a database would check a
/// term column.
#[derive(Default)]
struct Jobs {
    fence: Fence,
    done: Mutex<Vec<(usize, FencingToken)>>,
}

/// One replica: campaigns, runs jobs while leader, campaigns again after a loss, and resigns
/// when told to stop.
async fn replica(id: usize, url: String, jobs: Arc<Jobs>, mut stop: watch::Receiver<bool>) {
    let backend = match distlock::connect(&url).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("replica-{id}: cannot connect: {e}");
            return;
        }
    };
    let election = LockClient::new(backend)
        .election("scheduler")
        .expect("a valid election name on a backend with terms")
        .options(AcquireOptions::with_ttl(TTL));
    let value = format!("replica-{id}");
    loop {
        let stopping = stop.clone();
        let jobs = jobs.clone();
        let leading = election.lead(&value, |held| async move {
            let term = held.fencing_token().expect("elections always have terms");
            let mut stopping = stopping;
            loop {
                tokio::select! {
                    _ = stopping.wait_for(|s| *s) => return,
                    _ = sleep(JOB_EVERY) => {}
                }
                let write = || jobs.done.lock().expect("jobs").push((id, term));
                if jobs.fence.guarded(term, write).is_err() {
                    return;
                }
            }
        });
        let failed = tokio::select! {
            ran = leading => ran.err(),
            _ = stop.wait_for(|s| *s) => return,
        };
        if *stop.borrow() {
            return;
        }
        if let Some(e) = failed {
            eprintln!("replica-{id}: campaign failed: {e}");
            sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The next leader the observer reports, or exits when none comes in `limit`.
async fn next_leader(
    leaders: &mut distlock::BoxStream<'static, distlock::Result<Leader>>,
    limit: Duration,
) -> Leader {
    let until = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, leaders.next()).await {
            Ok(Some(Ok(l))) => return l,
            Ok(Some(Err(e))) => eprintln!("observer: {e} (retrying)"),
            Ok(None) | Err(_) => {
                eprintln!("FAIL: no new leader within {limit:?}");
                std::process::exit(1);
            }
        }
    }
}

fn replica_of(leader: &Leader) -> usize {
    leader
        .value
        .strip_prefix("replica-")
        .and_then(|n| n.parse().ok())
        .expect("values are replica-<n>")
}

fn usage(problem: &str) -> ! {
    eprintln!("{problem}\nusage: scheduler [--backend <url>]");
    std::process::exit(2);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut url = "memory://scheduler".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--backend" => {
                url = args
                    .next()
                    .unwrap_or_else(|| usage("--backend needs a URL"))
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let shown = distlock::redact(&url);
    // The memory store lives in this process; its replicas share it through the URL's name.
    let observer = match distlock::connect(&url).await {
        Ok(b) => LockClient::new(b),
        Err(e) => {
            eprintln!("cannot use {shown}: {e}");
            std::process::exit(2);
        }
    };
    let election = match observer.election("scheduler") {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cannot elect on {shown}: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "{REPLICAS} replicas of a scheduler (backend: {shown}, lease TTL {TTL:?} or the session's)"
    );
    let mut leaders = election.observe();
    let jobs = Arc::new(Jobs::default());
    let mut runtimes = Vec::new();
    let mut stops = Vec::new();
    for id in 0..REPLICAS {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime per replica");
        let (stop, stopped) = watch::channel(false);
        rt.spawn(replica(id, url.clone(), jobs.clone(), stopped));
        runtimes.push(Some(rt));
        stops.push(stop);
    }
    let wait = TTL * 4 + Duration::from_secs(10);
    let first = next_leader(&mut leaders, wait).await;
    println!("leader: {} (term {})", first.value, first.term);
    sleep(LEADING).await;

    let killed = replica_of(&first);
    println!("killing {} (no resign: its lease must expire)", first.value);
    let at = Instant::now();
    if let Some(rt) = runtimes[killed].take() {
        rt.shutdown_background();
    }
    let second = next_leader(&mut leaders, wait).await;
    println!(
        "leader: {} (term {}), {:.1?} after the kill",
        second.value,
        second.term,
        at.elapsed()
    );
    sleep(LEADING).await;

    let resigning = replica_of(&second);
    println!("stopping {} (it resigns)", second.value);
    let at = Instant::now();
    stops[resigning].send_replace(true);
    let third = next_leader(&mut leaders, wait).await;
    println!(
        "leader: {} (term {}), {:.1?} after the resign",
        third.value,
        third.term,
        at.elapsed()
    );
    sleep(LEADING).await;
    for stop in &stops {
        stop.send_replace(true);
    }
    let mut vacant = false;
    let until = Instant::now() + wait;
    while !vacant && Instant::now() < until {
        vacant = election.leader().await.is_ok_and(|l| l.is_none());
        sleep(Duration::from_millis(20)).await;
    }
    println!(
        "after shutdown: {}",
        if vacant {
            "no leader"
        } else {
            "STILL A LEADER"
        }
    );
    let write = || unreachable!("a deposed term must not write");
    let stale = jobs.fence.guarded(first.term, write).is_err();
    println!(
        "a late write with {}'s term {}: {}",
        first.value,
        first.term,
        if stale { "refused" } else { "ACCEPTED" }
    );
    let done = jobs.done.lock().expect("jobs").clone();
    let per_term = |term| done.iter().filter(|(_, t)| *t == term).count();
    println!(
        "jobs: {} (terms {}, {}, {}: {}, {}, {})",
        done.len(),
        first.term,
        second.term,
        third.term,
        per_term(first.term),
        per_term(second.term),
        per_term(third.term)
    );
    let ordered = done.windows(2).all(|w| w[0].1 <= w[1].1);
    let leaders_only = done.iter().all(|(id, t)| {
        [&first, &second, &third]
            .iter()
            .any(|l| l.term == *t && replica_of(l) == *id)
    });
    let ok = stale
        && vacant
        && ordered
        && leaders_only
        && first.term < second.term
        && second.term < third.term;
    println!(
        "{}",
        if ok {
            "OK: one leader at a time, every job fenced by its term"
        } else {
            "FAIL"
        }
    );
    // Every replica has resigned (no leader is left): nothing of theirs is still running.
    runtimes
        .into_iter()
        .flatten()
        .for_each(Runtime::shutdown_background);
    std::process::exit(if ok { 0 } else { 1 });
}
