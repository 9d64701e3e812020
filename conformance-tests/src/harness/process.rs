//! One server process: spawn, readiness, kill, restart, pause, resume.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::HarnessError;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns from one thread that lives as long as the process: `PR_SET_PDEATHSIG` fires when the
/// spawning *thread* exits, so spawning from a short-lived test thread would kill the server early.
pub(crate) fn spawn(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("distlock-harness-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
                    unsafe {
                        cmd.pre_exec(|| {
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .unwrap_or_else(|e| panic!("cannot start the harness spawner thread: {e}"));
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("harness spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("harness spawner thread is gone"))?
}

/// A running server that is killed when the handle drops.
pub struct ServerProcess {
    label: String,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: PathBuf,
    ready: Box<dyn Fn() -> bool + Send + Sync>,
    /// `(uid, gid)` to run as (PostgreSQL refuses to run as root).
    run_as: Option<(u32, u32)>,
    /// The server forks a process per connection (PostgreSQL): every signal goes to its
    /// children too (they make themselves leaders of their own process groups, so a group
    /// signal misses them; they would serve on for a moment after a kill, and a pause would
    /// stop only the parent).
    forking: bool,
    child: Mutex<Option<Child>>,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("label", &self.label)
            .field("pid", &self.pid())
            .finish()
    }
}

const READY_TIMEOUT: Duration = Duration::from_secs(60);

impl ServerProcess {
    /// Starts `program args`, logging to `log`, and waits until `ready` answers true.
    pub(crate) fn start(
        label: String,
        program: PathBuf,
        args: Vec<OsString>,
        log: PathBuf,
        ready: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Result<Self, HarnessError> {
        Self::start_with_env(label, program, args, Vec::new(), log, ready)
    }

    /// [`ServerProcess::start`] for a server that forks workers (its children signalled with it),
    /// as user `uid` and group `gid` when given (restarts too).
    pub(crate) fn start_forking(
        label: String,
        program: PathBuf,
        args: Vec<OsString>,
        log: PathBuf,
        ready: Box<dyn Fn() -> bool + Send + Sync>,
        run_as: Option<(u32, u32)>,
    ) -> Result<Self, HarnessError> {
        Self::launch_new(label, program, args, Vec::new(), log, ready, (run_as, true))
    }

    /// [`ServerProcess::start`] with `env` added to the environment (restarts keep it).
    pub(crate) fn start_with_env(
        label: String,
        program: PathBuf,
        args: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
        log: PathBuf,
        ready: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Result<Self, HarnessError> {
        Self::launch_new(label, program, args, env, log, ready, (None, false))
    }

    fn launch_new(
        label: String,
        program: PathBuf,
        args: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
        log: PathBuf,
        ready: Box<dyn Fn() -> bool + Send + Sync>,
        (run_as, forking): (Option<(u32, u32)>, bool),
    ) -> Result<Self, HarnessError> {
        let p = ServerProcess {
            label,
            program,
            args,
            env,
            log,
            ready,
            run_as,
            forking,
            child: Mutex::new(None),
        };
        p.launch()?;
        p.wait_ready(READY_TIMEOUT)?;
        Ok(p)
    }

    /// The label, for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    fn launch(&self) -> Result<(), HarnessError> {
        let io = |source| HarnessError::Io {
            server: self.label.clone(),
            source,
        };
        let out = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io)?;
        let err = out.try_clone().map_err(io)?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        let child = spawn(cmd).map_err(io)?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    /// Waits until the readiness probe answers, or fails with the log's tail.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), HarnessError> {
        let start = Instant::now();
        let mut exited = false;
        while start.elapsed() < timeout {
            if (self.ready)() {
                return Ok(());
            }
            if self.exited() {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(HarnessError::NotReady {
            server: self.label.clone(),
            after: start.elapsed(),
            exited,
            log: self.log_tail(20),
        })
    }

    fn exited(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        matches!(
            child.as_mut().map(|c| c.try_wait()),
            Some(Ok(Some(_))) | None
        )
    }

    /// Whether the readiness probe answers right now.
    pub fn is_ready(&self) -> bool {
        (self.ready)()
    }

    /// The last `n` lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        let lines: Vec<String> = File::open(&self.log)
            .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
            .unwrap_or_default();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            self.signal_pid(pid, sig);
        }
    }

    /// `sig` to `pid`, and to its children for a forking server: stopped first (it cannot fork
    /// while the children are signalled), then the children, then itself.
    fn signal_pid(&self, pid: u32, sig: libc::c_int) {
        let send = |pid: u32, sig| {
            // SAFETY: kill(2) on our own child or its children; no memory is involved.
            unsafe {
                libc::kill(pid as libc::pid_t, sig);
            }
        };
        if self.forking {
            if sig != libc::SIGCONT {
                send(pid, libc::SIGSTOP);
            }
            children(pid).into_iter().for_each(|c| send(c, sig));
        }
        send(pid, sig);
    }

    /// SIGKILL (a forking server's children too), and reap the process. Idempotent.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut c) = child.take() {
            self.signal_pid(c.id(), libc::SIGKILL);
            let _ = c.wait();
        }
    }

    /// Starts the same command again (same ports, same data dir) and waits until ready.
    pub fn restart(&self) -> Result<(), HarnessError> {
        self.kill();
        self.launch()?;
        self.wait_ready(READY_TIMEOUT)
    }

    /// SIGSTOP: the process stops answering but keeps its sockets.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`ServerProcess::pause`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// The processes whose parent is `pid` (read from `/proc`).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            // `pid (comm) state ppid ...`: the command may hold spaces and parentheses.
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}
