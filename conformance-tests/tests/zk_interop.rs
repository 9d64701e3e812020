//! Sharing a ZooKeeper path with another language's lock recipe, with the real peers from
//! Debian. kazoo's `Lock` (python3-kazoo) names its nodes `<id>__lock__<seq>` and counts only
//! such nodes as contenders: it never sees distlock's default (Curator) nodes, so distlock
//! refuses, with a typed error naming the node, to queue where a node of a layout it does not
//! know is: never a silent skip that would let both hold. With `layout=kazoo` distlock names its
//! nodes as kazoo does, and the two share one queue: exclusion and wake-ups both ways, a mixed
//! queue served in arrival order, readers shared with kazoo's `ReadLock`. Curator's
//! `InterProcessMutex` (libcurator-recipes-java, run by a JDK's single-file launcher) names its
//! nodes as distlock's default layout does, and shares the queue the same way.

use std::time::Duration;

use distlock::{AcquireOptions, ELECTION_LOCK_PREFIX, LockClient, LockError};
use distlock_conformance::deployments::zk::options;
use distlock_conformance::harness::{PeerHolder, ZkEnsemble, require, shared_election};
use distlock_zk::{Layout, ZkBackend, ZkOptions};
use tokio::time::timeout;

const PYTHON: &str = "/usr/bin/python3";

/// A kazoo holder on `path` (`argv[3]`: `Lock`, `ReadLock` or `WriteLock`): prints `held` once
/// granted, releases when its stdin closes.
const KAZOO_HOLDER: &str = r#"
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1])
zk.start()
lock = getattr(zk, sys.argv[3])(sys.argv[2], "kazoo")
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
zk.stop()
"#;

/// The root every client here uses (kazoo's lock path is `<root>/<name>`).
const NAME: &str = "kazoo-job";

