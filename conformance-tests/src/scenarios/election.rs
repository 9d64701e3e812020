//! Leader election: one leader at a time, terms as fencing tokens, observers, hand-over.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{
    ELECTION_LOCK_PREFIX, Election, Fence, FencingToken, Leader, LockError, LockName, Ran,
};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::time::{Instant, sleep, timeout};

use super::{client, eventually, opts, unique};
use crate::deployment::Deployment;
use crate::harness::HolderProcess;

/// An election named `name` on a new, independent client.
async fn election(d: &dyn Deployment, name: &str) -> Election {
    client(d)
        .await
        .election(name)
        .expect("a valid election name on a backend with terms")
        .options(opts(d))
}

/// The lock an election queues on, to count what the server keeps for it.
fn queue_of(name: &str) -> LockName {
    LockName::new(format!("{ELECTION_LOCK_PREFIX}{name}")).expect("valid")
}

/// The next leader an observer reports, within `limit`.
async fn next_leader(
    seen: &mut BoxStream<'static, distlock_api::Result<Leader>>,
    limit: Duration,
) -> Leader {
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match timeout(left, seen.next()).await {
            Ok(Some(Ok(l))) => return l,
            // A failed read is reported and the stream goes on.
            Ok(Some(Err(e))) if e.is_retryable() => continue,
            Ok(other) => panic!("observer: {other:?}"),
            Err(_) => panic!("no leader reported within {limit:?}"),
        }
    }
}

