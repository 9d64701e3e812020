//! The problem distlock solves, in one run: 8 "pods" sell stock from 100 units.
//!
//! 1. no lock: each pod reads the stock, then writes it back minus one; overlaps oversell;
//! 2. a distributed lock around the read-modify-write: exactly 100 sold;
//! 3. the lock, but pod 0 is paused (think GC) inside the critical section for longer than its
//!    TTL: the lock passes to another pod, and pod 0 wakes up and writes a stale stock value;
//! 4. the same pause, with the write checked against the lease's fencing token: refused.
//!
//! Runs on the embedded in-memory backend; no server needed. Give a backend URL to run it on a
//! real server: `cargo run -p distlock --example oversell -- redis://127.0.0.1:6379`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{AcquireOptions, Fence, LockClient};

const PODS: usize = 8;
const STOCK: u64 = 100;
const TTL: Duration = Duration::from_millis(150);
const PAUSE: Duration = Duration::from_millis(400);

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    NoLock,
    Locked,
    PausedUnfenced,
    PausedFenced,
}

/// The shared "database": a stock counter and the fence that guards it.
#[derive(Default)]
struct Db {
    stock: Mutex<u64>,
    fence: Fence,
}

#[derive(Default, Clone, Copy)]
struct Outcome {
    sold: u64,
    rejected: u64,
}

async fn run(url: &str, mode: Mode) -> Result<(Outcome, u64), distlock::ConfigError> {
    let db = Arc::new(Db::default());
    *db.stock.lock().expect("stock") = STOCK;
    let mut pods = Vec::new();
    for pod in 0..PODS {
        let db = db.clone();
        // Every pod is its own client of the lock store, as separate processes would be.
        let locks = LockClient::new(distlock::connect(url).await?);
        pods.push(tokio::spawn(async move {
            let mut out = Outcome::default();
            // A paused process cannot renew: the lease is fixed, as the watchdog would be frozen too.
            let opts = AcquireOptions::with_ttl(TTL).fixed();
            for round in 0.. {
                let lease = match mode {
                    Mode::NoLock => None,
                    _ => Some(
                        locks
                            .acquire("stock:sku-42", &opts, Duration::from_secs(10))
                            .await
                            .expect("acquire"),
                    ),
                };
                let seen = *db.stock.lock().expect("stock");
                if seen == 0 {
                    break;
                }
                // The read-modify-write window: a database round trip.
                tokio::time::sleep(Duration::from_millis(1)).await;
                let paused = matches!(mode, Mode::PausedUnfenced | Mode::PausedFenced)
                    && pod == 0
                    && round == 3;
                if paused {
                    tokio::time::sleep(PAUSE).await;
                }
                let write = || *db.stock.lock().expect("stock") = seen - 1;
                match (mode, &lease) {
                    (Mode::PausedFenced, Some(l)) => {
                        // Redlock has no fencing token; every other backend has one.
                        let checked = match l.fencing_token() {
                            Some(token) => db.fence.guarded(token, write).is_ok(),
                            None => {
                                write();
                                true
                            }
                        };
                        if checked {
                            out.sold += 1;
                        } else {
                            out.rejected += 1;
                        }
                    }
                    _ => {
                        write();
                        out.sold += 1;
                    }
                }
                if let Some(l) = lease {
                    let _ = l.release().await;
                }
            }
            out
        }));
    }
    let mut total = Outcome::default();
    for p in pods {
        let o = p.await.expect("pod");
        total.sold += o.sold;
        total.rejected += o.rejected;
    }
    let left = *db.stock.lock().expect("stock");
    Ok((total, left))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let url = std::env::args().nth(1);
    let shown = url
        .as_deref()
        .map_or("memory (embedded)".to_string(), distlock::redact);
    println!(
        "{PODS} pods sell from {STOCK} units (backend: {shown}, lock TTL {TTL:?}, pause {PAUSE:?})\n"
    );
    println!("| scenario | sold | final stock | stale writes rejected | verdict |");
    println!("|---|---:|---:|---:|---|");
    for (mode, label) in [
        (Mode::NoLock, "no lock"),
        (Mode::Locked, "distributed lock"),
        (
            Mode::PausedUnfenced,
            "lock, holder paused past TTL, unfenced write",
        ),
        (
            Mode::PausedFenced,
            "lock, holder paused past TTL, fenced write",
        ),
    ] {
        // A fresh in-memory store per scenario, or the given server.
        let target = url
            .clone()
            .unwrap_or_else(|| format!("memory://oversell-{label}"));
        let (o, left) = match run(&target, mode).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cannot use {shown}: {e}");
                std::process::exit(2);
            }
        };
        let verdict = match o.sold.cmp(&STOCK) {
            std::cmp::Ordering::Greater => format!("OVERSOLD by {}", o.sold - STOCK),
            std::cmp::Ordering::Equal => "exact".to_string(),
            std::cmp::Ordering::Less => format!("undersold by {}", STOCK - o.sold),
        };
        println!(
            "| {label} | {} | {left} | {} | {verdict} |",
            o.sold, o.rejected
        );
    }
}
