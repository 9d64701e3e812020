//! A server that cannot take a new lock (full, out of memory) must say so at once.

use std::time::Duration;

use distlock_api::{AcquireOptions, LockClient};

/// Asks `client` for `name` with a 60 s wait and checks the server's refusal comes well inside
/// it (20 s): an error the server will repeat must not be waited out. The refusal must contain
/// `reason` (the server's words) and be retryable (the server takes the call once freed).
///
/// # Panics
/// When the acquire is granted, waits, or fails otherwise.
pub async fn refused_at_once(client: &LockClient, name: &str, opts: &AcquireOptions, reason: &str) {
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        client.acquire(name, opts, Duration::from_secs(60)),
    )
    .await
    .expect("a new acquire on a full server waited");
    match refused {
        Err(e) => {
            assert!(
                e.to_string().contains(reason),
                "the refusal does not say why: {e}"
            );
            assert!(
                e.is_retryable(),
                "a full server's refusal is worth a retry: {e}"
            );
        }
        Ok(_) => panic!("a full server granted a new lock"),
    }
}
