//! An efficiency lock from a configuration file: "only one replica rebuilds the cache".
//!
//! ```sh
//! cargo run -p distlock --example efficiency_from_config -- distlock.toml
//! ```
//!
//! With no file (and no `DISTLOCK_*` variables) the embedded in-memory backend serves. A replica
//! that finds the lock held skips the rebuild: a rare double run would only waste work.

use std::path::PathBuf;
use std::time::Duration;

use distlock::{LockError, Locks};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::args().nth(1).map(PathBuf::from);
    let locks = Locks::load(file.as_deref()).await?;
    println!(
        "efficiency locks come from backend {:?}",
        locks.profiles().0
    );
    match locks
        .efficiency("cache:rebuild")
        .ttl(Duration::from_secs(30))
        .try_now()
        .await
    {
        Ok(lease) => {
            println!("rebuilding the cache (token {:?})", lease.fencing_token());
            tokio::time::sleep(Duration::from_millis(100)).await;
            lease.release().await?;
            println!("done");
        }
        Err(LockError::Busy { .. }) => println!("another replica is rebuilding; skipping"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