/// Five candidates campaign three times each: never two leaders at once, every term above the
/// one before (checked by a fence, as the resource would), every campaign elected once.
pub async fn one_leader_at_a_time_with_increasing_terms(d: &dyn Deployment) {
    let name = unique("election-contention");
    let leading = Arc::new(AtomicUsize::new(0));
    let elected = Arc::new(AtomicUsize::new(0));
    let fence = Arc::new(Fence::new());
    let mut tasks = Vec::new();
    for id in 0..5 {
        let e = election(d, &name).await;
        let (leading, elected, fence) = (leading.clone(), elected.clone(), fence.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..3 {
                let l = e
                    .campaign_for(&format!("candidate-{id}-{round}"), Duration::from_secs(60))
                    .await
                    .expect("elected");
                assert_eq!(
                    leading.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two leaders at once"
                );
                fence
                    .check(l.term())
                    .expect("a term not above the previous leader's");
                sleep(Duration::from_millis(10)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                elected.fetch_add(1, Ordering::SeqCst);
                assert!(
                    l.resign().await.expect("resign"),
                    "resigned a leadership not held"
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("candidate");
    }
    assert_eq!(elected.load(Ordering::SeqCst), 15);
    assert!(
        eventually(Duration::from_secs(5), || async {
            d.artifacts(&queue_of(&name)).await == 0
        })
        .await,
        "candidates left behind after every leader resigned"
    );
}

/// Two observers on their own clients: the first report is the leader already in place; then
/// each leader and each proclaimed value, in order, the same on both, and the same as the
/// leader read on demand. Terms strictly increase; no term is reported with two values it did
/// not proclaim in that order.
pub async fn observers_agree_on_every_leader_in_order(d: &dyn Deployment) {
    let name = unique("election-observe");
    let e = election(d, &name).await;
    assert_eq!(e.leader().await.expect("leader read"), None);
    let first = e.campaign("first").await.expect("elected");
    let limit = d.ttl() * 2 + Duration::from_secs(5);
    let mut watchers = Vec::new();
    for _ in 0..2 {
        watchers.push(election(d, &name).await.observe());
    }
    let mut expected = vec![Leader {
        term: first.term(),
        value: "first".into(),
    }];
    let mut seen = vec![Vec::new(), Vec::new()];
    for (w, s) in watchers.iter_mut().zip(&mut seen) {
        s.push(next_leader(w, limit).await);
    }
    let mut current = first;
    current.proclaim("first, moved").await.expect("proclaim");
    expected.push(Leader {
        term: current.term(),
        value: "first, moved".into(),
    });
    for (w, s) in watchers.iter_mut().zip(&mut seen) {
        s.push(next_leader(w, limit).await);
    }
    for round in 0..2 {
        let next = election(d, &name).await;
        let value = format!("successor-{round}");
        let v = value.clone();
        let waiting = tokio::spawn(async move { next.campaign(&v).await });
        // The successor queues behind the leader; resigning hands over.
        sleep(Duration::from_millis(100)).await;
        assert!(current.resign().await.expect("resign"));
        current = waiting.await.expect("task").expect("elected");
        expected.push(Leader {
            term: current.term(),
            value,
        });
        for (w, s) in watchers.iter_mut().zip(&mut seen) {
            s.push(next_leader(w, limit).await);
        }
        assert_eq!(
            e.leader().await.expect("leader read").as_ref(),
            expected.last(),
            "the leader read on demand"
        );
    }
    assert_eq!(seen[0], expected, "what the first observer reported");
    assert_eq!(seen[1], expected, "what the second observer reported");
    assert!(expected.windows(2).all(|w| w[0].term <= w[1].term));
    assert!(current.resign().await.expect("resign"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            e.leader().await.ok() == Some(None)
        })
        .await,
        "a leader still read after the last one resigned"
    );
}

/// A leader resigns with a candidate waiting: the candidate is elected, and an observer hears of
/// it, within a few round trips, far from the TTL.
pub async fn a_resigned_leader_hands_over_promptly(d: &dyn Deployment) {
    let name = unique("election-resign");
    let leader = election(d, &name)
        .await
        .campaign("a")
        .await
        .expect("elected");
    let mut observer = election(d, &name).await.observe();
    assert_eq!(
        next_leader(&mut observer, d.ttl() * 2).await.term,
        leader.term()
    );
    let candidate = election(d, &name).await;
    let waiting = tokio::spawn(async move {
        let l = candidate.campaign("b").await;
        (l, Instant::now())
    });
    sleep(Duration::from_millis(200)).await;
    let resigned = Instant::now();
    assert!(leader.resign().await.expect("resign"));
    let (next, elected_at) = waiting.await.expect("task");
    let next = next.expect("elected");
    let heard = next_leader(&mut observer, d.ttl() * 2).await;
    let heard_at = Instant::now();
    let bound = Duration::from_secs(1).min(d.ttl() / 2);
    assert!(
        elected_at - resigned < bound,
        "elected {:?} after the resign (bound {bound:?})",
        elected_at - resigned
    );
    assert!(
        heard_at - resigned < bound * 2,
        "observer told {:?} after the resign",
        heard_at - resigned
    );
    assert_eq!(heard.term, next.term());
    assert!(next.resign().await.expect("resign"));
}

/// A leader process is killed (SIGKILL): a candidate waiting here is elected within the TTL (or
/// session timeout) and the backend's slack, with a term above the dead leader's.
pub async fn a_killed_leader_process_is_replaced(d: &dyn Deployment) {
    let name = unique("election-sigkill");
    let url = d.url().expect("gated on a reachable deployment");
    let queue = format!("{ELECTION_LOCK_PREFIX}{name}");
    let holder = tokio::task::block_in_place(|| {
        let h = HolderProcess::start(&url, &queue, d.ttl()).unwrap_or_else(|e| panic!("{e}"));
        let token = h
            .next_line("TOKEN ", Duration::from_secs(30))
            .expect("the leader process never reported its term");
        (h, token)
    });
    let (process, old) = holder;
    let candidate = election(d, &name).await;
    let killed = Instant::now();
    process.kill();
    let limit = d.ttl() + d.expiry_slack() + Duration::from_secs(1);
    let next = candidate
        .campaign_for("replacement", limit * 2)
        .await
        .expect("elected after the kill");
    assert!(
        killed.elapsed() <= limit,
        "replaced {:?} after the kill (TTL {:?})",
        killed.elapsed(),
        d.ttl()
    );
    if let Ok(old) = old.parse::<u64>() {
        assert!(
            next.term() > FencingToken(old),
            "term {} not above {old}",
            next.term()
        );
    }
    assert!(next.resign().await.expect("resign"));
}

/// The leader is cut off from the servers: its lost signal fires before a successor is elected,
/// the successor's term is higher, and the deposed leader's late write is refused by the fence
/// the resource keeps, while the successor's is accepted.
pub async fn a_cut_off_leader_is_told_first_and_fenced_off(d: &dyn Deployment) {
    let name = unique("election-cut");
    let (backend, cut) = d.cuttable_client().await;
    let leader = distlock_api::LockClient::new(backend)
        .election(&name)
        .expect("election")
        .options(opts(d))
        .campaign("old")
        .await
        .expect("elected");
    let fence = Fence::new();
    fence.check(leader.term()).expect("the leader writes");
    let told = Arc::new(Mutex::new(None));
    let t = told.clone();
    let signal = leader.lost_signal();
    let watcher = tokio::spawn(async move {
        signal.wait().await;
        *t.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    });
    cut.cut();
    let successor = election(d, &name)
        .await
        .campaign_for("new", d.ttl() * 4 + d.expiry_slack())
        .await
        .expect("a successor is elected");
    let elected_at = Instant::now();
    let told_at = told
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .expect("the cut-off leader was not told before its successor was elected");
    assert!(told_at <= elected_at);
    watcher.await.expect("watcher");
    assert!(successor.term() > leader.term());
    fence.check(successor.term()).expect("the successor writes");
    assert!(
        fence.check(leader.term()).is_err(),
        "the deposed leader's late write was accepted"
    );
    cut.restore();
    drop(leader);
    assert!(successor.resign().await.expect("resign"));
}

/// A candidate is reported as leader only once it knows it leads: a candidate cut off from the
/// servers when the leader ahead of it resigns holds the head of the queue, but cannot learn it,
/// so no observer may report it (the name has no announced leader until it learns, or until its
/// entry goes). Once it is cancelled and reconnected, the next candidate leads and is reported.
pub async fn a_candidate_is_reported_only_once_it_knows_it_leads(d: &dyn Deployment) {
    let name = unique("election-unaware");
    let queue = queue_of(&name);
    let leader = election(d, &name)
        .await
        .campaign("leader")
        .await
        .expect("elected");
    let (backend, cut) = d.cuttable_client().await;
    let unaware = {
        let e = distlock_api::LockClient::new(backend)
            .election(&name)
            .expect("election")
            .options(opts(d));
        tokio::spawn(async move { e.campaign("unaware").await })
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            d.artifacts(&queue).await == 2
        })
        .await,
        "the second candidate never queued"
    );
    cut.cut();
    let observer = election(d, &name).await;
    assert!(leader.resign().await.expect("resign"));
    // Watch for a while: long enough for any backend to show its head, far below any TTL.
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        if let Ok(Some(l)) = observer.leader().await {
            assert_ne!(
                l.value, "unaware",
                "a candidate that cannot know it leads was reported as leader (term {})",
                l.term
            );
        }
        sleep(Duration::from_millis(10)).await;
    }
    unaware.abort();
    drop(unaware.await);
    cut.restore();
    let next = election(d, &name)
        .await
        .campaign_for("next", d.ttl() * 4 + d.expiry_slack())
        .await
        .expect("the next candidate is elected");
    let now = observer.leader().await.expect("leader").map(|l| l.value);
    assert_eq!(now.as_deref(), Some("next"));
    assert!(next.resign().await.expect("resign"));
}

