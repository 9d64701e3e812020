//! `distlock` as operators run it: real processes against real servers (Redis, etcd, ZooKeeper,
//! each started once for this file with stock settings; short sessions through the URLs).

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::{LockClient, connect};
use distlock_conformance::deployment::{Cut, ProxyCut};
use distlock_conformance::harness::{EtcdCluster, ProxyMode, RedisServer, TempDir, ZkEnsemble};
use tokio::process::Command;
use tokio::time::{Instant, sleep};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

struct Servers {
    redis: RedisServer,
    etcd: EtcdCluster,
    zk: ZkEnsemble,
}

async fn servers() -> Arc<Servers> {
    static CELL: OnceLock<Arc<Servers>> = OnceLock::new();
    tokio::task::spawn_blocking(|| {
        CELL.get_or_init(|| {
            Arc::new(Servers {
                redis: RedisServer::start().expect("redis"),
                etcd: EtcdCluster::start(1).expect("etcd"),
                zk: ZkEnsemble::start(1).expect("zookeeper"),
            })
        })
        .clone()
    })
    .await
    .expect("servers")
}

/// Each backend's URL over `hosts` (`host:port` each), with a short session where the lease is
/// the session's.
fn urls(s: &Servers, hosts: impl Fn(Vec<u16>) -> Vec<String>) -> Vec<String> {
    vec![
        format!(
            "redis://{}?prefix=cli",
            hosts(vec![s.redis.port()]).join(",")
        ),
        format!(
            "etcd://{}/cli?session_ttl=2s",
            hosts(s.etcd.client_ports.clone()).join(",")
        ),
        format!(
            "zk://{}?root=/cli&session_timeout=4s",
            hosts(s.zk.client_ports.clone()).join(",")
        ),
    ]
}

fn direct(ports: Vec<u16>) -> Vec<String> {
    ports
        .into_iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect()
}

fn unique(test: &str) -> String {
    format!("cli-{test}-{:x}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

fn distlock(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--backend").arg(url).kill_on_drop(true);
    c
}

async fn waiters(client: &LockClient, name: &str) -> usize {
    client.inspect(name).await.expect("inspect").waiters
}

/// Polls `check` every 20 ms for up to `within`.
async fn eventually<F: AsyncFnMut() -> bool>(within: Duration, mut check: F) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if check().await {
            return true;
        }
        sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Three `distlock run` on one name: their commands never overlap (each logs start and end
/// around a sleep, and the log alternates), and each exits with its command's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_one_name_never_overlap() {
    let s = servers().await;
    for url in urls(&s, direct) {
        let dir = TempDir::new("cli").expect("dir");
        let log = dir.path().join("log");
        let name = unique("overlap");
        let script = format!(
            "echo start >> {0}; sleep 0.2; echo end >> {0}; exit 7",
            log.display()
        );
        let runs: Vec<_> = (0..3)
            .map(|_| {
                distlock(&url)
                    .args(["run", &name, "--ttl", "2s", "--", "sh", "-c", &script])
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        for mut r in runs {
            assert_eq!(r.wait().await.expect("wait").code(), Some(7), "{url}");
        }
        let text = std::fs::read_to_string(&log).expect("log");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{url}: {text}");
        for pair in lines.chunks(2) {
            assert_eq!(pair, ["start", "end"], "{url}: overlapping runs: {text}");
        }
    }
}

/// Four `distlock run --limit 2` on one name: two commands at a time, never three (each logs
/// start and end around a sleep); a run giving another limit is refused with 78.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_with_a_limit_share_it_and_never_exceed_it() {
    let s = servers().await;
    for url in urls(&s, direct) {
        let dir = TempDir::new("cli").expect("dir");
        let log = dir.path().join("log");
        let name = unique("limit");
        let script = format!(
            "echo start >> {0}; sleep 0.5; echo end >> {0}",
            log.display()
        );
        let run = |limit: &str, command: &[&str]| {
            distlock(&url)
                .args(["run", &name, "--ttl", "2s", "--limit", limit, "--"])
                .args(command)
                .spawn()
                .expect("spawn")
        };
        let runs: Vec<_> = (0..4).map(|_| run("2", &["sh", "-c", &script])).collect();
        let started = eventually(Duration::from_secs(10), async || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("start"))
        })
        .await;
        assert!(started, "{url}: nothing started");
        let other = run("3", &["true"]).wait().await.expect("wait");
        assert_eq!(
            other.code(),
            Some(78),
            "{url}: another limit was not refused"
        );
        for mut r in runs {
            assert_eq!(r.wait().await.expect("wait").code(), Some(0), "{url}");
        }
        let text = std::fs::read_to_string(&log).expect("log");
        let (mut running, mut most) = (0, 0);
        for line in text.lines() {
            running += if line == "start" { 1 } else { -1 };
            most = most.max(running);
        }
        assert_eq!(text.lines().count(), 8, "{url}: {text}");
        assert_eq!(
            most, 2,
            "{url}: at most two at once, and two at some point: {text}"
        );
    }
}

/// The command sees the lock in its environment, with the holder's token as `status` reads it
/// from the server; a second run with `--no-wait` exits 75 at once; bad input has its own codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_the_token_and_conflicts_have_their_codes() {
    let s = servers().await;
    for url in urls(&s, direct) {
        let name = unique("token");
        let dir = TempDir::new("cli").expect("dir");
        let out = dir.path().join("env");
        let script = format!(
            "echo $DISTLOCK_LOCK_HELD $DISTLOCK_NAME $DISTLOCK_TOKEN > {}; sleep 1",
            out.display()
        );
        let mut holder = distlock(&url)
            .args(["run", &name, "--", "sh", "-c", &script])
            .spawn()
            .expect("spawn");
        assert!(
            eventually(Duration::from_secs(10), async || {
                std::fs::read_to_string(&out).is_ok_and(|t| t.ends_with('\n'))
            })
            .await,
            "{url}: the command never ran"
        );
        let env = std::fs::read_to_string(&out).expect("env");
        let fields: Vec<&str> = env.split_whitespace().collect();
        let status = distlock(&url)
            .args(["status", &name, "--json"])
            .output()
            .await
            .expect("status");
        let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
        assert_eq!(json[0]["held"], true, "{url}: {json}");
        assert_eq!(
            fields,
            ["1", name.as_str(), &json[0]["token"].to_string()],
            "{url}: the command's environment against the server's holder"
        );
        let busy = distlock(&url)
            .args(["run", &name, "--no-wait", "--", "true"])
            .status()
            .await
            .expect("busy run");
        assert_eq!(busy.code(), Some(75), "{url}");
        let timed_out = distlock(&url)
            .args(["run", &name, "--wait", "200ms", "--", "true"])
            .status()
            .await
            .expect("timed-out run");
        assert_eq!(timed_out.code(), Some(75), "{url}");
        assert_eq!(holder.wait().await.expect("holder").code(), Some(0));
    }
    let bad = Command::new(BIN)
        .args(["--backend", "nosuch://x", "run", "n", "--", "true"])
        .status()
        .await
        .expect("bad url");
    assert_eq!(bad.code(), Some(78));
    let usage = Command::new(BIN)
        .args(["run"])
        .status()
        .await
        .expect("usage");
    assert_eq!(usage.code(), Some(64));
    let missing = Command::new(BIN)
        .args([
            "--backend",
            "memory://cli",
            "run",
            "n",
            "--",
            "/nonexistent/command",
        ])
        .status()
        .await
        .expect("missing command");
    assert_eq!(missing.code(), Some(127));
}

