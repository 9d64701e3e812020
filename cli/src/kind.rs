//! What a name is held as: a lock, a permit of a semaphore, a read or write lease of a
//! read-write lock, or an election's leadership. Each kind queues in a namespace of its own
//! (the library's prefixes), so two kinds of one name never meet on the server: `run` refuses a
//! name in use as another kind, and `status` shows each kind in use.

use distlock::{ELECTION_LOCK_PREFIX, RWLOCK_LOCK_PREFIX, SEMAPHORE_LOCK_PREFIX};

/// How `run` or `elect` holds its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `run NAME`.
    Lock,
    /// `run --limit N NAME`.
    Permit(u32),
    /// `run --shared NAME`.
    Read,
    /// `run --exclusive NAME`.
    Write,
    /// `elect NAME`, announcing this value to observers.
    Leader(String),
}

/// One namespace a name may be used in.
pub struct Namespace {
    /// The kind as `status` shows it.
    pub label: &'static str,
    /// The kind as a message names it.
    pub what: &'static str,
    /// The prefix of its queue's lock name.
    pub prefix: &'static str,
    /// How an operator uses a name this way.
    pub used_by: &'static str,
}

/// Every namespace, the plain lock's first.
pub const NAMESPACES: [Namespace; 4] = [
    Namespace {
        label: "lock",
        what: "a lock",
        prefix: "",
        used_by: "run without --limit, --shared or --exclusive",
    },
    Namespace {
        label: "semaphore",
        what: "a semaphore",
        prefix: SEMAPHORE_LOCK_PREFIX,
        used_by: "run --limit N",
    },
    Namespace {
        label: "rwlock",
        what: "a read-write lock",
        prefix: RWLOCK_LOCK_PREFIX,
        used_by: "run --shared or --exclusive",
    },
    Namespace {
        label: "election",
        what: "an election",
        prefix: ELECTION_LOCK_PREFIX,
        used_by: "elect",
    },
];

impl Kind {
    /// The namespace this kind queues in.
    pub fn namespace(&self) -> &'static Namespace {
        &NAMESPACES[match self {
            Kind::Lock => 0,
            Kind::Permit(_) => 1,
            Kind::Read | Kind::Write => 2,
            Kind::Leader(_) => 3,
        }]
    }
}

/// This process as an election's value: `<host>:<pid>`, so observers can tell who leads.
/// (The command is Linux-only: it relies on prctl; the kernel keeps the host name here.)
pub fn this_process() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".to_string());
    format!("{host}:{}", std::process::id())
}
