//! Sharing a ZooKeeper path with another language's lock recipe, with the real peers from
//! Debian. kazoo's `Lock` (python3-kazoo) names its nodes `<id>__lock__<seq>` and counts only
//! such nodes as contenders: it never sees distlock's nodes, so the two cannot share a queue.
//! distlock refuses, with a typed error naming the node, to queue where a node of a layout it
//! does not know is: never a silent skip that would let both hold.

use std::process::Stdio;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient, LockError};
use distlock_conformance::deployments::zk::options;
use distlock_conformance::harness::{ZkEnsemble, require};
use distlock_zk::ZkBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::timeout;

const PYTHON: &str = "/usr/bin/python3";

/// A kazoo `Lock` holder on `path`: prints `held` once granted, releases when its stdin closes.
const KAZOO_HOLDER: &str = r#"
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1])
zk.start()
lock = zk.Lock(sys.argv[2], "kazoo")
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
zk.stop()
"#;

/// The root every client here uses (kazoo's lock path is `<root>/<name>`).
const NAME: &str = "kazoo-job";

/// One kazoo `Lock` holder of `NAME`.
struct KazooHolder {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl KazooHolder {
    fn spawn(zk: &ZkEnsemble) -> Self {
        let path = format!("{}/{NAME}", options().root);
        let mut child = tokio::process::Command::new(PYTHON)
            .args(["-c", KAZOO_HOLDER, &zk.connect_string(), &path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 with kazoo");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        KazooHolder { child, lines }
    }

    /// Whether it holds within `limit`.
    async fn holds_within(&mut self, limit: Duration) -> bool {
        matches!(
            timeout(limit, self.lines.next_line()).await,
            Ok(Ok(Some(line))) if line == "held"
        )
    }

    /// Releases (its stdin closes) and waits for it to end.
    async fn release(mut self) {
        let stdin = self.child.stdin.take();
        if let Some(mut s) = stdin {
            let _ = s.shutdown().await;
        }
        let status = timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("kazoo ends")
            .expect("kazoo status");
        assert!(status.success(), "kazoo holder failed: {status}");
    }
}

fn refused(got: Result<distlock::Lease, LockError>) -> String {
    match got {
        Err(LockError::ForeignEntry { name, entry }) => {
            assert_eq!(name, NAME);
            entry
        }
        other => panic!("expected a typed refusal, got {other:?}"),
    }
}

/// kazoo holds `NAME`: distlock's try and wait are refused with `ForeignEntry` naming kazoo's
/// node, leave nothing of theirs behind, and once kazoo released, distlock takes the lock. (Not
/// the other way round: kazoo does not see distlock's nodes, which is why distlock refuses.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_lock_on_the_path_is_refused_by_name_and_leaves_nothing() {
    require(PYTHON, "python3").expect("python3");
    let kazoo_installed = std::process::Command::new(PYTHON)
        .args(["-c", "import kazoo"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(kazoo_installed, "python3-kazoo is not installed");
    let zk = ZkEnsemble::start(1).expect("zookeeper");
    let backend = ZkBackend::connect(&zk.connect_string(), options())
        .await
        .expect("connect");
    let client = LockClient::new(std::sync::Arc::new(backend));
    let opts = AcquireOptions::with_ttl(Duration::from_secs(4));

    let mut kazoo = KazooHolder::spawn(&zk);
    assert!(
        kazoo.holds_within(Duration::from_secs(20)).await,
        "kazoo never held"
    );
    let node = refused(client.try_acquire(NAME, &opts).await);
    assert!(node.contains("__lock__"), "{node}");
    let node = refused(client.acquire(NAME, &opts, Duration::from_secs(2)).await);
    assert!(node.contains("__lock__"), "{node}");
    let name = distlock::LockName::new(NAME).expect("valid");
    assert_eq!(
        distlock_conformance::leftovers::zk_at(&zk.connect_string(), &options().root, &name).await,
        1,
        "only kazoo's node stays"
    );
    // `status` names it too, rather than calling the name free.
    assert!(matches!(
        client.inspect(NAME).await,
        Err(LockError::ForeignEntry { .. })
    ));

    kazoo.release().await;
    let lease = client
        .acquire(NAME, &opts, Duration::from_secs(10))
        .await
        .expect("free once kazoo released");
    assert!(lease.release().await.expect("release"));
}