/// A signal while `distlock run` still waits ends the wait (exit 128 + signal) and leaves no
/// waiter queued on the server (gone before any TTL could have expired it); the command never
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_waiting_leaves_nothing_queued() {
    let s = servers().await;
    for url in urls(&s, direct) {
        let name = unique("sigterm");
        let client = LockClient::new(connect(&url).await.expect("connect"));
        let opts = distlock::AcquireOptions::with_ttl(Duration::from_secs(10));
        let held = client.try_acquire(&name, &opts).await.expect("hold");
        let dir = TempDir::new("cli").expect("dir");
        let ran = dir.path().join("ran");
        let mut waiting = distlock(&url)
            .args(["run", &name, "--", "touch"])
            .arg(&ran)
            .spawn()
            .expect("spawn");
        assert!(
            eventually(Duration::from_secs(10), async || {
                waiters(&client, &name).await == 1
            })
            .await,
            "{url}: the run never queued"
        );
        let pid = waiting.id().expect("pid") as libc::pid_t;
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let status = waiting.wait().await.expect("wait");
        assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{url}");
        // Well inside every session and waiter TTL here: the waiter left, it did not expire.
        assert!(
            eventually(Duration::from_millis(500), async || {
                waiters(&client, &name).await == 0
            })
            .await,
            "{url}: the interrupted run left a waiter"
        );
        assert!(held.release().await.expect("release"));
        assert!(!Path::new(&ran).exists(), "{url}: the command ran");
    }
}

