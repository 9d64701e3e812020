//! Holders in another process: paused with SIGSTOP, or killed with SIGKILL.

use std::sync::atomic::Ordering;
use std::time::Duration;

use distlock_api::{Fence, FencingToken, LockClient, LockName};
use futures_util::future::join_all;
use tokio::time::Instant;

use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;
use crate::harness::{HarnessError, HolderProcess};

/// A process `start` runs on `d`'s URL; when `holding`, once it reported its token (returned).
pub(crate) fn process(
    d: &dyn Deployment,
    holding: bool,
    start: impl FnOnce(&str) -> Result<HolderProcess, HarnessError>,
) -> (HolderProcess, String) {
    let url = d
        .url()
        .expect("gated on a deployment other processes can reach");
    tokio::task::block_in_place(|| {
        let process = start(&url).unwrap_or_else(|e| panic!("{e}"));
        let token = if holding {
            process
                .next_line("TOKEN ", Duration::from_secs(30))
                .expect("the holder process never reported its token")
        } else {
            String::new()
        };
        (process, token)
    })
}

/// A process holding the lock `name` with `ttl`, and its token.
fn start_holder(
    d: &dyn Deployment,
    name: &str,
    ttl: Duration,
) -> (HolderProcess, Option<FencingToken>) {
    let (holder, token) = process(d, true, |url| HolderProcess::start(url, name, ttl));
    (holder, token.parse().ok().map(FencingToken))
}

/// A holder process paused (SIGSTOP) past its TTL: another client acquires with a higher token;
/// the holder resumes, is told its lease is lost, and its write through the fence is refused
/// while the new holder's write is accepted.
pub async fn paused_holder_process_is_fenced_off(d: &dyn Deployment) {
    let name = unique("sigstop");
    let (holder, old) = start_holder(d, &name, d.ttl());
    let old = old.expect("gated on fencing");
    holder.pause();
    let b = client(d).await;
    let fresh = b
        .acquire(&name, &opts(d), d.ttl() * 3 + d.expiry_slack())
        .await
        .expect("acquire while the holder is stopped");
    let new = fresh.fencing_token().expect("token");
    assert!(
        new > old,
        "new token {new} not above the paused holder's {old}"
    );
    let fence = Fence::new();
    fence
        .check(new)
        .expect("the new holder's write is accepted");
    holder.drain();
    holder.resume();
    let told = tokio::task::block_in_place(|| holder.next_line("LOST ", d.ttl() * 2));
    assert!(
        told.is_some(),
        "the resumed holder was never told its lease is lost"
    );
    let write = tokio::task::block_in_place(|| holder.next_line("WRITE ", Duration::from_secs(5)))
        .and_then(|t| t.parse().ok())
        .map(FencingToken)
        .expect("the resumed holder writes");
    assert_eq!(write, old);
    assert!(
        fence.check(write).is_err(),
        "the paused holder's stale write was accepted"
    );
    holder.kill();
    assert!(fresh.release().await.expect("release"));
}

/// A holder process that ends normally with its lease still in scope (SIGTERM: `main` returns
/// and the runtime ends before the drop's background release ran): the lock is free as soon as
/// the process is gone, not at its TTL or session timeout (the holder asks for a TTL far longer
/// than this test waits).
pub async fn a_holder_process_that_ends_holding_frees_the_lock_at_once(d: &dyn Deployment) {
    let name = unique("sigterm");
    let (holder, _) = start_holder(d, &name, Duration::from_secs(60));
    end(&holder);
    take_at_once(
        d,
        &name,
        "the lock is still held after its holder process ended",
    )
    .await;
}

/// A process that ends normally while it waits (SIGTERM: `main` returns, dropping the wait,
/// and the runtime ends before the wait's background clean-up ran): its place in the queue goes
/// with it, so the holder's release hands the lock to a newcomer at once, not once the dead
/// waiter's liveness, session or TTL runs out. (Where waiters keep a place in a queue: FIFO.)
pub async fn a_waiter_process_that_ends_waiting_leaves_nothing_queued(d: &dyn Deployment) {
    let name = unique("sigterm-waiting");
    let a = client(d).await;
    let held = a.try_acquire(&name, &opts(d)).await.expect("acquire");
    let (waiter, _) = process(d, false, |url| {
        HolderProcess::start(url, &name, Duration::from_secs(60))
    });
    let lock = LockName::new(&name).expect("name");
    assert!(
        eventually(Duration::from_secs(10), || async {
            d.artifacts(&lock).await >= 2
        })
        .await,
        "the waiter process never queued"
    );
    end(&waiter);
    assert!(held.release().await.expect("release"));
    take_at_once(d, &name, "the lock went to the waiter that ended").await;
}

