//! Semaphores and read-write locks: the admission queue's other policies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use distlock_api::{
    Admission, Fence, Lease, LockClient, LockError, LockName, RWLOCK_LOCK_PREFIX, RwLock,
    SEMAPHORE_LOCK_PREFIX, Semaphore,
};
use futures_util::future::join_all;
use rand::Rng;
use tokio::time::{Instant, sleep, timeout};

use super::process::{end, end_runtime_waiting, process};
use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;
use crate::harness::HolderProcess;

async fn semaphore(d: &dyn Deployment, name: &str, permits: u32) -> Semaphore {
    client(d)
        .await
        .semaphore(name, permits)
        .expect("a valid semaphore on a backend with policies")
        .options(opts(d))
}

async fn rwlock(d: &dyn Deployment, name: &str) -> RwLock {
    client(d)
        .await
        .rwlock(name)
        .expect("a valid read-write lock on a backend with policies")
        .options(opts(d))
}

fn queue(prefix: &str, name: &str) -> LockName {
    LockName::new(format!("{prefix}{name}")).expect("valid")
}

/// Waits until the server shows `n` entries (held or queued) for `name`, or panics.
async fn entries(d: &dyn Deployment, name: &LockName, n: usize) {
    entries_within(d, name, n, Duration::from_secs(5)).await
}

/// [`entries`] within `within`: shorter than a waiter's liveness (3 s on Redis), to see that a
/// waiter that gave up left at once rather than being dropped when its liveness ran out.
async fn entries_within(d: &dyn Deployment, name: &LockName, n: usize, within: Duration) {
    let seen = eventually(within, || async { d.artifacts(name).await == n }).await;
    assert!(seen, "{name}: {} entries, not {n}", d.artifacts(name).await);
}