/// The run's connections are cut while its command runs: the lease is lost, the command's
/// whole process group gets SIGTERM, and `distlock` exits 76 within the TTL and a little.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_terminates_the_command() {
    let s = servers().await;
    let ports = [
        vec![s.redis.port()],
        s.etcd.client_ports.clone(),
        s.zk.client_ports.clone(),
    ];
    for (i, ports) in ports.into_iter().enumerate() {
        let cut = ProxyCut::to_ports(ports);
        let url = urls(&s, |_| cut.addrs()).remove(i);
        let name = unique("lost");
        let dir = TempDir::new("cli").expect("dir");
        let pid_file = dir.path().join("pid");
        // A grandchild in the same group: the whole group must go.
        let script = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
        let mut run = distlock(&url)
            .args([
                "run",
                &name,
                "--ttl",
                "2s",
                "--kill-after",
                "1s",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        assert!(
            eventually(Duration::from_secs(10), async || {
                std::fs::read_to_string(&pid_file).is_ok_and(|t| t.ends_with('\n'))
            })
            .await,
            "{url}: the command never ran"
        );
        let sleeper: libc::pid_t = std::fs::read_to_string(&pid_file)
            .expect("pid")
            .trim()
            .parse()
            .expect("pid number");
        let cut_at = Instant::now();
        cut.cut();
        let status = tokio::time::timeout(Duration::from_secs(20), run.wait())
            .await
            .unwrap_or_else(|_| panic!("{url}: distlock still running 20 s after the cut"))
            .expect("wait");
        assert_eq!(status.code(), Some(76), "{url}");
        assert!(
            cut_at.elapsed() < Duration::from_secs(12),
            "{url}: {:?}",
            cut_at.elapsed()
        );
        // SAFETY: kill(2) with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(sleeper, 0) } == 0;
        assert!(
            !alive,
            "{url}: the command's process group outlived the lock"
        );
        cut.restore();
    }
}

/// A signal sent to `distlock` while its command runs reaches the command (its process group),
/// and `distlock` exits with the command's status; the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_running_command() {
    let s = servers().await;
    let url = urls(&s, direct).remove(0);
    let name = unique("forward");
    let dir = TempDir::new("cli").expect("dir");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'exit 42' USR1; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut run = distlock(&url)
        .args(["run", &name, "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    assert!(
        eventually(Duration::from_secs(10), async || ready.exists()).await,
        "the command never ran"
    );
    let pid = run.id().expect("pid") as libc::pid_t;
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(pid, libc::SIGUSR1);
    }
    let status = tokio::time::timeout(Duration::from_secs(10), run.wait())
        .await
        .expect("distlock ends with its command")
        .expect("wait");
    assert_eq!(status.code(), Some(42));
    let client = LockClient::new(connect(&url).await.expect("connect"));
    assert!(
        client
            .inspect(&name)
            .await
            .expect("inspect")
            .holders
            .is_empty()
    );
}

/// A command that ignores SIGTERM, under a lock whose holder is cut off: with a `--kill-after`
/// far longer than the lost signal's lead, the command is still killed (SIGKILL within half the
/// lead) before the server's expiry could grant the lock, so the next `run` of the name never
/// finds it alive; the long `--kill-after` is cut with a warning. The same for a leader's
/// command under `elect`: the next leader's command starts only once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_kills_the_command_before_anyone_else_runs() {
    let s = servers().await;
    let ports = [
        vec![s.redis.port()],
        s.etcd.client_ports.clone(),
        s.zk.client_ports.clone(),
    ];
    let cases = ports
        .into_iter()
        .enumerate()
        .flat_map(|(i, p)| [(i, p.clone(), "run"), (i, p, "elect")]);
    for (i, ports, verb) in cases {
        let cut = ProxyCut::to_ports(ports);
        let url = urls(&s, |_| cut.addrs()).remove(i);
        let direct_url = urls(&s, direct).remove(i);
        let name = unique("killed-in-time");
        let dir = TempDir::new("cli").expect("dir");
        let pid_file = dir.path().join("pid");
        let script = format!(
            "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
            pid_file.display()
        );
        let run = distlock(&url)
            .args([verb, &name, "--ttl", "3s", "--kill-after", "10s", "--"])
            .args(["sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        assert!(
            eventually(Duration::from_secs(10), async || {
                std::fs::read_to_string(&pid_file).is_ok_and(|t| t.ends_with('\n'))
            })
            .await,
            "{verb} {url}: the command never ran"
        );
        let pid = std::fs::read_to_string(&pid_file).expect("pid");
        cut.cut();
        let check = format!(
            "if kill -0 {} 2>/dev/null; then echo overlap; else echo alone; fi",
            pid.trim()
        );
        let until = Instant::now() + Duration::from_secs(20);
        let next = loop {
            let out = distlock(&direct_url)
                .args([verb, &name, "--no-wait", "--", "sh", "-c", &check])
                .output()
                .await
                .expect("next run");
            if out.status.code() != Some(75) || Instant::now() > until {
                break out;
            }
            sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(next.status.code(), Some(0), "{verb} {url}: {next:?}");
        assert_eq!(
            String::from_utf8_lossy(&next.stdout).trim(),
            "alone",
            "{verb} {url}: the next run started while the lost lock's command still ran"
        );
        let out = run.wait_with_output().await.expect("first run");
        assert_eq!(out.status.code(), Some(76), "{verb} {url}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--kill-after 10s"),
            "{verb} {url}: {stderr}"
        );
        cut.restore();
    }
}

