//! The problem distlock solves, in one run: 8 "pods" sell stock from 100 units.
//!
//! 1. no lock: each pod reads the stock, then writes it back minus one; overlaps oversell;
//! 2. a distributed lock around the read-modify-write: exactly 100 sold;
//! 3. the lock, but pod 0 is paused (think GC) inside the critical section for longer than its
//!    lease: the lock can pass to another pod, and pod 0 wakes up and writes a stale stock value;
//! 4. the same pause, with the write checked against the lease's fencing token: refused;
//! 5. on PostgreSQL (`--backend postgres://...`, built with the `postgres` feature), the stock
//!    in a table of the same database and every write in a guarded transaction: the paused
//!    pod's write is refused by the guard itself, with no token kept anywhere.
//!
//! Runs on the embedded in-memory backend; no server needed. On a real server:
//!
//! ```sh
//! cargo run -p distlock --example oversell -- --backend redis://127.0.0.1:6379
//! cargo run -p distlock --example oversell -- --config distlock.toml   # + DISTLOCK_* variables
//! DISTLOCK_BACKENDS__MAIN__URL=etcd://127.0.0.1:2379 cargo run -p distlock --example oversell -- --config /dev/null
//! ```
//!
//! `--short` sells 20 units instead of 100 (what the tests run).
//!
//! On etcd and ZooKeeper a lease lives on the client's session, whose TTL it gets (10 s by
//! default): the paused pod sleeps past that, and its fixed lease is released at its deadline as
//! on every backend, so the paused rows take about a session TTL each there.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Config, Fence, Locks};

const PODS: usize = 8;
const TTL: Duration = Duration::from_millis(150);
/// Past the lease's own validity, the pause lasts this much longer.
const OVERSLEEP: Duration = Duration::from_millis(300);

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

