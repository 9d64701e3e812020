//! Swapping the backend with an environment variable only: the code names no backend.
//!
//! ```sh
//! cargo run -p distlock --example backend_from_env                       # embedded memory
//! DISTLOCK_BACKENDS__DEFAULT__URL=redis://127.0.0.1:6379 cargo run -p distlock --example backend_from_env
//! DISTLOCK_BACKENDS__DEFAULT__URL=etcd://127.0.0.1:2379/app cargo run -p distlock --example backend_from_env
//! ```
//!
//! The built-in configuration has one backend named `default` (`memory://`); the variable
//! replaces its URL. On Redis the correctness profile is absent (Redis cannot give correctness),
//! and asking for a correctness lock says so instead of handing out a weaker lock.

use std::time::Duration;

use distlock::Locks;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = Locks::load(None).await?;
    let (efficiency, correctness) = locks.profiles();
    println!("efficiency: {efficiency}, correctness: {correctness:?}");
    let lease = locks
        .efficiency("job:nightly-report")
        .wait(Duration::from_secs(5))
        .await?;
    println!(
        "{} lease, token {:?}",
        lease.backend(),
        lease.fencing_token()
    );
    lease.release().await?;
    match locks.correctness("payment:7").try_now().await {
        Ok(lease) => {
            println!("correctness lease, token {:?}", lease.fencing_token());
            lease.release().await?;
        }
        Err(e) => println!("no correctness lock here: {e}"),
    }
    Ok(())
}
