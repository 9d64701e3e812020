//! One client, a process of its own: takes the run's name through the public facade from a
//! backend URL, does the workload's work under it (see [`Workload`]), and releases. It checks its
//! lease before each write, as a careful application does: what remains is the window no check
//! can close. The new primitives' clients and the crowd's mix waits, waits with short timeouts,
//! tries (not the crowd's: a try never queues) and waits dropped at a random point (the cancel
//! path, in a crowd from any place in a long queue); the lock's five clients wait, as they always
//! did, so the lock's figures stay comparable across campaigns.

use std::path::PathBuf;
use std::time::Duration;

use distlock::{Config, Guarantee, Lease, LockError, Locks, OptionValue};
use rand::Rng;

use crate::history::{Event, Recorder};
use crate::resource::Line;
use crate::workload::{FIRST_OBSERVER, NAME, Workload};

/// What a client is told on its command line.
pub struct ClientArgs {
    /// The backend URL.
    pub url: String,
    /// `host:port` of the resource process.
    pub resource: String,
    /// Its history file.
    pub history: PathBuf,
    /// Its process number in the history.
    pub id: u32,
    /// The lease TTL.
    pub ttl: Duration,
    /// The longest sleep between reading and writing the lock-set.
    pub max_sleep: Duration,
    /// How long to keep the lock after the writes (a long job), or until it is lost: a cut
    /// then lands on a lease that must be kept alive, and its lost signal can be timed.
    pub hold: Duration,
    /// What it does.
    pub workload: Workload,
}

/// What a client took, with what it must do to give it back.
enum Held {
    Lease(Lease),
    Leadership(distlock::Leadership),
}

impl Held {
    fn lease(&self) -> &Lease {
        match self {
            Held::Lease(l) => l,
            Held::Leadership(l) => l.lease(),
        }
    }

    async fn release(self) -> bool {
        match self {
            Held::Lease(l) => l.release().await.unwrap_or(false),
            Held::Leadership(l) => l.resign().await.unwrap_or(false),
        }
    }
}

/// The primitive a client takes.
enum Handle {
    Lock,
    Semaphore(distlock::Semaphore),
    RwLock(distlock::RwLock),
    Election(distlock::Election),
}

fn fail(id: u32, what: impl std::fmt::Display) -> ! {
    eprintln!("client {id}: {what}");
    std::process::exit(1);
}