/// SIGTERM, and the process returns from `main` within 10 s.
pub(crate) fn end(process: &HolderProcess) {
    let ended = tokio::task::block_in_place(|| process.terminate(Duration::from_secs(10)));
    assert!(ended, "the process did not end on SIGTERM");
}

/// A new client takes `name` with a try (no wait): `busy` says what a refusal means.
async fn take_at_once(d: &dyn Deployment, name: &str, busy: &str) {
    let lease = client(d)
        .await
        .try_acquire(name, &opts(d))
        .await
        .unwrap_or_else(|e| panic!("{busy}: {e}"));
    assert!(lease.release().await.expect("release"));
}

/// A holder process killed (SIGKILL) while holding: the lock is free within TTL + the backend's
/// slack.
pub async fn killed_holder_process_frees_the_lock(d: &dyn Deployment) {
    let name = unique("sigkill");
    let (holder, old) = start_holder(d, &name, d.ttl());
    let killed = Instant::now();
    holder.kill();
    let b = client(d).await;
    let limit = d.ttl() + d.expiry_slack() + Duration::from_secs(1);
    let lease = b
        .acquire(&name, &opts(d), limit * 2)
        .await
        .expect("acquire after the kill");
    let took = killed.elapsed();
    assert!(
        took <= limit,
        "freed {took:?} after the kill, limit {limit:?}"
    );
    assert!(lease.fencing_token() > old || old.is_none());
    assert!(lease.release().await.expect("release"));
}

/// How many waits the runtime below ends with: a new connection per clean-up (a session or a
/// server's connection set-up each, 3-10 ms measured) would fill much of the 2 s the library
/// gives a shutdown's clean-ups, while the clean-ups alone (a write each, about 3 ms on etcd,
/// slower when the scenarios around run at once) fit it with room.
const WAITS_AT_THE_END: usize = 150;

/// A runtime that ends (as a service's does when `main` returns) with many waits on as many
/// names: each wait's clean-up runs on the library's thread through a new client, and all of
/// them leave their queues before the runtime's drop returns, so every holder's release hands
/// its lock to a newcomer at once.
pub async fn a_runtime_that_ends_with_many_waits_leaves_nothing_queued(d: &dyn Deployment) {
    let names: Vec<String> = (0..WAITS_AT_THE_END)
        .map(|i| format!("{}/{i}", unique("ended-runtime")))
        .collect();
    let (a, o) = (client(d).await, opts(d));
    let held = join_all(names.iter().map(|name| a.try_acquire(name, &o))).await;
    end_runtime_waiting(
        d,
        |waiter| {
            for name in &names {
                let (w, name, o) = (waiter.clone(), name.clone(), opts(d));
                tokio::spawn(async move {
                    let _ = w.acquire(&name, &o, Duration::from_secs(60)).await;
                });
            }
        },
        &names
            .iter()
            .map(|n| (LockName::new(n).expect("name"), 2))
            .collect::<Vec<_>>(),
    );
    let released = join_all(
        held.into_iter()
            .map(|lease| async { lease.expect("acquire").release().await.expect("release") }),
    )
    .await;
    assert!(
        released.into_iter().all(|r| r),
        "a lease was lost while held"
    );
    let (b, o) = (&client(d).await, &o);
    join_all(names.iter().map(|name| async move {
        let lease = b
            .try_acquire(name, o)
            .await
            .unwrap_or_else(|e| panic!("{name} went to a wait of the ended runtime: {e}"));
        assert!(lease.release().await.expect("release"));
    }))
    .await;
}

/// Runs a runtime of its own, in a thread, as a process's: `start` spawns its waits on it
/// through a new client of `d`; once each name of `queued` shows at least its count of entries
/// (20 s at most), the runtime is dropped with them waiting, and this returns when its drop
/// did. The names are read one at a time, each until it shows its count (an entry stays until
/// the drop): hundreds read at once every poll loaded the server the scenarios beside it use.
pub(crate) fn end_runtime_waiting(
    d: &dyn Deployment,
    start: impl FnOnce(LockClient) + Send,
    queued: &[(LockName, usize)],
) {
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    // Left waiting, on this runtime, until the runtime is dropped.
                    start(client(d).await);
                    let seen = std::sync::atomic::AtomicUsize::new(0);
                    let all = eventually(Duration::from_secs(20), || async {
                        let mut i = seen.load(Ordering::Relaxed);
                        while let Some((name, least)) = queued.get(i)
                            && d.artifacts(name).await >= *least
                        {
                            i += 1;
                        }
                        seen.store(i, Ordering::Relaxed);
                        i == queued.len()
                    })
                    .await;
                    assert!(all, "a wait never queued");
                });
                drop(rt);
            });
        });
    });
}
