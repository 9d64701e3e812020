//! The contract, proven on the in-memory reference backend in simulated time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::memory::{MemoryBackend, MemoryStore};
use distlock_api::{
    AcquireOptions, Admission, Capabilities, Fencing, FencingToken, Grant, GrantKey, Guarantee,
    Leader, LockBackend, LockClient, LockError, LockName, LockStatus, LostReason, Owner, Renewal,
};
use futures_util::stream::BoxStream;
use tokio::time::{Instant, advance, sleep, sleep_until};

const TTL: Duration = Duration::from_secs(3);

/// A memory client that counts renewals and can pretend to be an efficiency-only backend.
#[derive(Debug)]
struct Probe {
    inner: MemoryBackend,
    renewals: AtomicUsize,
    batches: AtomicUsize,
    caps: Capabilities,
}

impl Probe {
    fn new(inner: MemoryBackend) -> Arc<Self> {
        let caps = inner.capabilities().clone();
        Arc::new(Probe {
            inner,
            renewals: AtomicUsize::new(0),
            batches: AtomicUsize::new(0),
            caps,
        })
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LockBackend for Probe {
    fn kind(&self) -> &'static str {
        "probe"
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    fn lease_ttl(&self, requested: Duration) -> Duration {
        self.inner.lease_ttl(requested)
    }
    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> distlock_api::Result<Grant> {
        self.inner.try_acquire(name, ttl).await
    }
    async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        deadline: Instant,
    ) -> distlock_api::Result<Grant> {
        self.inner.acquire(name, ttl, deadline).await
    }
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> distlock_api::Result<Renewal> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(key, ttl).await
    }
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        _deadline: Instant,
    ) -> Vec<distlock_api::Result<Renewal>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        let mut out = Vec::new();
        for (key, ttl) in batch {
            out.push(self.renew(key, *ttl).await);
        }
        out
    }
    async fn release(&self, key: &GrantKey) -> distlock_api::Result<bool> {
        self.inner.release(key).await
    }
    async fn abandon(&self, key: &GrantKey) {
        self.inner.abandon(key).await
    }
    async fn reconnect(&self) -> distlock_api::Result<Arc<dyn LockBackend>> {
        self.inner.reconnect().await
    }
    async fn inspect(&self, name: &LockName) -> distlock_api::Result<LockStatus> {
        self.inner.inspect(name).await
    }
    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> distlock_api::Result<Grant> {
        self.inner
            .acquire_admitted(name, admission, ttl, deadline)
            .await
    }
    async fn announce(
        &self,
        key: &GrantKey,
        token: FencingToken,
        value: &str,
    ) -> distlock_api::Result<bool> {
        self.inner.announce(key, token, value).await
    }
    async fn leader(&self, name: &LockName) -> distlock_api::Result<Option<Leader>> {
        self.inner.leader(name).await
    }
    async fn leader_changes(
        &self,
        name: &LockName,
    ) -> distlock_api::Result<BoxStream<'static, ()>> {
        self.inner.leader_changes(name).await
    }
}

fn pair() -> (MemoryStore, LockClient, LockClient, MemoryBackend) {
    let store = MemoryStore::new();
    let a = store.client();
    let b = store.client();
    (
        store,
        LockClient::new(Arc::new(a.clone())),
        LockClient::new(Arc::new(b)),
        a,
    )
}

fn name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