/// 3N tasks on a semaphore of N, each taking a permit three times: never more than N holders
/// at once, and N at once at some point (permits are shared, not serialised); every permit's
/// token is distinct.
pub async fn a_semaphore_never_admits_more_than_its_permits(d: &dyn Deployment) {
    const N: u32 = 3;
    let name = unique("semaphore-bound");
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 * N {
        let s = semaphore(d, &name, N).await;
        let (inside, most, tokens) = (inside.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let permit = s.acquire(Duration::from_secs(60)).await.expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                sleep(Duration::from_millis(30)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                tokens.lock().expect("tokens").push(permit.fencing_token());
                assert!(
                    permit.release().await.expect("release"),
                    "a permit was lost"
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(most.load(Ordering::SeqCst), N as usize, "holders at once");
    let mut tokens = std::mem::take(&mut *tokens.lock().expect("tokens"));
    assert_eq!(tokens.len(), 9 * N as usize);
    if tokens.iter().all(Option::is_some) {
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), 9 * N as usize, "two permits shared a token");
    }
    entries(d, &queue(SEMAPHORE_LOCK_PREFIX, &name), 0).await;
}

/// A permit whose holder died (no renewal, no release) comes back within the TTL, to the
/// waiter queued for it; the live holder's permit is untouched.
pub async fn a_dead_holders_permit_returns(d: &dyn Deployment) {
    let name = unique("semaphore-dead");
    let key = queue(SEMAPHORE_LOCK_PREFIX, &name);
    let (dead, cut) = d.cuttable_client().await;
    let start = Instant::now();
    let grant = dead
        .acquire_admitted(&key, Admission::Permit(2), d.ttl(), None)
        .await
        .expect("permit");
    // No watchdog, no release, no session keep-alive: as if the process died right here.
    cut.cut();
    let s = semaphore(d, &name, 2).await;
    let live = s.try_acquire().await.expect("the second permit");
    let limit = d.ttl() + d.expiry_slack() + Duration::from_secs(1);
    let back = s
        .acquire(limit * 2)
        .await
        .expect("the dead holder's permit");
    let took = start.elapsed();
    assert!(took <= limit, "returned after {took:?}, limit {limit:?}");
    assert!(
        took >= d.ttl().mul_f64(0.9),
        "returned before the TTL: {took:?}"
    );
    assert!(back.fencing_token() > grant.token || grant.token.is_none());
    assert!(live.lost_reason().is_none(), "the live permit was lost");
    assert!(back.release().await.expect("release"));
    assert!(live.release().await.expect("release"));
    cut.restore();
}

/// A process holding the one permit of `name` (of 1) with `ttl`, once it said so.
fn permit_holder(d: &dyn Deployment, name: &str, ttl: Duration) -> HolderProcess {
    process(d, true, |url| {
        HolderProcess::start_permit(url, name, ttl, 1)
    })
    .0
}

/// A process reading (or, when `write`, writing) the read-write lock `name`, once it holds
/// when `holding`.
fn rw_process(d: &dyn Deployment, name: &str, write: bool, holding: bool) -> HolderProcess {
    let ttl = Duration::from_secs(60);
    process(d, holding, |url| {
        HolderProcess::start_rw(url, name, ttl, write)
    })
    .0
}

/// A try of the other kind than `write` says: a read after a writer, a write after a reader.
async fn try_other_kind(l: &RwLock, write: bool) -> distlock_api::Result<Lease> {
    if write {
        l.try_read().await
    } else {
        l.try_write().await
    }
}

/// A process that ends normally with its permit still in scope (SIGTERM: `main` returns and
/// the runtime ends before the drop's background release ran): the permit is back as soon as
/// the process is gone, not at its TTL or session timeout (it asks for a TTL far longer than
/// this test waits).
pub async fn a_permit_holder_process_that_ends_returns_its_permit_at_once(d: &dyn Deployment) {
    let name = unique("semaphore-sigterm");
    let holder = permit_holder(d, &name, Duration::from_secs(60));
    let s = semaphore(d, &name, 1).await;
    assert!(matches!(s.try_acquire().await, Err(LockError::Busy { .. })));
    end(&holder);
    let permit = s
        .try_acquire()
        .await
        .expect("the permit is still taken after its holder process ended");
    assert!(permit.release().await.expect("release"));
}

/// A process that ends normally while it waits for a permit of a semaphore of 2 (SIGTERM:
/// `main` returns, dropping the wait, and the runtime ends before the wait's clean-up ran): its
/// entry goes with it, so a permit given back goes to a newcomer at once, not to the dead
/// waiter until its liveness, session or TTL runs out.
pub async fn a_permit_waiter_process_that_ends_waiting_leaves_nothing_queued(d: &dyn Deployment) {
    let name = unique("semaphore-sigterm-waiting");
    let s = semaphore(d, &name, 2).await;
    let mut held = vec![
        s.try_acquire().await.expect("permit"),
        s.try_acquire().await.expect("permit"),
    ];
    let (waiter, _) = process(d, false, |url| {
        HolderProcess::start_permit(url, &name, Duration::from_secs(60), 2)
    });
    entries(d, &queue(SEMAPHORE_LOCK_PREFIX, &name), 3).await;
    end(&waiter);
    let back = held.pop().expect("a permit");
    assert!(back.release().await.expect("release"));
    held.push(
        s.try_acquire()
            .await
            .expect("the permit given back went to the waiter that ended"),
    );
    for permit in held {
        assert!(permit.release().await.expect("release"));
    }
}

/// Processes that end normally while they read, then while they write (SIGTERM: `main` returns
/// and the runtime ends before the drop's background release ran): each one's hold is gone as
/// soon as the process is, so a newcomer of the other kind is admitted at once, not at the TTL
/// or session timeout (they ask for a TTL far longer than this test waits).
pub async fn reader_and_writer_processes_that_end_holding_free_the_lock_at_once(
    d: &dyn Deployment,
) {
    let name = unique("rwlock-sigterm");
    let l = rwlock(d, &name).await;
    for write in [false, true] {
        end(&rw_process(d, &name, write, true));
        let next = try_other_kind(&l, write).await.unwrap_or_else(|e| {
            panic!("still held after its holder process ended (writer: {write}): {e}")
        });
        assert!(next.release().await.expect("release"));
    }
    entries(d, &queue(RWLOCK_LOCK_PREFIX, &name), 0).await;
}

/// Processes that end normally while they wait to read behind a writer, then to write behind
/// a reader (SIGTERM: `main` returns, dropping the wait, and the runtime ends before the wait's
/// clean-up ran): each one's entry goes with it. Another reader is admitted beside the reader at
/// once (a writer left waiting would hold it back), and once the holder leaves, a newcomer of
/// the other kind is admitted at once, not the dead waiter until its liveness, session or TTL
/// runs out.
pub async fn reader_and_writer_waiter_processes_that_end_waiting_leave_nothing_queued(
    d: &dyn Deployment,
) {
    let name = unique("rwlock-sigterm-waiting");
    let key = queue(RWLOCK_LOCK_PREFIX, &name);
    let l = rwlock(d, &name).await;
    for write in [false, true] {
        let held = if write {
            l.try_read().await.expect("read")
        } else {
            l.try_write().await.expect("write")
        };
        let waiter = rw_process(d, &name, write, false);
        entries(d, &key, 2).await;
        end(&waiter);
        let other = if write {
            let beside = l
                .try_read()
                .await
                .expect("a reader held back by the writer that ended");
            Some(beside)
        } else {
            None
        };
        for lease in other.into_iter().chain([held]) {
            assert!(lease.release().await.expect("release"));
        }
        let next = try_other_kind(&l, write).await.unwrap_or_else(|e| {
            panic!("the lock went to the waiter that ended (writer: {write}): {e}")
        });
        assert!(next.release().await.expect("release"));
    }
    entries(d, &key, 0).await;
}

/// A permit holder process killed (SIGKILL: no release, no renewal, its session left to
/// expire) gives its permit back within the TTL, to the waiter queued for it.
pub async fn a_killed_holder_process_returns_its_permit(d: &dyn Deployment) {
    let name = unique("semaphore-sigkill");
    let holder = permit_holder(d, &name, d.ttl());
    let s = semaphore(d, &name, 1).await;
    assert!(matches!(s.try_acquire().await, Err(LockError::Busy { .. })));
    let killed = Instant::now();
    holder.kill();
    let limit = d.ttl() + d.expiry_slack() + Duration::from_secs(1);
    let permit = s
        .acquire(limit * 2)
        .await
        .expect("the killed holder's permit");
    let took = killed.elapsed();
    assert!(
        took <= limit,
        "returned {took:?} after the kill, limit {limit:?}"
    );
    assert!(permit.release().await.expect("release"));
}

/// Waiters that time out or are dropped leave nothing queued, and the permits they waited for
/// go to the waiter behind them; with one permit and with several (whose queue entries record
/// their count). Then a loop of short waits, each timing out while every permit is held, is
/// granted as soon as permits come back: none of its own earlier waits is left ahead of it.
pub async fn cancelled_permit_waiters_leave_nothing(d: &dyn Deployment) {
    for permits in [1, 3] {
        let name = unique("semaphore-cancel");
        let key = queue(SEMAPHORE_LOCK_PREFIX, &name);
        let s = semaphore(d, &name, permits).await;
        let mut held = Vec::new();
        for _ in 0..permits {
            held.push(s.try_acquire().await.expect("permit"));
        }
        let timed_out = semaphore(d, &name, permits)
            .await
            .acquire(Duration::from_millis(300))
            .await;
        assert!(
            matches!(timed_out, Err(LockError::Timeout { ref name, .. }) if name == s.name()),
            "{timed_out:?}"
        );
        let dropped = semaphore(d, &name, permits).await;
        assert!(
            timeout(
                Duration::from_millis(300),
                dropped.acquire(Duration::from_secs(60))
            )
            .await
            .is_err()
        );
        entries_within(d, &key, permits as usize, Duration::from_secs(1)).await;
        // A permit back: a try is admitted at once, nothing of theirs ahead of it.
        let last = held.pop().expect("a permit");
        assert!(last.release().await.expect("release"));
        held.push(s.try_acquire().await.unwrap_or_else(|e| {
            panic!("{permits} permits, one free after two waits gave up: {e:?}")
        }));
        // A retry loop of short waits while every permit is held, then all of them come back.
        let retry = semaphore(d, &name, permits).await;
        let looping = tokio::spawn(async move {
            loop {
                match retry.acquire(Duration::from_millis(150)).await {
                    Ok(permit) => break (Instant::now(), permit),
                    Err(LockError::Timeout { .. }) => {}
                    Err(e) => panic!("retry loop: {e:?}"),
                }
            }
        });
        sleep(Duration::from_millis(700)).await;
        let freed = Instant::now();
        for permit in held.drain(..) {
            assert!(permit.release().await.expect("release"));
        }
        let (granted, permit) = timeout(Duration::from_secs(5), looping)
            .await
            .unwrap_or_else(|_| panic!("{permits} permits free, the retry loop is not granted"))
            .expect("task");
        assert!(
            granted - freed < Duration::from_secs(1),
            "the retry loop was granted {:?} after the permits came free",
            granted - freed
        );
        let waiter = semaphore(d, &name, permits).await;
        let behind = permits.saturating_sub(1) as usize;
        let mut fill = Vec::new();
        for _ in 0..behind {
            fill.push(s.try_acquire().await.expect("permit"));
        }
        let next = tokio::spawn(async move { waiter.acquire(Duration::from_secs(30)).await });
        entries(d, &key, permits as usize + 1).await;
        assert!(permit.release().await.expect("release"));
        let next = next.await.expect("task").expect("the waiter behind them");
        assert!(next.release().await.expect("release"));
        for permit in fill {
            assert!(permit.release().await.expect("release"));
        }
        entries(d, &key, 0).await;
    }
}

/// Readers and writers whose waits time out or are dropped leave nothing queued: once the lock
/// comes free, a try of the other kind is admitted at once, and a retry loop of short reads
/// behind a writer is granted as soon as the writer leaves.
pub async fn cancelled_reader_and_writer_waits_leave_nothing(d: &dyn Deployment) {
    let name = unique("rwlock-cancel");
    let key = queue(RWLOCK_LOCK_PREFIX, &name);
    let w = rwlock(d, &name).await;
    let r = rwlock(d, &name).await;
    // Readers give up behind a writer.
    let write = w.try_write().await.expect("write");
    assert!(matches!(
        r.read(Duration::from_millis(300)).await,
        Err(LockError::Timeout { .. })
    ));
    assert!(
        timeout(Duration::from_millis(300), r.read(Duration::from_secs(60)))
            .await
            .is_err()
    );
    entries_within(d, &key, 1, Duration::from_secs(1)).await;
    assert!(write.release().await.expect("release"));
    let write = w
        .try_write()
        .await
        .expect("a writer once the readers gave up");
    // A retry loop of short reads behind the writer.
    let looping = {
        let r = rwlock(d, &name).await;
        tokio::spawn(async move {
            loop {
                match r.read(Duration::from_millis(150)).await {
                    Ok(read) => break (Instant::now(), read),
                    Err(LockError::Timeout { .. }) => {}
                    Err(e) => panic!("retry loop: {e:?}"),
                }
            }
        })
    };
    sleep(Duration::from_millis(700)).await;
    let freed = Instant::now();
    assert!(write.release().await.expect("release"));
    let (granted, read) = timeout(Duration::from_secs(5), looping)
        .await
        .expect("the writer left, the read loop is not granted")
        .expect("task");
    assert!(
        granted - freed < Duration::from_secs(1),
        "the read loop was granted {:?} after the writer left",
        granted - freed
    );
    // Writers give up behind a reader.
    assert!(matches!(
        w.write(Duration::from_millis(300)).await,
        Err(LockError::Timeout { .. })
    ));
    assert!(
        timeout(Duration::from_millis(300), w.write(Duration::from_secs(60)))
            .await
            .is_err()
    );
    entries_within(d, &key, 1, Duration::from_secs(1)).await;
    // A later reader is not held back by a writer that gave up.
    let other = r.try_read().await.expect("a reader beside the reader");
    assert!(read.release().await.expect("release"));
    assert!(other.release().await.expect("release"));
    let write = w.try_write().await.expect("a writer once the readers left");
    assert!(write.release().await.expect("release"));
    entries(d, &key, 0).await;
}

/// A writer's wait behind 20 readers (a backend may follow only the nearest entries ahead of a
/// long queue, as etcd's writers further back than 16 do), timed out or dropped at random
/// points, leaves nothing queued and is never granted beside a reader; a writer waiting while
/// the readers leave out of their order is granted only once the last one left.
pub async fn a_writer_behind_many_readers_timed_out_or_dropped_leaves_nothing(d: &dyn Deployment) {
    const READERS: usize = 20;
    let name = unique("rwlock-deep");
    let key = queue(RWLOCK_LOCK_PREFIX, &name);
    let mut reads = Vec::new();
    for _ in 0..READERS {
        let r = rwlock(d, &name).await;
        reads.push(r.try_read().await.expect("a reader beside the readers"));
    }
    for i in 0..6u64 {
        // Even rounds are dropped by the caller; odd ones may time out first.
        let wait = if i % 2 == 0 {
            Duration::from_secs(30)
        } else {
            Duration::from_millis(50 * i)
        };
        let w = rwlock(d, &name).await;
        let task = tokio::spawn(async move { w.write(wait).await });
        let at = rand::rng().random_range(0..300u64);
        sleep(Duration::from_millis(at)).await;
        task.abort();
        assert!(
            !matches!(task.await, Ok(Ok(_))),
            "round {i}: a writer was granted beside the readers"
        );
        entries_within(d, &key, READERS, d.ttl() / 2).await;
    }
    let w = rwlock(d, &name).await;
    let writing = tokio::spawn(async move { w.write(Duration::from_secs(60)).await });
    entries(d, &key, READERS + 1).await;
    // The readers nearest the writer leave first, then the ones at the head.
    reads.rotate_left(READERS / 2);
    while let Some(read) = reads.pop() {
        assert!(
            !writing.is_finished(),
            "the writer was granted with {} readers holding",
            reads.len() + 1
        );
        assert!(read.release().await.expect("release"));
    }
    let write = timeout(Duration::from_secs(10), writing)
        .await
        .expect("the writer was not granted once the readers left")
        .expect("task")
        .expect("write");
    assert!(write.release().await.expect("release"));
    entries(d, &key, 0).await;
}

/// A try answers `Busy` for holders and waiters ahead of it, never for other callers' tries
/// that fail themselves: while a reader holds, two clients' writer tries (each `Busy`) hammer
/// the name, and every reader's try meanwhile is granted beside the reader. (On etcd and
/// ZooKeeper a try used to queue an entry and take it back when not admitted: a writer's,
/// visible for a round trip or two, turned readers' tries away.)
pub async fn a_try_loses_only_to_holders_and_waiters(d: &dyn Deployment) {
    const READS: usize = 40;
    let name = unique("rwlock-tries");
    let held = rwlock(d, &name)
        .await
        .try_read()
        .await
        .expect("the first reader");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for _ in 0..2 {
        let (w, stop, started) = (rwlock(d, &name).await, stop.clone(), started.clone());
        writers.push(tokio::spawn(async move {
            let mut tries = 0;
            while !stop.load(Ordering::Relaxed) {
                match w.try_write().await {
                    Err(LockError::Busy { .. }) => {
                        tries += 1;
                        started.fetch_add(1, Ordering::Relaxed);
                        // The memory store answers without I/O: without a yield, two writers
                        // would starve the runtime, the reader's watchdog included.
                        tokio::task::yield_now().await;
                    }
                    Ok(_) => panic!("a writer beside a reader"),
                    Err(e) => panic!("a writer's try: {e:?}"),
                }
            }
            tries
        }));
    }
    let r = rwlock(d, &name).await;
    // The readers start once the writers hammer: on the memory store, a reader's 40 tries can
    // otherwise all end before a writer task was first scheduled.
    let until = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::Relaxed) == 0 && Instant::now() < until {
        sleep(Duration::from_millis(1)).await;
    }
    let mut busy = 0;
    for _ in 0..READS {
        match r.try_read().await {
            Ok(read) => assert!(read.release().await.expect("release")),
            Err(LockError::Busy { .. }) => busy += 1,
            Err(e) => panic!("a reader's try: {e:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut tried = 0;
    for w in writers {
        tried += w.await.expect("writer task");
    }
    assert!(tried > 0, "the writers never tried");
    assert_eq!(
        busy, 0,
        "{busy} of {READS} reader tries were Busy beside a reader, with only writers' tries ({tried}) about"
    );
    assert!(held.release().await.expect("release"));
    entries(d, &queue(RWLOCK_LOCK_PREFIX, &name), 0).await;
}

/// Permit waiters are admitted in arrival order: each permit that comes back goes to the
/// waiter that arrived first among those still waiting.
pub async fn permits_are_granted_in_arrival_order(d: &dyn Deployment) {
    let name = unique("semaphore-fifo");
    let key = queue(SEMAPHORE_LOCK_PREFIX, &name);
    let holders = semaphore(d, &name, 2).await;
    let mut held = vec![
        holders.try_acquire().await.expect("first"),
        holders.try_acquire().await.expect("second"),
    ];
    let (tx, mut admitted) = tokio::sync::mpsc::unbounded_channel();
    for id in 0..4 {
        let s = semaphore(d, &name, 2).await;
        let tx = tx.clone();
        tokio::spawn(async move {
            let permit = s.acquire(Duration::from_secs(60)).await;
            let _ = tx.send((id, permit));
        });
        // Each is queued before the next arrives.
        entries(d, &key, 3 + id).await;
    }
    // One permit back at a time: exactly one waiter is admitted each time, the earliest.
    for expected in 0..4 {
        let oldest = held.remove(0);
        assert!(oldest.release().await.expect("release"));
        let (id, permit) = timeout(Duration::from_secs(10), admitted.recv())
            .await
            .expect("a waiter admitted")
            .expect("channel");
        assert_eq!(id, expected, "admitted out of arrival order");
        held.push(permit.expect("permit"));
    }
    for permit in held {
        assert!(permit.release().await.expect("release"));
    }
    entries(d, &key, 0).await;
}

/// A semaphore in use with N permits refuses a user asking for another number, naming both,
/// and leaves nothing of that user queued; users agreeing on N are unaffected.
pub async fn a_mismatched_permit_count_is_refused(d: &dyn Deployment) {
    let name = unique("semaphore-mismatch");
    let key = queue(SEMAPHORE_LOCK_PREFIX, &name);
    let held = semaphore(d, &name, 2)
        .await
        .try_acquire()
        .await
        .expect("permit");
    for (other, wait) in [(3, None), (1, Some(Duration::from_secs(1)))] {
        let s = semaphore(d, &name, other).await;
        let got = match wait {
            None => s.try_acquire().await,
            Some(t) => s.acquire(t).await,
        };
        assert!(
            matches!(got, Err(LockError::LimitMismatch { ours, theirs: 2, ref name }) if ours == other && name == s.name()),
            "{got:?}"
        );
        entries(d, &key, 1).await;
    }
    let second = semaphore(d, &name, 2)
        .await
        .try_acquire()
        .await
        .expect("same N");
    assert!(second.release().await.expect("release"));
    assert!(held.release().await.expect("release"));
    assert!(matches!(
        client(d).await.semaphore(&name, 0),
        Err(LockError::InvalidConfig { ref key, .. }) if key == "permits"
    ));
}

/// Readers hold together; a writer is refused while they do, and holds alone; write tokens
/// are above every earlier lease's.
pub async fn readers_share_and_a_writer_excludes(d: &dyn Deployment) {
    let name = unique("rwlock-share");
    let fence = Fence::new();
    let mut readers = Vec::new();
    for _ in 0..3 {
        let r = rwlock(d, &name).await;
        readers.push(r.try_read().await.expect("readers share"));
    }
    let w = rwlock(d, &name).await;
    assert!(matches!(w.try_write().await, Err(LockError::Busy { .. })));
    let mut highest = None;
    for r in readers {
        highest = highest.max(r.fencing_token());
        assert!(r.release().await.expect("release"));
    }
    for _ in 0..2 {
        let write = w.write(Duration::from_secs(10)).await.expect("write");
        if let Some(t) = write.fencing_token() {
            fence.check(t).expect("write tokens strictly increase");
            assert!(Some(t) > highest, "a write token below an earlier read's");
            highest = Some(t);
        }
        let other = rwlock(d, &name).await;
        assert!(matches!(
            other.try_read().await,
            Err(LockError::Busy { .. })
        ));
        assert!(matches!(
            other.try_write().await,
            Err(LockError::Busy { .. })
        ));
        assert!(write.release().await.expect("release"));
    }
    entries(d, &queue(RWLOCK_LOCK_PREFIX, &name), 0).await;
}

/// A writer waiting behind a reader is admitted before readers that arrive after it (they are
/// refused a try and queue behind it), and those readers are admitted together once it leaves.
pub async fn a_waiting_writer_is_not_starved_by_later_readers(d: &dyn Deployment) {
    let name = unique("rwlock-starve");
    let key = queue(RWLOCK_LOCK_PREFIX, &name);
    let first = rwlock(d, &name).await.try_read().await.expect("read");
    let w = rwlock(d, &name).await;
    let writer = tokio::spawn(async move { w.write(Duration::from_secs(60)).await });
    entries(d, &key, 2).await;
    let late = rwlock(d, &name).await;
    assert!(
        matches!(late.try_read().await, Err(LockError::Busy { .. })),
        "a reader passed a waiting writer"
    );
    let mut later = Vec::new();
    for _ in 0..2 {
        let r = rwlock(d, &name).await;
        later.push(tokio::spawn(async move {
            r.read(Duration::from_secs(60)).await
        }));
    }
    entries(d, &key, 4).await;
    sleep(Duration::from_millis(200)).await;
    assert!(
        later.iter().all(|t| !t.is_finished()),
        "a reader passed the writer"
    );
    assert!(first.release().await.expect("release"));
    let write = writer.await.expect("task").expect("the writer, next");
    sleep(Duration::from_millis(200)).await;
    assert!(
        later.iter().all(|t| !t.is_finished()),
        "a reader beside the writer"
    );
    let write_token = write.fencing_token();
    assert!(write.release().await.expect("release"));
    let mut reads = Vec::new();
    for t in later {
        reads.push(t.await.expect("task").expect("readers after the writer"));
    }
    for r in reads {
        assert!(r.fencing_token() > write_token || write_token.is_none());
        assert!(r.release().await.expect("release"));
    }
    entries(d, &key, 0).await;
}

/// A runtime that ends (as a process's does) with 50 waits of each kind: a permit of a full
/// semaphore of 2, a reader behind a writer, a writer behind a reader, each on a name of its
/// own. Every wait leaves its queue before the runtime's drop returns: once the holders let go,
/// a newcomer takes both permits of each semaphore, and writes each read-write lock, at once.
pub async fn a_runtime_that_ends_with_many_permit_reader_and_writer_waits_leaves_nothing_queued(
    d: &dyn Deployment,
) {
    const EACH: usize = 50;
    let base = unique("ended-runtime-kinds");
    let names =
        |kind: &str| -> Vec<String> { (0..EACH).map(|i| format!("{base}/{kind}/{i}")).collect() };
    let (permits, reads, writes) = (names("permit"), names("read"), names("write"));
    let (a, b, o) = (client(d).await, client(d).await, opts(d));
    let sem = |c: &LockClient, n: &str| c.semaphore(n, 2).expect("semaphore").options(o.clone());
    let rw = |c: &LockClient, n: &str| c.rwlock(n).expect("rwlock").options(o.clone());
    let hold = join_all(
        (permits.iter().flat_map(|n| [sem(&a, n), sem(&b, n)]))
            .map(|s| async move { s.try_acquire().await }),
    );
    let ahead = join_all(
        (reads.iter().map(|n| (rw(&a, n), true)))
            .chain(writes.iter().map(|n| (rw(&a, n), false)))
            .map(|(l, write)| async move {
                if write {
                    l.try_write().await
                } else {
                    l.try_read().await
                }
            }),
    );
    let (held, ahead) = tokio::join!(hold, ahead);
    end_runtime_waiting(
        d,
        |waiter| {
            let forever = Duration::from_secs(60);
            for n in &permits {
                let s = sem(&waiter, n);
                tokio::spawn(async move { s.acquire(forever).await });
            }
            for (n, write) in reads
                .iter()
                .map(|n| (n, false))
                .chain(writes.iter().map(|n| (n, true)))
            {
                let l = rw(&waiter, n);
                tokio::spawn(async move {
                    if write {
                        l.write(forever).await
                    } else {
                        l.read(forever).await
                    }
                });
            }
        },
        &(permits.iter().map(|n| (queue(SEMAPHORE_LOCK_PREFIX, n), 3)))
            .chain(
                reads
                    .iter()
                    .chain(&writes)
                    .map(|n| (queue(RWLOCK_LOCK_PREFIX, n), 2)),
            )
            .collect::<Vec<_>>(),
    );
    let released = join_all(
        held.into_iter()
            .chain(ahead)
            .map(|lease| async { lease.expect("held").release().await.expect("release") }),
    )
    .await;
    assert!(
        released.into_iter().all(|r| r),
        "a lease was lost while held"
    );
    let c = client(d).await;
    let taken = join_all(
        (permits.iter().flat_map(|n| [sem(&a, n), sem(&c, n)]))
            .map(|s| async move { s.try_acquire().await }),
    );
    let written = join_all(reads.iter().chain(&writes).map(|n| {
        let l = rw(&c, n);
        async move { l.try_write().await }
    }));
    let (taken, written) = tokio::join!(taken, written);
    for lease in taken.into_iter().chain(written) {
        let lease = lease.unwrap_or_else(|e| panic!("taken by a wait of the ended runtime: {e}"));
        assert!(lease.release().await.expect("release"));
    }
}