/// The command cannot outlive or out-run `distlock`: SIGKILL of `distlock` takes the command's
/// whole process group with it (a grandchild too), and while `distlock` is stopped the command
/// is stopped, then resumed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_dies_and_stops_with_distlock() {
    let s = servers().await;
    let url = urls(&s, direct).remove(0);
    let dir = TempDir::new("cli").expect("dir");
    let started = |name: &str| {
        let pid_file = dir.path().join(name);
        let script = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
        let run = distlock(&url)
            .args(["run", name, "--", "sh", "-c", &script])
            .spawn()
            .expect("spawn");
        (run, pid_file)
    };
    let pid_of = async |file: &Path| -> libc::pid_t {
        assert!(
            eventually(Duration::from_secs(10), async || {
                std::fs::read_to_string(file).is_ok_and(|t| t.ends_with('\n'))
            })
            .await,
            "the command never ran"
        );
        std::fs::read_to_string(file)
            .expect("pid")
            .trim()
            .parse()
            .expect("pid number")
    };
    let state = |pid: libc::pid_t| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
            .and_then(|r| r.chars().next())
    };
    let signal = |pid: u32, sig: libc::c_int| {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(pid as libc::pid_t, sig);
        }
    };

    let (mut run, file) = started(&unique("parent-killed"));
    let sleeper = pid_of(&file).await;
    signal(run.id().expect("pid"), libc::SIGKILL);
    run.wait().await.expect("reaped");
    assert!(
        eventually(Duration::from_secs(3), async || state(sleeper).is_none()).await,
        "the command's grandchild outlived distlock's SIGKILL"
    );

    let (mut run, file) = started(&unique("parent-stopped"));
    let sleeper = pid_of(&file).await;
    let pid = run.id().expect("pid");
    signal(pid, libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(3), async || state(sleeper) == Some('T')).await,
        "the command runs on while distlock is stopped: {:?}",
        state(sleeper)
    );
    signal(pid, libc::SIGCONT);
    assert!(
        eventually(Duration::from_secs(3), async || state(sleeper) == Some('S')).await,
        "the command was not resumed with distlock: {:?}",
        state(sleeper)
    );
    signal(pid, libc::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(10), run.wait())
        .await
        .expect("distlock ends with its command")
        .expect("wait");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
}

/// Durations past the clock's range are long waits, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_clocks_range_is_no_panic() {
    let status = Command::new(BIN)
        .args(["--backend", "memory://cli", "run", "huge"])
        .args(["--wait", "10000000000000000000s", "--", "true"])
        .status()
        .await
        .expect("run");
    assert_eq!(status.code(), Some(0));
}

