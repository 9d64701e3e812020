//! A release its runtime shut down under. A lease let go of in the background (dropped, or its
//! `release` cut short) is released by a task of the runtime it was acquired on. A runtime that
//! shuts down first, as at the end of `#[tokio::main]` with a lease still in scope, drops that
//! task unfinished, and the client's connections with it: the lock then stayed held until its
//! TTL or session timeout after a process that ended normally. So the task carries a
//! [`LastChance`]: dropped unfinished, it has the release run on a thread of this module,
//! through a new client of the same servers ([`LockBackend::reconnect`]), and waits for it. A
//! backend's own clean-up tasks (a cancelled wait leaving its queue, or giving back a Redlock
//! round's votes) carry one too, with the clean-up to run ([`LastChance::spawn`]). One new
//! client per client that ended serves all of its jobs (a connection or session is made once,
//! not per wait or lease). The jobs a thread drops in one shutdown share one window of
//! [`WAIT`] (a runtime's workers, dropping theirs at once, have one each): a process ending
//! with thousands of leases or waits in scope ends within it, each one it did not reach left to
//! its TTL or session.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak, mpsc};
// The standard clock, not tokio's: a runtime with a paused clock (tests) may be dropping the
// task, and this module's thread runs on real time.
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::timeout;

use crate::backend::{GrantKey, LockBackend};
use crate::error::Result;

/// How long the dropped releases of one shutdown wait here, together: a connect and a release
/// are a few round trips; a server that cannot be reached within this leaves the lock to its
/// TTL, as without this.
const WAIT: Duration = Duration::from_secs(2);

/// The window of one thread's drops: those of one shutdown on that thread (a runtime's
/// end, or one of its workers') share it, and threads dropping at once have one each, so
/// neither another runtime's earlier end nor another worker's drops shorten it.
#[derive(Default)]
struct Window {
    /// Its end, and whether a job was left undone in it (said once).
    end: Option<(Instant, bool)>,
    /// This thread's jobs sent and not yet run (one whose wait ran out is still queued).
    pending: Arc<AtomicUsize>,
}

thread_local! {
    static WINDOW: RefCell<Window> = RefCell::default();
}

/// Until when a job sent now from this thread may run, and the thread's count of jobs
/// pending: the current window, or a new one once the last has passed with none of its jobs
/// pending (another shutdown). `None` while a passed window still has jobs queued.
fn window() -> Option<(Instant, Arc<AtomicUsize>)> {
    let now = Instant::now();
    let open = |w: &mut Window| match w.end {
        Some((end, _)) if end > now => Some(end),
        Some(_) if w.pending.load(Ordering::Acquire) > 0 => None,
        _ => {
            w.end = Some((now + WAIT, false));
            Some(now + WAIT)
        }
    };
    WINDOW
        .try_with(|w| {
            let mut w = w.borrow_mut();
            open(&mut w).map(|end| (end, w.pending.clone()))
        })
        // The thread's own values are gone (it is ending): a window of its own.
        .unwrap_or_else(|_| Some((now + WAIT, Arc::default())))
}

/// Whether this is the window's first job left undone.
fn first_left() -> bool {
    WINDOW
        .try_with(|w| match w.borrow_mut().end.as_mut() {
            Some((_, warned)) => !std::mem::replace(warned, true),
            None => true,
        })
        .unwrap_or(true)
}

/// A backend's client that a clean-up can make anew on the library's thread
/// ([`LastChance::spawn`]).
pub trait Reconnect: Clone + Send + Sync + 'static {
    /// Shared by this client and its clones and by no other client, and gone with the last of
    /// them: the new client made for one clean-up serves the next ones of the same client
    /// while it is alive.
    fn identity(&self) -> Weak<dyn Any + Send + Sync>;

    /// A new client of the same servers with the same options.
    fn reconnected(&self) -> impl Future<Output = Result<Self>> + Send;
}

/// New clients made on the library's thread, each kept while the client it stands in for
/// lives (`None`: it could not be made, and is not tried again for that client).
struct Fresh<K: ?Sized, V>(Vec<(Weak<K>, Option<V>)>);