/// kazoo's `recipe` (`Lock`, `ReadLock`, `WriteLock`) on distlock's lock `name`.
fn kazoo(zk: &ZkEnsemble, name: &str, recipe: &str) -> PeerHolder {
    let name = distlock::LockName::new(name).expect("valid");
    let path = distlock_zk::paths::lock_dir(&options().root, &name);
    let mut python = tokio::process::Command::new(PYTHON);
    python.args(["-c", KAZOO_HOLDER, &zk.connect_string(), &path, recipe]);
    PeerHolder::spawn(python)
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
    let zk = zookeeper_and_kazoo();
    let backend = ZkBackend::connect(&zk.connect_string(), options())
        .await
        .expect("connect");
    let client = LockClient::new(std::sync::Arc::new(backend));
    let opts = AcquireOptions::with_ttl(Duration::from_secs(4));

    let mut kazoo = kazoo(&zk, NAME, "Lock");
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

fn zookeeper_and_kazoo() -> ZkEnsemble {
    require(PYTHON, "python3").expect("python3");
    let kazoo_installed = std::process::Command::new(PYTHON)
        .args(["-c", "import kazoo"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(kazoo_installed, "python3-kazoo is not installed");
    ZkEnsemble::start(1).expect("zookeeper")
}

/// On `layout=kazoo`, distlock and kazoo share one queue: each waits for the other and is woken
/// by its release; a mixed queue (kazoo, distlock, kazoo) is served in arrival order; a distlock
/// reader and kazoo's `ReadLock` hold together while kazoo's `WriteLock` waits for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_kazoo_layout_distlock_and_kazoo_share_one_queue() {
    let zk = zookeeper_and_kazoo();
    let connect = || async {
        let o = ZkOptions {
            layout: Layout::Kazoo,
            ..options()
        };
        let backend = ZkBackend::connect(&zk.connect_string(), o)
            .await
            .expect("connect");
        LockClient::new(std::sync::Arc::new(backend))
    };
    let client = connect().await;
    let opts = AcquireOptions::with_ttl(Duration::from_secs(4));
    let name = "kazoo-shared";
    let waiters = async |n: usize| {
        for _ in 0..200 {
            if client.inspect(name).await.expect("inspect").waiters == n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };

    // distlock holds, kazoo waits, and is woken by distlock's release.
    let ours = client.try_acquire(name, &opts).await.expect("free");
    let mut k1 = kazoo(&zk, name, "Lock");
    assert!(
        !k1.holds_within(Duration::from_secs(1)).await,
        "kazoo held beside distlock"
    );
    assert!(ours.release().await.expect("release"));
    assert!(
        k1.holds_within(Duration::from_secs(5)).await,
        "kazoo not woken"
    );

    // kazoo holds; distlock queues, then another kazoo: served in that order.
    let c = connect().await;
    let o = opts.clone();
    let d1 = tokio::spawn(async move { c.acquire(name, &o, Duration::from_secs(20)).await });
    assert!(waiters(1).await, "distlock's waiter never queued");
    let mut k2 = kazoo(&zk, name, "Lock");
    assert!(waiters(2).await, "kazoo's waiter never queued");
    k1.release().await;
    let d1 = timeout(Duration::from_secs(5), d1)
        .await
        .expect("distlock woken by kazoo's release")
        .expect("task")
        .expect("granted");
    assert!(
        !k2.holds_within(Duration::from_millis(500)).await,
        "kazoo jumped the queue"
    );
    assert!(d1.release().await.expect("release"));
    assert!(
        k2.holds_within(Duration::from_secs(5)).await,
        "kazoo not woken in turn"
    );
    k2.release().await;

    // Readers share across the two; kazoo's writer waits for both.
    let rw = client.rwlock(name).expect("rwlock").options(opts.clone());
    let read = rw.try_read().await.expect("read");
    let queue = format!("{}{name}", distlock::RWLOCK_LOCK_PREFIX);
    let mut kr = kazoo(&zk, &queue, "ReadLock");
    assert!(
        kr.holds_within(Duration::from_secs(5)).await,
        "kazoo's reader not admitted beside ours"
    );
    let mut kw = kazoo(&zk, &queue, "WriteLock");
    assert!(
        !kw.holds_within(Duration::from_secs(1)).await,
        "kazoo's writer beside readers"
    );
    assert!(read.release().await.expect("release"));
    assert!(
        !kw.holds_within(Duration::from_millis(500)).await,
        "kazoo's writer beside kazoo's reader"
    );
    kr.release().await;
    assert!(
        kw.holds_within(Duration::from_secs(5)).await,
        "kazoo's writer not woken"
    );
    kw.release().await;
    let name = distlock::LockName::new(name).expect("valid");
    assert_eq!(
        distlock_conformance::leftovers::zk_at(&zk.connect_string(), &options().root, &name).await,
        0
    );
}

/// A Curator holder on `args[1]`, by recipe (`args[2]`): `mutex` (`InterProcessMutex`),
/// `selector` (`LeaderSelector`, leading while its stdin is open) or `latch` (`LeaderLatch`),
/// the last two with participant id `args[3]`. Prints `held` once granted (leading), releases
/// when its stdin closes.
const CURATOR_HOLDER: &str = r#"
import java.util.concurrent.CountDownLatch;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorHolder {
    static void held() throws Exception {
        System.out.println("held");
        System.out.flush();
        while (System.in.read() >= 0) {}
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.newClient(args[0], new RetryNTimes(3, 100));
        c.start();
        if (args[2].equals("mutex")) {
            InterProcessMutex m = new InterProcessMutex(c, args[1]);
            m.acquire();
            held();
            m.release();
        } else if (args[2].equals("selector")) {
            CountDownLatch done = new CountDownLatch(1);
            LeaderSelector s = new LeaderSelector(c, args[1], new LeaderSelectorListenerAdapter() {
                public void takeLeadership(CuratorFramework f) throws Exception {
                    held();
                    done.countDown();
                }
            });
            s.setId(args[3]);
            s.start();
            done.await();
            s.close();
        } else {
            LeaderLatch l = new LeaderLatch(c, args[1], args[3]);
            l.start();
            System.out.println("started");
            System.out.flush();
            while (System.in.read() >= 0) {}
            l.close();
        }
        c.close();
    }
}
"#;

/// Debian's Curator, ZooKeeper client and what they need.
const CURATOR_JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
];

/// A Curator `InterProcessMutex` on distlock's lock `name` (same handling as kazoo's).
fn curator(zk: &ZkEnsemble, dir: &std::path::Path, name: &str) -> PeerHolder {
    curator_recipe(zk, dir, name, "mutex", "")
}

/// Curator's `recipe` (see [`CURATOR_HOLDER`]) on distlock's lock `name`, as participant `id`.
fn curator_recipe(
    zk: &ZkEnsemble,
    dir: &std::path::Path,
    name: &str,
    recipe: &str,
    id: &str,
) -> PeerHolder {
    let source = dir.join("CuratorHolder.java");
    std::fs::write(&source, CURATOR_HOLDER).expect("java source");
    let classpath: Vec<String> = CURATOR_JARS
        .iter()
        .map(|j| format!("/usr/share/java/{j}.jar"))
        .collect();
    let name = distlock::LockName::new(name).expect("valid");
    let path = distlock_zk::paths::lock_dir(&options().root, &name);
    let mut java = tokio::process::Command::new(JAVA);
    java.arg("-cp").arg(classpath.join(":")).arg(&source).args([
        &zk.connect_string(),
        &path,
        recipe,
        id,
    ]);
    PeerHolder::spawn(java)
}

const JAVA: &str = "/usr/bin/java";

fn zookeeper_and_curator() -> ZkEnsemble {
    for jar in CURATOR_JARS {
        require(
            &format!("/usr/share/java/{jar}.jar"),
            "libcurator-recipes-java",
        )
        .expect("jar");
    }
    require(JAVA, "default-jdk-headless").expect("java");
    ZkEnsemble::start(1).expect("zookeeper")
}

/// On the default layout, distlock and Curator's `InterProcessMutex` share one queue: Curator
/// waits for distlock and is woken by its release; a Curator, distlock, Curator queue is served
/// in that order, each woken by the other's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_distlock_share_one_queue() {
    let zk = zookeeper_and_curator();
    let dir = distlock_conformance::harness::TempDir::new("curator").expect("dir");
    let connect = || async {
        let backend = ZkBackend::connect(&zk.connect_string(), options())
            .await
            .expect("connect");
        LockClient::new(std::sync::Arc::new(backend))
    };
    let client = connect().await;
    let opts = AcquireOptions::with_ttl(Duration::from_secs(4));
    let name = "curator-shared";
    let waiters = async |n: usize| {
        for _ in 0..400 {
            if client.inspect(name).await.expect("inspect").waiters == n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    // A JVM starts slowly: generous limits where something must happen.
    let soon = Duration::from_secs(30);

    let ours = client.try_acquire(name, &opts).await.expect("free");
    let mut c1 = curator(&zk, dir.path(), name);
    assert!(waiters(1).await, "Curator's waiter never queued");
    assert!(
        !c1.holds_within(Duration::from_millis(500)).await,
        "Curator held beside distlock"
    );
    assert!(ours.release().await.expect("release"));
    assert!(c1.holds_within(soon).await, "Curator not woken");

    let c = connect().await;
    let o = opts.clone();
    let d1 = tokio::spawn(async move { c.acquire(name, &o, Duration::from_secs(60)).await });
    assert!(waiters(1).await, "distlock's waiter never queued");
    let mut c2 = curator(&zk, dir.path(), name);
    assert!(waiters(2).await, "the second Curator waiter never queued");
    c1.release().await;
    let d1 = timeout(Duration::from_secs(5), d1)
        .await
        .expect("distlock woken by Curator's release")
        .expect("task")
        .expect("granted");
    assert!(
        !c2.holds_within(Duration::from_millis(500)).await,
        "Curator jumped the queue"
    );
    assert!(d1.release().await.expect("release"));
    assert!(c2.holds_within(soon).await, "Curator not woken in turn");
    c2.release().await;
    let name = distlock::LockName::new(name).expect("valid");
    assert_eq!(
        distlock_conformance::leftovers::zk_at(&zk.connect_string(), &options().root, &name).await,
        0
    );
}

/// A kazoo `Election` on `argv[2]` as participant `argv[3]`: prints `held` while it leads, and
/// resigns when its stdin closes.
const KAZOO_LEADER: &str = r#"
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1])
zk.start()
def lead():
    print("held", flush=True)
    sys.stdin.read()
zk.Election(sys.argv[2], sys.argv[3]).run(lead)
zk.stop()
"#;

/// The queue of distlock's election `name` (the lock `election/<name>`): where another recipe's
/// election on the same path queues.
fn election_path(name: &str) -> String {
    let lock = distlock::LockName::new(format!("{ELECTION_LOCK_PREFIX}{name}")).expect("valid");
    distlock_zk::paths::lock_dir(&options().root, &lock)
}

/// Curator's `LeaderSelector` queues as `InterProcessMutex` does, its participant id as the
/// node's data: it shares distlock's election on the default layout (see [`shared_election`]).
/// Curator's `LeaderLatch` names its nodes `latch-`, which distlock cannot order against its
/// own: a campaign beside one is refused with `ForeignEntry`, never joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_selector_shares_the_election_and_a_leader_latch_is_refused() {
    let zk = zookeeper_and_curator();
    let dir = distlock_conformance::harness::TempDir::new("curator-leader").expect("dir");
    let backend = ZkBackend::connect(&zk.connect_string(), options())
        .await
        .expect("connect");
    let client = LockClient::new(std::sync::Arc::new(backend));
    let name = "curator-leader";
    let queue = format!("{ELECTION_LOCK_PREFIX}{name}");
    // A JVM starts slowly: generous limits where something must happen.
    shared_election(&client, name, Duration::from_secs(30), |id| {
        curator_recipe(&zk, dir.path(), &queue, "selector", id)
    })
    .await;

    let latch = curator_recipe(&zk, dir.path(), &queue, "latch", "latch-1");
    let election = client.election(name).expect("election");
    let mut refused = None;
    for _ in 0..60 {
        match election
            .campaign_for("rust-3", Duration::from_millis(500))
            .await
        {
            Err(LockError::ForeignEntry { entry, .. }) => {
                refused = Some(entry);
                break;
            }
            Ok(leading) => {
                assert!(leading.resign().await.expect("resign"));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("expected a typed refusal, got {e:?}"),
        }
    }
    let entry = refused.expect("the latch's node was never refused");
    assert!(entry.contains("latch-"), "{entry}");
    latch.release().await;
    let lock = distlock::LockName::new(queue.as_str()).expect("valid");
    assert_eq!(
        distlock_conformance::leftovers::zk_at(&zk.connect_string(), &options().root, &lock).await,
        0
    );
}

/// On `layout=kazoo`, kazoo's `Election` (a `Lock` whose node data is the participant's id)
/// shares distlock's election (see [`shared_election`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_kazoo_layout_a_kazoo_election_shares_the_election() {
    let zk = zookeeper_and_kazoo();
    let o = ZkOptions {
        layout: Layout::Kazoo,
        ..options()
    };
    let backend = ZkBackend::connect(&zk.connect_string(), o)
        .await
        .expect("connect");
    let client = LockClient::new(std::sync::Arc::new(backend));
    let name = "kazoo-leader";
    let path = election_path(name);
    shared_election(&client, name, Duration::from_secs(10), |id| {
        let mut python = tokio::process::Command::new(PYTHON);
        python.args(["-c", KAZOO_LEADER, &zk.connect_string(), &path, id]);
        PeerHolder::spawn(python)
    })
    .await;
}
