//! Sharing a Redis lock with another language's client, with the real peer from Debian:
//! redis-py's `Lock` (python3-redis), which takes `SET <key> <token> NX PX` and releases by
//! compare-and-delete, as redsync, node-redlock and rslock do. On distlock's own layout such a
//! lock on our key would jump our FIFO queue and wake none of our waiters, so distlock refuses,
//! with a typed error naming the key, to take or wait for a lock held under a value it did not
//! write. With `layout=plain` the key is the name itself, and the two exclude each other and wake
//! each other's waiters (redis-py's by its 0.1 s poll; ours by keyspace events where the server
//! publishes them, else by polling); neither side queues, so there is no order across them, and
//! no fencing token (asked for one, the plain layout refuses).

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, Guarantee, LockBackend, LockClient, LockError, LockName, Wakeup};
use distlock_conformance::deployments::redis::options;
use distlock_conformance::harness::{PeerHolder, RedisServer, require};
use distlock_redis::keys::lock_keys;
use distlock_redis::{RedisBackend, RedisLayout, RedisOptions};

const PYTHON: &str = "/usr/bin/python3";

/// A redis-py `Lock` on `key` (`argv[3]`) with a 10 s timeout: prints `held` once granted,
/// releases when its stdin closes.
const REDIS_PY_HOLDER: &str = r#"
import sys
import redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), db=int(sys.argv[2]))
lock = r.lock(sys.argv[3], timeout=10)
lock.acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
"#;

fn redis_py(server: &RedisServer, key: &str) -> PeerHolder {
    let mut python = tokio::process::Command::new(PYTHON);
    python.args(["-c", REDIS_PY_HOLDER, &server.port().to_string(), "0", key]);
    PeerHolder::spawn(python)
}

