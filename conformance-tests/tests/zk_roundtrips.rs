//! Requests of the ZooKeeper backend, counted by the server (`mntr` packets): a repeat acquire on
//! an idle ensemble is granted on its create alone (the zxid gap proves the queue empty). That it
//! never passes a holder in between is the scenario `repeat_acquire_waits_for_a_holder_in_between`.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::harness::{ZkEnsemble, packets_received};
use distlock_zk::{ZkBackend, ZkOptions};

async fn ensemble() -> ZkEnsemble {
    tokio::task::spawn_blocking(|| ZkEnsemble::start(1).expect("zookeeper"))
        .await
        .expect("start")
}

async fn client(zk: &ZkEnsemble) -> LockClient {
    let backend = ZkBackend::connect(&zk.connect_string(), ZkOptions::default())
        .await
        .expect("connect");
    LockClient::new(Arc::new(backend))
}

async fn packets(port: u16) -> u64 {
    tokio::task::spawn_blocking(move || packets_received(port))
        .await
        .expect("mntr")
        .expect("a packet count")
}

/// A fixed lease: no watchdog renewal runs between the counts.
fn opts() -> AcquireOptions {
    AcquireOptions::with_ttl(Duration::from_secs(30)).fixed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_acquire_on_an_idle_ensemble_is_its_create_alone() {
    let zk = ensemble().await;
    let locks = client(&zk).await;
    // The first pair creates the directory and reads the queue; the second learns the gap.
    for _ in 0..2 {
        let lease = locks.try_acquire("repeat", &opts()).await.expect("acquire");
        assert!(lease.release().await.expect("release"));
    }
    const PAIRS: u64 = 20;
    let before = packets(zk.client_ports[0]).await;
    let mut tokens = Vec::new();
    for _ in 0..PAIRS {
        let lease = locks.try_acquire("repeat", &opts()).await.expect("acquire");
        tokens.push(lease.fencing_token().expect("a fencing token"));
        assert!(lease.release().await.expect("release"));
    }
    let sent = packets(zk.client_ports[0]).await - before;
    // A create and a delete per pair; one spare for a ping of the session (the mntr
    // connection itself is not a packet of a session).
    assert!(
        sent <= 2 * PAIRS + 1,
        "{PAIRS} pairs took {sent} requests; a repeat acquire should be its create alone"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must still increase: {tokens:?}"
    );
}
