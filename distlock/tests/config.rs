//! Configuration: defaults that work, profiles per grade, and one typed error per bad input.

use distlock::{Config, ConfigError, Guarantee, LockError, Locks};
use figment::Jail;

async fn load(toml: &str) -> Result<Locks, ConfigError> {
    Locks::from_config(&Config::from_toml(toml)?).await
}

fn invalid_key(r: Result<Locks, ConfigError>) -> (String, String) {
    match r {
        Err(ConfigError::InvalidValue { key, value, .. }) => (key, value),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
}

#[tokio::test]
async fn no_configuration_means_one_memory_backend_for_both_grades() {
    let locks = load("").await.expect("defaults");
    assert_eq!(locks.profiles(), ("default", Some("default")));
    let lease = locks
        .correctness("payment:7")
        .try_now()
        .await
        .expect("correctness on memory");
    assert_eq!(lease.guarantee(), Guarantee::Correctness);
    assert!(lease.fencing_token().is_some());
    let busy = locks.efficiency("payment:7").try_now().await;
    assert!(
        matches!(busy, Err(LockError::Busy { .. })),
        "both profiles share the one store"
    );
}

#[tokio::test]
async fn memory_urls_with_one_store_name_share_it() {
    let toml = r#"
        efficiency = "a"
        correctness = "b"
        [backends.a]
        url = "memory://shared"
        [backends.b]
        url = "memory://shared"
    "#;
    let locks = load(toml).await.expect("two names, one store");
    let _held = locks.efficiency("x").try_now().await.expect("first");
    assert!(matches!(
        locks.correctness("x").try_now().await,
        Err(LockError::Busy { .. })
    ));
}

#[tokio::test]
async fn correctness_on_redis_fails_at_load_time_naming_profile_backend_and_capability() {
    let toml = r#"
        correctness = "cache"
        [backends.cache]
        url = "redis://127.0.0.1:1"
    "#;
    match load(toml).await {
        Err(ConfigError::GradeMismatch {
            profile,
            backend,
            kind,
            missing,
        }) => {
            assert_eq!(
                (profile.as_str(), backend.as_str(), kind.as_str()),
                ("correctness", "cache", "redis")
            );
            assert!(missing.contains("efficiency"), "{missing}");
        }
        other => panic!("expected GradeMismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn correctness_on_every_redis_deployment_and_redlock_fails_at_load_time() {
    for (url, kind) in [
        ("rediss://127.0.0.1:1", "redis"),
        ("redis+cluster://127.0.0.1:1,127.0.0.1:2", "redis"),
        ("redis+sentinel://127.0.0.1:1/orders", "redis"),
        ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "redlock"),
    ] {
        let toml = format!("correctness = \"main\"\n[backends.main]\nurl = \"{url}\"");
        match load(&toml).await {
            Err(ConfigError::GradeMismatch {
                backend, kind: k, ..
            }) => {
                assert_eq!((backend.as_str(), k.as_str()), ("main", kind), "{url}")
            }
            other => panic!("{url}: expected GradeMismatch, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_lone_efficiency_backend_that_cannot_connect_is_named() {
    // Port 1: nothing listens, so connecting fails; the grade logic is checked before that.
    let toml = r#"
        [backends.cache]
        url = "redis://127.0.0.1:1?connect_timeout=200ms"
    "#;
    match load(toml).await {
        Err(ConfigError::Backend { backend, .. }) => assert_eq!(backend, "cache"),
        other => panic!("expected a connect error for the efficiency backend, got {other:?}"),
    }
}

#[tokio::test]
async fn unknown_scheme_is_named() {
    match load("[backends.x]\nurl = \"consul://h:1\"").await {
        Err(ConfigError::UnknownScheme {
            key, scheme, known, ..
        }) => {
            assert_eq!(
                (key.as_str(), scheme.as_str()),
                ("backends.x.url", "consul")
            );
            assert!(known.contains("etcd"), "{known}");
        }
        other => panic!("expected UnknownScheme, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_url_is_named() {
    let (key, value) = invalid_key(load("[backends.x]\nurl = \"etcd:h1:2379\"").await);
    assert_eq!(
        (key.as_str(), value.as_str()),
        ("backends.x.url", "etcd:h1:2379")
    );
    let (key, value) = invalid_key(load("[backends.x]\nurl = \"etcd://h1:notaport\"").await);
    assert_eq!(key, "backends.x.url");
    assert!(value.contains("notaport"));
}

#[tokio::test]
async fn empty_endpoint_list_is_named() {
    let (key, _) = invalid_key(load("[backends.x]\nurl = \"etcd:///prefix\"").await);
    assert_eq!(key, "backends.x.url");
    let (key, _) = invalid_key(load("[backends.x]\nurl = \"zk://,,/app\"").await);
    assert_eq!(key, "backends.x.url");
}

#[tokio::test]
async fn zero_ttl_is_named() {
    let (key, value) = invalid_key(load("[lease]\nttl = \"0s\"").await);
    assert_eq!((key.as_str(), value.as_str()), ("lease.ttl", "0s"));
}

#[tokio::test]
async fn negative_ttl_is_named() {
    let (key, value) = invalid_key(load("[lease]\nttl = -5").await);
    assert_eq!((key.as_str(), value.as_str()), ("lease.ttl", "-5"));
}

#[tokio::test]
async fn renew_interval_not_below_ttl_is_named() {
    let (key, _) = invalid_key(load("[lease]\nttl = \"10s\"\nrenew_every = \"10s\"").await);
    assert_eq!(key, "lease.renew_every");
}

#[tokio::test]
async fn bad_backend_option_is_named() {
    let toml = "[backends.x]\nurl = \"etcd://h:2379\"\noptions = { session_ttl = \"soon\" }";
    let (key, value) = invalid_key(load(toml).await);
    assert_eq!(
        (key.as_str(), value.as_str()),
        ("backends.x.options.session_ttl", "soon")
    );
    let (key, _) = invalid_key(load("[backends.x]\nurl = \"zk://h:2181?colour=red\"").await);
    assert_eq!(key, "backends.x.options.colour");
}

#[tokio::test]
async fn unknown_keys_are_refused() {
    for toml in [
        "colour = \"red\"",
        "[lease]\nttl = \"1s\"\nspeed = 3",
        "[backends.x]\nurl = \"memory://\"\nhost = \"h\"",
    ] {
        match load(toml).await {
            Err(ConfigError::Parse(e)) => assert!(e.to_string().contains("unknown field"), "{e}"),
            other => panic!("{toml}: expected a parse error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn profile_naming_a_missing_backend_is_named() {
    match load("correctness = \"main\"").await {
        Err(ConfigError::UnknownBackend {
            profile,
            backend,
            have,
        }) => {
            assert_eq!(
                (profile.as_str(), backend.as_str(), have.as_str()),
                ("correctness", "main", "default")
            );
        }
        other => panic!("expected UnknownBackend, got {other:?}"),
    }
}

#[tokio::test]
async fn several_backends_need_an_efficiency_profile() {
    let toml = "[backends.a]\nurl = \"memory://a\"\n[backends.b]\nurl = \"memory://b\"";
    let (key, _) = invalid_key(load(toml).await);
    assert_eq!(key, "efficiency");
}

#[test]
fn passwords_never_show_in_debug_or_errors() {
    let config = Config::from_toml(
        "[backends.x]\nurl = \"redis://user:hunter2@h:6379/0\"\noptions = { password = \"hunter3\" }",
    )
    .expect("parses");
    let dbg = format!("{config:?}");
    assert!(
        !dbg.contains("hunter2") && !dbg.contains("hunter3"),
        "{dbg}"
    );
    let err =
        distlock::BackendSpec::parse("k", "etcd://user:hunter2@h:notaport", &Default::default())
            .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[test]
// figment's Jail fixes the closure's error type; its size is not ours to choose.
#[allow(clippy::result_large_err)]
fn file_and_environment_merge_with_environment_winning() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "distlock.toml",
            "efficiency = \"a\"\n[backends.a]\nurl = \"memory://a\"\n[lease]\nttl = \"30s\"",
        )?;
        jail.set_env("DISTLOCK_LEASE__TTL", "5s");
        jail.set_env("DISTLOCK_BACKENDS__B__URL", "memory://b");
        jail.set_env("DISTLOCK_CORRECTNESS", "b");
        let config = Config::load(Some("distlock.toml".as_ref())).expect("loads");
        assert_eq!(
            config.lease.ttl.map(|t| t.to_string()).as_deref(),
            Some("5s")
        );
        assert_eq!(config.backends["b"].url, "memory://b");
        assert_eq!(config.correctness.as_deref(), Some("b"));
        assert_eq!(config.efficiency.as_deref(), Some("a"));
        Ok(())
    });
}

#[cfg(feature = "redis")]
#[test]
fn every_redis_deployment_parses_from_a_url() {
    use distlock::BackendSpec;
    use distlock_redis::RedisTopology;
    let none = Default::default();
    let topology = |url: &str| match BackendSpec::parse("url", url, &none) {
        Ok(BackendSpec::Redis { topology, options }) => (topology, options),
        other => panic!("{url}: {other:?}"),
    };
    let (t, o) = topology("redis://h:6379/2?min_replicas=1&replica_timeout=250ms");
    assert_eq!(t, RedisTopology::Single("redis://h:6379/2".into()));
    assert_eq!((o.min_replicas, o.replica_timeout.as_millis()), (1, 250));
    let (t, _) = topology("rediss+cluster://u:pw@a:7000,b:7001");
    assert_eq!(
        t,
        RedisTopology::Cluster(vec![
            "rediss://u:pw@a:7000".into(),
            "rediss://u:pw@b:7001".into()
        ])
    );
    let (t, _) = topology("redis+sentinel://u:pw@s1:26379,s2:26379/orders");
    assert_eq!(
        t,
        RedisTopology::Sentinel {
            sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
            service: "orders".into(),
            node_auth: Some("redis://u:pw@localhost".into()),
        }
    );
    assert!(!format!("{t:?}").contains("pw"), "{t:?}");
}

/// What a layout cannot give is known at load time, before connecting: the Redis plain layout
/// has no token, queue or policies; ZooKeeper's kazoo layout no semaphores.
#[cfg(all(feature = "redis", feature = "zk"))]
#[test]
fn a_layout_declares_what_it_gives_before_connecting() {
    use distlock::{BackendSpec, Fencing};
    let none = Default::default();
    let caps = |url: &str| {
        BackendSpec::parse("url", url, &none)
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .capabilities()
    };
    let plain = caps("redis://h:6379?layout=plain");
    assert_eq!(
        (plain.fencing, plain.fifo, plain.policies),
        (Fencing::None, false, false)
    );
    assert!(caps("redis://h:6379").fencing.is_monotonic());
    assert!(!caps("zk://h:2181?layout=kazoo").permits);
    assert!(caps("zk://h:2181").permits);
}

#[cfg(feature = "redis")]
#[test]
fn bad_redis_deployments_are_named() {
    use distlock::BackendSpec;
    let none = Default::default();
    let key_of = |url: &str| match BackendSpec::parse("url", url, &none) {
        Err(ConfigError::InvalidValue { key, reason, .. }) => (key, reason),
        other => panic!("{url}: expected InvalidValue, got {other:?}"),
    };
    let (key, reason) = key_of("redis+sentinel://s1:26379");
    assert_eq!(key, "url");
    assert!(reason.contains("<service>"), "{reason}");
    assert_eq!(key_of("redis+cluster://").0, "url");
    assert_eq!(key_of("redis://h:6379?ca=/nowhere.pem").0, "url.options.ca");
    assert_eq!(
        key_of("rediss://h:6379?ca=/nowhere.pem").0,
        "url.options.ca"
    );
    assert_eq!(
        key_of("redis://h:6379?min_replicas=two").0,
        "url.options.min_replicas"
    );
}
