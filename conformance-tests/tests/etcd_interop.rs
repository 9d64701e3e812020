//! Sharing one etcd lock with etcd's own recipe (`concurrency.Mutex`, as Go services and
//! `etcdctl lock` use it), with the real `etcdctl` from Debian's etcd-client: distlock's lock
//! `n` under URL prefix `p` is etcd's lock `p/n` when `n` is made of ASCII letters, digits and
//! `-_:@+=,` (the characters distlock's key encoding keeps). Both recipes queue on the create
//! revision of one key each under `p/n/`, so they exclude each other, wake each other and serve a
//! mixed queue in order; their fencing tokens are comparable when the Go side uses its key's
//! create revision (distlock's token), not `ETCD_LOCK_REV` (the store's revision when etcdctl
//! saw its grant, which orders differently). etcd's election recipe (`concurrency.Election`,
//! `etcdctl elect`) queues the same way, its proposal as its key's value: it shares distlock's
//! election `n`, etcd's election `p/election%2Fn`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient, LockError, LockName};
use distlock_conformance::deployments::etcd::options;
use distlock_conformance::harness::{EtcdCluster, PeerHolder, TempDir, require, shared_election};
use distlock_conformance::leftovers;
use distlock_etcd::{EtcdBackend, EtcdOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::{Instant, sleep, timeout};

const ETCDCTL: &str = "/usr/bin/etcdctl";

/// The URL prefix both sides share, and the lock name: etcd's lock `locks/job`.
const PREFIX: &str = "locks";
const NAME: &str = "job";

/// One `etcdctl lock locks/job` holder: once granted, its command prints its key's create
/// revision and holds until its done-file appears.
struct EtcdctlHolder {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    done: PathBuf,
}

impl EtcdctlHolder {
    fn spawn(cluster: &EtcdCluster, dir: &Path, n: usize) -> Self {
        let endpoints = cluster.endpoints().join(",");
        let done = dir.join(format!("done-{n}"));
        // The create revision of the holder's key, as a Go service reads it (`Get(m.Key())`).
        let script = format!(
            "etcdctl --endpoints={endpoints} get \"$ETCD_LOCK_KEY\" -w json; \
             echo \"$ETCD_LOCK_REV\"; \
             while [ ! -e {} ]; do sleep 0.01; done",
            done.display()
        );
        let mut child = tokio::process::Command::new(ETCDCTL)
            .args([
                &format!("--endpoints={endpoints}"),
                "lock",
                &format!("{PREFIX}/{NAME}"),
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        EtcdctlHolder { child, lines, done }
    }

    /// The create revision of its key once it holds, if it holds within `limit`.
    async fn granted_within(&mut self, limit: Duration) -> Option<u64> {
        let line = timeout(limit, self.lines.next_line()).await.ok()?;
        let line = line.expect("etcdctl output")?;
        let at = line.find("\"create_revision\":")? + "\"create_revision\":".len();
        let digits: String = line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Some(digits.parse().expect("a revision"))
    }

    /// The `ETCD_LOCK_REV` etcdctl gave its command (read after [`Self::granted_within`]).
    async fn lock_rev(&mut self) -> u64 {
        let line = timeout(Duration::from_secs(5), self.lines.next_line())
            .await
            .expect("ETCD_LOCK_REV in time")
            .expect("etcdctl output")
            .expect("a line");
        line.trim().parse().expect("a revision")
    }

    /// Lets its command end; returns when etcdctl (which unlocks after it) has exited.
    async fn release(mut self) {
        std::fs::write(&self.done, b"").expect("done file");
        let status = timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("etcdctl exits")
            .expect("wait");
        assert!(status.success(), "etcdctl lock failed: {status}");
    }
}

async fn start() -> (Arc<EtcdCluster>, LockClient, TempDir) {
    require(ETCDCTL, "etcd-client").unwrap_or_else(|e| panic!("{e}"));
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| EtcdCluster::start(1).expect("etcd"))
            .await
            .expect("start"),
    );
    (
        cluster.clone(),
        client(&cluster).await,
        TempDir::new("etcdctl").expect("dir"),
    )
}

async fn client(cluster: &EtcdCluster) -> LockClient {
    let o = EtcdOptions {
        prefix: PREFIX.into(),
        ..options()
    };
    LockClient::new(Arc::new(
        EtcdBackend::connect(&cluster.endpoints(), o)
            .await
            .expect("connect"),
    ))
}

fn opts() -> AcquireOptions {
    AcquireOptions::with_ttl(options().session_ttl)
}

/// How many keys (holders and waiters of both recipes) the lock has.
async fn entries(cluster: &EtcdCluster) -> usize {
    let name = LockName::new(NAME).expect("a valid name");
    leftovers::etcd_at(&cluster.endpoints(), PREFIX, &name).await
}

async fn until_entries(cluster: &EtcdCluster, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while entries(cluster).await != n {
        assert!(Instant::now() < until, "the queue never held {n} entries");
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_and_distlock_exclude_and_wake_each_other_with_tokens_in_grant_order() {
    let (cluster, locks, dir) = start().await;
    let mut tokens = Vec::new();
    // etcdctl holds: distlock is refused, then woken by etcdctl's unlock.
    let mut first = EtcdctlHolder::spawn(&cluster, dir.path(), 1);
    tokens.push(
        first
            .granted_within(Duration::from_secs(10))
            .await
            .expect("etcdctl holds"),
    );
    assert!(matches!(
        locks.try_acquire(NAME, &opts()).await,
        Err(LockError::Busy { .. })
    ));
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire(NAME, &opts(), Duration::from_secs(20)).await })
    };
    until_entries(&cluster, 2).await;
    assert!(
        !waiter.is_finished(),
        "distlock was granted while etcdctl held"
    );
    first.release().await;
    let released = Instant::now();
    let held = waiter.await.expect("task").expect("distlock is granted");
    let woken = released.elapsed();
    tokens.push(held.fencing_token().expect("etcd has tokens").get());
    // distlock holds: etcdctl waits, and is woken by distlock's release.
    let mut second = EtcdctlHolder::spawn(&cluster, dir.path(), 2);
    assert_eq!(
        second.granted_within(Duration::from_millis(500)).await,
        None,
        "etcdctl was granted while distlock held"
    );
    let released = Instant::now();
    assert!(held.release().await.expect("release"));
    tokens.push(
        second
            .granted_within(Duration::from_secs(10))
            .await
            .expect("etcdctl is granted after distlock's release"),
    );
    let etcdctl_woken = released.elapsed();
    second.release().await;
    // The waits end on the other's release, not on a session's expiry (10 s for etcdctl).
    assert!(
        woken < Duration::from_secs(5) && etcdctl_woken < Duration::from_secs(5),
        "woken after {woken:?} (distlock) and {etcdctl_woken:?} (etcdctl)"
    );
    eprintln!("woken: distlock after {woken:?}, etcdctl after {etcdctl_woken:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of grant order: {tokens:?}"
    );
    assert_eq!(entries(&cluster).await, 0);
}