async fn run(
    config: &Config,
    mode: Mode,
    stock: u64,
    name: &str,
) -> Result<(Outcome, u64), distlock::ConfigError> {
    let db = Arc::new(Db::default());
    *db.stock.lock().expect("stock") = stock;
    let mut pods = Vec::new();
    for pod in 0..PODS {
        let db = db.clone();
        let name = name.to_string();
        // Every pod is its own client of the lock store, as separate processes would be.
        let locks = Locks::from_config(config).await?;
        pods.push(tokio::spawn(async move {
            let mut out = Outcome::default();
            for round in 0.. {
                let lease = match mode {
                    Mode::NoLock => None,
                    // A paused process cannot renew: the lease is fixed, as a frozen watchdog.
                    _ => Some(
                        locks
                            .efficiency(&name)
                            .ttl(TTL)
                            .fixed()
                            .wait(Duration::from_secs(30))
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
                    && round == 0;
                if paused && let Some(l) = &lease {
                    tokio::time::sleep(l.remaining() + OVERSLEEP).await;
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
    let total = all_pods(pods).await;
    let left = *db.stock.lock().expect("stock");
    Ok((total, left))
}

/// Row 5: the stock in a table next to the lock's, each write in a guarded transaction
/// ([`distlock::postgres::guard`]).
#[cfg(feature = "postgres")]
mod guarded {
    use distlock::postgres::tokio_postgres::{Client, NoTls};
    use distlock::postgres::{PostgresOptions, guard};

    use super::*;

    /// The PostgreSQL options of `url`, when it is one.
    pub fn options(url: &str) -> Option<PostgresOptions> {
        match distlock::BackendSpec::parse("url", url, &Default::default()).ok()? {
            distlock::BackendSpec::Postgres { options } => Some(options),
            _ => None,
        }
    }

    async fn data(o: &PostgresOptions) -> Client {
        let config = o.client_config().expect("the URL's hosts");
        let (client, connection) = config.connect(NoTls).await.expect("data connection");
        tokio::spawn(connection);
        client
    }

    pub async fn run(
        config: &Config,
        o: &PostgresOptions,
        stock: u64,
        name: &str,
    ) -> Result<(Outcome, u64), distlock::ConfigError> {
        let admin = data(o).await;
        admin
            .batch_execute("CREATE TABLE IF NOT EXISTS oversell_stock (sku text PRIMARY KEY, units bigint NOT NULL)")
            .await
            .expect("stock table");
        admin
            .execute(
                "INSERT INTO oversell_stock VALUES ($1, $2) ON CONFLICT (sku) DO UPDATE SET units = $2",
                &[&name, &(stock as i64)],
            )
            .await
            .expect("stock");
        let mut pods = Vec::new();
        for pod in 0..PODS {
            let (name, locks, mut db) = (
                name.to_string(),
                Locks::from_config(config).await?,
                data(o).await,
            );
            pods.push(tokio::spawn(async move {
                let mut out = Outcome::default();
                for round in 0.. {
                    let lease = locks
                        .efficiency(&name)
                        .ttl(TTL)
                        .fixed()
                        .wait(Duration::from_secs(30))
                        .await
                        .expect("acquire");
                    let seen: i64 = db
                        .query_one("SELECT units FROM oversell_stock WHERE sku = $1", &[&name])
                        .await
                        .expect("read")
                        .get(0);
                    if seen == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if pod == 0 && round == 0 {
                        tokio::time::sleep(lease.remaining() + OVERSLEEP).await;
                    }
                    let txn = db.transaction().await.expect("begin");
                    if guard(&txn, &lease).await.expect("guard") {
                        txn.execute(
                            "UPDATE oversell_stock SET units = $1 WHERE sku = $2",
                            &[&(seen - 1), &name],
                        )
                        .await
                        .expect("write");
                        txn.commit().await.expect("commit");
                        out.sold += 1;
                    } else {
                        // Dropped: rolled back.
                        out.rejected += 1;
                    }
                    let _ = lease.release().await;
                }
                out
            }));
        }
        let total = all_pods(pods).await;
        let left: i64 = admin
            .query_one("SELECT units FROM oversell_stock WHERE sku = $1", &[&name])
            .await
            .expect("read")
            .get(0);
        Ok((total, left as u64))
    }
}

/// What the pods sold and had refused, in all.
async fn all_pods(pods: Vec<tokio::task::JoinHandle<Outcome>>) -> Outcome {
    let mut total = Outcome::default();
    for p in pods {
        let o = p.await.expect("pod");
        total.sold += o.sold;
        total.rejected += o.rejected;
    }
    total
}

/// Where the locks come from: a URL, a config file (+ environment), or a fresh in-memory store.
enum Source {
    Url(String),
    File(PathBuf),
    Memory,
}

/// The configuration of one scenario (a fresh in-memory store for each, on the default).
fn config_for(source: &Source, label: &str) -> Result<Config, distlock::ConfigError> {
    match source {
        Source::Url(u) => Ok(Config::for_url(u)),
        Source::File(f) => Config::load(Some(f)),
        Source::Memory => Ok(Config::for_url(&format!("memory://oversell-{label}"))),
    }
}

fn usage(problem: &str) -> ! {
    eprintln!("{problem}\nusage: oversell [--backend <url> | --config <file>] [--short]");
    std::process::exit(2);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let mut source = Source::Memory;
    let mut stock = 100;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--backend" => {
                source = Source::Url(
                    args.next()
                        .unwrap_or_else(|| usage("--backend needs a URL")),
                )
            }
            "--config" => {
                source = Source::File(
                    args.next()
                        .unwrap_or_else(|| usage("--config needs a file"))
                        .into(),
                )
            }
            "--short" => stock = 20,
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let shown = match &source {
        Source::Url(u) => distlock::redact(u),
        Source::File(f) => format!("config {}", f.display()),
        Source::Memory => "memory (embedded)".to_string(),
    };
    // A configuration that cannot be used is said before anything else is printed.
    if let Err(e) = match config_for(&source, "check") {
        Ok(c) => Locks::from_config(&c).await.map(drop),
        Err(e) => Err(e),
    } {
        eprintln!("cannot use {shown}: {e}");
        std::process::exit(2);
    }
    println!(
        "{PODS} pods sell from {stock} units (backend: {shown}, lock TTL {TTL:?} or the backend's minimum, pause: the lease's validity + {OVERSLEEP:?})\n"
    );
    println!("| scenario | sold | final stock | stale writes rejected | verdict |");
    println!("|---|---:|---:|---:|---|");
    let row = |label: &str, result: Result<(Outcome, u64), distlock::ConfigError>| {
        let (o, left) = result.unwrap_or_else(|e| {
            eprintln!("cannot use {shown}: {e}");
            std::process::exit(2);
        });
        let verdict = match o.sold.cmp(&stock) {
            std::cmp::Ordering::Greater => format!("OVERSOLD by {}", o.sold - stock),
            std::cmp::Ordering::Equal => "exact".to_string(),
            std::cmp::Ordering::Less => format!("undersold by {}", stock - o.sold),
        };
        println!(
            "| {label} | {} | {left} | {} | {verdict} |",
            o.sold, o.rejected
        );
    };
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
        let name = format!("stock:sku-42:{label}");
        let result = match config_for(&source, label) {
            Ok(c) => run(&c, mode, stock, &name).await,
            Err(e) => Err(e),
        };
        row(label, result);
    }
    #[cfg(feature = "postgres")]
    if let Source::Url(url) = &source
        && let Some(options) = guarded::options(url)
    {
        let label = "lock, holder paused past TTL, guarded transaction";
        let name = format!("stock:sku-42:{label}");
        let result = match config_for(&source, label) {
            Ok(c) => guarded::run(&c, &options, stock, &name).await,
            Err(e) => Err(e),
        };
        row(label, result);
    }
}
