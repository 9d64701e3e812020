//! redis-server, single or N independent masters (for Redlock).

use std::time::Duration;

use super::{HarnessError, ServerProcess, TempDir, ask, free_port, local, require};

const BINARY: &str = "/usr/bin/redis-server";

/// One redis-server on a free loopback port, without persistence (a restart comes back empty,
/// which is the Redlock crash hazard the tests need).
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    process: ServerProcess,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts it and waits for `PONG`.
    pub fn start() -> Result<Self, HarnessError> {
        require(BINARY, "redis-server")?;
        let dir = TempDir::new("redis").map_err(|source| HarnessError::Io {
            server: "redis".into(),
            source,
        })?;
        let port = free_port();
        let args = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--repl-diskless-sync-delay",
            "0",
            "--dir",
            &dir.path().to_string_lossy(),
        ]
        .iter()
        .map(Into::into)
        .collect();
        let process = ServerProcess::start(
            format!("redis-server :{port}"),
            BINARY.into(),
            args,
            dir.path().join("redis.log"),
            Box::new(move || ping(port)),
        )?;
        Ok(RedisServer {
            port,
            process,
            _dir: dir,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process, for faults.
    pub fn process(&self) -> &ServerProcess {
        &self.process
    }
}

fn ping(port: u16) -> bool {
    ask(local(port), b"PING\r\nQUIT\r\n", Duration::from_millis(500))
        .is_some_and(|r| r.starts_with("+PONG"))
}

/// N independent redis masters (no replication between them), for Redlock.
#[derive(Debug)]
pub struct RedisMasters {
    /// The servers, in order.
    pub nodes: Vec<RedisServer>,
}

impl RedisMasters {
    /// Starts `n` servers.
    pub fn start(n: usize) -> Result<Self, HarnessError> {
        Ok(RedisMasters {
            nodes: (0..n)
                .map(|_| RedisServer::start())
                .collect::<Result<_, _>>()?,
        })
    }

    /// `redlock://127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }
}
