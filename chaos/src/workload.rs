//! What the clients of a run do with the name: a lock, a semaphore of N, a read-write lock or
//! an election (with observers), and what each needs of a deployment.

use distlock::{ELECTION_LOCK_PREFIX, RWLOCK_LOCK_PREFIX, SEMAPHORE_LOCK_PREFIX};

use crate::deployment::Deployment;

/// The name every run uses (each run has servers of its own).
pub const NAME: &str = "chaos";

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Five clients take the lock, write the fenced register and add to the lock-set.
    Lock,
    /// N clients do the lock's work under it: a queue long enough that a backend may follow
    /// only the nearest keys ahead (etcd's waiters further back than 16), under the same faults.
    /// They ask as the new primitives' clients do, tries apart: some waits time out or are
    /// dropped, from any place in the queue.
    Crowd(u32),
    /// 2N + 1 clients take permits of a semaphore of N and register at the resource while they
    /// hold one.
    Semaphore(u32),
    /// Five clients, 70 % readers and 30 % writers: writers as the lock's, readers reading the
    /// register twice and reporting a change under them.
    RwLock,
    /// Five candidates campaign, lead for a while (writing with their term, sometimes
    /// proclaiming), resign or are killed; two observer processes record what `observe()` and
    /// `leader()` report.
    Election,
}

/// Every workload, in the report's order.
pub const WORKLOADS: [Workload; 6] = [
    Workload::Lock,
    Workload::Crowd(CROWD),
    Workload::Semaphore(2),
    Workload::Semaphore(3),
    Workload::RwLock,
    Workload::Election,
];

/// Clients of a crowd run: more than etcd's 16 waiters on the name's shared watch, so most of
/// them follow keys of their own.
pub const CROWD: u32 = 20;

/// Observer processes of an election run.
pub const OBSERVERS: u32 = 2;

/// The first observer's process id (candidates count from 0).
pub const FIRST_OBSERVER: u32 = 500;

impl Workload {
    /// Its label on the command line and in the report.
    pub fn label(self) -> String {
        match self {
            Workload::Lock => "lock".into(),
            Workload::Crowd(n) => format!("crowd-{n}"),
            Workload::Semaphore(n) => format!("semaphore-{n}"),
            Workload::RwLock => "rwlock".into(),
            Workload::Election => "election".into(),
        }
    }

    /// The workload labelled `label`.
    pub fn parse(label: &str) -> Option<Self> {
        match label {
            "lock" => Some(Workload::Lock),
            "rwlock" => Some(Workload::RwLock),
            "election" => Some(Workload::Election),
            _ => {
                let n = |prefix| {
                    label
                        .strip_prefix(prefix)
                        .and_then(|n: &str| n.parse().ok())
                        .filter(|n| *n > 0)
                };
                n("semaphore-")
                    .map(Workload::Semaphore)
                    .or_else(|| n("crowd-").map(Workload::Crowd))
            }
        }
    }

    /// Whether `d` offers it: Redlock and the Redis plain layout have neither the policies
    /// semaphores and read-write locks need nor the tokens terms are made of.
    pub fn offered_on(self, d: Deployment) -> bool {
        self.is_lock() || !matches!(d, Deployment::Redlock | Deployment::RedisPlain)
    }

    /// Its clients do the lock's work (a lock or a crowd).
    pub fn is_lock(self) -> bool {
        matches!(self, Workload::Lock | Workload::Crowd(_))
    }

    /// Its share of a full campaign's time on each deployment, relative to the others': about
    /// what 10 000 operations take (measured on Redis Cluster: a lock ~75 operations/s under
    /// faults, a semaphore ~250, a read-write lock ~140, an election ~37, as its leaders lead a
    /// while).
    pub fn weight(self) -> f64 {
        match self {
            Workload::Lock => 3.0,
            // As long as the lock's: fewer operations each, with four times the clients.
            Workload::Crowd(_) => 3.0,
            Workload::Semaphore(_) => 1.0,
            Workload::RwLock => 1.8,
            Workload::Election => 6.5,
        }
    }

    /// Client processes (candidates for an election; observers apart).
    pub fn clients(self) -> u32 {
        match self {
            Workload::Semaphore(n) => 2 * n + 1,
            Workload::Crowd(n) => n,
            _ => 5,
        }
    }

    /// The lock name the backend queues on: what is left on the server is counted under it.
    pub fn queue(self) -> String {
        let prefix = match self {
            Workload::Lock | Workload::Crowd(_) => "",
            Workload::Semaphore(_) => SEMAPHORE_LOCK_PREFIX,
            Workload::RwLock => RWLOCK_LOCK_PREFIX,
            Workload::Election => ELECTION_LOCK_PREFIX,
        };
        format!("{prefix}{NAME}")
    }

    /// How many shared holders may hold at once: a semaphore's N; `None` for any number (a
    /// read-write lock's readers; a lock and an election have no shared holders).
    pub fn shared_limit(self) -> Option<usize> {
        match self {
            Workload::Semaphore(n) => Some(n as usize),
            _ => None,
        }
    }
}
