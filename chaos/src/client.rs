//! One lock client, a process of its own: acquires one name through the public facade from a
//! backend URL, and under the lock writes the fenced register (with its token) and adds one
//! element to the lock-set (read, sleep, write back); then releases. It checks its lease before
//! each write, as a careful application does: what remains is the window no check can close.

use std::path::PathBuf;
use std::time::Duration;

use distlock::{Config, LockError, Locks};
use rand::Rng;

use crate::history::{Event, Recorder};
use crate::resource::Line;

/// What a client is told on its command line.
pub struct ClientArgs {
    /// The backend URL.
    pub url: String,
    /// The lock name.
    pub name: String,
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
}

/// Runs until killed.
pub async fn run(args: ClientArgs) {
    let rec = match Recorder::open(&args.history, args.id) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("client {}: {e}", args.id);
            std::process::exit(1);
        }
    };
    // The servers may be down at start (a nemesis): keep trying, as a service would.
    let locks = loop {
        match Locks::from_config(&Config::for_url(&args.url)).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let correctness = locks.profiles().1.is_some();
    let mut resource = loop {
        match Line::connect(&args.resource).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let mut seq = 0u64;
    loop {
        rec.record(Event::AcquireInvoke);
        let acquire = if correctness {
            locks.correctness(&args.name)
        } else {
            locks.efficiency(&args.name)
        };
        let lease = match acquire.ttl(args.ttl).wait(Duration::from_secs(5)).await {
            Ok(l) => l,
            Err(e) => {
                let kind = match e {
                    LockError::Busy { .. } => "busy",
                    LockError::Timeout { .. } => "timeout",
                    _ => "error",
                };
                rec.record(Event::AcquireFail { kind: kind.into() });
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let token = lease.fencing_token().map(|t| t.get());
        rec.record(Event::AcquireOk { token });
        let signal = lease.lost_signal();
        let watcher = {
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
                seq += 1;
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
        if !args.hold.is_zero() {
            tokio::select! {
                _ = lease.lost() => {}
                _ = tokio::time::sleep(args.hold) => {}
            }
        }
        rec.record(Event::ReleaseInvoke);
        let held = lease.release().await.unwrap_or(false);
        rec.record(Event::ReleaseDone { held });
        watcher.abort();
        let pause = rand::rng().random_range(0..10);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}
