//! Round trips of the Redis backend, counted by the server (`INFO commandstats`): an uncontended
//! acquire is one script call, a release is one, a watchdog tick for 100 leases is one; and the
//! commands those scripts run on the uncontended path are the few the guarantees need (on one
//! server and on each Redlock node); a server that lost its script cache is taught each script
//! once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient, LockName};
use distlock_conformance::harness::{RedisMasters, RedisServer};
use distlock_redis::keys::lock_keys;
use distlock_redis::{RedisBackend, RedisOptions, RedlockBackend, RedlockOptions};

/// Calls per command so far, scripts' inner commands included (`INFO` itself left out).
async fn command_calls(admin: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("INFO");
    // Lines look like `cmdstat_evalsha:calls=3,usec=...`.
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (name != "info").then(|| (name.to_string(), calls))
        })
        .collect()
}

/// What ran between two [`command_calls`] readings.
fn ran(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Script calls so far (EVAL counts too: a script not cached yet).
async fn script_calls(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let calls = command_calls(admin).await;
    ["evalsha", "eval"]
        .iter()
        .filter_map(|c| calls.get(*c))
        .sum()
}

/// A server, an admin connection that reads its counters, and a lock client on it.
async fn setup() -> (RedisServer, redis::aio::MultiplexedConnection, LockClient) {
    let server = tokio::task::spawn_blocking(|| RedisServer::start().expect("redis"))
        .await
        .expect("start");
    let admin = server.admin().await.expect("admin");
    let backend = RedisBackend::connect(&server.url(), RedisOptions::default())
        .await
        .expect("connect");
    let locks = LockClient::new(Arc::new(backend));
    (server, admin, locks)
}

/// Fixed-lease options (no watchdog renewal may run between the counts), after one warm-up
/// pair with them: the first call of each script also loads it (NOSCRIPT, SCRIPT LOAD).
async fn warmed_up(locks: &LockClient) -> AcquireOptions {
    let opts = AcquireOptions::with_ttl(Duration::from_secs(30)).fixed();
    locks
        .try_acquire("warm", &opts)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    opts
}

/// Each of `cmds` once, as [`ran`] reports it.
fn once_each(cmds: &[&str]) -> BTreeMap<String, u64> {
    cmds.iter().map(|c| (c.to_string(), 1)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_is_one_script_call_each_running_only_what_it_needs() {
    let (_server, mut admin, locks) = setup().await;
    let opts = warmed_up(&locks).await;
    let before = command_calls(&mut admin).await;
    let lease = locks.try_acquire("count", &opts).await.expect("acquire");
    let after_acquire = command_calls(&mut admin).await;
    assert!(lease.release().await.expect("release"));
    let after_release = command_calls(&mut admin).await;
    // One script call each. Inside, acquire checks for a queue, steps the fencing counter and
    // sets the lock (no read); release reads, deletes and checks for a queue to hand over to,
    // and publishes nothing when there is none (a single server's waiters always queue).
    assert_eq!(
        ran(&before, &after_acquire),
        once_each(&["evalsha", "exists", "incr", "set"]),
        "an uncontended acquire"
    );
    assert_eq!(
        ran(&after_acquire, &after_release),
        once_each(&["del", "evalsha", "exists", "get"]),
        "a release nobody waits for"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_forgot_our_scripts_is_taught_each_once_and_the_pair_still_holds() {
    let (_server, mut admin, locks) = setup().await;
    let opts = warmed_up(&locks).await;
    // What a restarted or failed-over server looks like to a client: no script cached.
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .expect("SCRIPT FLUSH");
    let before = command_calls(&mut admin).await;
    for _ in 0..2 {
        let lease = locks.try_acquire("forgot", &opts).await.expect("acquire");
        assert!(lease.fencing_token().is_some());
        assert!(lease.release().await.expect("release"));
    }
    let ran = ran(&before, &command_calls(&mut admin).await);
    // Acquire and release each answered NOSCRIPT once, loaded their script and went again;
    // the second pair found both cached.
    assert_eq!(ran.get("script|load"), Some(&2), "{ran:?}");
    assert_eq!(ran.get("set"), Some(&2), "{ran:?}");
    assert_eq!(ran.get("del"), Some(&2), "{ran:?}");
}

/// Three masters, an admin connection to each, and their URLs.
async fn redlock_setup() -> (
    RedisMasters,
    Vec<redis::aio::MultiplexedConnection>,
    Vec<String>,
) {
    let masters = tokio::task::spawn_blocking(|| RedisMasters::start(3).expect("masters"))
        .await
        .expect("start");
    let mut admins = Vec::new();
    for node in &masters.nodes {
        admins.push(node.admin().await.expect("admin"));
    }
    let urls: Vec<String> = masters.nodes.iter().map(RedisServer::url).collect();
    (masters, admins, urls)
}

async fn redlock_backend(urls: &[String]) -> RedlockBackend {
    RedlockBackend::connect(urls, RedlockOptions::default())
        .await
        .expect("connect")
}

async fn redlock_client(urls: &[String]) -> LockClient {
    LockClient::new(Arc::new(redlock_backend(urls).await))
}

/// For a test about `name` on three masters: the masters, an admin connection to each, the
/// name, its arbiter's index, and a warmed-up client.
async fn redlock_on(
    name: &str,
) -> (
    RedisMasters,
    Vec<redis::aio::MultiplexedConnection>,
    LockName,
    usize,
    LockClient,
    AcquireOptions,
) {
    let (masters, admins, urls) = redlock_setup().await;
    let name = LockName::new(name).expect("name");
    let arbiter = redlock_backend(&urls).await.arbiter(&name);
    let locks = redlock_client(&urls).await;
    let opts = warmed_up(&locks).await;
    (masters, admins, name, arbiter, locks, opts)
}

/// Takes `name` (a majority grants) and releases it: the `PUBLISH`es each of `admins`' nodes
/// ran for the release.
async fn announced_release(
    locks: &LockClient,
    opts: &AcquireOptions,
    name: &str,
    admins: &mut [redis::aio::MultiplexedConnection],
) -> Vec<u64> {
    let lease = locks
        .try_acquire(name, opts)
        .await
        .expect("a majority grants");
    let before = calls_of(admins, "publish").await;
    assert!(lease.release().await.expect("release"));
    grew(&calls_of(admins, "publish").await, &before)
}

/// Sets `name`'s lock key on one node for an owner no client here knows (30 s).
async fn hold_elsewhere(admin: &mut redis::aio::MultiplexedConnection, name: &LockName) {
    let () = redis::cmd("SET")
        .arg(lock_keys("distlock", name).lock)
        .arg("someone-else")
        .arg("PX")
        .arg(30_000)
        .query_async(admin)
        .await
        .expect("SET");
}

/// Per node, how many more calls `after` counts than `before`.
fn grew(after: &[u64], before: &[u64]) -> Vec<u64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// Each node's count of `command` so far.
async fn calls_of(admins: &mut [redis::aio::MultiplexedConnection], command: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for admin in admins {
        out.push(
            command_calls(admin)
                .await
                .get(command)
                .copied()
                .unwrap_or(0),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_pair_is_a_plain_set_and_a_release_only_the_arbiter_announces() {
    let (_masters, mut admins, _, arbiter, locks, opts) = redlock_on("count").await;
    let mut before = Vec::new();
    for admin in &mut admins {
        before.push(command_calls(admin).await);
    }
    let lease = locks.try_acquire("count", &opts).await.expect("acquire");
    assert!(lease.release().await.expect("release"));
    // Redlock nodes grant with the raw minimum and hold no queue: the release reads nothing
    // else, and only the name's arbiter wakes Redlock waiters on the name's channel (one message
    // per waiter, not one per node).
    for (i, (admin, before)) in admins.iter_mut().zip(&before).enumerate() {
        let after = command_calls(admin).await;
        let want = if i == arbiter {
            once_each(&["del", "evalsha", "get", "publish", "set"])
        } else {
            once_each(&["del", "evalsha", "get", "set"])
        };
        assert_eq!(ran(before, &after), want, "a redlock pair on node {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_lease_granted_without_the_arbiter_is_still_announced_there() {
    let (_masters, mut admins, name, arbiter, locks, opts) = redlock_on("not-on-arbiter").await;
    hold_elsewhere(&mut admins[arbiter], &name).await;
    let published = announced_release(&locks, &opts, "not-on-arbiter", &mut admins).await;
    let want: Vec<u64> = (0..3).map(|i| u64::from(i == arbiter)).collect();
    assert_eq!(published, want, "the arbiter announces, the others do not");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_release_whose_arbiter_is_down_is_announced_by_the_others() {
    let (masters, mut admins, _, arbiter, locks, opts) = redlock_on("arbiter-down").await;
    masters.nodes[arbiter].process().kill();
    let mut live: Vec<_> = admins
        .drain(..)
        .enumerate()
        .filter(|(i, _)| *i != arbiter)
        .map(|(_, a)| a)
        .collect();
    let published = announced_release(&locks, &opts, "arbiter-down", &mut live).await;
    assert_eq!(published, vec![1, 1], "each live node announces once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_holding_the_arbiter_asks_the_others_again_then_lets_go() {
    let (_masters, mut admins, name, arbiter, locks, opts) = redlock_on("held-elsewhere").await;
    // Every node but the arbiter is held by someone this client never hears about.
    let key = lock_keys("distlock", &name).lock;
    for (i, admin) in admins.iter_mut().enumerate() {
        if i != arbiter {
            hold_elsewhere(admin, &name).await;
        }
    }
    let before = calls_of(&mut admins, "set").await;
    let published = calls_of(&mut admins, "publish").await;
    let outcome = locks
        .acquire("held-elsewhere", &opts, Duration::from_millis(600))
        .await;
    assert!(
        matches!(outcome, Err(distlock::LockError::Timeout { .. })),
        "{outcome:?}"
    );
    let asked = grew(&calls_of(&mut admins, "set").await, &before);
    // The first (parallel) round asks each node once; every later round wins the arbiter (it
    // is free) and asks each other node four times (once, then three more) before it gives the
    // arbiter back.
    let rounds = asked[arbiter] - 1;
    assert!(rounds >= 1, "no round after the first: {asked:?}");
    for (i, n) in asked.iter().enumerate() {
        if i != arbiter {
            assert_eq!(*n, 1 + 4 * rounds, "node {i} in {asked:?}");
        }
    }
    // Only the first round's clean-up announced (it freed the arbiter, which a waiter may have
    // found taken); letting go of the arbiter after asking again woke nobody: the owner of the
    // others will, when it releases.
    let woke = grew(&calls_of(&mut admins, "publish").await, &published);
    let want: Vec<u64> = (0..3).map(|i| u64::from(i == arbiter)).collect();
    assert_eq!(woke, want, "announcements per node");
    for (i, admin) in admins.iter_mut().enumerate() {
        let held: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(admin)
            .await
            .expect("GET");
        let want = (i != arbiter).then(|| "someone-else".to_string());
        assert_eq!(held, want, "node {i} after the waiter gave up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn woken_redlock_waiters_retry_on_one_node_and_only_its_winner_goes_on() {
    const WAITERS: u64 = 6;
    let (_masters, mut admins, urls) = redlock_setup().await;
    let holder = redlock_client(&urls).await;
    let opts = warmed_up(&holder).await;
    let lease = holder
        .try_acquire("contended", &opts)
        .await
        .expect("acquire");
    let start = calls_of(&mut admins, "set").await;
    let (granted, mut grants) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let (locks, opts, granted) = (redlock_client(&urls).await, opts.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let lease = locks
                .acquire("contended", &opts, Duration::from_secs(20))
                .await;
            let _ = granted.send(lease.is_ok());
            // Held until the test ends (the task is aborted then).
            let _held = lease;
            std::future::pending::<()>().await;
        }));
    }
    // Every waiter's first round reached every node (a plain SET each, refused).
    let mut before = start.clone();
    for _ in 0..500 {
        before = calls_of(&mut admins, "set").await;
        if before.iter().zip(&start).all(|(b, s)| b - s >= WAITERS) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        before.iter().zip(&start).all(|(b, s)| b - s >= WAITERS),
        "the waiters' first rounds: {start:?} -> {before:?}"
    );
    assert!(lease.release().await.expect("release"));
    let won = tokio::time::timeout(Duration::from_secs(5), grants.recv()).await;
    assert!(
        matches!(won, Ok(Some(true))),
        "a waiter was granted: {won:?}"
    );
    // The losers' random pauses (50-250 ms) end meanwhile: each sends another round.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = calls_of(&mut admins, "set").await;
    let mut sets: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    sets.sort_unstable();
    // Every woken waiter asked the arbiter; only the one it granted asked the other nodes.
    // Without the arbiter each retry is a SET on every node.
    assert_eq!(
        &sets[..2],
        &[1, 1],
        "SETs per node after the release: {sets:?}"
    );
    assert!(
        sets[2] >= WAITERS,
        "SETs per node after the release: {sets:?}"
    );
    for w in waiters {
        w.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_tick_for_100_leases_is_one_script_call() {
    let (_server, mut admin, locks) = setup().await;
    // Renewed every second.
    let opts = AcquireOptions::with_ttl(Duration::from_secs(3));
    let mut leases = Vec::new();
    for i in 0..100 {
        leases.push(
            locks
                .try_acquire(&format!("tick-{i}"), &opts)
                .await
                .expect("acquire"),
        );
    }
    // The first tick (at ~1 s) also loads the script; count the two after it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = script_calls(&mut admin).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = script_calls(&mut admin).await - before;
    assert_eq!(
        calls, 2,
        "two ticks of 100 leases took {calls} script calls"
    );
    assert!(leases.iter().all(|l| l.lost_reason().is_none()));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(leases[0].backend_key())
        .query_async(&mut admin)
        .await
        .expect("PTTL");
    assert!(ttl > 1_000, "the lease was renewed: PTTL {ttl} ms");
}
