//! The server harness starts real servers, applies faults, and leaves nothing running.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use distlock_conformance::harness::{
    ClockOffset, EtcdCluster, LatencyLink, Proxy, ProxyMode, RedisCluster, RedisMasters,
    RedisServer, ZkEnsemble, free_port,
};

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

fn redis_ping(port: u16, timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn redis_starts_kills_restarts_pauses_and_stops() {
    let server = RedisServer::start().expect("redis-server");
    assert!(server.url().starts_with("redis://127.0.0.1:"));
    assert_eq!(
        redis_ping(server.port(), Duration::from_secs(2)).expect("ping"),
        "+PONG\r\n"
    );
    let p = server.process();
    p.pause();
    assert!(
        redis_ping(server.port(), Duration::from_millis(300)).is_err(),
        "a paused server answered"
    );
    p.resume();
    assert_eq!(
        redis_ping(server.port(), Duration::from_secs(2)).expect("ping"),
        "+PONG\r\n"
    );
    let pid = p.pid().expect("pid");
    p.kill();
    assert!(!pid_alive(pid));
    assert!(redis_ping(server.port(), Duration::from_millis(300)).is_err());
    p.restart().expect("restart");
    assert_eq!(
        redis_ping(server.port(), Duration::from_secs(2)).expect("ping"),
        "+PONG\r\n"
    );
    let pid = p.pid().expect("pid");
    drop(server);
    assert!(!pid_alive(pid), "redis outlived its handle");
}

/// The clock shim moves a server's wall clock (its `TIME`, and so key expiry) and nothing else:
/// a key with 60 s to live is gone after a jump of 2 minutes, and the server keeps serving,
/// also after a restart on the same clock.
#[test]
fn a_server_clock_jumps_forward_and_expires_keys_early() {
    let clock = ClockOffset::new().expect("the clock shim");
    let server = RedisServer::start_on_clock(&clock).expect("redis-server on the shim");
    let time = |s: &RedisServer| -> u64 {
        let reply = s.command("TIME").expect("TIME");
        // *2, $10, <seconds>, $6, <microseconds>
        reply
            .lines()
            .nth(2)
            .and_then(|l| l.trim().parse().ok())
            .expect("seconds")
    };
    let before = time(&server);
    assert_eq!(
        server
            .command("SET k v PX 60000")
            .as_deref()
            .and_then(|r| r.lines().next()),
        Some("+OK")
    );
    assert_eq!(
        clock.jump(Duration::from_secs(120)),
        Duration::from_secs(120)
    );
    let after = time(&server);
    assert!(
        (before + 115..before + 130).contains(&after),
        "TIME moved from {before} to {after}, not by 2 minutes"
    );
    assert_eq!(
        server
            .command("EXISTS k")
            .as_deref()
            .and_then(|r| r.lines().next()),
        Some(":0"),
        "a key outlived a clock jump past its TTL"
    );
    server.process().kill();
    server
        .process()
        .restart()
        .expect("restart on the same clock");
    assert!(
        time(&server) >= after,
        "the restarted server lost the offset"
    );
}

#[test]
fn independent_redis_masters() {
    let masters = RedisMasters::start(3).expect("3 masters");
    assert_eq!(masters.nodes.len(), 3);
    assert!(masters.url().starts_with("redlock://127.0.0.1:"));
    assert_eq!(masters.url().matches(',').count(), 2);
}

/// A master cut from the other masters by its bus proxies, while its client port still
/// answers: past the node timeout it knows it is in the minority (`cluster_state:fail`) and
/// the others mark it failed; healed, the cluster is whole again.
#[test]
fn a_redis_cluster_master_is_cut_from_its_peers_and_healed() {
    let cluster =
        RedisCluster::start_with_bus_links(3, Duration::from_millis(1_000)).expect("cluster");
    let state = |i: usize| cluster.nodes[i].command("CLUSTER INFO").unwrap_or_default();
    let until = |what: &str, check: &dyn Fn() -> bool| {
        for _ in 0..200 {
            if check() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{what} within 10 s");
    };
    cluster.isolate(0, true);
    until("the cut master sees itself in the minority", &|| {
        state(0).contains("cluster_state:fail")
    });
    until("the others mark it failed", &|| {
        cluster.nodes[1].command("CLUSTER NODES").is_some_and(|n| {
            n.lines()
                .any(|l| !l.contains("myself") && l.contains(" master,fail "))
        })
    });
    assert!(
        cluster.nodes[0]
            .command("PING")
            .is_some_and(|r| r.starts_with("+PONG"))
    );
    cluster.isolate(0, false);
    until("the cluster is whole again", &|| {
        (0..3).all(|i| state(i).contains("cluster_state:ok"))
    });
}

#[test]
fn etcd_single_and_three_node_cluster() {
    let single = EtcdCluster::start(1).expect("etcd");
    assert_eq!(single.leader(), Some(0));
    let cluster = EtcdCluster::start(3).expect("3-node etcd");
    let leader = cluster.leader().expect("a leader");
    let pids: Vec<u32> = cluster.members.iter().filter_map(|m| m.pid()).collect();
    assert_eq!(pids.len(), 3);
    cluster.members[leader].kill();
    let mut new_leader = None;
    for _ in 0..100 {
        new_leader = cluster.leader();
        if new_leader.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        new_leader.is_some_and(|l| l != leader),
        "no new leader after killing the old one"
    );
    drop(cluster);
    assert!(
        pids.iter().all(|&p| !pid_alive(p)),
        "etcd members outlived the handle"
    );
}

#[test]
fn zookeeper_standalone_and_three_node_ensemble() {
    let single = ZkEnsemble::start(1).expect("zookeeper");
    assert_eq!(single.leader(), Some(0));
    assert!(single.url().starts_with("zk://127.0.0.1:"));
    let ensemble = ZkEnsemble::start(3).expect("3-node zookeeper");
    assert!(ensemble.leader().is_some(), "an ensemble without a leader");
    let pids: Vec<u32> = ensemble.nodes.iter().filter_map(|n| n.pid()).collect();
    drop(ensemble);
    assert!(
        pids.iter().all(|&p| !pid_alive(p)),
        "zookeeper nodes outlived the handle"
    );
}

#[test]
fn a_latency_link_delays_each_way_keeps_order_and_does_not_throttle() {
    let server = RedisServer::start().expect("redis-server");
    let one_way = Duration::from_millis(20);
    let link = LatencyLink::start(([127, 0, 0, 1], server.port()).into(), one_way).expect("link");
    let mut s = TcpStream::connect(link.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    // 50 requests written one by one, all in flight at once: each is answered, in order, and
    // the first no sooner than a round trip; sent in a burst, they are not held back one delay
    // each (that would take 50 round trips, 2 s).
    let started = std::time::Instant::now();
    for i in 0..50 {
        s.write_all(format!("ECHO {i}\r\n").as_bytes())
            .expect("write");
    }
    let expected: String = (0..50)
        .map(|i| format!("${}\r\n{i}\r\n", i.to_string().len()))
        .collect();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < expected.len() {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "the link closed early");
        if got.is_empty() {
            assert!(
                started.elapsed() >= 2 * one_way,
                "answered before a round trip of the link"
            );
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(String::from_utf8_lossy(&got), expected);
    assert!(
        started.elapsed() < 25 * 2 * one_way,
        "the link held each request back in turn: {:?}",
        started.elapsed()
    );
    drop(link);
    assert!(
        matches!(s.read(&mut buf), Ok(0) | Err(_)),
        "a connection outlived the link"
    );
}

#[test]
fn proxy_passes_delays_blackholes_and_resets() {
    let server = RedisServer::start().expect("redis-server");
    let proxy = Proxy::start(([127, 0, 0, 1], server.port()).into()).expect("proxy");
    let port = proxy.addr().port();
    assert_eq!(
        redis_ping(port, Duration::from_secs(2)).expect("through proxy"),
        "+PONG\r\n"
    );

    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(400)));
    assert!(
        redis_ping(port, Duration::from_millis(150)).is_err(),
        "the delay was not applied"
    );
    assert_eq!(
        redis_ping(port, Duration::from_secs(3)).expect("delayed"),
        "+PONG\r\n"
    );

    proxy.set_mode(ProxyMode::Blackhole);
    assert!(
        redis_ping(port, Duration::from_millis(300)).is_err(),
        "a blackholed request was answered"
    );

    // Requests still reach the server; only the replies are lost.
    proxy.set_mode(ProxyMode::DropReplies);
    let mut s = TcpStream::connect(proxy.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    s.write_all(b"SET dropped-reply 1\r\n").expect("write");
    let mut buf = [0u8; 16];
    assert!(s.read(&mut buf).is_err(), "a reply got through");
    let mut direct = TcpStream::connect(("127.0.0.1", server.port())).expect("direct");
    direct
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    direct
        .write_all(b"EXISTS dropped-reply\r\n")
        .expect("write");
    let n = direct.read(&mut buf).expect("read");
    assert_eq!(&buf[..n], b":1\r\n", "the request did not reach the server");

    proxy.set_mode(ProxyMode::Pass);
    let mut s = TcpStream::connect(proxy.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    s.write_all(b"PING\r\n").expect("write");
    let mut buf = [0u8; 16];
    assert!(s.read(&mut buf).expect("read") > 0);
    proxy.reset();
    std::thread::sleep(Duration::from_millis(100));
    let closed = match s.read(&mut buf) {
        Ok(0) | Err(_) => true,
        Ok(_) => false,
    };
    assert!(closed, "reset left the connection open");
}

#[test]
fn a_missing_binary_names_its_package() {
    let err = distlock_conformance::harness::require("/nonexistent/etcd", "etcd-server")
        .expect_err("a missing binary must fail");
    assert!(
        err.to_string().contains("apt-get install etcd-server"),
        "{err}"
    );
    distlock_conformance::harness::require("/usr/bin/etcd", "etcd-server")
        .expect("etcd is installed");
    assert!(free_port() > 0);
}
