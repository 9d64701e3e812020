//! The README's main job (`examples/oversell.rs`, short form) against each real backend: the same
//! table shape everywhere, the locked rows exact, the fenced stale write refused.

use std::process::Command;

use distlock_conformance::harness::{EtcdCluster, PostgresServer, RedisServer, ZkEnsemble};

/// Runs the demo on `url` and returns its table rows (label, sold, rejected, verdict).
fn run_demo(url: &str) -> Vec<(String, u64, u64, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_oversell-demo"))
        .args(["--backend", url, "--short"])
        .output()
        .expect("run the demo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo on {url} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| scenario"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 5, "row shape: {l}");
            (
                cells[0].to_string(),
                cells[1].parse().expect("sold"),
                cells[3].parse().expect("rejected"),
                cells[4].to_string(),
            )
        })
        .collect()
}

fn check(url: &str) {
    let rows = run_demo(url);
    let labels: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let mut expected = vec![
        "no lock",
        "distributed lock",
        "lock, holder paused past TTL, unfenced write",
        "lock, holder paused past TTL, fenced write",
    ];
    // PostgreSQL adds the stock in the same database, written through the guard.
    let guarded = url.starts_with("postgres");
    if guarded {
        expected.push("lock, holder paused past TTL, guarded transaction");
    }
    assert_eq!(labels, expected, "{url}");
    assert!(rows[0].3.starts_with("OVERSOLD"), "{url}: {rows:?}");
    assert_eq!(rows[1].3, "exact", "{url}: {rows:?}");
    assert_eq!(rows[3].3, "exact", "{url}: {rows:?}");
    if guarded {
        assert_eq!(rows[4].3, "exact", "{url}: {rows:?}");
        assert_eq!(
            rows[4].2, 1,
            "the paused pod's write refused by the guard: {rows:?}"
        );
    }
}

/// Every server with its stock settings and every URL with the backend's default options (etcd's
/// 10 s session, whose keep-alives leave an idle connection to a stock server's ping policy).
#[test]
fn the_demo_tells_the_same_story_on_every_backend() {
    check("memory://demo");
    let redis = RedisServer::start().expect("redis");
    check(&format!("{}?prefix=demo", redis.url()));
    let etcd = EtcdCluster::start(1).expect("etcd");
    check(&format!("etcd://{}/demo", etcd.endpoints().join(",")));
    let zk = ZkEnsemble::start(1).expect("zookeeper");
    check(&format!("zk://{}/demo", zk.connect_string()));
    let postgres = PostgresServer::start().expect("postgres");
    check(&format!("{}?schema=demo", postgres.url()));
}

/// A configuration that cannot be used is reported before the table starts, with a distinct
/// exit code.
#[test]
fn a_bad_backend_is_reported_before_the_table() {
    let out = Command::new(env!("CARGO_BIN_EXE_oversell-demo"))
        .args(["--backend", "nosuch://x", "--short"])
        .output()
        .expect("run the demo");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stdout).is_empty(),
        "printed before the error: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("nosuch"));
}

/// The election example (`examples/scheduler.rs`) on `url`: it exits 0 only when one leader
/// ran at a time, every job was fenced by its term, the killed leader was replaced, the
/// resigned one handed over, and the deposed term's late write was refused.
fn check_scheduler(url: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_scheduler-demo"))
        .args(["--backend", url])
        .output()
        .expect("run the scheduler example");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scheduler on {url} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in ["after the kill", "after the resign", "refused", "OK: "] {
        assert!(text.contains(line), "{url}: no {line:?} in {text}");
    }
}

/// Stock servers; etcd and ZooKeeper with a short session, which is the election's lease there.
#[test]
fn the_scheduler_elects_replaces_and_hands_over_on_every_backend() {
    check_scheduler("memory://scheduler");
    let redis = RedisServer::start().expect("redis");
    check_scheduler(&format!("{}?prefix=scheduler", redis.url()));
    let etcd = EtcdCluster::start(1).expect("etcd");
    check_scheduler(&format!(
        "etcd://{}/scheduler?session_ttl=2s",
        etcd.endpoints().join(",")
    ));
    let zk = ZkEnsemble::start(1).expect("zookeeper");
    check_scheduler(&format!(
        "zk://{}/scheduler?session_timeout=4s",
        zk.connect_string()
    ));
}
