//! A client whose runtime ends while a request of its wait went unanswered: what a process that
//! returns from `main` mid-wait leaves on the server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Proxy, ProxyMode};

/// Handed to the client: from [`LoseReplies::now`] on, the servers' replies are lost.
pub struct LoseReplies(Arc<Vec<Proxy>>);

impl LoseReplies {
    /// Call once the client connected and had what it needs answered.
    pub fn now(self) {
        self.0
            .iter()
            .for_each(|x| x.set_mode(ProxyMode::DropReplies));
    }
}

/// Runs the client `start` makes on a runtime of its own, in a thread, with the addresses of
/// `proxies` (in front of the servers): it connects, calls [`LoseReplies::now`] and waits. Once
/// `landed` says the wait's request reached the server (1 s at most), the runtime is dropped
/// with the wait unanswered; the proxies pass again first, for a clean-up through new
/// connections. Whether the request landed; the runtime's drop has returned either way.
pub async fn reply_lost_as_the_runtime_ends<S, F>(
    proxies: &Arc<Vec<Proxy>>,
    start: S,
    mut landed: impl AsyncFnMut() -> bool,
) -> bool
where
    S: FnOnce(Vec<String>, LoseReplies) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let (seen, on_seen) = tokio::sync::oneshot::channel::<()>();
    let p = proxies.clone();
    let ender = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let addrs = p.iter().map(|x| x.addr().to_string()).collect();
            // Left running, on this runtime, until the runtime is dropped.
            tokio::spawn(start(addrs, LoseReplies(p.clone())));
            let _ = on_seen.await;
        });
        // Nothing polls the old connections now: the new ones' answers may pass.
        p.iter().for_each(|x| x.set_mode(ProxyMode::Pass));
        drop(rt);
    });
    let mut seen_landed = false;
    for _ in 0..100 {
        if landed().await {
            seen_landed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = seen.send(());
    tokio::task::spawn_blocking(move || ender.join().expect("the client's thread"))
        .await
        .expect("join");
    seen_landed
}
