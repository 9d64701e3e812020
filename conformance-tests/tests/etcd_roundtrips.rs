//! Requests of the etcd backend, counted by the server (its metrics): a repeat acquire on an idle
//! cluster is its put alone (the revision gap proves the queue empty), with no range read; a
//! release is one compare-and-delete txn on the key's value. That
//! it never passes a holder in between is the scenario `repeat_acquire_waits_for_a_holder_in_between`.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::deployments::etcd::{deploy, options};
use distlock_conformance::harness::metric_sum;
use distlock_etcd::EtcdBackend;

async fn client(endpoints: &[String]) -> LockClient {
    let backend = EtcdBackend::connect(endpoints, options())
        .await
        .expect("connect");
    LockClient::new(Arc::new(backend))
}

/// Range reads (inside txns too, a compare's read of its key included) and txns the member has
/// served so far.
async fn counts(port: u16) -> (f64, f64) {
    tokio::task::spawn_blocking(move || {
        let ranges = metric_sum(port, &[("etcd_mvcc_range_total", "")]);
        let txns = metric_sum(
            port,
            &[("grpc_server_handled_total", "grpc_method=\"Txn\"")],
        );
        ranges.zip(txns)
    })
    .await
    .expect("metrics")
    .expect("the member's metrics")
}

/// A fixed lease: no watchdog renewal runs between the counts.
fn opts() -> AcquireOptions {
    AcquireOptions::with_ttl(Duration::from_secs(30)).fixed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_acquire_on_an_idle_cluster_reads_no_queue() {
    let d = deploy("etcd", 1, false).await;
    let locks = client(&d.cluster.endpoints()).await;
    // The first pair reads the queue in its txn; the second can use the repeat grant.
    for _ in 0..2 {
        let lease = locks.try_acquire("repeat", &opts()).await.expect("acquire");
        assert!(lease.release().await.expect("release"));
    }
    const PAIRS: u32 = 20;
    let port = d.cluster.metrics_ports[0];
    let (ranges, txns) = counts(port).await;
    let mut tokens = Vec::new();
    for _ in 0..PAIRS {
        let lease = locks.try_acquire("repeat", &opts()).await.expect("acquire");
        tokens.push(lease.fencing_token().expect("a fencing token"));
        assert!(lease.release().await.expect("release"));
    }
    let (ranges_after, txns_after) = counts(port).await;
    assert_eq!(
        txns_after - txns,
        f64::from(2 * PAIRS),
        "one enqueue txn per acquire, one compare-and-delete txn per release"
    );
    // Each txn's compare reads its key; the queue read would be one more range per acquire.
    assert_eq!(
        ranges_after - ranges,
        f64::from(2 * PAIRS),
        "a repeat acquire on an idle cluster should read no range beyond its compare"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must still increase: {tokens:?}"
    );
}