/// The first hour's stumbles: each must not come back.
/// * no backend anywhere: refused (exit 64), never a private in-process store;
/// * a bad name is exit 64, said once and cut (not 200 KB of stderr); a `--ttl` past 584 years
///   is exit 78, named;
/// * `check` proves each backend answers (an unreachable etcd is exit 69, one line naming it);
/// * a command under `distlock run` that runs `distlock` (or loads the configuration) is not
///   confused by the variables `run` set for it;
/// * `--wait 0` tries once (exit 75 while held), `1h30m` is a duration;
/// * a `--ttl` the backend does not apply (etcd's session TTL) is said;
/// * `DISTLOCK_LEASE__TTL` applies with `--backend` too; `-E` sets the conflict's status; `-v`
///   shows the library's log lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_first_hour() {
    let bare = Command::new(BIN)
        .args(["run", "n", "--", "true"])
        .env_remove("DISTLOCK_BACKENDS__MAIN__URL")
        .output()
        .await
        .expect("run");
    assert_eq!(bare.status.code(), Some(64), "{bare:?}");
    assert!(String::from_utf8_lossy(&bare.stderr).contains("--backend"));

    let unreachable = Command::new(BIN)
        .args(["--backend", "etcd://127.0.0.1:1", "check"])
        .output()
        .await
        .expect("check");
    assert_eq!(unreachable.status.code(), Some(69), "{unreachable:?}");

    // A bad name is a usage error, said once and cut.
    let long = "n".repeat(100_000);
    let bad_name = Command::new(BIN)
        .args(["--backend", "memory://cli", "run", &long, "--", "true"])
        .output()
        .await
        .expect("bad name");
    assert_eq!(bad_name.status.code(), Some(64), "{:?}", bad_name.status);
    assert!(
        bad_name.stderr.len() < 1_000,
        "{} bytes of stderr for a bad name",
        bad_name.stderr.len()
    );
    // A TTL past what a lease counts (about 584 years) is refused naming it (exit 78), not cut
    // short with a word about sessions.
    let huge = Command::new(BIN)
        .args(["--backend", "memory://cli", "run", "n", "--ttl"])
        .args(["18446744073709551615s", "--", "true"])
        .output()
        .await
        .expect("huge ttl");
    assert_eq!(huge.status.code(), Some(78), "{huge:?}");
    assert!(
        String::from_utf8_lossy(&huge.stderr).contains("ttl = \"18446744073709551615s\""),
        "{huge:?}"
    );
    let said = String::from_utf8_lossy(&unreachable.stderr);
    assert!(said.contains("127.0.0.1:1"), "{said}");
    assert!(
        said.contains("Connection refused") && !said.contains("tonic"),
        "one clear line, not a transport dump: {said}"
    );

    let s = servers().await;
    let url = urls(&s, direct).remove(0);
    let dir = TempDir::new("cli").expect("dir");
    let config = dir.path().join("distlock.toml");
    std::fs::write(&config, format!("[backends.main]\nurl = \"{url}\"\n")).expect("toml");
    let (outer, inner) = (unique("outer"), unique("inner"));
    let nested = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .args(["run", &outer, "--ttl", "1h30m", "--", BIN, "--config"])
        .arg(&config)
        .args(["run", &inner, "--wait", "0", "--", "true"])
        .output()
        .await
        .expect("nested run");
    assert_eq!(nested.status.code(), Some(0), "{nested:?}");
    // A TTL the backend cannot apply is said, not silently ignored.
    let etcd = urls(&s, direct).remove(1);
    let session = distlock(&etcd)
        .args(["run", &unique("ttl"), "--ttl", "60s", "--", "true"])
        .output()
        .await
        .expect("etcd run");
    assert_eq!(session.status.code(), Some(0), "{session:?}");
    assert!(
        String::from_utf8_lossy(&session.stderr).contains("--ttl 60s does not apply on etcd"),
        "{session:?}"
    );

    // `check` refuses the lease settings `run` refuses: a renewal period past the validity
    // window of the session's TTL (2 s), which a bare lease settings check passes.
    for command in [&["check"][..], &["run", "renew", "--", "true"][..]] {
        let refused = distlock(&etcd)
            .env("DISTLOCK_LEASE__RENEW_EVERY", "10s")
            .args(command)
            .output()
            .await
            .expect("check");
        assert_eq!(refused.status.code(), Some(78), "{command:?}: {refused:?}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("lease.renew_every"),
            "{command:?}: {refused:?}"
        );
    }

    // -v shows the library's debug lines (the release here) on stderr.
    let verbose = Command::new(BIN)
        .args([
            "-v",
            "--backend",
            "memory://cli",
            "run",
            "logged",
            "--",
            "true",
        ])
        .output()
        .await
        .expect("verbose run");
    assert_eq!(verbose.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&verbose.stderr).contains("distlock released"),
        "{verbose:?}"
    );

    // The lease variables apply with --backend too.
    let name = unique("env-ttl");
    let mut held = distlock(&url)
        .env("DISTLOCK_LEASE__TTL", "7s")
        .args(["run", &name, "--", "sleep", "2"])
        .spawn()
        .expect("run");
    let client = LockClient::new(connect(&url).await.expect("connect"));
    assert!(
        eventually(Duration::from_secs(10), async || client
            .inspect(&name)
            .await
            .is_ok_and(|st| st
                .holder()
                .and_then(|h| h.expires_in)
                .is_some_and(|left| left <= Duration::from_secs(7))))
        .await,
        "DISTLOCK_LEASE__TTL=7s not applied: {:?}",
        client.inspect(&name).await
    );
    assert_eq!(held.wait().await.expect("run").code(), Some(0));

    let name = unique("wait-zero");
    let mut holder = distlock(&url)
        .args(["run", &name, "--", "sleep", "2"])
        .spawn()
        .expect("holder");
    assert!(
        eventually(Duration::from_secs(10), async || client
            .inspect(&name)
            .await
            .is_ok_and(|st| st.holder().is_some()))
        .await
    );
    let tried = distlock(&url)
        .args(["run", &name, "--wait", "0", "--", "true"])
        .status()
        .await
        .expect("try");
    assert_eq!(tried.code(), Some(75));
    let chosen = distlock(&url)
        .args(["run", &name, "--no-wait", "-E", "3", "--", "true"])
        .status()
        .await
        .expect("try with -E");
    assert_eq!(chosen.code(), Some(3), "-E sets the conflict's exit status");
    assert_eq!(holder.wait().await.expect("holder").code(), Some(0));
}