/// Runs until killed.
pub async fn run(args: ClientArgs) {
    let rec = Recorder::open(&args.history, args.id).unwrap_or_else(|e| fail(args.id, e));
    let mut config = Config::for_url(&args.url);
    config.lease.ttl = Some(OptionValue::Text(format!("{}ms", args.ttl.as_millis())));
    // The servers may be down at start (a nemesis): keep trying, as a service would.
    let locks = loop {
        match Locks::from_config(&config).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let grade = if locks.profiles().1.is_some() {
        Guarantee::Correctness
    } else {
        Guarantee::Efficiency
    };
    let handle = match args.workload {
        Workload::Lock | Workload::Crowd(_) => Ok(Handle::Lock),
        Workload::Semaphore(n) => locks.semaphore(NAME, n, grade).map(Handle::Semaphore),
        Workload::RwLock => locks.rwlock(NAME, grade).map(Handle::RwLock),
        Workload::Election => locks.election(NAME, grade).map(Handle::Election),
    }
    .unwrap_or_else(|e| fail(args.id, e));
    if let Handle::Election(election) = &handle
        && args.id >= FIRST_OBSERVER
    {
        return crate::observer::run(election, &rec).await;
    }
    let mut resource = loop {
        match Line::connect(&args.resource).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let mut seq = 0u64;
    loop {
        seq += 1;
        let Some((held, shared)) = acquire(&locks, grade, &handle, &args, &rec, seq).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let lease = held.lease();
        let token = lease.fencing_token().map(|t| t.get());
        rec.record(Event::AcquireOk { token, shared });
        let watcher = {
            let signal = lease.lost_signal();
            let rec = Recorder::open(&args.history, args.id).ok();
            tokio::spawn(async move {
                let reason = signal.wait().await;
                if let Some(rec) = rec {
                    rec.record(Event::Lost {
                        reason: reason.to_string(),
                    });
                }
            })
        };
        let mut held = held;
        match &handle {
            Handle::Semaphore(_) => permit_work(&mut resource, held.lease(), &args, token).await,
            Handle::RwLock(_) if shared => read_work(&mut resource, held.lease(), &rec).await,
            _ => {
                exclusive_work(&mut resource, held.lease(), &args, &rec, token, seq).await;
                if let Held::Leadership(l) = &mut held
                    && rand::rng().random_bool(0.3)
                    && l.lease().lost_reason().is_none()
                {
                    let value = format!("{}-{seq}-p", args.id);
                    rec.record(Event::Proclaim {
                        value: value.clone(),
                    });
                    let _ = l.proclaim(&value).await;
                }
            }
        }
        if !args.hold.is_zero() {
            tokio::select! {
                _ = held.lease().lost() => {}
                _ = tokio::time::sleep(args.hold) => {}
            }
        } else if matches!(handle, Handle::Election(_)) {
            // A leader leads for a while; the others queue behind it.
            let lead = rand::rng().random_range(20..200);
            tokio::select! {
                _ = held.lease().lost() => {}
                _ = tokio::time::sleep(Duration::from_millis(lead)) => {}
            }
        }
        rec.record(Event::ReleaseInvoke);
        let was = held.release().await;
        rec.record(Event::ReleaseDone { held: was });
        watcher.abort();
        let pause = rand::rng().random_range(0..10);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// How a new primitive's client asks this time.
#[derive(Clone, Copy)]
enum Ask {
    /// Wait up to 5 s.
    Wait,
    /// Wait up to a few hundred milliseconds: the timeout path.
    Short(Duration),
    /// Try once.
    Try,
    /// Wait, and drop the wait after a random time: the cancel path.
    Drop(Duration),
}

/// A random ask; a try only where `tries` (an election has none: a candidate campaigns; a
/// crowd's clients are there to queue).
fn pick_ask(tries: bool) -> Ask {
    let mut rng = rand::rng();
    match rng.random_range(0..10) {
        0 | 1 if tries => Ask::Try,
        2 | 3 => Ask::Short(Duration::from_millis(rng.random_range(1..300))),
        4 | 5 => Ask::Drop(Duration::from_millis(rng.random_range(0..150))),
        _ => Ask::Wait,
    }
}

/// Asks for the name as the workload does, recording the attempt and its failure; the grant
/// (whether shared) on success.
async fn acquire(
    locks: &Locks,
    grade: Guarantee,
    handle: &Handle,
    args: &ClientArgs,
    rec: &Recorder,
    seq: u64,
) -> Option<(Held, bool)> {
    let ask = match handle {
        Handle::Lock if args.workload == Workload::Lock => Ask::Wait,
        Handle::Lock | Handle::Election(_) => pick_ask(false),
        _ => pick_ask(true),
    };
    let shared = match handle {
        Handle::Semaphore(_) => true,
        Handle::RwLock(_) => rand::rng().random_bool(0.7),
        _ => false,
    };
    let value = format!("{}-{seq}", args.id);
    rec.record(Event::AcquireInvoke {
        shared,
        value: matches!(handle, Handle::Election(_)).then(|| value.clone()),
    });
    let wait = match ask {
        Ask::Short(d) => d,
        _ => Duration::from_secs(5),
    };
    let taking = async {
        match (handle, ask) {
            (Handle::Lock, _) => {
                let acquire = match grade {
                    Guarantee::Correctness => locks.correctness(NAME),
                    Guarantee::Efficiency => locks.efficiency(NAME),
                };
                acquire.ttl(args.ttl).wait(wait).await.map(Held::Lease)
            }
            (Handle::Semaphore(s), Ask::Try) => s.try_acquire().await.map(Held::Lease),
            (Handle::Semaphore(s), _) => s.acquire(wait).await.map(Held::Lease),
            (Handle::RwLock(l), Ask::Try) if shared => l.try_read().await.map(Held::Lease),
            (Handle::RwLock(l), Ask::Try) => l.try_write().await.map(Held::Lease),
            (Handle::RwLock(l), _) if shared => l.read(wait).await.map(Held::Lease),
            (Handle::RwLock(l), _) => l.write(wait).await.map(Held::Lease),
            (Handle::Election(e), _) => e.campaign_for(&value, wait).await.map(Held::Leadership),
        }
    };
    let result = match ask {
        Ask::Drop(after) => match tokio::time::timeout(after, taking).await {
            Ok(r) => r,
            Err(_) => {
                rec.record(Event::AcquireFail {
                    kind: "dropped".into(),
                });
                return None;
            }
        },
        _ => taking.await,
    };
    match result {
        Ok(held) => Some((held, shared)),
        Err(e) => {
            let kind = match e {
                LockError::Busy { .. } => "busy",
                LockError::Timeout { .. } => "timeout",
                _ => "error",
            };
            rec.record(Event::AcquireFail { kind: kind.into() });
            None
        }
    }
}

/// The lock's work (and a writer's, and a leader's): the fenced register with the token, then
/// one element added to the lock-set (read, sleep, write back).
async fn exclusive_work(
    resource: &mut Line,
    lease: &Lease,
    args: &ClientArgs,
    rec: &Recorder,
    token: Option<u64>,
    seq: u64,
) {
    if let Some(t) = token
        && lease.lost_reason().is_none()
    {
        rec.record(Event::WriteInvoke { token: t });
        match resource
            .ask(&format!("FENCED {t} {}", args.id))
            .await
            .as_deref()
        {
            Ok("OK") => rec.record(Event::WriteOk { token: t }),
            _ => rec.record(Event::WriteRefused { token: t }),
        }
    }
    if lease.lost_reason().is_none()
        && let Ok(read) = resource.ask("READ").await
    {
        let sleep = rand::rng().random_range(Duration::ZERO..=args.max_sleep);
        tokio::time::sleep(sleep).await;
        if lease.lost_reason().is_none() {
            let element = format!("{}-{seq}", args.id);
            let set = read.trim_start_matches("SET").trim();
            if resource
                .ask(&format!("WRITE {set} {element}"))
                .await
                .is_ok_and(|r| r == "OK")
            {
                rec.record(Event::SetAdd { element });
            }
        }
    }
}

/// A reader's work: the register read twice with a sleep between; a write between the two
/// while the read lease was held is a torn read.
async fn read_work(resource: &mut Line, lease: &Lease, rec: &Recorder) {
    if lease.lost_reason().is_some() {
        return;
    }
    let Ok(before) = resource.ask("PEEK").await else {
        return;
    };
    let sleep = rand::rng().random_range(0..20);
    tokio::time::sleep(Duration::from_millis(sleep)).await;
    let Ok(after) = resource.ask("PEEK").await else {
        return;
    };
    if before != after && lease.lost_reason().is_none() {
        rec.record(Event::TornRead { before, after });
    }
}

/// A permit holder's work: registered at the resource while it works.
async fn permit_work(resource: &mut Line, lease: &Lease, args: &ClientArgs, token: Option<u64>) {
    if lease.lost_reason().is_some() {
        return;
    }
    let token = token.map_or("-".to_string(), |t| t.to_string());
    if resource
        .ask(&format!("ENTER {} {token}", args.id))
        .await
        .is_err()
    {
        return;
    }
    // A careful holder stops at its lost signal, which comes before another can be given the
    // permit.
    let sleep = rand::rng().random_range(Duration::ZERO..=args.max_sleep);
    tokio::select! {
        _ = lease.lost() => {}
        _ = tokio::time::sleep(sleep) => {}
    }
    let _ = resource.ask(&format!("LEAVE {}", args.id)).await;
}
