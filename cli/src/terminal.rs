//! The terminal, when `distlock run` is started in its foreground: the command's process group
//! gets it while it runs (in a group of its own, reading it would otherwise stop the command
//! with SIGTTIN), Ctrl-Z stops `distlock` with the command, as a shell job, and `distlock` takes
//! the terminal back at the end.

use std::time::Duration;

/// How often `distlock` looks whether the command was stopped from the terminal (Ctrl-Z).
pub const STOP_POLL: Duration = Duration::from_millis(100);

/// The controlling terminal on stdin, `distlock` being its foreground process group.
#[derive(Clone, Copy)]
pub struct Terminal {
    /// `distlock`'s own process group, which gets the terminal back.
    ours: libc::pid_t,
}

impl Terminal {
    /// The terminal on stdin, if `distlock` is in its foreground.
    pub fn foreground() -> Option<Terminal> {
        // SAFETY: isatty, tcgetpgrp and getpgrp only read.
        let ours = unsafe {
            if libc::isatty(0) != 1 || libc::tcgetpgrp(0) != libc::getpgrp() {
                return None;
            }
            libc::getpgrp()
        };
        Some(Terminal { ours })
    }

    /// Called in the command's process after fork, before exec (its group is set): it takes
    /// the terminal for its group. Only async-signal-safe calls.
    pub fn take_in_child() {
        // SAFETY: signal, tcsetpgrp and getpgrp are async-signal-safe.
        unsafe {
            give(libc::getpgrp());
        }
    }

    /// Gives the terminal to `group`.
    pub fn hand_to(self, group: libc::pid_t) {
        // SAFETY: see `give`.
        unsafe { give(group) }
    }

    /// Whether `distlock`'s group has the terminal (after `fg`, not after `bg`).
    pub fn is_ours(self) -> bool {
        // SAFETY: tcgetpgrp only reads.
        unsafe { libc::tcgetpgrp(0) == self.ours }
    }

    /// Takes the terminal back for `distlock`'s group.
    pub fn take_back(self) {
        // SAFETY: see `give`.
        unsafe { give(self.ours) }
    }

    /// Whether the command `pid` was stopped by the terminal (SIGTSTP, SIGTTIN, SIGTTOU: Ctrl-Z
    /// or a background read), as opposed to the guard's SIGSTOP. Leaves its status waitable.
    pub fn stopped_by_terminal(pid: libc::pid_t) -> bool {
        // SAFETY: waitid(2) with WNOWAIT on our own child only peeks at its state.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let peeked = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT,
            );
            peeked == 0
                && info.si_pid() == pid
                && matches!(
                    info.si_status(),
                    libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                )
        }
    }

    /// Stops `distlock` itself (after taking the terminal back), as the shell expects of a
    /// stopped job; returns once it is continued (`fg`, `bg`, SIGCONT).
    pub fn stop_with_the_command(self) {
        self.take_back();
        // SAFETY: raise(2) on ourselves.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
    }
}

/// tcsetpgrp on stdin, with SIGTTOU ignored meanwhile (a background group asking for the
/// terminal is sent it otherwise).
///
/// # Safety
/// Async-signal-safe calls only, so it may run between fork and exec.
unsafe fn give(group: libc::pid_t) {
    // SAFETY: the caller's promise; the previous disposition is restored.
    unsafe {
        let previous = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(0, group);
        libc::signal(libc::SIGTTOU, previous);
    }
}
