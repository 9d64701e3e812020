//! The guard: a small process of its own (the same binary, `distlock __guard`) that keeps the
//! command from running without its lock holder. The command's own process cannot see its
//! holder die or stop, and a parent-death signal reaches the direct child only, not its
//! children; the guard watches `distlock` and acts on the command's whole process group:
//!
//! * `distlock` ends without saying the command is done (SIGKILL, SIGQUIT, a crash): its end of
//!   the guard's stdin closes, and the guard kills the group;
//! * `distlock` is stopped (SIGSTOP, or SIGTSTP from a terminal): the guard stops the group
//!   within [`POLL`]; `distlock` resumes it on SIGCONT only while its lease is still valid.
//!
//! The guard is in a process group of its own and ignores the signals a terminal or an operator
//! sends to `distlock`'s group, so it outlives them.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use tokio::process::{Child, ChildStdin, Command};

/// The hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "__guard";
/// How often the guard looks at `distlock`'s state.
const POLL: Duration = Duration::from_millis(50);
/// The byte `distlock` writes once the command is reaped: the guard then leaves the group alone.
const DONE: u8 = b'd';

/// `distlock`'s handle on its guard.
pub struct Guard {
    child: Child,
    stdin: ChildStdin,
}

impl Guard {
    /// Starts a guard over the process group `group`, watching this process.
    pub fn start(group: libc::pid_t) -> std::io::Result<Guard> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg(SUBCOMMAND)
            .arg(group.to_string())
            .arg(std::process::id().to_string())
            .stdin(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the guard has no stdin"))?;
        Ok(Guard { child, stdin })
    }

    /// The command was reaped: the guard leaves without touching its (gone) group.
    pub async fn done(mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.stdin.write_all(&[DONE]).await;
        drop(self.stdin);
        let _ = self.child.wait().await;
    }
}

/// The guard's own process: `distlock __guard <group> <watched pid>`.
pub fn main(args: &[String]) -> ExitCode {
    let parsed = match args {
        [group, watched] => group.parse::<libc::pid_t>().ok().zip(watched.parse().ok()),
        _ => None,
    };
    let Some((group, watched)) = parsed else {
        eprintln!("distlock {SUBCOMMAND}: expects <process group> <pid to watch>");
        return ExitCode::from(crate::exit::USAGE);
    };
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGPIPE,
    ] {
        // SAFETY: signal(2) with SIG_IGN installs no handler code.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let mut stdin = std::io::stdin().lock();
    let mut stopped = false;
    loop {
        let mut fd = libc::pollfd {
            fd: stdin.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd.
        let ready = unsafe { libc::poll(&mut fd, 1, POLL.as_millis() as libc::c_int) };
        if ready > 0 {
            let mut byte = [0u8; 1];
            let done = matches!(stdin.read(&mut byte), Ok(1) if byte[0] == DONE);
            if !done {
                kill_group(group, libc::SIGKILL);
            }
            return ExitCode::SUCCESS;
        }
        let halted = is_stopped(watched);
        if halted && !stopped {
            kill_group(group, libc::SIGSTOP);
        }
        stopped = halted;
    }
}

/// Whether `pid` is stopped (state `T` or `t` in `/proc/<pid>/stat`).
fn is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold anything.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state == 'T' || state == 't')
}

/// Sends `sig` to every process of `group`.
pub fn kill_group(group: libc::pid_t, sig: libc::c_int) {
    // SAFETY: killpg(2) on the command's process group.
    unsafe {
        libc::killpg(group, sig);
    }
}