/// `status` of a name used with `run --limit 2` shows the semaphore's two permits (their
/// tokens, and who holds each: this host, the pid of the `distlock` that holds it, the command
/// it runs, since when) and its waiter, not "free".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_every_permit_who_holds_it_and_the_waiters() {
    let s = servers().await;
    for url in urls(&s, direct) {
        let name = unique("status-permits");
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(
                distlock(&url)
                    .args(["run", &name, "--limit", "2", "--", "sh", "-c", "sleep 3"])
                    .spawn()
                    .expect("spawn"),
            );
        }
        let json = async || -> serde_json::Value {
            let out = distlock(&url)
                .args(["status", &name, "--json"])
                .output()
                .await
                .expect("status");
            serde_json::from_slice(&out.stdout).expect("json")
        };
        assert!(
            eventually(Duration::from_secs(10), async || json().await[0]["waiters"]
                == 1)
            .await,
            "{url}: {}",
            json().await
        );
        let seen = json().await;
        assert_eq!(seen[0]["kind"], "semaphore", "{url}: {seen}");
        assert_eq!(seen[0]["held"], true, "{url}: {seen}");
        let holders = seen[0]["holders"].as_array().expect("holders");
        assert_eq!(holders.len(), 2, "{url}: {seen}");
        assert!(
            holders
                .iter()
                .all(|h| h["holds"] == "permit of 2" && h["token"].is_u64()),
            "{url}: {seen}"
        );
        let pids: Vec<u64> = runs.iter().filter_map(|r| r.id().map(u64::from)).collect();
        let host = distlock::HolderInfo::now().host;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64;
        for h in holders {
            let who = &h["holder"];
            assert_eq!(who["host"], &*host, "{url}: {seen}");
            assert!(
                who["pid"].as_u64().is_some_and(|p| pids.contains(&p)),
                "{url}: {seen}"
            );
            assert_eq!(who["command"], "sh -c 'sleep 3'", "{url}: {seen}");
            let since = who["since_ms"].as_u64().expect("since_ms");
            assert!(since <= now_ms && now_ms - since < 20_000, "{url}: {seen}");
        }
        let text = distlock(&url)
            .args(["status", &name])
            .output()
            .await
            .expect("status");
        let text = String::from_utf8_lossy(&text.stdout);
        assert_eq!(
            text.lines()
                .filter(|l| l.ends_with("\tsh -c 'sleep 3'"))
                .count(),
            2,
            "{url}: {text}"
        );
        for mut r in runs {
            assert_eq!(r.wait().await.expect("run").code(), Some(0), "{url}");
        }
    }
}

/// A lock and a semaphore of one name refuse each other (exit 78), both ways, on every backend:
/// a plain `run S` never runs beside `run --limit 2 S`, nor the reverse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_of_one_name_refuse_each_other() {
    let s = servers().await;
    for url in urls(&s, direct) {
        for (first, second) in [
            (&["--limit", "2"][..], &[][..]),
            (&[][..], &["--limit", "2"][..]),
        ] {
            let name = unique("kinds");
            let dir = TempDir::new("cli").expect("dir");
            let ran = dir.path().join("ran");
            let script = format!("touch {}; sleep 3", ran.display());
            let mut holder = distlock(&url)
                .args(["run", &name])
                .args(first)
                .args(["--", "sh", "-c", &script])
                .spawn()
                .expect("holder");
            assert!(
                eventually(Duration::from_secs(10), async || ran.exists()).await,
                "{url}: the first command never ran"
            );
            let other = distlock(&url)
                .args(["run", &name])
                .args(second)
                .args(["--", "true"])
                .output()
                .await
                .expect("second run");
            assert_eq!(
                other.status.code(),
                Some(78),
                "{url}: {first:?} then {second:?}: {other:?}"
            );
            assert_eq!(holder.wait().await.expect("holder").code(), Some(0));
        }
    }
}

/// Run from a terminal (`script` gives it one), the command gets the terminal: it reads what is
/// typed (in a process group of its own it was stopped by SIGTTIN and hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_command_reads_the_terminal() {
    use tokio::io::AsyncWriteExt;
    let line = format!("{BIN} --backend memory://cli run tty -- sh -c 'read a; echo got:$a'");
    let mut run = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("script (util-linux)");
    sleep(Duration::from_millis(500)).await;
    let mut stdin = run.stdin.take().expect("stdin");
    stdin.write_all(b"hello\n").await.expect("type");
    let out = tokio::time::timeout(Duration::from_secs(10), run.wait_with_output())
        .await
        .expect("the command hung on reading its terminal")
        .expect("script");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("got:hello"),
        "{out:?}"
    );
}

