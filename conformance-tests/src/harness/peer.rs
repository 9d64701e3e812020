//! A lock holder of another language's recipe (kazoo, Curator, redis-py), in a process of its
//! own: it prints `held` once granted and releases when its stdin closes.

use std::process::Stdio;
use std::time::Duration;

use distlock_api::{AcquireOptions, ELECTION_LOCK_PREFIX, LockClient};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::timeout;

/// A running peer holder, killed on drop.
pub struct PeerHolder {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PeerHolder {
    /// Runs `command` (stdin and stdout piped, stderr discarded).
    ///
    /// # Panics
    /// When it cannot start: the test's set-up is broken.
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        PeerHolder { child, lines }
    }

    /// Whether it holds within `limit`.
    pub async fn holds_within(&mut self, limit: Duration) -> bool {
        matches!(
            timeout(limit, self.lines.next_line()).await,
            Ok(Ok(Some(line))) if line == "held"
        )
    }

    /// Releases (its stdin closes) and waits for it to end successfully.
    ///
    /// # Panics
    /// When it fails or does not end within 20 s.
    pub async fn release(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.shutdown().await;
        }
        let status = timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("the peer ends")
            .expect("the peer's status");
        assert!(status.success(), "the peer holder failed: {status}");
    }
}

/// One election shared with another recipe's, as the test drives it: distlock leads and the
/// peer waits; distlock resigns and the peer leads, which distlock's observers see with the
/// peer's participant id as the value; a distlock candidate waits for the peer and leads once it
/// resigns, with a later term. `peer` starts the other recipe's participant `id`.
///
/// # Panics
/// When any of that does not happen: the test fails.
pub async fn shared_election(
    client: &LockClient,
    name: &str,
    soon: Duration,
    peer: impl FnOnce(&str) -> PeerHolder,
) {
    let opts = AcquireOptions::with_ttl(Duration::from_secs(4));
    let election = client.election(name).expect("election").options(opts);
    let queue = format!("{ELECTION_LOCK_PREFIX}{name}");
    let waiters = async |n: usize| {
        for _ in 0..600 {
            if client.inspect(&queue).await.expect("inspect").waiters == n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    let ours = election.campaign("rust-1").await.expect("leads");
    let mut theirs = peer("peer-1");
    assert!(waiters(1).await, "the peer never queued");
    assert!(
        !theirs.holds_within(Duration::from_millis(500)).await,
        "the peer led beside distlock"
    );
    let first_term = ours.term();
    assert!(ours.resign().await.expect("resign"));
    assert!(theirs.holds_within(soon).await, "the peer never led");
    let leader = election.leader().await.expect("leader").expect("a leader");
    assert_eq!(leader.value, "peer-1");
    assert!(leader.term > first_term);

    let e = election.clone();
    let next = tokio::spawn(async move { e.campaign_for("rust-2", Duration::from_secs(60)).await });
    assert!(waiters(1).await, "distlock's candidate never queued");
    theirs.release().await;
    let next = timeout(Duration::from_secs(10), next)
        .await
        .expect("distlock woken by the peer's resignation")
        .expect("task")
        .expect("leads");
    assert!(next.term() > leader.term);
    let now = election.leader().await.expect("leader").expect("a leader");
    assert_eq!((now.value.as_str(), now.term), ("rust-2", next.term()));
    assert!(next.resign().await.expect("resign"));
}
