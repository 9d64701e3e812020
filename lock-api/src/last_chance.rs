//! A release its runtime shut down under. A lease let go of in the background (dropped, or its
//! `release` cut short) is released by a task of the runtime it was acquired on. A runtime that
//! shuts down first, as at the end of `#[tokio::main]` with a lease still in scope, drops that
//! task unfinished, and the client's connections with it: the lock then stayed held until its
//! TTL or session timeout after a process that ended normally. So the task carries a
//! [`LastChance`]: dropped unfinished, it has the release run on a thread of this module,
//! through a new client of the same servers ([`LockBackend::reconnect`]), and waits for it up
//! to [`WAIT`].

use std::sync::{Arc, OnceLock, Weak, mpsc};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::{Instant, timeout_at};

use crate::backend::{GrantKey, LockBackend};

/// How long a dropped release waits here: a connect and a release are a few round trips; a
/// server that cannot be reached within this leaves the lock to its TTL, as without this.
const WAIT: Duration = Duration::from_secs(2);

struct Job {
    backend: Arc<dyn LockBackend>,
    key: GrantKey,
    until: Instant,
    done: mpsc::Sender<bool>,
}

/// Carried by a background release: dropped before [`LastChance::disarm`], it releases `key`
/// here.
pub(crate) struct LastChance(Option<(Arc<dyn LockBackend>, GrantKey)>);

impl LastChance {
    pub(crate) fn arm(backend: Arc<dyn LockBackend>, key: GrantKey) -> Self {
        LastChance(Some((backend, key)))
    }

    /// The release ran (or gave up) on its own runtime.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for LastChance {
    fn drop(&mut self) {
        let Some((backend, key)) = self.0.take() else {
            return;
        };
        let name = key.name.clone();
        let (done, finished) = mpsc::channel();
        let job = Job {
            backend,
            key,
            until: Instant::now() + WAIT,
            done,
        };
        // A blocking wait: this runs where the runtime drops its tasks, not in one of them.
        let released = helper().is_some_and(|h| h.send(job).is_ok())
            && finished.recv_timeout(WAIT).unwrap_or(false);
        if !released {
            tracing::warn!(lock = %name, "distlock: the runtime ended before a lease's release ran, and no new client released it; the lock stays until its TTL or session timeout");
        }
    }
}

/// The thread that runs released jobs, started at the first (`None` if it cannot start).
fn helper() -> Option<&'static UnboundedSender<Job>> {
    static HELPER: OnceLock<Option<UnboundedSender<Job>>> = OnceLock::new();
    HELPER
        .get_or_init(|| {
            let (jobs, queue) = unbounded_channel();
            // Its runtime is built on the thread: one dropped here, inside the runtime that is
            // shutting down, would panic.
            std::thread::Builder::new()
                .name("distlock-last-chance".into())
                .spawn(move || {
                    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        rt.block_on(serve(queue));
                    }
                })
                .ok()
                .map(|_| jobs)
        })
        .as_ref()
}

/// Runs each job on a new client of its backend, made once per backend (`None`: it could not be
/// made) and kept while that backend lives.
async fn serve(mut queue: UnboundedReceiver<Job>) {
    type Client = Option<Arc<dyn LockBackend>>;
    let mut clients: Vec<(Weak<dyn LockBackend>, Client)> = Vec::new();
    while let Some(job) = queue.recv().await {
        clients.retain(|(of, _)| of.strong_count() > 0);
        let known = clients
            .iter()
            .find(|(of, _)| std::ptr::addr_eq(of.as_ptr(), Arc::as_ptr(&job.backend)))
            .map(|(_, client)| client.clone());
        let client = match known {
            Some(client) => client,
            None => {
                let made = timeout_at(job.until, job.backend.reconnect())
                    .await
                    .ok()
                    .and_then(Result::ok);
                clients.push((Arc::downgrade(&job.backend), made.clone()));
                made
            }
        };
        let released = match client {
            Some(c) => timeout_at(job.until, c.release(&job.key))
                .await
                .is_ok_and(|r| r.is_ok()),
            None => false,
        };
        let _ = job.done.send(released);
    }
}