/// `run --shared` runs beside another `--shared` run of the name; `--exclusive` waits for them
/// and runs alone (a try of it is busy meanwhile); a plain `run` of the name is refused (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_runs_share_and_an_exclusive_run_is_alone() {
    let s = servers().await;
    for url in urls(&s, direct) {
        let dir = TempDir::new("cli").expect("dir");
        let (log, began) = (dir.path().join("log"), dir.path().join("began"));
        let name = unique("rw");
        let mut first = distlock(&url)
            .args(["run", "--shared", &name, "--", "sh", "-c"])
            .arg(format!(
                "touch {1}; sleep 2; echo first-end >> {0}",
                log.display(),
                began.display()
            ))
            .spawn()
            .expect("first reader");
        assert!(
            eventually(Duration::from_secs(10), async || began.exists()).await,
            "{url}: the first reader never ran"
        );
        let second = distlock(&url)
            .args(["run", "-s", "--no-wait", &name, "--", "sh", "-c"])
            .arg(format!("echo second >> {}", log.display()))
            .status()
            .await
            .expect("second reader");
        assert_eq!(second.code(), Some(0), "{url}: readers share");
        let tried = distlock(&url)
            .args(["run", "-x", "--no-wait", &name, "--", "true"])
            .status()
            .await
            .expect("writer's try");
        assert_eq!(tried.code(), Some(75), "{url}: a writer beside a reader");
        let plain = distlock(&url)
            .args(["run", &name, "--", "true"])
            .output()
            .await
            .expect("plain run");
        assert_eq!(plain.status.code(), Some(78), "{url}: {plain:?}");
        assert!(
            String::from_utf8_lossy(&plain.stderr).contains("read-write lock"),
            "{url}: {plain:?}"
        );
        let writer = distlock(&url)
            .args([
                "run",
                "--exclusive",
                "--wait",
                "20s",
                &name,
                "--",
                "sh",
                "-c",
            ])
            .arg(format!("echo writer >> {}", log.display()))
            .status()
            .await
            .expect("writer");
        assert_eq!(writer.code(), Some(0), "{url}");
        assert_eq!(first.wait().await.expect("first").code(), Some(0));
        let text = std::fs::read_to_string(&log).expect("log");
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            ["second", "first-end", "writer"],
            "{url}"
        );
    }
}

/// `distlock elect`: two candidates' commands run one after the other, the second with a higher
/// term as its token; while one leads, `status` shows the election's leader, a try to lead is
/// busy (75) and a plain `run` of the name is refused (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elected_commands_follow_each_other_with_rising_terms() {
    let s = servers().await;
    for url in urls(&s, direct) {
        let dir = TempDir::new("cli").expect("dir");
        let log = dir.path().join("log");
        let name = unique("elect");
        let script = format!(
            "echo \"start $DISTLOCK_TOKEN\" >> {0}; sleep 1; echo end >> {0}",
            log.display()
        );
        let candidates: Vec<_> = (0..2)
            .map(|_| {
                distlock(&url)
                    .args(["elect", &name, "--", "sh", "-c", &script])
                    .spawn()
                    .expect("candidate")
            })
            .collect();
        let leads = async || {
            let out = distlock(&url)
                .args(["status", &name, "--json"])
                .output()
                .await
                .expect("status");
            let seen: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
            seen[0]["kind"] == "election" && seen[0]["holders"][0]["holds"] == "leader"
        };
        assert!(
            eventually(Duration::from_secs(10), leads).await,
            "{url}: no leader shown"
        );
        let tried = distlock(&url)
            .args(["elect", "--no-wait", &name, "--", "true"])
            .status()
            .await
            .expect("try");
        assert_eq!(tried.code(), Some(75), "{url}: a second leader");
        let plain = distlock(&url)
            .args(["run", &name, "--", "true"])
            .status()
            .await
            .expect("plain run");
        assert_eq!(plain.code(), Some(78), "{url}: a lock beside a leader");
        for mut c in candidates {
            assert_eq!(c.wait().await.expect("candidate").code(), Some(0), "{url}");
        }
        let text = std::fs::read_to_string(&log).expect("log");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{url}: {text}");
        assert_eq!(
            (lines[1], lines[3]),
            ("end", "end"),
            "{url}: overlap: {text}"
        );
        let term = |line: &str| -> u64 {
            let token = line.strip_prefix("start ").expect("a start line");
            token.parse().expect("a term")
        };
        assert!(term(lines[2]) > term(lines[0]), "{url}: {text}");
    }
}

/// `--metrics-addr` serves the library's metrics for Prometheus while the command runs (the
/// lease held shows); an address already in use is said, with exit 69, before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_while_the_command_runs() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let busy = taken.local_addr().expect("addr").to_string();
    let refused = Command::new(BIN)
        .args(["--backend", "memory://cli", "--metrics-addr", &busy])
        .args(["run", "metered", "--", "true"])
        .output()
        .await
        .expect("run");
    assert_eq!(refused.status.code(), Some(69), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains(&busy),
        "{refused:?}"
    );
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = free.local_addr().expect("addr").to_string();
    drop(free);
    let mut run = Command::new(BIN)
        .args(["--backend", "memory://cli", "--metrics-addr", &addr])
        .args(["run", "metered", "--", "sleep", "3"])
        .kill_on_drop(true)
        .spawn()
        .expect("run");
    let scrape = async || -> String {
        let Ok(mut conn) = tokio::net::TcpStream::connect(&addr).await else {
            return String::new();
        };
        let asked = conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await;
        let mut body = String::new();
        if asked.is_ok() {
            let _ = conn.read_to_string(&mut body).await;
        }
        body
    };
    assert!(
        eventually(Duration::from_secs(5), async || scrape()
            .await
            .contains("distlock_leases_held{backend=\"memory\"} 1"))
        .await,
        "{}",
        scrape().await
    );
    assert_eq!(run.wait().await.expect("run").code(), Some(0));
}

