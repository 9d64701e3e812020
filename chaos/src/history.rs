//! The history every process of a campaign writes: one JSON object per line, stamped on the
//! machine's `CLOCK_MONOTONIC`, which every process on one machine shares, so the merged lines
//! of all processes are one timeline.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Process ids of the processes that are not lock clients.
pub const RESOURCE: u32 = 1_000;
/// The nemesis (fault injector).
pub const NEMESIS: u32 = 2_000;

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// A client asked for the name.
    AcquireInvoke {
        /// For a read lease or a permit (shared with others).
        #[serde(default, skip_serializing_if = "is_false")]
        shared: bool,
        /// A candidate's value.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
    /// It holds it, with this token (none on Redlock): a term for a leader.
    AcquireOk {
        /// The fencing token.
        token: Option<u64>,
        /// A read lease or a permit.
        #[serde(default, skip_serializing_if = "is_false")]
        shared: bool,
    },
    /// A leader is about to proclaim a new value.
    Proclaim {
        /// The value.
        value: String,
    },
    /// A reader saw the register change under its read lease.
    TornRead {
        /// The register before.
        before: String,
        /// And after.
        after: String,
    },
    /// A permit holder registered at the resource (the resource's own record).
    Entered {
        /// The client.
        client: u32,
        /// How many were registered then, this one included.
        inside: usize,
    },
    /// An observer was told of a leader.
    Observed {
        /// Its term.
        term: u64,
        /// Its value.
        value: String,
        /// `observe` (the stream) or `leader` (a read).
        via: String,
    },
    /// An observer's stream or read failed.
    ObserveError {
        /// The error.
        error: String,
    },
    /// Its acquire failed (busy, timeout, backend error).
    AcquireFail {
        /// The error's kind.
        kind: String,
    },
    /// Its lost signal fired.
    Lost {
        /// The reason.
        reason: String,
    },
    /// It started releasing.
    ReleaseInvoke,
    /// Its release returned.
    ReleaseDone {
        /// Whether it still held the lock (false: lost, or the release failed).
        held: bool,
    },
    /// It wrote to the fenced register.
    WriteInvoke {
        /// The token it wrote with.
        token: u64,
    },
    /// The register accepted the write.
    WriteOk {
        /// The token.
        token: u64,
    },
    /// The register refused it: a newer holder had written.
    WriteRefused {
        /// The token.
        token: u64,
    },
    /// Its read-modify-write of the lock-set was acknowledged, adding this element.
    SetAdd {
        /// The element (unique).
        element: String,
    },
    /// The register accepted a write (the register's own record).
    Accepted {
        /// The token.
        token: u64,
        /// The writing client.
        client: u32,
    },
    /// The lock-set at the end of the run (the resource's own record).
    FinalSet {
        /// Its elements.
        elements: Vec<String>,
    },
    /// A fault began.
    FaultStart {
        /// Which nemesis.
        kind: String,
        /// The client process or server it hit.
        target: String,
    },
    /// The fault was healed.
    FaultEnd {
        /// Which nemesis.
        kind: String,
    },
}

fn is_false(b: &bool) -> bool {
    !b
}

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub t: u64,
    /// The process: a client number, [`RESOURCE`] or [`NEMESIS`].
    pub p: u32,
    /// What happened.
    #[serde(flatten)]
    pub ev: Event,
}

/// Appends entries to one file, a flushed line each: a killed process loses at most the line
/// it was writing.
pub struct Recorder {
    process: u32,
    out: Mutex<File>,
}

impl Recorder {
    /// Records for `process` into `path` (appending).
    pub fn open(path: &Path, process: u32) -> std::io::Result<Self> {
        let out = File::options().create(true).append(true).open(path)?;
        Ok(Recorder {
            process,
            out: Mutex::new(out),
        })
    }

    /// Records `ev` now.
    pub fn record(&self, ev: Event) {
        let entry = Entry {
            t: now_ns(),
            p: self.process,
            ev,
        };
        if let Ok(mut line) = serde_json::to_string(&entry) {
            line.push('\n');
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(line.as_bytes());
        }
    }
}

/// Every entry of the history files `paths`, in time order (a torn last line is skipped).
pub fn read(paths: &[impl AsRef<Path>]) -> Vec<Entry> {
    let mut all: Vec<Entry> = paths
        .iter()
        .filter_map(|p| File::open(p).ok())
        .flat_map(|f| BufReader::new(f).lines().map_while(Result::ok))
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    all.sort_by_key(|e| e.t);
    all
}
