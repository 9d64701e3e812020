//! The in-memory reference backend: one store per test, clients are its clients.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::memory::{MemoryBackend, MemoryStore};
use distlock_api::{Capabilities, LockBackend, LockName};

use crate::Factory;
use crate::deployment::{Cut, Deployment};

/// A fresh [`MemoryStore`].
#[derive(Debug, Default)]
pub struct MemoryDeployment {
    store: MemoryStore,
}

/// The memory backend's factory: every deployment is a fresh store; no server to kill.
pub const FACTORY: Factory = Factory {
    label: "memory",
    capabilities: || MemoryBackend::default().capabilities().clone(),
    shared: || Box::pin(async { Arc::new(MemoryDeployment::default()) as Arc<dyn Deployment> }),
    isolated: None,
    survives_a_member_kill: false,
};

struct MemoryCut(MemoryBackend);

impl Cut for MemoryCut {
    fn reset(&self) {
        self.0.set_reachable(true);
    }
    fn cut(&self) {
        self.0.set_reachable(false);
    }
    fn restore(&self) {
        self.0.set_reachable(true);
    }
}

#[async_trait]
impl Deployment for MemoryDeployment {
    fn label(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        self.store.client().capabilities().clone()
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.store.client())
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        let c = self.store.client();
        (Arc::new(c.clone()), Box::new(MemoryCut(c)))
    }

    async fn artifacts(&self, name: &LockName) -> usize {
        self.store.artifacts(name)
    }

    async fn delete_lock(&self, name: &LockName) {
        assert!(self.store.evict(name), "nothing to evict");
    }

    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        self.store.holder_remaining(name)
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn expiry_slack(&self) -> Duration {
        Duration::from_millis(50)
    }
}
