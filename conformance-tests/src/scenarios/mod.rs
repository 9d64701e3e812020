//! The scenarios, written once. Each takes a [`Deployment`] and asserts something that can fail.
//! Names are unique per run, so scenarios share servers and run concurrently.

mod basic;
mod cancellation;
mod election;
mod faults;
mod fencing;
mod idle;
mod inspect;
mod liveness;
mod lost;
mod ownership;
mod process;
mod reentrancy;
mod release;
mod renewal;
mod run;
mod semaphore;
mod waiting;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    AcquireOptions, Admission, Capabilities, FencingToken, Grant, GrantKey, Leader, LockBackend,
    LockClient, LockName, LockStatus, Renewal,
};
use futures_util::stream::BoxStream;
use tokio::time::Instant;

pub use basic::*;
pub use cancellation::*;
pub use election::*;
pub use faults::*;
pub use fencing::*;
pub use idle::*;
pub use inspect::*;
pub use liveness::*;
pub use lost::*;
pub use ownership::*;
pub use process::*;
pub use reentrancy::*;
pub use release::*;
pub use renewal::*;
pub use run::*;
pub use semaphore::*;
pub use waiting::*;

use crate::deployment::Deployment;

/// A name no other test or earlier run uses.
pub(crate) fn unique(scenario: &str) -> String {
    format!("conformance/{scenario}/{:016x}", rand::random::<u64>())
}

/// A lock client on a new, independent backend client.
pub(crate) async fn client(d: &dyn Deployment) -> LockClient {
    LockClient::new(d.client().await)
}

/// Default options with the deployment's TTL.
pub(crate) fn opts(d: &dyn Deployment) -> AcquireOptions {
    AcquireOptions::with_ttl(d.ttl())
}

/// Polls `check` until it holds or `within` passes; returns whether it held.
pub(crate) async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A backend wrapper that counts renewals (to prove when the watchdog stops) and the renewal
/// calls the watchdog made (on completion, so a server has counted their requests by then).
/// Batches go to the wrapped backend as batches: its own batched path is what runs.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn LockBackend>,
    renewals: AtomicUsize,
    batches: AtomicUsize,
}

impl Counting {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            renewals: AtomicUsize::new(0),
            batches: AtomicUsize::new(0),
        })
    }

    /// Leases renewed so far (each lease of a batch counts once).
    pub fn renewals(&self) -> usize {
        self.renewals.load(Ordering::SeqCst)
    }

    /// Waits until `n` more renewal calls have completed, or `limit` passed.
    pub async fn wait_batches(&self, n: usize, limit: Duration) {
        let target = self.batches.load(Ordering::SeqCst) + n;
        let until = Instant::now() + limit;
        while self.batches.load(Ordering::SeqCst) < target && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl LockBackend for Counting {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn lease_ttl(&self, requested: Duration) -> Duration {
        self.inner.lease_ttl(requested)
    }
    async fn try_acquire(&self, name: &LockName, ttl: Duration) -> distlock_api::Result<Grant> {
        self.inner.try_acquire(name, ttl).await
    }
    async fn acquire(
        &self,
        name: &LockName,
        ttl: Duration,
        deadline: Instant,
    ) -> distlock_api::Result<Grant> {
        self.inner.acquire(name, ttl, deadline).await
    }
    async fn renew(&self, key: &GrantKey, ttl: Duration) -> distlock_api::Result<Renewal> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(key, ttl).await
    }
    async fn renew_batch(
        &self,
        batch: &[(&GrantKey, Duration)],
        deadline: Instant,
    ) -> Vec<distlock_api::Result<Renewal>> {
        self.renewals.fetch_add(batch.len(), Ordering::SeqCst);
        let out = self.inner.renew_batch(batch, deadline).await;
        self.batches.fetch_add(1, Ordering::SeqCst);
        out
    }
    async fn release(&self, key: &GrantKey) -> distlock_api::Result<bool> {
        self.inner.release(key).await
    }
    async fn abandon(&self, key: &GrantKey) {
        self.inner.abandon(key).await
    }
    async fn reconnect(&self) -> distlock_api::Result<Arc<dyn LockBackend>> {
        self.inner.reconnect().await
    }
    async fn inspect(&self, name: &LockName) -> distlock_api::Result<LockStatus> {
        self.inner.inspect(name).await
    }
    async fn acquire_admitted(
        &self,
        name: &LockName,
        admission: Admission,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> distlock_api::Result<Grant> {
        self.inner
            .acquire_admitted(name, admission, ttl, deadline)
            .await
    }
    async fn announce(
        &self,
        key: &GrantKey,
        token: FencingToken,
        value: &str,
    ) -> distlock_api::Result<bool> {
        self.inner.announce(key, token, value).await
    }
    async fn leader(&self, name: &LockName) -> distlock_api::Result<Option<Leader>> {
        self.inner.leader(name).await
    }
    async fn leader_changes(
        &self,
        name: &LockName,
    ) -> distlock_api::Result<BoxStream<'static, ()>> {
        self.inner.leader_changes(name).await
    }
}
