//! Requests of the ZooKeeper backend, counted by the server (`mntr` packets): a repeat acquire on
//! an idle ensemble is granted on its create alone (the zxid gap proves the queue empty); a
//! hand-over to the next waiter in line costs the release's delete and nothing more, and so does
//! one to a waiter that queued two back (it watched two ahead meanwhile, and kept its watch on
//! the one ahead when the head went). A leader read whose
//! listed head went before its read reads the next node, with no listing again. That the
//! repeat grant never passes a holder in between is the scenario
//! `repeat_acquire_waits_for_a_holder_in_between`; that waiters keep their order when some give
//! up is the `waiting` scenarios'.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::harness::{ZkEnsemble, packets_received, watch_count};
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

/// One `mntr` figure of the node on `port`, read off the runtime's threads.
async fn mntr(port: u16, figure: fn(u16) -> Option<u64>) -> u64 {
    tokio::task::spawn_blocking(move || figure(port))
        .await
        .expect("mntr")
        .expect("the figure in mntr's answer")
}

async fn packets(port: u16) -> u64 {
    mntr(port, packets_received).await
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
    // A create and a delete per pair, and one for the closing `mntr` reading (the server
    // counts it as a packet too).
    assert!(
        sent <= 2 * PAIRS + 1,
        "{PAIRS} pairs took {sent} requests; a repeat acquire should be its create alone"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must still increase: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_to_the_next_in_line_is_the_release_alone() {
    let zk = ensemble().await;
    let port = zk.client_ports[0];
    let clients = [client(&zk).await, client(&zk).await];
    let mut holder = clients[0]
        .try_acquire("handover", &opts())
        .await
        .expect("acquire");
    const ROUNDS: u64 = 10;
    let mut sent = 0;
    for round in 0..ROUNDS {
        let settled = mntr(port, watch_count).await;
        let waiter = clients[(round as usize + 1) % 2].clone();
        let waiting = tokio::spawn(async move {
            waiter
                .acquire("handover", &opts(), Duration::from_secs(10))
                .await
        });
        // The waiter is settled once its watch on the holder's node is in.
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while mntr(port, watch_count).await <= settled {
            assert!(
                tokio::time::Instant::now() < until,
                "the waiter never watched"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let before = packets(port).await;
        let token = holder.fencing_token().expect("a fencing token");
        assert!(holder.release().await.expect("release"));
        holder = waiting.await.expect("join").expect("the waiter's grant");
        sent += packets(port).await - before;
        assert!(holder.fencing_token().expect("a fencing token") > token);
    }
    // Per hand-over the release's delete and the closing `mntr` reading (the server counts it
    // as a packet too); one spare for a ping of a session. A listing would be a third.
    assert!(
        sent <= 2 * ROUNDS + 1,
        "{ROUNDS} hand-overs took {sent} requests; the next in line should need no listing"
    );
}

/// Waits until the server counts no request but our own `mntr` readings: every waiter settled.
async fn quiet(port: u16) {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut last = packets(port).await;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = packets(port).await;
        if now - last <= 1 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the clients never settled"
        );
        last = now;
    }
}

/// A waiter's acquire running in the background.
type Waiting = tokio::task::JoinHandle<distlock::Result<distlock::Lease>>;

/// The first client takes `name`; the second queues behind it, then the third behind the
/// second, each settled before the next.
async fn queue_of_three(
    clients: &[LockClient; 3],
    name: &str,
    port: u16,
) -> (distlock::Lease, Waiting, Waiting) {
    let first = clients[0]
        .try_acquire(name, &opts())
        .await
        .expect("acquire");
    let mut waiting = Vec::new();
    for c in &clients[1..] {
        let (c, name) = (c.clone(), name.to_string());
        waiting.push(tokio::spawn(async move {
            c.acquire(&name, &opts(), Duration::from_secs(10)).await
        }));
        quiet(port).await;
    }
    let third = waiting.pop().expect("third");
    let second = waiting.pop().expect("second");
    (first, second, third)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_to_a_waiter_that_queued_two_back_needs_no_listing_either() {
    let zk = ensemble().await;
    let port = zk.client_ports[0];
    let clients = [client(&zk).await, client(&zk).await, client(&zk).await];
    const ROUNDS: u64 = 5;
    let mut sent = 0;
    for round in 0..ROUNDS {
        let name = format!("two-back-{round}");
        let (first, second, third) = queue_of_three(&clients, &name, port).await;
        assert!(first.release().await.expect("release"));
        let second = second.await.expect("join").expect("the second's grant");
        assert!(
            !third.is_finished(),
            "the third was granted beside the second"
        );
        quiet(port).await;
        let before = packets(port).await;
        assert!(second.release().await.expect("release"));
        let third = third.await.expect("join").expect("the third's grant");
        sent += packets(port).await - before;
        assert!(third.release().await.expect("release"));
    }
    // Per hand-over the release's delete and the closing `mntr` reading; one spare for a ping
    // of a session. The third learned of the first's delete (it watches two ahead) while the
    // second held, so its own turn needs no listing, which would be a third request.
    assert!(
        sent <= 2 * ROUNDS + 1,
        "{ROUNDS} hand-overs took {sent} requests; a waiter two back should need no listing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_two_back_keeps_its_watch_on_the_one_ahead_when_the_head_goes() {
    let zk = ensemble().await;
    let port = zk.client_ports[0];
    let clients = [client(&zk).await, client(&zk).await, client(&zk).await];
    const ROUNDS: u64 = 5;
    let mut sent = 0;
    for round in 0..ROUNDS {
        let name = format!("kept-{round}");
        let (first, second, third) = queue_of_three(&clients, &name, port).await;
        let before = packets(port).await;
        assert!(first.release().await.expect("release"));
        let second = second.await.expect("join").expect("the second's grant");
        // Time for the third to act on the head's delete, which it watched.
        tokio::time::sleep(Duration::from_millis(300)).await;
        sent += packets(port).await - before;
        assert!(
            !third.is_finished(),
            "the third was granted beside the second"
        );
        // The watch it kept on the second still brings its turn.
        assert!(second.release().await.expect("release"));
        let third = third.await.expect("join").expect("the third's grant");
        assert!(third.release().await.expect("release"));
    }
    // Per round the release's delete and the closing `mntr` reading; two spare for sessions'
    // pings. Dropping and making again its watch on the second would be two more per round
    // (the client asks the server to remove a watch dropped before it fired).
    assert!(
        sent <= 2 * ROUNDS + 2,
        "{ROUNDS} heads' releases took {sent} requests; the waiter two back should keep its watch"
    );
}

/// Candidates hand leadership over every ~30 ms while an observer 20 ms (round trip) away polls
/// `leader()`: the head it listed is often deleted before its read, three reads in a row too.
/// It reads the next node instead of saying "nobody leads". What it may say is "nobody leads yet"
/// in the round trip between a grant and the new leader's announcement (a candidate is reported
/// only once it knows it leads), a window of one local round trip per hand-over, so the bound
/// is 2 % of the reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_read_during_hand_overs_reads_the_next_head() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use distlock_conformance::harness::LatencyLink;

    let zk = ensemble().await;
    let name = "hand-overs";
    let stop = Arc::new(AtomicBool::new(false));
    let mut candidates = Vec::new();
    for i in 0..4 {
        let election = client(&zk).await.election(name).expect("election");
        let stop = stop.clone();
        candidates.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let leading = election.campaign(&format!("c{i}")).await.expect("campaign");
                tokio::time::sleep(Duration::from_millis(30)).await;
                leading.resign().await.expect("resign");
            }
        }));
    }
    let upstream = zk.connect_string().parse().expect("a host:port");
    let link = LatencyLink::start(upstream, Duration::from_millis(10)).expect("link");
    let backend = ZkBackend::connect(&link.addr().to_string(), ZkOptions::default())
        .await
        .expect("connect through the link");
    let observer = LockClient::new(Arc::new(backend))
        .election(name)
        .expect("election");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mut led, mut nobody) = (0, 0);
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        match observer.leader().await.expect("leader") {
            Some(_) => led += 1,
            None => nobody += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in candidates {
        c.await.expect("candidate");
    }
    assert!(led > 10, "only {led} reads");
    assert!(
        nobody * 50 <= led,
        "{nobody} of {} reads said nobody leads while candidates queued",
        led + nobody
    );
}