/// A campaign dropped while waiting, and one that times out, leave no candidate; the callback
/// form runs while leader, resigns when done, and a second replica's callback runs after it.
pub async fn cancelled_campaigns_leave_nothing_and_callbacks_hand_over(d: &dyn Deployment) {
    let name = unique("election-cancel");
    let queue = queue_of(&name);
    let leader = election(d, &name)
        .await
        .campaign("a")
        .await
        .expect("elected");
    let e = election(d, &name).await;
    assert!(
        timeout(Duration::from_millis(300), e.campaign("b"))
            .await
            .is_err(),
        "elected while the leader holds"
    );
    match e.campaign_for("c", Duration::from_millis(300)).await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            d.artifacts(&queue).await == 1
        })
        .await,
        "a cancelled or timed-out campaign left a candidate behind"
    );
    assert!(leader.resign().await.expect("resign"));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut replicas = Vec::new();
    for id in 0..2 {
        let e = election(d, &name).await;
        let ran = ran.clone();
        replicas.push(tokio::spawn(async move {
            e.lead(&format!("replica-{id}"), |held| async move {
                ran.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((id, true));
                sleep(Duration::from_millis(100)).await;
                ran.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((id, false));
                held.fencing_token()
            })
            .await
        }));
    }
    let mut terms = Vec::new();
    for r in replicas {
        match r.await.expect("replica").expect("elected") {
            Ran::Completed(term) => terms.push(term.expect("a term")),
            other => panic!("the callback did not complete: {other:?}"),
        }
    }
    assert_ne!(terms[0], terms[1]);
    let ran = ran.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(ran.len(), 4);
    assert!(
        ran[0].0 == ran[1].0 && ran[2].0 == ran[3].0 && ran[0].1 && !ran[1].1,
        "the callbacks overlapped: {ran:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            d.artifacts(&queue).await == 0
        })
        .await,
        "a callback's leadership was left behind"
    );
}

