//! The metrics a scripted sequence of acquires, renewals, a loss and releases records, read from
//! a recorder installed for this test binary alone.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::memory::MemoryStore;
use distlock_api::metrics::{ACQUIRE_DURATION, HELD_DURATION, LEASES_HELD, LEASES_LOST, RENEWALS};
use distlock_api::{AcquireOptions, LockClient, LockError, LockName, LostReason};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

type Snapshot = Vec<(CompositeKey, DebugValue)>;

/// The value of `name` with every label of `labels`, summed over the other labels' values:
/// (counter, gauge, histogram samples).
fn read(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> (u64, f64, usize) {
    let (mut count, mut gauge, mut samples) = (0, 0.0, 0);
    for (key, value) in snapshot {
        let key = key.key();
        let matches = key.name() == name
            && labels
                .iter()
                .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v));
        if matches {
            match value {
                DebugValue::Counter(c) => count += c,
                DebugValue::Gauge(g) => gauge += g.into_inner(),
                DebugValue::Histogram(h) => samples += h.len(),
            }
        }
    }
    (count, gauge, samples)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_scripted_sequence_records_what_happened() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let store = MemoryStore::new();
    let a = LockClient::new(Arc::new(store.client()));
    let b = LockClient::new(Arc::new(store.client()));
    let opts = AcquireOptions::with_ttl(Duration::from_secs(3));

    let lost = a.try_acquire("m/lost", &opts).await.expect("granted");
    assert!(matches!(
        b.try_acquire("m/lost", &opts).await,
        Err(LockError::Busy { .. })
    ));
    assert!(matches!(
        b.acquire("m/lost", &opts, Duration::from_millis(100)).await,
        Err(LockError::Timeout { .. })
    ));
    let kept = b.try_acquire("m/kept", &opts).await.expect("granted");
    // Two renewal ticks for each of the two leases (every TTL / 3).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(store.evict(&LockName::new("m/lost").expect("name")));
    assert_eq!(lost.lost().await, LostReason::RenewalRefused);
    let released = a.try_acquire("m/released", &opts).await.expect("granted");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(released.release().await.expect("release"));
    // One snapshot: reading drains histograms.
    let snapshot: Snapshot = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();

    let acquires = |outcome, mode| {
        read(
            &snapshot,
            ACQUIRE_DURATION,
            &[("backend", "memory"), ("outcome", outcome), ("mode", mode)],
        )
        .2
    };
    assert_eq!(acquires("granted", "try"), 3);
    assert_eq!(acquires("busy", "try"), 1);
    assert_eq!(acquires("timeout", "wait"), 1);
    let renewals = |outcome| read(&snapshot, RENEWALS, &[("outcome", outcome)]).0;
    assert!(renewals("renewed") >= 4, "renewed {}", renewals("renewed"));
    assert_eq!(renewals("refused"), 1);
    assert_eq!(
        read(&snapshot, LEASES_LOST, &[("reason", "renewal_refused")]).0,
        1
    );
    // `kept` is still held; the lost and the released one ended.
    assert_eq!(
        read(&snapshot, LEASES_HELD, &[("backend", "memory")]).1,
        1.0
    );
    assert_eq!(
        read(&snapshot, HELD_DURATION, &[("grade", "efficiency")]).2,
        2
    );
    drop(kept);
}
