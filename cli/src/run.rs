//! `distlock run`: the command starts only once the lock (or with `--limit N`, one of N
//! permits) is held and still valid, in a process group of its own; it is terminated (SIGTERM,
//! then SIGKILL within half the lost signal's lead) when the lock is lost, so it is gone before
//! the server could grant the lock to anyone else; signals sent to `distlock` go to it; a signal
//! while still waiting ends the wait with nothing left queued. The lock is released only once
//! the command was reaped. The command cannot outlive or out-run `distlock`: see `guard.rs`.

use std::io::IsTerminal;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use distlock::{AcquireOptions, Admission, Guarantee, Lease, LockError, Locks, run_vars};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::guard::{Guard, kill_group};
use crate::kind::{Kind, NAMESPACES};
use crate::terminal::{STOP_POLL, Terminal};
use crate::{Held, exit, grade};

/// A wait with no `--wait`: as long as it takes.
const FOREVER: Duration = Duration::from_secs(10 * 365 * 86_400);
/// A waiting notice goes to a terminal once the wait passes this.
const NOTICE_AFTER: Duration = Duration::from_secs(1);
/// How long the release at the end may take before `distlock` exits anyway (the lock then
/// frees at its TTL).
const RELEASE_LIMIT: Duration = Duration::from_secs(5);
/// Longer than the guard's look at `distlock`'s state (`guard.rs`), plus a scheduling delay.
const GUARD_POLL_SPAN: Duration = Duration::from_millis(250);
/// A wait ended by a signal is cleaned up by tasks the backend starts as the wait is dropped
/// (leave the queue, delete the queue entry): they get this long to reach the server before the
/// process exits, which would otherwise leave the entry to its TTL or session timeout.
const CLEANUP_GRACE: Duration = Duration::from_millis(500);

/// The signals passed on to the command (and that end a wait), installed before anything
/// waits, so none is missed.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }

    /// The next signal received, as its number.
    async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.usr1.recv() => libc::SIGUSR1,
            _ = self.usr2.recv() => libc::SIGUSR2,
        }
    }
}

