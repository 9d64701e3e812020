//! The deployments the suite runs against, one module per backend, and the list of them all.

pub mod etcd;
pub mod memory;
pub mod postgres;
pub mod redis;
pub mod redis_cluster;
pub mod redlock;
pub mod zk;

use crate::Factory;

/// Every backend present in the workspace, in matrix column order.
pub fn all() -> Vec<Factory> {
    vec![
        memory::FACTORY,
        redis::FACTORY,
        redis::PLAIN_FACTORY,
        redis_cluster::FACTORY,
        redlock::FACTORY,
        etcd::FACTORY,
        etcd::CLUSTER_FACTORY,
        zk::FACTORY,
        zk::KAZOO_FACTORY,
        zk::ENSEMBLE_FACTORY,
        postgres::FACTORY,
    ]
}