/// Every command line of the guide's `distlock` section runs as shown (exit 0), on this run's
/// servers in place of the guide's addresses, with `true` for the scripts, in order, with the
/// guide's configuration example as `distlock.toml` (its servers replaced the same way). The
/// install line is the one not run: the test runs the binary it builds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_line_of_the_guide_runs() {
    const GUIDE: &str = include_str!("../../docs/guide.md");
    let s = servers().await;
    let redis = format!("127.0.0.1:{}", s.redis.port());
    let etcd = direct(s.etcd.client_ports.clone()).join(",");
    let block = |fence: &str, after: &str, has: &str| -> String {
        let section = GUIDE.split(after).nth(1).expect("the section");
        section
            .split(fence)
            .skip(1)
            .filter_map(|b| b.split("```").next())
            .find(|b| b.contains(has))
            .expect("the block")
            .to_string()
    };
    // A URL's authority (user, password, hosts) becomes this run's server.
    let served = |url: &str| -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let at = rest.find(['/', '?']).unwrap_or(rest.len());
        let hosts = match scheme {
            "redis" => &redis,
            "etcd" => &etcd,
            other => panic!("the guide uses {other}://: give this test its server"),
        };
        format!("{scheme}://{hosts}{}", &rest[at..])
    };
    let dir = TempDir::new("cli").expect("dir");
    let toml = block("```toml", "## Configuration reference", "[backends.");
    let config: String = toml
        .lines()
        .map(|line| match line.split_once("url = \"") {
            Some((head, rest)) => {
                let (url, tail) = rest.split_once('"').expect("a quoted URL");
                format!("{head}url = \"{}\"{tail}\n", served(url))
            }
            None => format!("{line}\n"),
        })
        .collect();
    std::fs::write(dir.path().join("distlock.toml"), config).expect("toml");
    let commands = block("```sh", "## The `distlock` command", "distlock ");
    let mut ran = 0;
    for line in commands.lines().filter(|l| l.starts_with("distlock ")) {
        let mut shown = line.to_string();
        for guide_url in line
            .split([' ', '\''])
            .filter(|w| w.starts_with("redis://") || w.starts_with("etcd://"))
        {
            shown = shown.replace(guide_url, &served(guide_url));
        }
        let shown = match shown.split_once(" -- ") {
            Some((head, _script)) => format!("{head} -- true"),
            None => shown,
        };
        let out = Command::new("sh")
            .arg("-c")
            .arg(shown.replacen("distlock ", &format!("{BIN} "), 1))
            .current_dir(dir.path())
            .output()
            .await
            .expect("sh");
        assert_eq!(out.status.code(), Some(0), "{line}\n{out:?}");
        ran += 1;
    }
    assert!(ran >= 6, "only {ran} command lines found in the guide");
}

/// Granted, started, killed: a waiter whose grant comes back too late to be valid (the release's
/// news, its take and the answer each held up 1.8 s on its link, against a 3 s TTL) starts
/// nothing: it exits 76 and the command never started (it used to start, to be killed at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_comes_back_lost_starts_nothing() {
    let s = servers().await;
    let cut = ProxyCut::to_ports([s.redis.port()]);
    let slow_url = urls(&s, |_| cut.addrs()).remove(0);
    let url = urls(&s, direct).remove(0);
    let name = unique("late-grant");
    let dir = TempDir::new("cli").expect("dir");
    let (held, ran) = (dir.path().join("held"), dir.path().join("ran"));
    let mut holder = distlock(&url)
        .args(["run", "--ttl", "3s", &name, "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 1.5", held.display()))
        .spawn()
        .expect("holder");
    assert!(
        eventually(Duration::from_secs(10), async || held.exists()).await,
        "the holder never ran"
    );
    let waiter = distlock(&slow_url)
        .args(["run", "--ttl", "3s", &name, "--", "touch"])
        .arg(&ran)
        .stderr(Stdio::piped())
        .spawn()
        .expect("waiter");
    let client = LockClient::new(connect(&url).await.expect("connect"));
    assert!(
        eventually(Duration::from_secs(10), async || waiters(&client, &name)
            .await
            == 1)
        .await,
        "the waiter never queued"
    );
    cut.0
        .iter()
        .for_each(|p| p.set_mode(ProxyMode::Delay(Duration::from_millis(1800))));
    assert_eq!(holder.wait().await.expect("holder").code(), Some(0));
    let out = tokio::time::timeout(Duration::from_secs(30), waiter.wait_with_output())
        .await
        .expect("the waiter never ended")
        .expect("waiter");
    cut.restore();
    assert!(!ran.exists(), "the command ran on a lost lease: {out:?}");
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    // Started and killed at once, the command may not have got as far as its `touch`: what
    // `distlock` did is on its stderr.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("before the command started"),
        "{out:?}"
    );
}