/// distlock holds, etcdctl queues, distlock queues behind it: served in that order, tokens (create
/// revisions) rising; etcdctl's `ETCD_LOCK_REV` is above the later holder's token, which is why
/// the Go side must fence with its key's create revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_queue_is_served_in_arrival_order() {
    let (cluster, locks, dir) = start().await;
    let holder = locks.try_acquire(NAME, &opts()).await.expect("acquire");
    let mut queued = EtcdctlHolder::spawn(&cluster, dir.path(), 1);
    until_entries(&cluster, 2).await;
    let behind = {
        let locks = client(&cluster).await;
        tokio::spawn(async move { locks.acquire(NAME, &opts(), Duration::from_secs(20)).await })
    };
    until_entries(&cluster, 3).await;
    let first_token = holder.fencing_token().expect("token").get();
    assert!(holder.release().await.expect("release"));
    let etcdctl_token = queued
        .granted_within(Duration::from_secs(10))
        .await
        .expect("etcdctl, queued second, is granted next");
    // What etcdctl hands its command as a token is the store's revision when it saw its grant:
    // after the third's key was created, so above the token the third is granted later.
    let lock_rev = queued.lock_rev().await;
    sleep(Duration::from_millis(200)).await;
    assert!(
        !behind.is_finished(),
        "distlock, queued third, was granted while etcdctl held"
    );
    queued.release().await;
    let last = behind.await.expect("task").expect("granted last");
    let last_token = last.fencing_token().expect("token").get();
    assert!(first_token < etcdctl_token && etcdctl_token < last_token);
    assert!(
        lock_rev > last_token,
        "ETCD_LOCK_REV {lock_rev} was comparable with the next holder's token {last_token}"
    );
    assert!(last.release().await.expect("release"));
    drop(dir);
}

/// An `etcdctl elect <election> <proposal>` candidate (`$0` endpoints, `$1` election, `$2`
/// proposal): prints `held` once elected (etcdctl prints its key), and resigns (SIGINT) when its
/// stdin closes. etcdctl's output goes through a FIFO held open, so it is never cut off by a
/// closed pipe while it leads.
const ETCDCTL_ELECT: &str = r#"
f=$(mktemp -u) && mkfifo "$f" || exit 1
/usr/bin/etcdctl --endpoints="$0" elect "$1" "$2" > "$f" &
e=$!
exec 3< "$f"
read -r key <&3 || exit 1
echo held
cat > /dev/null
kill -INT "$e"
wait "$e"
rm -f "$f"
"#;

/// `etcdctl elect` shares distlock's election (see [`shared_election`]): one leader, each side
/// woken by the other's resignation, distlock's observers reading etcdctl's proposal as the
/// leader's value, terms (create revisions) increasing across both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_shares_the_election() {
    let (cluster, client, _dir) = start().await;
    let name = "etcd-leader";
    let election = format!(
        "{PREFIX}/{}",
        LockName::new(format!("election/{name}"))
            .expect("valid")
            .encoded()
    );
    let endpoints = cluster.endpoints().join(",");
    shared_election(&client, name, Duration::from_secs(10), |id| {
        let mut sh = tokio::process::Command::new("sh");
        sh.args(["-c", ETCDCTL_ELECT, &endpoints, &election, id]);
        PeerHolder::spawn(sh)
    })
    .await;
}