fn server_and_redis_py(extra: &[&str]) -> RedisServer {
    require(PYTHON, "python3").expect("python3");
    let installed = std::process::Command::new(PYTHON)
        .args(["-c", "import redis"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(installed, "python3-redis is not installed");
    RedisServer::start_with(extra, None).unwrap_or_else(|e| panic!("{e}"))
}

async fn client(server: &RedisServer, o: RedisOptions) -> (LockClient, Arc<RedisBackend>) {
    let backend = Arc::new(
        RedisBackend::connect(&server.url(), o)
            .await
            .expect("connect"),
    );
    (LockClient::new(backend.clone()), backend)
}

fn plain() -> RedisOptions {
    RedisOptions {
        layout: RedisLayout::Plain {
            prefix: String::new(),
        },
        ..options()
    }
}

fn opts() -> AcquireOptions {
    AcquireOptions::with_ttl(Duration::from_secs(4))
}

/// redis-py holds distlock's own lock key: distlock's try, wait and inspect are refused with
/// `ForeignEntry` naming the key, nothing of distlock's is left queued, and once redis-py
/// released, distlock takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_py_lock_on_distlocks_key_is_refused_by_name_and_leaves_nothing() {
    let server = server_and_redis_py(&[]);
    let (client, _) = client(&server, options()).await;
    let name = "redis-py-job";
    let key = lock_keys(&options().prefix, &LockName::new(name).expect("valid")).lock;
    let mut peer = redis_py(&server, &key);
    assert!(
        peer.holds_within(Duration::from_secs(10)).await,
        "redis-py never held"
    );
    let refused = |got: Result<distlock::Lease, LockError>| match got {
        Err(LockError::ForeignEntry { name: n, entry }) => {
            assert_eq!((n.as_str(), entry.as_str()), (name, key.as_str()));
        }
        other => panic!("expected a typed refusal, got {other:?}"),
    };
    refused(client.try_acquire(name, &opts()).await);
    refused(client.acquire(name, &opts(), Duration::from_secs(2)).await);
    let status = client.inspect(name).await;
    assert!(
        matches!(status, Err(LockError::ForeignEntry { .. })),
        "{status:?}"
    );
    let leftovers = distlock_conformance::leftovers::redis(
        &mut server.admin().await.expect("admin"),
        &options().prefix,
        &LockName::new(name).expect("valid"),
    )
    .await;
    assert_eq!(leftovers, 1, "only redis-py's key stays");

    peer.release().await;
    let lease = client
        .acquire(name, &opts(), Duration::from_secs(10))
        .await
        .expect("free once redis-py released");
    assert!(lease.release().await.expect("release"));
}

/// On `layout=plain` (stock server: no keyspace events, so our waiters poll), distlock and
/// redis-py exclude each other and each is woken by the other's release; `status` shows
/// redis-py's holder (no token, nobody named); distlock's stale release never deletes redis-py's
/// key; and the layout says what it cannot do: no token, no correctness, no semaphore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_plain_layout_distlock_and_redis_py_exclude_and_wake_each_other() {
    let server = server_and_redis_py(&[]);
    let (client, backend) = client(&server, plain()).await;
    assert_eq!(client.capabilities().wakeup, Wakeup::Polling);
    let name = "plain-job";

    // distlock holds (no token: none is comparable across clients); redis-py waits, and is
    // woken by distlock's release.
    let ours = client.try_acquire(name, &opts()).await.expect("free");
    assert_eq!(ours.fencing_token(), None);
    let mut py = redis_py(&server, name);
    assert!(
        !py.holds_within(Duration::from_secs(1)).await,
        "redis-py held beside distlock"
    );
    assert!(ours.release().await.expect("release"));
    assert!(
        py.holds_within(Duration::from_secs(5)).await,
        "redis-py not woken"
    );

    // redis-py holds: distlock's try is busy, `status` shows a holder it cannot name, and a
    // waiter is woken by redis-py's release.
    assert!(matches!(
        client.try_acquire(name, &opts()).await,
        Err(LockError::Busy { .. })
    ));
    let status = client.inspect(name).await.expect("inspect");
    let holder = status.holder().expect("redis-py's holder");
    assert_eq!((holder.token, &holder.holder), (None, &None));
    assert!(
        holder
            .expires_in
            .is_some_and(|d| d <= Duration::from_secs(10))
    );
    let c = client.clone();
    let waiting =
        tokio::spawn(async move { c.acquire(name, &opts(), Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "distlock held beside redis-py");
    py.release().await;
    let lease = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("distlock woken by redis-py's release")
        .expect("task")
        .expect("granted");

    assert!(lease.release().await.expect("release"));

    // A grant that expired under a stalled holder (no watchdog here): redis-py takes the key,
    // and distlock's late release is refused and leaves redis-py's lock alone.
    let lock = LockName::new(name).expect("valid");
    let stale = backend
        .try_acquire(&lock, Duration::from_millis(300))
        .await
        .expect("free");
    let mut py = redis_py(&server, name);
    assert!(
        py.holds_within(Duration::from_secs(5)).await,
        "redis-py not granted"
    );
    assert!(!backend.release(&stale.key).await.expect("release"));
    assert!(
        client
            .inspect(name)
            .await
            .expect("inspect")
            .holder()
            .is_some()
    );
    py.release().await;

    // What the layout cannot give is refused, not faked.
    assert!(matches!(
        client
            .acquire(
                name,
                &opts().guarantee(Guarantee::Correctness),
                Duration::from_secs(1)
            )
            .await,
        Err(LockError::Unsupported { .. })
    ));
    assert!(matches!(
        client.semaphore(name, 2).map(drop),
        Err(LockError::Unsupported { .. })
    ));
}

/// With keyspace events on (`notify-keyspace-events Kgx`, the setting this test varies), a
/// plain-layout waiter watches the key (one subscription to its keyspace channel while it
/// waits, none after) and is woken by redis-py's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keyspace_events_a_plain_waiter_watches_the_key() {
    let server = server_and_redis_py(&["--notify-keyspace-events", "Kgx"]);
    let (client, _) = client(&server, plain()).await;
    assert_eq!(
        client.capabilities().wakeup,
        Wakeup::Watch,
        "{:?}",
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("notify-keyspace-events")
            .query_async::<redis::Value>(&mut server.admin().await.expect("admin"))
            .await
    );
    let name = "watched-job";
    let mut py = redis_py(&server, name);
    assert!(
        py.holds_within(Duration::from_secs(10)).await,
        "redis-py never held"
    );
    let c = client.clone();
    let waiting =
        tokio::spawn(async move { c.acquire(name, &opts(), Duration::from_secs(20)).await });
    let mut admin = server.admin().await.expect("admin");
    let channel = format!("__keyspace@0__:{name}");
    let listeners = async |admin: &mut redis::aio::MultiplexedConnection| {
        let counts: Vec<(String, usize)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(admin)
            .await
            .expect("PUBSUB NUMSUB");
        counts[0].1
    };
    let mut watched = false;
    for _ in 0..100 {
        if listeners(&mut admin).await == 1 {
            watched = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(watched, "the waiter never subscribed to {channel}");
    py.release().await;
    let lease = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("distlock woken by redis-py's release")
        .expect("task")
        .expect("granted");
    assert!(lease.release().await.expect("release"));
    let mut left = true;
    for _ in 0..100 {
        if listeners(&mut admin).await == 0 {
            left = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!left, "the subscription outlived the wait");
}
