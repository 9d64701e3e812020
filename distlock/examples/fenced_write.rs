//! A correctness lock and a fenced write: the resource keeps the highest token it accepted and
//! refuses older ones, so a holder that stalled past its lease cannot overwrite the work of the
//! next holder.
//!
//! ```sh
//! cargo run -p distlock --example fenced_write                                  # embedded
//! cargo run -p distlock --example fenced_write -- etcd://127.0.0.1:2379/shop    # a real server
//! ```
//!
//! With a database, the same check is a conditional write, for example
//! `UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence < $2`.

use std::sync::Mutex;
use std::time::Duration;

use distlock::{Config, Fence, Locks};

/// The protected resource: a balance and the fence in front of it.
#[derive(Default)]
struct Ledger {
    balance: Mutex<i64>,
    fence: Fence,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://fenced".into());
    // Loading fails here, before any lock is taken, if the backend cannot give correctness.
    let locks = Locks::from_config(&Config::for_url(&url)).await?;
    let ledger = Ledger::default();

    let first = locks
        .correctness("payment:7")
        .ttl(Duration::from_secs(2))
        .fixed()
        .wait(Duration::from_secs(5))
        .await?;
    let first_token = first
        .fencing_token()
        .expect("correctness leases are fenced");
    // The first holder stalls past its lease (GC pause, slow network)...
    tokio::time::sleep(first.remaining() + Duration::from_millis(200)).await;
    println!("first holder lost its lease: {:?}", first.lost_reason());

    // ...the next holder gets the lock and writes with a newer token...
    let second = locks
        .correctness("payment:7")
        .wait(Duration::from_secs(30))
        .await?;
    let second_token = second.fencing_token().expect("fenced");
    ledger.fence.guarded(second_token, || {
        *ledger.balance.lock().expect("balance") += 100
    })?;
    println!("second holder wrote with token {second_token:?}");

    // ...and the stalled holder's late write is refused.
    match ledger.fence.guarded(first_token, || {
        *ledger.balance.lock().expect("balance") -= 100
    }) {
        Ok(()) => println!("the stale write went through: the resource did not check"),
        Err(stale) => println!("stale write refused: {stale}"),
    }
    second.release().await?;
    drop(first);
    println!("balance: {}", *ledger.balance.lock().expect("balance"));
    Ok(())
}
