//! PostgreSQL 15 (Debian's `postgresql`): one server, `initdb` into a temp dir and run as the
//! `postgres` user when the tests run as root (the server refuses root), with stock settings
//! apart from the port, the loopback address, the socket directory and what a caller passes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{HarnessError, ServerProcess, TempDir, TlsFiles, free_port, require, retry_port_clash};

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// One PostgreSQL server on a free loopback port; superuser `postgres`, trusted on loopback.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    process: ServerProcess,
    dir: TempDir,
}

impl PostgresServer {
    /// Starts it with stock settings and waits until it accepts connections.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(&[])
    }

    /// Starts it with `settings` (`-c name=value`), for a scenario that varies one.
    pub fn start_with(settings: &[(&str, &str)]) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(settings))
    }

    fn start_once(settings: &[(&str, &str)]) -> Result<Self, HarnessError> {
        Self::start_from(settings, None, None)
    }

    /// Starts it also serving TLS with `tls`'s certificate (`ssl=on`; plain connections stay
    /// allowed, as on a stock server with TLS on).
    pub fn start_tls(tls: &TlsFiles) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_from(&[], None, Some(tls)))
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`, asynchronous: stock settings on
    /// both), started and ready.
    pub fn start_standby(primary: &PostgresServer) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_from(&[], Some(primary.port), None))
    }

    /// A new server: `initdb`, or a base backup of the primary on `of` that follows it.
    fn start_from(
        settings: &[(&str, &str)],
        of: Option<u16>,
        tls: Option<&TlsFiles>,
    ) -> Result<Self, HarnessError> {
        let postgres = format!("{BIN}/postgres");
        require(&postgres, "postgresql")?;
        let io = |source| HarnessError::Io {
            server: "postgres".into(),
            source,
        };
        let dir = TempDir::new("postgres").map_err(io)?;
        let run_as = server_user();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(io)?;
        }
        let data = dir.path().join("data");
        match of {
            None => initdb(&data, run_as),
            Some(port) => base_backup(&data, port, run_as),
        }
        .map_err(io)?;
        let port = free_port();
        let mut args: Vec<OsString> = vec![
            "-D".into(),
            data.into(),
            "-p".into(),
            port.to_string().into(),
            "-k".into(),
            dir.path().into(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
        ];
        let mut settings: Vec<(&str, String)> =
            settings.iter().map(|(n, v)| (*n, v.to_string())).collect();
        if let Some(tls) = tls {
            // The server reads its key only if the server's user owns it, mode 0600.
            let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
            std::fs::copy(&tls.cert, &cert).map_err(io)?;
            std::fs::copy(&tls.key, &key).map_err(io)?;
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(io)?;
            if let Some((uid, gid)) = run_as {
                for f in [&cert, &key] {
                    std::os::unix::fs::chown(f, Some(uid), Some(gid)).map_err(io)?;
                }
            }
            settings.push(("ssl", "on".into()));
            settings.push(("ssl_cert_file", cert.display().to_string()));
            settings.push(("ssl_key_file", key.display().to_string()));
        }
        for (name, value) in settings {
            args.push("-c".into());
            args.push(format!("{name}={value}").into());
        }
        let process = ServerProcess::start_forking(
            format!("postgres :{port}"),
            postgres.into(),
            args,
            dir.path().join("postgres.log"),
            Box::new(move || ready(port)),
            run_as,
        )?;
        Ok(PostgresServer { port, process, dir })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server process, for fault tests (its backends die with it).
    pub fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

/// What makes a standby synchronous: the primary waits for any one to flush each commit. Set
/// on both servers of a [`PostgresPair`] (a standby ignores it until promoted), the setting
/// that pair exists to vary.
const SYNCHRONOUS: &[(&str, &str)] = &[("synchronous_standby_names", "*")];

/// A primary and its synchronous standby, and the failover an operator's tool (Patroni,
/// repmgr) makes: the primary killed, the standby promoted, the old primary rebuilt from the
/// new one as its synchronous standby (at the same port).
#[derive(Debug)]
pub struct PostgresPair {
    servers: [PostgresServer; 2],
    primary: AtomicUsize,
}

impl PostgresPair {
    /// Starts both and waits until the standby streams synchronously.
    pub fn start() -> Result<Self, HarnessError> {
        let primary = PostgresServer::start_with(SYNCHRONOUS)?;
        let standby =
            retry_port_clash(|| PostgresServer::start_from(SYNCHRONOUS, Some(primary.port), None))?;
        let pair = PostgresPair {
            servers: [primary, standby],
            primary: AtomicUsize::new(0),
        };
        pair.until_synchronous()?;
        Ok(pair)
    }

    /// Server `i` (0 or 1).
    pub fn server(&self, i: usize) -> &PostgresServer {
        &self.servers[i]
    }

    /// Which server is the primary now.
    pub fn primary(&self) -> usize {
        self.primary.load(Ordering::SeqCst)
    }

    /// Kills the primary, promotes the standby, and rebuilds the old primary as the new one's
    /// synchronous standby; returns once it streams. Commits wait meanwhile: the new primary
    /// has no synchronous standby until then.
    pub fn fail_over(&self) -> Result<(), HarnessError> {
        let io = |source| HarnessError::Io {
            server: "postgres".into(),
            source,
        };
        let (old, new) = (self.primary(), 1 - self.primary());
        let run_as = server_user();
        self.servers[old].process.kill();
        tool(
            "pg_ctl",
            |cmd| {
                cmd.args(["promote", "-w", "-t", "60", "-D"])
                    .arg(self.servers[new].data());
            },
            run_as,
        )
        .map_err(io)?;
        self.primary.store(new, Ordering::SeqCst);
        let data = self.servers[old].data();
        std::fs::remove_dir_all(&data).map_err(io)?;
        base_backup(&data, self.servers[new].port, run_as).map_err(io)?;
        self.servers[old].process.restart()?;
        self.until_synchronous()
    }

    /// Waits until the primary has a synchronous standby streaming.
    fn until_synchronous(&self) -> Result<(), HarnessError> {
        let port = self.servers[self.primary()].port;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = Command::new(format!("{BIN}/psql"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
                .args(["-d", "postgres", "-Atc"])
                .arg("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                .stdin(Stdio::null())
                .output();
            if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "1") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Io {
                    server: format!("postgres :{port}"),
                    source: std::io::Error::other("no synchronous standby within 60 s"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `(uid, gid)` of the `postgres` user when we run as root (the package creates it), else
/// `None`: we run it as ourselves.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions; getpwnam reads a static record we copy at once.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let pw = libc::getpwnam(c"postgres".as_ptr());
        (!pw.is_null()).then(|| ((*pw).pw_uid, (*pw).pw_gid))
    }
}

fn initdb(data: &Path, run_as: Option<(u32, u32)>) -> std::io::Result<()> {
    tool(
        "initdb",
        |cmd| {
            cmd.arg("-D")
                .arg(data)
                // --no-sync: only initdb's own files skip fsync; the server runs with stock
                // settings.
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]);
        },
        run_as,
    )
}

/// A copy of the primary on `port` into `data`, set up to follow it (`-R`: `standby.signal`
/// and `primary_conninfo`). A stock primary allows it: trusted replication on loopback, WAL
/// senders and the `replica` WAL level are the defaults.
fn base_backup(data: &Path, port: u16, run_as: Option<(u32, u32)>) -> std::io::Result<()> {
    tool(
        "pg_basebackup",
        |cmd| {
            cmd.arg("-D")
                .arg(data)
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
                .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
        },
        run_as,
    )
}

/// Runs one of PostgreSQL's programs to completion (as the server's user).
fn tool(
    name: &str,
    args: impl FnOnce(&mut Command),
    run_as: Option<(u32, u32)>,
) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(format!("{BIN}/{name}"));
    args(&mut cmd);
    cmd.stdin(Stdio::null());
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid).gid(gid);
    }
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "{name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    )))
}

/// Whether the server accepts connections (`pg_isready`).
fn ready(port: u16) -> bool {
    Command::new(format!("{BIN}/pg_isready"))
        .args(["-q", "-h", "127.0.0.1", "-t", "1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// pgbouncer (Debian's `pgbouncer`) in front of a [`PostgresServer`], in a pool mode the test
/// chooses; stock settings otherwise (its default pool size), trusting loopback.
#[derive(Debug)]
pub struct Pgbouncer {
    port: u16,
    _process: ServerProcess,
    _dir: TempDir,
}

impl Pgbouncer {
    /// Starts it in `pool_mode` (`session` or `transaction`) before `server`.
    pub fn start(server: &PostgresServer, pool_mode: &str) -> Result<Self, HarnessError> {
        retry_port_clash(|| Self::start_once(server, pool_mode))
    }

    fn start_once(server: &PostgresServer, pool_mode: &str) -> Result<Self, HarnessError> {
        const BINARY: &str = "/usr/sbin/pgbouncer";
        require(BINARY, "pgbouncer")?;
        let io = |source| HarnessError::Io {
            server: "pgbouncer".into(),
            source,
        };
        let dir = TempDir::new("pgbouncer").map_err(io)?;
        let run_as = server_user();
        let port = free_port();
        let (users, ini) = (
            dir.path().join("users.txt"),
            dir.path().join("pgbouncer.ini"),
        );
        // Trust still needs the user listed.
        std::fs::write(&users, "\"postgres\" \"\"\n").map_err(io)?;
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = {pool_mode}\n",
                server.port,
                users.display()
            ),
        )
        .map_err(io)?;
        if let Some((uid, gid)) = run_as {
            for p in [dir.path(), users.as_path(), ini.as_path()] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(io)?;
            }
        }
        let process = ServerProcess::start_forking(
            format!("pgbouncer :{port}"),
            BINARY.into(),
            vec![ini.into()],
            dir.path().join("pgbouncer.log"),
            Box::new(move || ready(port)),
            run_as,
        )?;
        Ok(Pgbouncer {
            port,
            _process: process,
            _dir: dir,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}