/// A candidate whose campaign is cancelled just as the leader resigns (so as it reaches the
/// head) is reported, if at all, only until its entry goes: the candidate behind it is elected
/// promptly, observers end on it with every term above the one before, and nothing of the
/// cancelled candidate stays (the guarantee the guide states for observers).
pub async fn a_candidate_cancelled_at_the_head_is_reported_only_until_it_goes(d: &dyn Deployment) {
    for round in 0..4 {
        let name = unique("election-cancel-head");
        let queue = queue_of(&name);
        let leader = election(d, &name)
            .await
            .campaign("leader")
            .await
            .expect("elected");
        let mut seen = election(d, &name).await.observe();
        assert_eq!(
            next_leader(&mut seen, Duration::from_secs(5)).await.value,
            "leader"
        );
        let cancelled = {
            let e = election(d, &name).await;
            tokio::spawn(async move { e.campaign("cancelled").await })
        };
        assert!(
            eventually(Duration::from_secs(5), || async {
                d.artifacts(&queue).await == 2
            })
            .await,
            "round {round}: the second candidate never queued"
        );
        let next = {
            let e = election(d, &name).await;
            tokio::spawn(async move { e.campaign("next").await })
        };
        assert!(
            eventually(Duration::from_secs(5), || async {
                d.artifacts(&queue).await == 3
            })
            .await,
            "round {round}: the third candidate never queued"
        );
        // The resign hands the head to the candidate being cancelled, a little later each round.
        let resign = tokio::spawn(leader.resign());
        sleep(Duration::from_millis(round * 2)).await;
        cancelled.abort();
        // A campaign that completed just before is a leadership the caller drops: it resigns.
        drop(cancelled.await);
        assert!(resign.await.expect("resign").expect("resign"));
        let next = timeout(Duration::from_secs(5), next)
            .await
            .unwrap_or_else(|_| panic!("round {round}: a cancelled candidate held the next back"))
            .expect("task")
            .expect("elected");
        let mut last = FencingToken(0);
        let mut values = Vec::new();
        loop {
            let l = next_leader(&mut seen, Duration::from_secs(5)).await;
            assert!(l.term > last, "round {round}: term {} after {last}", l.term);
            last = l.term;
            values.push(l.value.clone());
            if l.value == "next" {
                break;
            }
            assert_eq!(l.value, "cancelled", "round {round}: {values:?}");
        }
        assert_eq!(last, next.term(), "round {round}");
        assert!(
            eventually(Duration::from_secs(5), || async {
                d.artifacts(&queue).await == 1
            })
            .await,
            "round {round}: the cancelled candidate left its entry"
        );
        let now = election(d, &name).await.leader().await.expect("leader");
        assert_eq!(
            now.map(|l| l.value),
            Some("next".to_string()),
            "round {round}"
        );
        assert!(next.resign().await.expect("resign"));
    }
}
