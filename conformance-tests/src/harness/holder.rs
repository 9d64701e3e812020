//! The cross-process holder (`distlock-holder`), run as a child the test can pause and kill.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::HarnessError;
use super::process::spawn;

/// A running `distlock-holder`, killed on drop.
#[derive(Debug)]
pub struct HolderProcess {
    child: Mutex<Child>,
    lines: Mutex<Receiver<String>>,
}

/// Where the `distlock-holder` binary is: next to the running test or binary (cargo puts test
/// executables in `deps/`, binaries one level up).
pub fn holder_binary() -> Result<PathBuf, HarnessError> {
    let exe = std::env::current_exe().map_err(|source| HarnessError::Io {
        server: "distlock-holder".into(),
        source,
    })?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let candidates = [
        dir.join("distlock-holder"),
        dir.join("..").join("distlock-holder"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or(HarnessError::Missing {
            binary: candidates[0].display().to_string(),
            package: "(none: build it with `cargo build -p distlock-conformance --bins`)",
        })
}

impl HolderProcess {
    /// Starts the holder on `url` for lock `name` with `ttl`.
    pub fn start(url: &str, name: &str, ttl: Duration) -> Result<Self, HarnessError> {
        Self::start_with(url, name, ttl, None)
    }

    /// Starts the holder on `url` for a permit of the semaphore `name` of `permits`, with `ttl`.
    pub fn start_permit(
        url: &str,
        name: &str,
        ttl: Duration,
        permits: u32,
    ) -> Result<Self, HarnessError> {
        Self::start_with(url, name, ttl, Some(permits.to_string()))
    }

    /// Starts the holder on `url` for the read-write lock `name` with `ttl`: to write when
    /// `write`, else to read.
    pub fn start_rw(
        url: &str,
        name: &str,
        ttl: Duration,
        write: bool,
    ) -> Result<Self, HarnessError> {
        let kind = if write { "write" } else { "read" };
        Self::start_with(url, name, ttl, Some(kind.to_string()))
    }

    fn start_with(
        url: &str,
        name: &str,
        ttl: Duration,
        kind: Option<String>,
    ) -> Result<Self, HarnessError> {
        let mut cmd = Command::new(holder_binary()?);
        cmd.args([url, name, &ttl.as_millis().to_string()])
            .args(kind)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = spawn(cmd).map_err(|source| HarnessError::Io {
            server: "distlock-holder".into(),
            source,
        })?;
        let stdout = child.stdout.take().ok_or_else(|| HarnessError::Io {
            server: "distlock-holder".into(),
            source: std::io::Error::other("no stdout"),
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(HolderProcess {
            child: Mutex::new(child),
            lines: Mutex::new(rx),
        })
    }

    /// The next line starting with `prefix`, skipping others, within `timeout`; its remainder.
    pub fn next_line(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let until = Instant::now() + timeout;
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return Some(rest.trim().to_string());
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Drops every line received so far.
    pub fn drain(&self) {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        while lines.try_recv().is_ok() {}
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.lock().unwrap_or_else(|p| p.into_inner()).id();
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(pid as libc::pid_t, sig);
        }
    }

    /// SIGSTOP: the whole process, watchdog and session heartbeats included, stops.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGTERM, and waits up to `timeout` for it to exit (it returns from `main`); whether it
    /// did. The lease it holds is dropped as its runtime ends.
    pub fn terminate(&self, timeout: Duration) -> bool {
        self.signal(libc::SIGTERM);
        let until = Instant::now() + timeout;
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        while Instant::now() < until {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// SIGKILL, and reap it.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}
