//! A lock holder of another language's recipe (kazoo, Curator, redis-py), in a process of its
//! own: it prints `held` once granted and releases when its stdin closes.

use std::process::Stdio;
use std::time::Duration;

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
