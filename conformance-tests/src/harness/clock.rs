//! A server's wall clock, moved forward by a test: the clock shim (`shim/clock_shim.c`, built by
//! `build.rs`) is preloaded into the server and reads its offset from a file this handle writes.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use super::{HarnessError, TempDir};

/// One server's clock offset (forward only, as an NTP step after a drift, or an operator's
/// `date -s`). Starts at zero.
#[derive(Debug)]
pub struct ClockOffset {
    file: PathBuf,
    offset: Mutex<Duration>,
    _dir: TempDir,
}

impl ClockOffset {
    /// A zero offset, and the shim to apply it.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the shim could not be built (no C compiler: the message names
    /// the compiler's error) or the offset file cannot be written.
    pub fn new() -> Result<Self, HarnessError> {
        let io = |source| HarnessError::Io {
            server: "clock shim".into(),
            source,
        };
        let built = env!("DISTLOCK_CLOCK_SHIM_ERROR");
        if !built.is_empty() {
            return Err(io(std::io::Error::other(format!(
                "the clock shim was not built (a C compiler is needed): {built}"
            ))));
        }
        let dir = TempDir::new("clock").map_err(io)?;
        let file = dir.path().join("offset");
        std::fs::write(&file, 0i64.to_le_bytes()).map_err(io)?;
        Ok(ClockOffset {
            file,
            offset: Mutex::new(Duration::ZERO),
            _dir: dir,
        })
    }

    /// The environment a server process needs to run on this clock.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            ("LD_PRELOAD".into(), env!("DISTLOCK_CLOCK_SHIM").into()),
            (
                "DISTLOCK_CLOCK_OFFSET_FILE".into(),
                self.file.clone().into(),
            ),
        ]
    }

    /// Moves the clock forward by `by`, at once (the server sees it at its next clock read).
    ///
    /// # Panics
    /// When the offset file cannot be written: the fault could not be injected.
    pub fn jump(&self, by: Duration) -> Duration {
        let mut offset = self.offset.lock().unwrap_or_else(|p| p.into_inner());
        *offset += by;
        // One 8-byte write at offset 0 of a mapped file: the server reads old or new, whole.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.file)
            .unwrap_or_else(|e| panic!("clock offset file: {e}"));
        f.write_all(&(offset.as_millis() as i64).to_le_bytes())
            .unwrap_or_else(|e| panic!("clock offset file: {e}"));
        *offset
    }
}