impl<K: ?Sized, V: Clone> Fresh<K, V> {
    /// The new client for `of`, made by `make` unless one was.
    async fn of(&mut self, of: Weak<K>, make: impl Future<Output = Option<V>>) -> Option<V> {
        self.0.retain(|(k, _)| k.strong_count() > 0);
        if let Some((_, made)) = self
            .0
            .iter()
            .find(|(k, _)| std::ptr::addr_eq(k.as_ptr(), of.as_ptr()))
        {
            return made.clone();
        }
        let made = make.await;
        self.0.push((of, made.clone()));
        made
    }
}

/// New clients for backends' clean-ups, of whatever type each backend's is.
type AnyFresh = Fresh<dyn Any + Send + Sync, Arc<dyn Any + Send + Sync>>;

/// New clients, shared by the jobs running at once (each holds the lock only to find or make
/// its own).
type Shared<T> = Arc<tokio::sync::Mutex<T>>;

/// A backend's clean-up, given the new clients made so far.
type Cleanup = Box<dyn FnOnce(Shared<AnyFresh>) -> BoxFuture<'static, bool> + Send>;

/// What a job does.
enum Work {
    /// A lease's release, on a new client of its backend.
    Release(Arc<dyn LockBackend>, GrantKey),
    /// A backend's clean-up, on a new client of its own kind.
    Run(Cleanup),
}

struct Job {
    work: Work,
    until: Instant,
    /// The sending thread's pending jobs, this one among them.
    pending: Arc<AtomicUsize>,
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
    /// of `client`. Should that runtime shut down before `now` finished, or should there be no
    /// runtime here, `fallback` runs instead on a new client of the same servers (the
    /// connections of a runtime that shut down went with it; one new client serves every
    /// fallback of `client`), and says whether it did the work.
    pub fn spawn<B, N, F>(now: N, client: B, fallback: impl FnOnce(B) -> F + Send + 'static)
    where
        B: Reconnect,
        N: Future + Send + 'static,
        N::Output: Send,
        F: Future<Output = bool> + Send + 'static,
    {
        let last = LastChance(Some(Work::Run(Box::new(move |fresh: Shared<AnyFresh>| {
            Box::pin(async move {
                let made = async {
                    let made = client.reconnected().await.ok()?;
                    Some(Arc::new(made) as Arc<dyn Any + Send + Sync>)
                };
                let fresh = fresh.lock().await.of(client.identity(), made).await;
                match fresh.and_then(|f| f.downcast_ref::<B>().cloned()) {
                    Some(fresh) => fallback(fresh).await,
                    None => false,
                }
            })
        }))));
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
        let ran = window().is_some_and(|(until, pending)| {
            pending.fetch_add(1, Ordering::AcqRel);
            let job = Job {
                work,
                until,
                pending: pending.clone(),
                done,
            };
            let sent = helper().is_some_and(|h| h.send(job).is_ok());
            if !sent {
                pending.fetch_sub(1, Ordering::AcqRel);
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

/// Runs each job on a new client of the client it came from, made at its first job and kept
/// while that client lives. Jobs run at once: those of threads dropping at the same time (two
/// runtimes ending, or one's workers) do not queue behind each other within their windows.
async fn serve(mut queue: UnboundedReceiver<Job>) {
    let backends: Shared<Fresh<dyn LockBackend, Arc<dyn LockBackend>>> =
        Arc::new(Fresh(Vec::new()).into());
    let others: Shared<AnyFresh> = Arc::new(Fresh(Vec::new()).into());
    while let Some(job) = queue.recv().await {
        let (backends, others) = (backends.clone(), others.clone());
        tokio::spawn(async move {
            let left = job.left();
            let ran = match job.work {
                Work::Run(cleanup) => timeout(left, cleanup(others)).await,
                Work::Release(backend, key) => {
                    let made = async { backend.reconnect().await.ok() };
                    let release = async {
                        let fresh = backends
                            .lock()
                            .await
                            .of(Arc::downgrade(&backend), made)
                            .await;
                        match fresh {
                            Some(c) => c.release(&key).await.is_ok(),
                            None => false,
                        }
                    };
                    timeout(left, release).await
                }
            }
            .unwrap_or(false);
            job.pending.fetch_sub(1, Ordering::AcqRel);
            let _ = job.done.send(ran);
        });
    }
}
