//! The matrix: one test per backend x scenario, named `<backend>::<scenario>`.

use distlock_conformance::conformance_tests;
use distlock_conformance::deployments;

conformance_tests!(memory, deployments::memory::FACTORY);
conformance_tests!(redis, deployments::redis::FACTORY);
conformance_tests!(redis_plain, deployments::redis::PLAIN_FACTORY);
conformance_tests!(redis_cluster, deployments::redis_cluster::FACTORY);
conformance_tests!(redlock, deployments::redlock::FACTORY);
conformance_tests!(etcd, deployments::etcd::FACTORY);
conformance_tests!(etcd3, deployments::etcd::CLUSTER_FACTORY);
conformance_tests!(zk, deployments::zk::FACTORY);
conformance_tests!(zk_kazoo, deployments::zk::KAZOO_FACTORY);
conformance_tests!(zk3, deployments::zk::ENSEMBLE_FACTORY);
conformance_tests!(postgres, deployments::postgres::FACTORY);
