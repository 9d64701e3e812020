//! Real servers for the tests: started on free loopback ports with temp data dirs, probed until
//! ready, and stopped when their handle drops, also after a panic. Every server is spawned from
//! one long-lived thread with `PR_SET_PDEATHSIG = SIGKILL`, so even a test process that dies
//! without unwinding takes its servers with it.
//!
//! Single servers and multi-node deployments: [`RedisServer`] / [`RedisMasters`],
//! [`EtcdCluster`] (1 or 3 members), [`ZkEnsemble`] (standalone or 3 nodes), [`PostgresServer`]. Fault hooks:
//! [`ServerProcess::kill`], [`ServerProcess::restart`], [`ServerProcess::pause`] /
//! [`ServerProcess::resume`], the TCP [`Proxy`] between a client and a server, and a server
//! wall clock moved forward ([`ClockOffset`]). A [`LatencyLink`] puts a fixed network delay
//! between a client and a server (the benchmark's datacenter setting). A
//! [`HolderProcess`] runs a lock holder in another process, to pause (SIGSTOP) or kill;
//! [`reply_lost_as_the_runtime_ends`] ends a client's runtime while its wait has no answer.

mod clock;
mod etcd;
mod holder;
mod latency;
mod peer;
mod postgres;
mod process;
mod proxy;
mod redis;
mod runtime_end;
mod tls;
mod zookeeper;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use clock::ClockOffset;
pub use etcd::{EtcdCluster, metric_sum};
pub use holder::{HolderProcess, holder_binary};
pub use latency::LatencyLink;
pub use peer::{PeerHolder, shared_election};
pub use postgres::{Pgbouncer, PostgresPair, PostgresServer};
pub use process::ServerProcess;
pub use proxy::{Proxy, ProxyMode};
pub use redis::{RedisCluster, RedisMasters, RedisReplicated, RedisSentinel, RedisServer};
pub use runtime_end::{LoseReplies, reply_lost_as_the_runtime_ends};
pub use tls::TlsFiles;
pub use zookeeper::{ZkEnsemble, packets_received, watch_count};

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The server binary is not installed.
    #[error(
        "{binary} is not installed: run `apt-get install {package}` (or `bash scripts/test.sh`, which does)"
    )]
    Missing {
        /// The missing file.
        binary: String,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// The server did not become ready in time.
    #[error("{server} was not ready after {after:?} (exited: {exited}); last log lines:\n{log}")]
    NotReady {
        /// Which server.
        server: String,
        /// How long we waited.
        after: Duration,
        /// Whether its process had ended.
        exited: bool,
        /// The tail of its log.
        log: String,
    },
    /// Spawning or preparing the server failed.
    #[error("starting {server}: {source}")]
    Io {
        /// Which server.
        server: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Checks that `path` exists, else names the package to install.
pub fn require(path: &str, package: &'static str) -> Result<(), HarnessError> {
    if Path::new(path).exists() {
        Ok(())
    } else {
        Err(HarnessError::Missing {
            binary: path.to_string(),
            package,
        })
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    // Binding port 0 lets the kernel pick an unused port; it stays unused for a while after.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// Runs `start` again (3 tries in all) when a server could not bind a port picked free, or
/// exited before it was ready (ZooKeeper's log says nothing here about why): between the pick
/// and the bind, another socket can take the port (servers' own outgoing connections draw from
/// the same ephemeral range).
pub(crate) fn retry_port_clash<T>(
    mut start: impl FnMut() -> Result<T, HarnessError>,
) -> Result<T, HarnessError> {
    let mut tries = 1;
    loop {
        match start() {
            Err(e)
                if tries < 3
                    && (matches!(e, HarnessError::NotReady { exited: true, .. })
                        || e.to_string()
                            .to_lowercase()
                            .contains("address already in use")) =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<tmp>/distlock-<label>-<pid>-<n>`. The first call of a process also removes
    /// such directories of processes that are gone: servers shared by a whole test binary live
    /// in statics, which are never dropped (their processes die with the test process through
    /// `PR_SET_PDEATHSIG`, their directories would stay behind, ~400 MB per etcd member).
    pub fn new(label: &str) -> std::io::Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        static SWEEP: std::sync::Once = std::sync::Once::new();
        SWEEP.call_once(sweep_orphans);
        let dir = std::env::temp_dir().join(format!(
            "distlock-{label}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Removes `<tmp>/distlock-<label>-<pid>-<n>` directories whose process no longer runs.
fn sweep_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("distlock-")) else {
            continue;
        };
        let mut parts = rest.rsplit('-');
        let (Some(n), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        if n.parse::<u64>().is_err() || parts.next().is_none() {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let gone = !Path::new(&format!("/proc/{pid}")).exists();
        if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sends `request` to `addr` and returns what the server answered before closing or timing out
/// (at most about 1 MiB: etcd's metrics page is a few hundred KiB).
pub(crate) fn ask(addr: SocketAddr, request: &[u8], timeout: Duration) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    s.write_all(request).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > 1024 * 1024 {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}

/// A loopback address.
pub(crate) fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphaned_directories_are_swept_and_live_ones_kept() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let dead = child.id();
        child.wait().expect("wait");
        let tmp = std::env::temp_dir();
        let orphan = tmp.join(format!("distlock-sweeptest-{dead}-0"));
        let live = tmp.join(format!("distlock-sweeptest-{}-0", std::process::id()));
        for d in [&orphan, &live] {
            std::fs::create_dir_all(d.join("data")).expect("mkdir");
        }
        sweep_orphans();
        assert!(!orphan.exists(), "the dead process's directory stayed");
        assert!(live.exists(), "a live process's directory was removed");
        std::fs::remove_dir_all(&live).expect("cleanup");
    }
}