pub async fn run(locks: &Locks, args: &Held, kind: Kind) -> ExitCode {
    // SIGCONT is not passed on: `distlock` resumed after a stop resumes the command itself, if
    // its lease is still valid.
    let installed =
        Signals::install().and_then(|s| Ok((s, signal(SignalKind::from_raw(libc::SIGCONT))?)));
    let (mut signals, mut cont) = match installed {
        Ok(s) => s,
        Err(e) => {
            eprintln!("distlock: cannot handle signals: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    // `status` names each holder by the command it runs, not by `distlock`'s own arguments
    // (which may carry a URL with a password).
    distlock::describe_process(&command_line(&args.command));
    let acquire = acquire(locks, args, &kind);
    let notice = async {
        tokio::time::sleep(NOTICE_AFTER).await;
        if std::io::stderr().is_terminal() {
            eprintln!(
                "distlock: waiting for lock {}...",
                distlock::shown(&args.name)
            );
        }
        std::future::pending::<()>().await
    };
    // A signal drops the acquire, whose clean-up then leaves nothing queued.
    let lease = tokio::select! {
        got = acquire => got,
        sig = signals.next() => {
            tokio::time::sleep(CLEANUP_GRACE).await;
            return ExitCode::from(exit::signalled(sig));
        }
        _ = notice => unreachable!("the notice never ends"),
    };
    let lease = match lease {
        Ok(l) => l,
        Err(e) => {
            eprintln!("distlock: {}", exit::said(&args.name, &e));
            return ExitCode::from(match exit::for_error(&e) {
                exit::BUSY => args.conflict_exit_code.unwrap_or(exit::BUSY),
                code => code,
            });
        }
    };
    // The lease must still be valid as the command starts: a grant that came just before a
    // stall may already be lost, and nothing is started on it.
    if let Some(reason) = lease.lost_reason() {
        eprintln!(
            "distlock: lock {} lost ({reason}) before the command started",
            distlock::shown(&args.name)
        );
        release(lease).await;
        return ExitCode::from(exit::LOST);
    }
    // Each kind of one name is a queue of its own: a plain run beside `--limit` runs (or beside
    // `--shared` ones, or a leader) would run unbounded. Checked once held, by both sides, so of
    // two that start together at least the later one sees the other and gives way.
    if let Some(other) = other_kind_in_use(locks, args, &kind).await {
        eprintln!(
            "distlock: {} is in use as {other}: every user of a name must run it the same way",
            distlock::shown(&args.name)
        );
        release(lease).await;
        return ExitCode::from(exit::CONFIG);
    }
    if let Some(asked) = args.ttl
        && lease.ttl().abs_diff(asked) >= Duration::from_secs(1)
    {
        eprintln!(
            "distlock: --ttl {asked:?} does not apply on {}: its leases live on the client's \
             session, whose TTL is {:?} (set session_ttl or session_timeout in the URL)",
            lease.backend(),
            lease.ttl()
        );
    }
    let grace = kill_grace(args, &lease);
    let terminal = Terminal::foreground();
    let mut child = match spawn(args, &lease, terminal.is_some()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("distlock: cannot start {:?}: {e}", args.command[0]);
            release(lease).await;
            // As a shell says for a command it cannot run.
            return ExitCode::from(127);
        }
    };
    let Some(group) = child.id().map(|pid| pid as libc::pid_t) else {
        // Reaped already: it ran and ended.
        let status = child.wait().await;
        release(lease).await;
        return ExitCode::from(status.map_or(exit::UNAVAILABLE, code));
    };
    let guard = match Guard::start(group) {
        Ok(g) => g,
        Err(e) => {
            eprintln!(
                "distlock: cannot start the guard that keeps the command under the lock: {e}"
            );
            kill_group(group, libc::SIGKILL);
            let _ = child.wait().await;
            release(lease).await;
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let kill = |sig: libc::c_int| kill_group(group, sig);
    // After a SIGCONT, the command is resumed once more a little later: the guard may have
    // stopped it just after `distlock` resumed it.
    let mut resume_again: Option<tokio::time::Instant> = None;
    let outcome = loop {
        let again = async {
            match resume_again {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = child.wait() => break status.map_or(exit::UNAVAILABLE, code),
            reason = lease.lost() => {
                eprintln!(
                    "distlock: lock {} lost ({reason}): terminating the command",
                    distlock::shown(&args.name)
                );
                kill(libc::SIGTERM);
                // A stopped command acts on SIGTERM only once continued.
                kill(libc::SIGCONT);
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    kill(libc::SIGKILL);
                    let _ = child.wait().await;
                }
                break exit::LOST;
            }
            // Ctrl-Z stopped the command (its group has the terminal): stop as a shell job, with
            // it; continued in the foreground, it gets the terminal back if the lease holds.
            _ = tokio::time::sleep(STOP_POLL), if terminal.is_some() => {
                if let Some(t) = terminal
                    && Terminal::stopped_by_terminal(group)
                {
                    t.stop_with_the_command();
                    if lease.lost_reason().is_none() {
                        if t.is_ours() {
                            t.hand_to(group);
                        }
                        kill(libc::SIGCONT);
                    }
                }
            }
            _ = cont.recv() => {
                if lease.lost_reason().is_none() {
                    kill(libc::SIGCONT);
                    resume_again = Some(tokio::time::Instant::now() + GUARD_POLL_SPAN);
                }
            }
            _ = again => {
                resume_again = None;
                if lease.lost_reason().is_none() {
                    kill(libc::SIGCONT);
                }
            }
            sig = signals.next() => kill(sig),
        }
    };
    if let Some(t) = terminal {
        t.take_back();
    }
    guard.done().await;
    // Only now, with the command reaped, may anyone else hold the lock.
    release(lease).await;
    ExitCode::from(outcome)
}

/// How long the command gets between SIGTERM and SIGKILL once the lock is lost: `--kill-after`,
/// at most half the lost signal's lead, so the command is gone before the server's expiry could
/// grant the lock to anyone else. A longer `--kill-after` is cut, with a warning.
fn kill_grace(args: &Held, lease: &Lease) -> Duration {
    let bound = lease.lead() / 2;
    match args.kill_after {
        Some(asked) if asked > bound => {
            eprintln!(
                "distlock: --kill-after {asked:?} is longer than half the lost signal's lead \
                 ({:?}) at a TTL of {:?}: the command gets {bound:?} between SIGTERM and \
                 SIGKILL (a longer TTL gives it more)",
                lease.lead(),
                lease.ttl()
            );
            bound
        }
        Some(asked) => asked,
        None => bound,
    }
}

/// Takes the name as `kind` says, waiting as the options say.
async fn acquire(locks: &Locks, args: &Held, kind: &Kind) -> distlock::Result<Lease> {
    let wait = match (args.no_wait, args.wait) {
        (true, _) | (_, Some(Duration::ZERO)) => None,
        (false, wait) => Some(wait.unwrap_or(FOREVER)),
    };
    let grade = grade(args.correctness);
    let opts = |defaults: &AcquireOptions| match args.ttl {
        Some(ttl) => AcquireOptions {
            ttl,
            ..defaults.clone()
        },
        None => defaults.clone(),
    };
    match kind {
        Kind::Lock => {
            let mut call = match grade {
                Guarantee::Efficiency => locks.efficiency(&args.name),
                Guarantee::Correctness => locks.correctness(&args.name),
            };
            if let Some(ttl) = args.ttl {
                call = call.ttl(ttl);
            }
            match wait {
                None => call.try_now().await,
                Some(w) => call.wait(w).await,
            }
        }
        Kind::Permit(n) => {
            let semaphore = locks.semaphore(&args.name, *n, grade)?;
            let chosen = opts(semaphore.lease_options());
            let semaphore = semaphore.options(chosen);
            match wait {
                None => semaphore.try_acquire().await,
                Some(w) => semaphore.acquire(w).await,
            }
        }
        Kind::Read | Kind::Write => {
            let rwlock = locks.rwlock(&args.name, grade)?;
            let chosen = opts(rwlock.lease_options());
            let rwlock = rwlock.options(chosen);
            match (kind, wait) {
                (Kind::Read, None) => rwlock.try_read().await,
                (Kind::Read, Some(w)) => rwlock.read(w).await,
                (_, None) => rwlock.try_write().await,
                (_, Some(w)) => rwlock.write(w).await,
            }
        }
        Kind::Leader(value) => {
            let election = locks.election(&args.name, grade)?;
            let chosen = opts(election.lease_options());
            let election = election.options(chosen);
            // A campaign has no try: one that may not wait is one whose wait is over at once.
            match election
                .campaign_for(value, wait.unwrap_or(Duration::ZERO))
                .await
            {
                Ok(leadership) => Ok(leadership.into_lease()),
                Err(LockError::Timeout { .. }) if wait.is_none() => Err(LockError::Busy {
                    name: args.name.clone(),
                }),
                Err(e) => Err(e),
            }
        }
    }
}

/// How the name is in use as another kind than ours (see `kind.rs`). A backend that cannot
/// say (no `inspect`) is taken at its word; one that fails to answer is a conflict we cannot
/// rule out.
async fn other_kind_in_use(locks: &Locks, args: &Held, kind: &Kind) -> Option<String> {
    let client = locks.client(grade(args.correctness)).ok()?;
    let ours = kind.namespace();
    for other in NAMESPACES.iter().filter(|n| n.prefix != ours.prefix) {
        match client
            .inspect(&format!("{}{}", other.prefix, args.name))
            .await
        {
            Ok(s) if s.holders.is_empty() && s.waiters == 0 => {}
            Ok(s) => {
                return Some(match s.holder().map(|h| h.admission) {
                    Some(Admission::Permit(n)) => format!("a semaphore of {n} (run --limit {n})"),
                    _ => format!("{} ({})", other.what, other.used_by),
                });
            }
            Err(LockError::Unsupported { .. }) => {}
            Err(e) => return Some(format!("unknown: its use could not be read ({e})")),
        }
    }
    None
}

/// Starts the command in a process group of its own, with the lock in its environment, and
/// with the terminal when `foreground` (see `terminal.rs`). The command's process is killed if
/// `distlock`'s thread that started it ends (the guard covers the rest of its group).
fn spawn(args: &Held, lease: &Lease, foreground: bool) -> std::io::Result<Child> {
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .process_group(0)
        .env(run_vars::LOCK_HELD, "1")
        .env(run_vars::NAME, &args.name)
        .env(run_vars::BACKEND, lease.backend())
        .env_remove(run_vars::TOKEN);
    if let Some(token) = lease.fencing_token() {
        cmd.env(run_vars::TOKEN, token.get().to_string());
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // `distlock` died before the line above: never run without it.
            if libc::getppid() != parent {
                libc::_exit(127);
            }
            if foreground {
                Terminal::take_in_child();
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// The command's exit status as a shell reports it.
fn code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(sig)) => exit::signalled(sig),
        (None, None) => exit::UNAVAILABLE,
    }
}

/// Releases, waiting a bounded time (a failed release frees the lock at its TTL).
async fn release(lease: Lease) {
    let _ = tokio::time::timeout(RELEASE_LIMIT, lease.release()).await;
}

/// The command as a shell would take it back (quoted by `shlex`, the quoting `cc` and
/// `bindgen` use; an argument with a NUL, which no shell can pass, is shown lossily).
fn command_line(command: &[std::ffi::OsString]) -> String {
    let words: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}
