//! ZooKeeper digest authentication and creator-only ACLs on the lock nodes.

use std::sync::Arc;
use std::time::Duration;

use distlock::{AcquireOptions, LockClient};
use distlock_conformance::deployments::zk::{deploy, options};
use distlock_zk::{NodeAcl, ZkBackend, ZkOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_only_lock_nodes_refuse_other_users() {
    let d = deploy("zk", 1, false).await;
    let o = ZkOptions {
        root: "/distlock-auth".into(),
        digest: Some("alice:secret".into()),
        acl: NodeAcl::CreatorOnly,
        ..options()
    };
    let alice = LockClient::new(Arc::new(
        ZkBackend::connect(&d.ensemble.connect_string(), o.clone())
            .await
            .expect("connect"),
    ));
    let lease = alice
        .try_acquire("vault", &AcquireOptions::with_ttl(Duration::from_secs(2)))
        .await
        .expect("acquire with digest auth");
    // Someone without alice's credentials cannot delete her lock node.
    let node = lease.backend_key().to_string();
    assert!(node.starts_with("/distlock-auth/vault/"), "{node}");
    let stranger = d.admin.delete(&node, None).await;
    assert!(
        matches!(stranger, Err(zookeeper_client::Error::NoAuth)),
        "an unauthenticated client deleted the lock: {stranger:?}"
    );
    let read = d.admin.get_data(&node).await;
    assert!(
        matches!(read, Err(zookeeper_client::Error::NoAuth)),
        "an unauthenticated client read the lock: {read:?}"
    );
    assert!(lease.release().await.expect("the owner can release"));
}
