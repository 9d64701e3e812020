//! The cross-process holder: acquires a lock through a backend URL (the same URL a user would
//! configure), then reports on stdout, one line each, so a test can pause or kill it:
//!
//! * `TOKEN <n>` (or `TOKEN none`) once the lock is held;
//! * `LOST <reason>` when its lost signal fires;
//! * `WRITE <n>` every 50 ms: the write it would make to the protected resource with its token.
//!
//! On SIGTERM it returns from `main`, as a service shutting down does: a wait is dropped there,
//! and a held lease as the runtime ends.
//!
//! Usage: `distlock-holder <url> <lock name> <ttl ms> [<permits> | read | write]`; with
//! `<permits>`, it takes a permit of the semaphore of that name and that many permits instead
//! of the lock; with `read` or `write`, it reads or writes the read-write lock of that name.

use std::io::Write;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use tokio::signal::unix::{SignalKind, signal};

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(name), Some(ttl)) = (
        args.get(1),
        args.get(2),
        args.get(3).and_then(|t| t.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: distlock-holder <url> <lock name> <ttl ms> [<permits> | read | write]");
        std::process::exit(2);
    };
    let backend = match distlock::connect(url).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        eprintln!("cannot listen for SIGTERM");
        std::process::exit(1);
    };
    let locks = LockClient::new(backend);
    let opts = AcquireOptions::with_ttl(Duration::from_millis(ttl));
    let wait = Duration::from_secs(30);
    let kind = args.get(4).map(String::as_str);
    let permits = match kind {
        None | Some("read" | "write") => None,
        Some(n) => match n.parse::<u32>() {
            Ok(n) => Some(n),
            Err(e) => {
                eprintln!("permits {n:?}: {e}");
                std::process::exit(2);
            }
        },
    };
    let acquire = async {
        match (kind, permits) {
            (None, _) => locks.acquire(name, &opts, wait).await,
            (_, Some(n)) => locks.semaphore(name, n)?.options(opts).acquire(wait).await,
            (Some("read"), _) => locks.rwlock(name)?.options(opts).read(wait).await,
            (Some(_), None) => locks.rwlock(name)?.options(opts).write(wait).await,
        }
    };
    let acquired = tokio::select! {
        acquired = acquire => acquired,
        _ = term.recv() => return,
    };
    let lease = match acquired {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let token = lease
        .fencing_token()
        .map_or("none".to_string(), |t| t.to_string());
    say(&format!("TOKEN {token}"));
    let lost = lease.lost_signal();
    tokio::spawn(async move {
        let reason = lost.wait().await;
        say(&format!("LOST {reason}"));
    });
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => say(&format!("WRITE {token}")),
            _ = term.recv() => return,
        }
    }
}
