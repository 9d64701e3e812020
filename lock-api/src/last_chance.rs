//! A release its runtime shut down under. A lease let go of in the background (dropped, or its
//! `release` cut short) is released by a task of the runtime it was acquired on. A runtime that
//! shuts down first, as at the end of `#[tokio::main]` with a lease still in scope, drops that
//! task unfinished, and the client's connections with it: the lock then stayed held until its
//! TTL or session timeout after a process that ended normally. So the task carries a
//! [`LastChance`]: dropped unfinished, it has the release run on a thread of this module,
//! through a new client of the same servers ([`LockBackend::reconnect`]), and waits for it. A
//! backend's own clean-up tasks (a cancelled wait leaving its queue, or giving back a Redlock
//! round's votes) carry one too, with the clean-up to run ([`LastChance::spawn`]). The jobs of
//! one shutdown share one window of [`WAIT`]: a process ending with thousands of leases in
//! scope ends within it, each lease it did not reach left to its TTL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};
// The standard clock, not tokio's: a runtime with a paused clock (tests) may be dropping the
// task, and this module's thread runs on real time.
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::timeout;

use crate::backend::{GrantKey, LockBackend};

/// How long the dropped releases of one shutdown wait here, together: a connect and a release
/// are a few round trips; a server that cannot be reached within this leaves the lock to its
/// TTL, as without this.
const WAIT: Duration = Duration::from_secs(2);

/// Jobs sent and not yet run.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// The current window: its end, and whether a lease was left to its TTL in it (said once).
static WINDOW: Mutex<Option<(Instant, bool)>> = Mutex::new(None);

/// Until when a job sent now may run: the current window, or a new one once the last has
/// passed with nothing pending (another shutdown). `None` while a passed window still has jobs.
fn window() -> Option<Instant> {
    let now = Instant::now();
    let mut window = WINDOW.lock().unwrap_or_else(|p| p.into_inner());
    match *window {
        Some((end, _)) if end > now => Some(end),
        Some(_) if PENDING.load(Ordering::Acquire) > 0 => None,
        _ => {
            *window = Some((now + WAIT, false));
            Some(now + WAIT)
        }
    }
}

/// Whether this is the window's first lease left to its TTL.
fn first_left() -> bool {
    let mut window = WINDOW.lock().unwrap_or_else(|p| p.into_inner());
    match window.as_mut() {
        Some((_, warned)) => !std::mem::replace(warned, true),
        None => true,
    }
}

/// What a job does.
enum Work {
    /// A lease's release, on a new client of its backend.
    Release(Arc<dyn LockBackend>, GrantKey),
    /// A backend's clean-up, which makes the client it needs.
    Run(Box<dyn FnOnce() -> BoxFuture<'static, bool> + Send>),
}

struct Job {
    work: Work,
    until: Instant,
    done: mpsc::Sender<bool>,
}

impl Job {
    fn left(&self) -> Duration {
        self.until.saturating_duration_since(Instant::now())
    }
}

/// Carried by a background task of a runtime that may shut down before the task finished:
/// dropped before the task did its work, it runs the task's work on a thread of the library
/// with a runtime of its own, and waits for it (the leases and clean-ups of one shutdown share
/// a window of 2 s, so a process never ends more than that later for them); what that leaves
/// undone is left to its TTL or session timeout, with a warning.
pub struct LastChance(Option<Work>);

impl LastChance {
    /// For a lease's background release.
    pub(crate) fn release(backend: Arc<dyn LockBackend>, key: GrantKey) -> Self {
        LastChance(Some(Work::Release(backend, key)))
    }

    /// A backend's background clean-up: `now` runs on the current runtime, on the connections
    /// the backend has. Should that runtime shut down before `now` finished, or should there be
    /// no runtime here, `fallback` makes the future to run instead, which connects anew (the
    /// connections of a runtime that shut down went with it) and says whether it did the work.
    pub fn spawn<N, F>(now: N, fallback: impl FnOnce() -> F + Send + 'static)
    where
        N: Future + Send + 'static,
        N::Output: Send,
        F: Future<Output = bool> + Send + 'static,
    {
        let last = LastChance(Some(Work::Run(Box::new(move || Box::pin(fallback())))));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                now.await;
                last.disarm();
            });
        }
    }

    /// The task did its work (or gave up on it) on its own runtime: nothing to do here.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for LastChance {
    fn drop(&mut self) {
        let Some(work) = self.0.take() else {
            return;
        };
        let what = match &work {
            Work::Release(_, key) => format!("the release of {}", key.name),
            Work::Run(_) => "a cancelled wait's clean-up (its queue entry or votes)".to_string(),
        };
        let (done, finished) = mpsc::channel();
        let ran = window().is_some_and(|until| {
            let job = Job { work, until, done };
            PENDING.fetch_add(1, Ordering::AcqRel);
            let sent = helper().is_some_and(|h| h.send(job).is_ok());
            if !sent {
                PENDING.fetch_sub(1, Ordering::AcqRel);
            }
            // A blocking wait: this runs where the runtime drops its tasks, not in one of them.
            sent && finished
                .recv_timeout(until.saturating_duration_since(Instant::now()))
                .unwrap_or(false)
        });
        if !ran && first_left() {
            tracing::warn!(
                "distlock: the runtime ended before {what} ran, and no new client did it in time; what it would free (and anything else left in this shutdown) stays until its TTL or session timeout"
            );
        }
    }
}

/// The thread that runs the jobs, started at the first (`None` if it cannot start).
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

/// Runs each job: a release on a new client of its backend, made once per backend (`None`: it
/// could not be made) and kept while that backend lives; a clean-up as it is.
async fn serve(mut queue: UnboundedReceiver<Job>) {
    type Client = Option<Arc<dyn LockBackend>>;
    let mut clients: Vec<(Weak<dyn LockBackend>, Client)> = Vec::new();
    while let Some(job) = queue.recv().await {
        let left = job.left();
        let ran = match job.work {
            Work::Run(cleanup) => timeout(left, cleanup()).await.unwrap_or(false),
            Work::Release(backend, key) => {
                clients.retain(|(of, _)| of.strong_count() > 0);
                let known = clients
                    .iter()
                    .find(|(of, _)| std::ptr::addr_eq(of.as_ptr(), Arc::as_ptr(&backend)))
                    .map(|(_, client)| client.clone());
                let until = job.until;
                let client = match known {
                    Some(client) => client,
                    None => {
                        let made = timeout(left, backend.reconnect())
                            .await
                            .ok()
                            .and_then(Result::ok);
                        clients.push((Arc::downgrade(&backend), made.clone()));
                        made
                    }
                };
                match client {
                    Some(c) => timeout(
                        until.saturating_duration_since(Instant::now()),
                        c.release(&key),
                    )
                    .await
                    .is_ok_and(|r| r.is_ok()),
                    None => false,
                }
            }
        };
        PENDING.fetch_sub(1, Ordering::AcqRel);
        let _ = job.done.send(ran);
    }
}