#[tokio::test(start_paused = true)]
async fn lease_carries_name_token_and_local_validity() {
    let (_, a, _, _) = pair();
    let sent = Instant::now();
    let lease = a
        .try_acquire("job", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    assert_eq!(lease.name().as_str(), "job");
    assert!(lease.fencing_token().is_some());
    assert_eq!(lease.backend(), "memory");
    // Measured from the send time, minus 1 % + 2 ms of drift and 10 % of lead.
    let drift = TTL.mul_f64(0.01) + Duration::from_millis(2);
    let lead = TTL / 10;
    assert_eq!(lease.valid_until(), sent + TTL - drift - lead);
    advance(Duration::from_millis(500)).await;
    assert!(lease.remaining() <= TTL - drift - lead - Duration::from_millis(500));
    assert!(lease.remaining() > Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn dyn_backend_and_correctness_refusal() {
    let probe = Probe::new(MemoryBackend::default());
    let mut caps = probe.caps.clone();
    caps.guarantee = Guarantee::Efficiency;
    caps.fencing = Fencing::PerNameWhileServerKeepsData;
    let weak: Arc<dyn LockBackend> = Arc::new(Probe {
        inner: MemoryBackend::default(),
        renewals: AtomicUsize::new(0),
        batches: AtomicUsize::new(0),
        caps,
    });
    let client = LockClient::new(weak);
    let opts = AcquireOptions::with_ttl(TTL).guarantee(Guarantee::Correctness);
    match client.try_acquire("pay", &opts).await {
        Err(LockError::Unsupported { backend, what }) => {
            assert_eq!(backend, "probe");
            assert!(what.contains("correctness"), "{what}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    // The same call site on an efficiency lock works, and the strong backend grants correctness.
    client
        .try_acquire("pay", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    let strong = LockClient::new(probe);
    let lease = strong.try_acquire("pay", &opts).await.unwrap();
    assert_eq!(lease.guarantee(), Guarantee::Correctness);
    assert!(lease.fencing_token().is_some());
}

#[tokio::test(start_paused = true)]
async fn watchdog_keeps_the_lease_across_five_ttls() {
    let (_, a, b, _) = pair();
    let lease = a
        .try_acquire("w", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    let until = Instant::now() + TTL * 5;
    while Instant::now() < until {
        assert!(matches!(
            b.try_acquire("w", &AcquireOptions::with_ttl(TTL)).await,
            Err(LockError::Busy { .. })
        ));
        sleep(Duration::from_millis(250)).await;
    }
    assert!(lease.lost_reason().is_none());
    assert!(lease.remaining() > TTL / 2);
    assert!(lease.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn one_batched_renewal_per_tick_for_leases_taken_together() {
    let store = MemoryStore::new();
    let probe = Probe::new(store.client());
    let client = LockClient::new(probe.clone());
    let opts = AcquireOptions::with_ttl(TTL);
    let mut leases = Vec::new();
    for i in 0..100 {
        leases.push(client.try_acquire(&format!("b{i}"), &opts).await.unwrap());
        sleep(Duration::from_millis(2)).await; // spread over 200 ms, less than half a period
    }
    // Four ticks of TTL / 3 each.
    sleep(TTL * 4 / 3 + Duration::from_millis(50)).await;
    assert_eq!(probe.batches.load(Ordering::SeqCst), 4);
    assert_eq!(probe.renewals.load(Ordering::SeqCst), 400);
    assert!(leases.iter().all(|l| l.lost_reason().is_none()));
    // A released lease leaves the batch at once.
    leases.pop().unwrap().release().await.unwrap();
    sleep(TTL / 3).await;
    assert_eq!(probe.renewals.load(Ordering::SeqCst), 499);
}

#[tokio::test(start_paused = true)]
async fn leases_taken_over_a_whole_period_settle_on_one_batch_per_period() {
    let store = MemoryStore::new();
    let probe = Probe::new(store.client());
    let client = LockClient::new(probe.clone());
    let opts = AcquireOptions::with_ttl(TTL);
    let mut leases = Vec::new();
    for i in 0..10 {
        leases.push(client.try_acquire(&format!("s{i}"), &opts).await.unwrap());
        sleep(TTL / 30).await; // spread over 90 % of a period (TTL / 3)
    }
    // The first period may take more than one call; after it, one call per period for all ten.
    sleep(TTL * 2 / 3).await;
    let settled = probe.batches.load(Ordering::SeqCst);
    sleep(TTL).await;
    assert_eq!(probe.batches.load(Ordering::SeqCst) - settled, 3);
    assert!(leases.iter().all(|l| l.lost_reason().is_none()));
}

#[tokio::test(start_paused = true)]
async fn lost_signal_fires_before_a_competitor_can_acquire() {
    let (_, a, b, a_raw) = pair();
    let lease = a
        .try_acquire("cut", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    let signal = lease.lost_signal();
    let lost_at = Arc::new(Mutex::new(None));
    let l2 = lost_at.clone();
    tokio::spawn(async move {
        let reason = signal.wait().await;
        *l2.lock().unwrap() = Some((Instant::now(), reason));
    });
    sleep(Duration::from_millis(100)).await;
    a_raw.set_reachable(false);
    let competitor = loop {
        match b.try_acquire("cut", &AcquireOptions::with_ttl(TTL)).await {
            Ok(l) => break l,
            Err(LockError::Busy { .. }) => sleep(Duration::from_millis(5)).await,
            Err(e) => panic!("{e}"),
        }
    };
    let won_at = Instant::now();
    let (fired_at, reason) = lost_at.lock().unwrap().expect("lost signal fired");
    assert_eq!(reason, LostReason::RenewalFailed);
    assert!(
        fired_at < won_at,
        "lost at {fired_at:?}, competitor at {won_at:?}"
    );
    assert!(lease.remaining().is_zero());
    assert!(competitor.fencing_token() > lease.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn refused_renewal_fires_lost_at_once() {
    let (store, a, _, _) = pair();
    let lease = a
        .try_acquire("r", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .unwrap();
    // The lock expires server-side; a manual renewal is refused and does not re-create it.
    advance(TTL + Duration::from_millis(1)).await;
    match lease.renew(TTL).await {
        Err(LockError::Lost { reason, .. }) => {
            assert!(matches!(
                reason,
                LostReason::Expired | LostReason::RenewalRefused
            ))
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(
        store.artifacts(&name("r")),
        0,
        "renew must never re-create the lock"
    );
    assert!(lease.lost_reason().is_some());
}

#[tokio::test(start_paused = true)]
async fn fixed_lease_expires_locally_before_the_store() {
    let (store, a, _, _) = pair();
    let lease = a
        .try_acquire("f", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .unwrap();
    let acquired = Instant::now();
    let reason = lease.lost().await;
    assert_eq!(reason, LostReason::Expired);
    // The local deadline came first, a lead before the store's expiry. The holder still has its
    // lease: the lock is not released behind its back, and the store frees it at its TTL.
    assert!(Instant::now() + TTL / 20 < acquired + TTL);
    sleep(Duration::from_millis(10)).await;
    assert_eq!(store.artifacts(&name("f")), 1, "released during the lead");
    sleep_until(acquired + TTL + Duration::from_millis(10)).await;
    assert_eq!(store.artifacts(&name("f")), 0);
}

#[tokio::test(start_paused = true)]
async fn manual_renew_extends_the_deadline() {
    let (_, a, _, _) = pair();
    let lease = a
        .try_acquire("m", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .unwrap();
    advance(Duration::from_secs(2)).await;
    lease.renew(Duration::from_secs(10)).await.unwrap();
    assert!(lease.remaining() > Duration::from_millis(8_800));
    advance(Duration::from_secs(5)).await;
    assert!(lease.lost_reason().is_none());
}

#[tokio::test(start_paused = true)]
async fn renewing_to_a_shorter_ttl_shortens_the_lease_and_the_watchdog_follows() {
    let (store, a, b, _) = pair();
    let long = Duration::from_secs(10);
    let short = Duration::from_millis(300);
    // Fixed: the validity becomes the shorter one, and the holder is told before B gets it.
    let fixed = a
        .try_acquire("short-fixed", &AcquireOptions::with_ttl(long).fixed())
        .await
        .unwrap();
    fixed.renew(short).await.unwrap();
    assert!(fixed.remaining() <= short, "{:?}", fixed.remaining());
    assert_eq!(fixed.ttl(), short);
    let won = loop {
        match b
            .try_acquire("short-fixed", &AcquireOptions::with_ttl(long))
            .await
        {
            Ok(l) => break l,
            Err(LockError::Busy { .. }) => sleep(Duration::from_millis(5)).await,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(fixed.lost_reason(), Some(LostReason::Expired));
    drop(won);
    // Watchdog: it renews on the shorter TTL's schedule from now on, so the lease holds.
    let kept = a
        .try_acquire("short-kept", &AcquireOptions::with_ttl(long))
        .await
        .unwrap();
    kept.renew(short).await.unwrap();
    for _ in 0..20 {
        sleep(short / 2).await;
        assert!(kept.lost_reason().is_none());
        assert!(matches!(
            b.try_acquire("short-kept", &AcquireOptions::with_ttl(long))
                .await,
            Err(LockError::Busy { .. })
        ));
    }
    assert_eq!(store.artifacts(&name("short-kept")), 1);
    // A period that does not fit the new TTL is refused before any I/O.
    let every = a
        .try_acquire(
            "short-every",
            &AcquireOptions::with_ttl(long).renew_every(Duration::from_secs(2)),
        )
        .await
        .unwrap();
    match every.renew(short).await {
        Err(LockError::InvalidConfig { key, .. }) => assert_eq!(key, "renew_every"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn a_resumed_holder_sees_its_loss_before_the_watchdog_runs() {
    // The lease's runtime stops running tasks once `block_on` returns, as a process stopped by
    // SIGSTOP runs none: its watchdog never gets to fire the signal.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let lease = rt.block_on(async {
        let (_, a, _, _) = pair();
        let opts = AcquireOptions::with_ttl(Duration::from_millis(200)).fixed();
        a.try_acquire("paused", &opts).await.unwrap()
    });
    let signal = lease.lost_signal();
    assert_eq!(lease.lost_reason(), None);
    std::thread::sleep(Duration::from_millis(250));
    // Resumed: the very next read says lost, whether or not the watchdog ran.
    assert_eq!(lease.lost_reason(), Some(LostReason::Expired));
    assert_eq!(signal.get(), Some(LostReason::Expired));
    assert!(lease.remaining().is_zero());
    drop(lease);
}

#[tokio::test(start_paused = true)]
async fn no_renewal_after_release() {
    let probe = Probe::new(MemoryBackend::default());
    let client = LockClient::new(probe.clone());
    let lease = client
        .try_acquire("n", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    sleep(TTL * 2).await;
    let before = probe.renewals.load(Ordering::SeqCst);
    assert!(before >= 5, "watchdog renewed {before} times in 2 TTLs");
    assert!(lease.release().await.unwrap());
    sleep(TTL * 10).await;
    assert_eq!(probe.renewals.load(Ordering::SeqCst), before);
    assert_eq!(probe.inner.store().artifacts(&name("n")), 0);
}

#[tokio::test(start_paused = true)]
async fn release_after_expiry_leaves_the_next_holder_alone() {
    let (store, a, b, _) = pair();
    let old = a
        .try_acquire("x", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .unwrap();
    advance(TTL * 2).await;
    let new = b
        .try_acquire("x", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    assert!(
        !old.release().await.unwrap(),
        "release after expiry reports not held"
    );
    assert_eq!(store.holder_token(&name("x")), new.fencing_token());
    assert!(matches!(
        a.try_acquire("x", &AcquireOptions::with_ttl(TTL)).await,
        Err(LockError::Busy { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn tokens_strictly_increase_across_handovers_and_expiry() {
    let (_, a, b, _) = pair();
    let mut last = None;
    for i in 0..60 {
        let client = if i % 2 == 0 { &a } else { &b };
        let opts = AcquireOptions::with_ttl(TTL).fixed();
        let lease = client.acquire("t", &opts, TTL * 3).await.unwrap();
        let token = lease.fencing_token();
        assert!(token > last, "{token:?} after {last:?}");
        last = token;
        match i % 3 {
            0 => assert!(lease.release().await.unwrap()),
            1 => drop(lease),
            _ => {
                // Expire without release; the next acquire waits for the TTL.
                std::mem::forget(lease);
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_are_granted_in_arrival_order_by_notification() {
    let store = MemoryStore::new();
    let holder = LockClient::new(Arc::new(store.client()));
    let lease = holder
        .try_acquire("q", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let c = LockClient::new(Arc::new(store.client()));
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let l = c
                .acquire("q", &AcquireOptions::with_ttl(TTL), Duration::from_secs(60))
                .await
                .unwrap();
            order.lock().unwrap().push((i, Instant::now()));
            l.release().await.unwrap();
        }));
        // Each waiter is queued before the next one starts.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
    }
    assert_eq!(store.artifacts(&name("q")), 11);
    sleep(Duration::from_millis(50)).await;
    let released_at = Instant::now();
    lease.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    let ids: Vec<_> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
    // Woken by the release itself, not a poll tick: no simulated time passed.
    assert_eq!(order[0].1, released_at);
}

#[tokio::test(start_paused = true)]
async fn reentrant_owner_keeps_token_and_counts_holds() {
    let (_, a, b, _) = pair();
    let owner = Owner::new();
    let opts = AcquireOptions::with_ttl(TTL).owner(&owner);
    let outer = a.try_acquire("re", &opts).await.unwrap();
    let inner = a.acquire("re", &opts, Duration::ZERO).await.unwrap();
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert_eq!(outer.hold_count(), 2);
    assert!(inner.release().await.unwrap());
    assert_eq!(outer.hold_count(), 1);
    assert!(matches!(
        b.try_acquire("re", &AcquireOptions::with_ttl(TTL)).await,
        Err(LockError::Busy { .. })
    ));
    // Without the owner, the same client is a different owner and is refused.
    assert!(matches!(
        a.try_acquire("re", &AcquireOptions::with_ttl(TTL)).await,
        Err(LockError::Busy { .. })
    ));
    assert!(outer.release().await.unwrap());
    b.try_acquire("re", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropped_acquire_future_leaves_nothing() {
    let (store, a, b, _) = pair();
    let lease = a
        .try_acquire("d", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    // Dropped while queued.
    let r = tokio::time::timeout(
        Duration::from_millis(100),
        b.acquire("d", &AcquireOptions::with_ttl(TTL), TTL * 10),
    )
    .await;
    assert!(r.is_err());
    assert_eq!(store.artifacts(&name("d")), 1);
    // Dropped right after the store handed it the lock, before it ran again.
    let b2 = b.clone();
    let waiter = tokio::spawn(async move {
        b2.acquire("d", &AcquireOptions::with_ttl(TTL), TTL * 10)
            .await
    });
    tokio::task::yield_now().await;
    assert_eq!(store.artifacts(&name("d")), 2);
    lease.release().await.unwrap();
    waiter.abort();
    let _ = waiter.await;
    tokio::task::yield_now().await;
    assert_eq!(
        store.artifacts(&name("d")),
        0,
        "nothing held, nothing queued"
    );
}

#[tokio::test(start_paused = true)]
async fn timeout_is_typed_and_leaves_no_waiter() {
    let (store, a, b, _) = pair();
    let _held = a
        .try_acquire("to", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    let start = Instant::now();
    match b
        .acquire(
            "to",
            &AcquireOptions::with_ttl(TTL),
            Duration::from_millis(500),
        )
        .await
    {
        Err(LockError::Timeout { name, waited }) => {
            assert_eq!(name, "to");
            assert_eq!(waited, Duration::from_millis(500));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(Instant::now() - start, Duration::from_millis(500));
    assert_eq!(store.artifacts(&name("to")), 1);
}

#[tokio::test(start_paused = true)]
async fn waiter_gets_the_lock_when_the_holder_expires() {
    let (_, a, b, _) = pair();
    let old = a
        .try_acquire("e", &AcquireOptions::with_ttl(TTL).fixed())
        .await
        .unwrap();
    let start = Instant::now();
    let new = b
        .acquire("e", &AcquireOptions::with_ttl(TTL), TTL * 2)
        .await
        .unwrap();
    // A fixed lease is lost at its validity deadline (drift and lead before the store's expiry),
    // but its holder still has it: the waiter is granted at the store's TTL, not during the lead.
    let waited = Instant::now() - start;
    assert!(
        waited >= TTL && waited < TTL + Duration::from_millis(100),
        "{waited:?}"
    );
    assert_eq!(old.lost_reason(), Some(LostReason::Expired));
    assert!(new.fencing_token() > old.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn dropped_lease_is_released_in_the_background() {
    let (store, a, b, _) = pair();
    let lease = a
        .try_acquire("bg", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    drop(lease);
    tokio::task::yield_now().await;
    assert_eq!(store.artifacts(&name("bg")), 0);
    b.try_acquire("bg", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
}

/// A lease still in scope as its runtime ends (the end of `#[tokio::main]`): the runtime drops
/// the drop's background release unrun (a current-thread one never polls it), and the release
/// runs on a new client before the runtime's drop returns, on either kind of runtime.
#[test]
fn a_lease_dropped_as_its_runtime_ends_is_released() {
    let store = MemoryStore::new();
    let long = AcquireOptions::with_ttl(Duration::from_secs(3600));
    for threads in [false, true] {
        let rt = if threads {
            tokio::runtime::Builder::new_multi_thread()
        } else {
            tokio::runtime::Builder::new_current_thread()
        }
        .enable_all()
        .build()
        .unwrap();
        rt.block_on(async {
            let holder = LockClient::new(Arc::new(store.client()));
            let _lease = holder.try_acquire("exit", &long).await.unwrap();
        });
        drop(rt);
        assert_eq!(
            store.artifacts(&name("exit")),
            0,
            "held after its runtime ended (threads: {threads})"
        );
    }
}

/// A client whose new clients are counted (each new one is the same client again).
#[derive(Clone)]
struct Reconnects(Arc<AtomicUsize>);

impl distlock_api::Reconnect for Reconnects {
    fn identity(&self) -> std::sync::Weak<dyn std::any::Any + Send + Sync> {
        Arc::downgrade(&self.0) as std::sync::Weak<AtomicUsize>
    }

    async fn reconnected(&self) -> distlock_api::Result<Self> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(self.clone())
    }
}

/// A backend's clean-up spawned with a last chance: done on the runtime, its fallback never
/// runs; left unrun as the runtime ends, or spawned with no runtime at all, the fallback has
/// run by the time the drop (or the spawn) returns, on one new client for all of a client's
/// fallbacks.
#[test]
fn a_clean_up_runs_once_on_its_runtime_or_else_on_its_fallback() {
    let count = |c: &Arc<AtomicUsize>| c.load(Ordering::SeqCst);
    let spawn = |client: &Reconnects, now: &Arc<AtomicUsize>, fallback: &Arc<AtomicUsize>| {
        let (now, fallback) = (now.clone(), fallback.clone());
        distlock_api::LastChance::spawn(
            async move {
                now.fetch_add(1, Ordering::SeqCst);
            },
            client.clone(),
            move |_| async move {
                fallback.fetch_add(1, Ordering::SeqCst);
                true
            },
        );
    };
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let new = || {
        let c = Reconnects(Arc::new(AtomicUsize::new(0)));
        (
            c,
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        )
    };
    // Run on its runtime.
    let (client, now, fallback) = new();
    let done = rt();
    done.block_on(async {
        spawn(&client, &now, &fallback);
        tokio::task::yield_now().await;
    });
    drop(done);
    assert_eq!((count(&now), count(&fallback), count(&client.0)), (1, 0, 0));
    // Left unrun as its runtime ends: three of them, on one new client.
    let (client, now, fallback) = new();
    let ending = rt();
    ending.block_on(async { (0..3).for_each(|_| spawn(&client, &now, &fallback)) });
    drop(ending);
    assert_eq!((count(&now), count(&fallback), count(&client.0)), (0, 3, 1));
    // No runtime.
    let (client, now, fallback) = new();
    spawn(&client, &now, &fallback);
    assert_eq!((count(&now), count(&fallback), count(&client.0)), (0, 1, 1));
}

/// Two runtimes ending on two threads 1 s apart, each with a clean-up left to its fallback:
/// the second's gets a window of its own (2 s from its end), not what the first's had left.
#[test]
fn a_runtime_ending_after_another_has_a_window_of_its_own() {
    let end_with = |takes: Duration, done: Arc<AtomicUsize>| {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                distlock_api::LastChance::spawn(
                    std::future::pending::<()>(),
                    Reconnects(Arc::new(AtomicUsize::new(0))),
                    move |_| async move {
                        tokio::time::sleep(takes).await;
                        done.fetch_add(1, Ordering::SeqCst);
                        true
                    },
                );
            });
            drop(rt);
        })
    };
    let (first, second) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = end_with(Duration::from_millis(500), first.clone());
    std::thread::sleep(Duration::from_secs(1));
    let b = end_with(Duration::from_millis(1500), second.clone());
    a.join().unwrap();
    b.join().unwrap();
    assert_eq!(first.load(Ordering::SeqCst), 1);
    assert_eq!(
        second.load(Ordering::SeqCst),
        1,
        "the second runtime's clean-up was cut short by the first's window"
    );
}

#[tokio::test(start_paused = true)]
async fn invalid_names_and_options_are_rejected_before_io() {
    let (_, a, _, a_raw) = pair();
    a_raw.set_reachable(false);
    for bad in ["", "nul\0inside", "new\nline"] {
        match a.try_acquire(bad, &AcquireOptions::with_ttl(TTL)).await {
            Err(LockError::InvalidName { name, .. }) => assert_eq!(name, bad),
            other => panic!("{bad:?}: expected InvalidName, got {other:?}"),
        }
    }
    let long = "x".repeat(2000);
    let err = a
        .try_acquire(&long, &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap_err();
    // The error carries the whole name; its message quotes the start and says the size.
    assert!(matches!(&err, LockError::InvalidName { name, .. } if *name == long));
    assert!(err.to_string().contains("(2000 bytes)"), "{err}");
    assert!(err.to_string().len() < 300);
    match a
        .try_acquire("ok", &AcquireOptions::with_ttl(Duration::ZERO))
        .await
    {
        Err(LockError::InvalidConfig { key, .. }) => assert_eq!(key, "ttl"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    // A valid call does reach the (cut) backend: a retryable backend error.
    let err = a
        .try_acquire("ok", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn secrets_stay_out_of_debug_output() {
    let (_, a, _, _) = pair();
    let lease = a
        .try_acquire("s", &AcquireOptions::with_ttl(TTL))
        .await
        .unwrap();
    let dbg = format!("{lease:?}");
    assert!(dbg.contains("\"s\""), "{dbg}");
    assert!(!dbg.to_lowercase().contains("secret"), "{dbg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_contention_real_time() {
    let store = MemoryStore::new();
    let counter = Arc::new(Mutex::new(0u64));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let c = LockClient::new(Arc::new(store.client()));
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                let l = c
                    .acquire(
                        "mx",
                        &AcquireOptions::with_ttl(TTL),
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
                let v = *counter.lock().unwrap();
                tokio::task::yield_now().await;
                *counter.lock().unwrap() = v + 1;
                l.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*counter.lock().unwrap(), 1600);
}

/// A memory client whose grants live on one shared "session" (as etcd leases and ZooKeeper
/// sessions do): its loss must reach every lease on it, and no released one.
#[derive(Debug)]
struct OnSession {
    inner: MemoryBackend,
    session: distlock_api::LostTrigger,
}

#[async_trait]
impl LockBackend for OnSession {
    fn kind(&self) -> &'static str {
        "on-session"
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> distlock_api::Result<Grant> {
        let mut grant = self.inner.try_acquire(name, ttl).await?;
        grant.session = Some(self.session.subscribe());
        Ok(grant)
    }
    async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        deadline: Instant,
    ) -> distlock_api::Result<Grant> {
        let mut grant = self.inner.acquire(name, ttl, deadline).await?;
        grant.session = Some(self.session.subscribe());
        Ok(grant)
    }
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> distlock_api::Result<Renewal> {
        self.inner.renew(key, ttl).await
    }
    async fn release(&self, key: &GrantKey) -> distlock_api::Result<bool> {
        self.inner.release(key).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_session_loss_reaches_every_lease_on_it_and_no_released_one() {
    let (session, _) = distlock_api::lost_signal();
    let backend = Arc::new(OnSession {
        inner: MemoryBackend::default(),
        session,
    });
    let c = LockClient::new(backend.clone());
    let opts = AcquireOptions::with_ttl(TTL);
    let released = c.try_acquire("s0", &opts).await.unwrap();
    let signal_of_released = released.lost_signal();
    assert!(released.release().await.unwrap());
    let held: Vec<_> = [
        c.try_acquire("s1", &opts).await.unwrap(),
        c.try_acquire("s2", &opts).await.unwrap(),
        c.try_acquire("s3", &opts).await.unwrap(),
    ]
    .into();
    sleep(Duration::from_millis(10)).await;
    assert!(held.iter().all(|l| l.lost_reason().is_none()));
    backend.session.fire(LostReason::SessionLost);
    for lease in &held {
        assert_eq!(
            tokio::time::timeout(Duration::from_millis(100), lease.lost()).await,
            Ok(LostReason::SessionLost)
        );
    }
    assert_eq!(
        signal_of_released.get(),
        None,
        "a released lease was told lost"
    );
    // A lease taken on a session that is already lost is told at once.
    let late = c.try_acquire("s4", &opts).await.unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_millis(100), late.lost()).await,
        Ok(LostReason::SessionLost)
    );
}

/// A timeout past the clock's range is a wait without limit, never a panic: for a lock, a
/// semaphore's permit, a read-write lock's writer and a campaign.
#[tokio::test]
async fn a_timeout_past_the_clocks_range_waits_without_limit() {
    let (_, a, _, _) = pair();
    let opts = AcquireOptions::with_ttl(TTL);
    let lease = a.acquire("huge", &opts, Duration::MAX).await.expect("lock");
    assert!(lease.release().await.expect("release"));
    let permit = a.semaphore("huge", 2).expect("semaphore");
    let permit = permit.acquire(Duration::MAX).await.expect("permit");
    assert!(permit.release().await.expect("release"));
    let write = a.rwlock("huge").expect("rwlock");
    let write = write.write(Duration::MAX).await.expect("write");
    assert!(write.release().await.expect("release"));
    let leading = a
        .election("huge")
        .expect("election")
        .campaign_for("v", Duration::MAX)
        .await
        .expect("campaign");
    assert!(leading.resign().await.expect("resign"));
}
