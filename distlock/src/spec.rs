//! Backend URLs parsed into a [`BackendSpec`] with typed errors, then connected. Each backend
//! crate declares its schemes and reads its own options (`distlock_redis::url`,
//! `distlock_etcd::url`, `distlock_zk::url`, on the shared grammar of `distlock_api::url`); this
//! module picks the crate by scheme, for the crates the cargo features `redis`, `etcd`, `zk`
//! enable. Options come from the query string or from a table; both use the same names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use distlock_api::memory::MemoryStore;
use distlock_api::url::BackendUrl;
use distlock_api::{Capabilities, LockBackend};

use crate::error::ConfigError;

/// A parsed backend location with its options, not yet connected.
#[derive(Clone)]
#[non_exhaustive]
pub enum BackendSpec {
    /// `memory://[store]`: an in-process store; every URL with the same store name shares it.
    Memory {
        /// The store name (empty for the default store).
        store: String,
    },
    /// One Redis deployment:
    /// * `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS): one server;
    /// * `redis+cluster://[user:password@]h1:p1,h2:p2,...` (`rediss+cluster://` for TLS): a Redis
    ///   Cluster reached through any of the nodes;
    /// * `redis+sentinel://[user:password@]s1:p1,s2:p2/<service>`: the master the Sentinels name
    ///   for `<service>` (the credentials are the data nodes').
    ///
    /// Options: `prefix`, `op_timeout`, `connect_timeout`, `min_replicas` (`WAIT` for that many
    /// replicas after each grant), `replica_timeout`, and for TLS `ca=<pem path>` (plus `cert=`
    /// and `key=` for a client certificate).
    #[cfg(feature = "redis")]
    Redis {
        /// Where (our own options removed from the URLs).
        topology: distlock_redis::RedisTopology,
        /// Backend options.
        options: distlock_redis::RedisOptions,
    },
    /// `redlock://[user:password@]h1:p1,h2:p2,h3:p3[?prefix=..&node_timeout=..&drift_factor=..&retry_delay=50ms..250ms&retry_count=..]`:
    /// Redlock over independent masters (an odd number, at least 3).
    #[cfg(feature = "redis")]
    Redlock {
        /// `redis://` URL of each master.
        urls: Vec<String>,
        /// Algorithm options.
        options: distlock_redis::RedlockOptions,
    },
    /// `etcd://[user:password@]h1:p1,h2:p2[/prefix][?session_ttl=..&op_timeout=..&connect_timeout=..]`;
    /// TLS with `ca=<pem path>` (and `cert=`, `key=` for a client certificate, `tls_domain=`).
    #[cfg(feature = "etcd")]
    Etcd {
        /// `host:port` of each member.
        endpoints: Vec<String>,
        /// Backend options.
        options: distlock_etcd::EtcdOptions,
    },
    /// `zk://[user:password@]h1:p1,h2:p2[/chroot][?root=..&session_timeout=..&on_disconnect=lose|wait:5s&acl=open|creator]`.
    #[cfg(feature = "zk")]
    Zk {
        /// The connect string, chroot included.
        connect: String,
        /// Backend options.
        options: distlock_zk::ZkOptions,
    },
}

impl std::fmt::Debug for BackendSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendSpec::Memory { store } => {
                f.debug_struct("Memory").field("store", store).finish()
            }
            #[cfg(feature = "redis")]
            BackendSpec::Redis { topology, options } => f
                .debug_struct("Redis")
                .field("topology", topology)
                .field("options", options)
                .finish(),
            #[cfg(feature = "redis")]
            BackendSpec::Redlock { urls, options } => f
                .debug_struct("Redlock")
                .field("urls", &urls.iter().map(|u| redact(u)).collect::<Vec<_>>())
                .field("options", options)
                .finish(),
            #[cfg(feature = "etcd")]
            BackendSpec::Etcd { endpoints, options } => f
                .debug_struct("Etcd")
                .field("endpoints", endpoints)
                .field("options", options)
                .finish(),
            #[cfg(feature = "zk")]
            BackendSpec::Zk { connect, options } => f
                .debug_struct("Zk")
                .field("connect", connect)
                .field("options", options)
                .finish(),
        }
    }
}

/// The schemes this build accepts: `memory`, and those each enabled backend crate declares.
pub fn known_schemes() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut s = vec!["memory"];
    #[cfg(feature = "redis")]
    s.extend(
        distlock_redis::url::SCHEMES
            .iter()
            .chain(distlock_redis::url::REDLOCK_SCHEMES),
    );
    #[cfg(feature = "etcd")]
    s.extend(distlock_etcd::url::SCHEMES);
    #[cfg(feature = "zk")]
    s.extend(distlock_zk::url::SCHEMES);
    s
}

/// Hides the password of `scheme://user:password@...` and of a `password=` query parameter.
pub fn redact(url: &str) -> String {
    distlock_api::url::redact(url)
}

/// Parses `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds. Zero and negatives are errors.
///
/// # Errors
/// [`ConfigError::InvalidValue`] naming `key` and `value`.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration, ConfigError> {
    distlock_api::url::parse_duration(key, value).map_err(ConfigError::from_backend_url)
}

impl BackendSpec {
    /// Parses `url`; `extra` are table options that override query parameters. `key` names where
    /// the URL came from, for errors.
    ///
    /// # Errors
    /// [`ConfigError::UnknownScheme`], or [`ConfigError::InvalidValue`] naming the key and value.
    pub fn parse(
        key: &str,
        url: &str,
        extra: &BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let mut parts =
            BackendUrl::parse(key, url, extra).map_err(ConfigError::from_backend_url)?;
        let scheme = parts.scheme.clone();
        let scheme = scheme.as_str();
        let read = |r: distlock_api::Result<BackendSpec>| r.map_err(ConfigError::from_backend_url);
        // Each backend crate declares its schemes and reads its own options.
        let spec = match scheme {
            "memory" => BackendSpec::Memory {
                store: parts.hosts.clone(),
            },
            #[cfg(feature = "redis")]
            s if distlock_redis::url::SCHEMES.contains(&s) => read(
                distlock_redis::url::redis_from_url(&mut parts)
                    .map(|(topology, options)| BackendSpec::Redis { topology, options }),
            )?,
            #[cfg(feature = "redis")]
            s if distlock_redis::url::REDLOCK_SCHEMES.contains(&s) => read(
                distlock_redis::url::redlock_from_url(&mut parts)
                    .map(|(urls, options)| BackendSpec::Redlock { urls, options }),
            )?,
            #[cfg(feature = "etcd")]
            s if distlock_etcd::url::SCHEMES.contains(&s) => read(
                distlock_etcd::url::from_url(&mut parts)
                    .map(|(endpoints, options)| BackendSpec::Etcd { endpoints, options }),
            )?,
            #[cfg(feature = "zk")]
            s if distlock_zk::url::SCHEMES.contains(&s) => read(
                distlock_zk::url::from_url(&mut parts)
                    .map(|(connect, options)| BackendSpec::Zk { connect, options }),
            )?,
            other => {
                return Err(ConfigError::UnknownScheme {
                    key: key.to_string(),
                    scheme: other.to_string(),
                    url: redact(url),
                    known: known_schemes().join(", "),
                });
            }
        };
        parts.finish().map_err(ConfigError::from_backend_url)?;
        Ok(spec)
    }

    /// The backend kind (`memory`, `redis`, `etcd`, `zk`).
    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Memory { .. } => "memory",
            #[cfg(feature = "redis")]
            BackendSpec::Redis { .. } => "redis",
            #[cfg(feature = "redis")]
            BackendSpec::Redlock { .. } => "redlock",
            #[cfg(feature = "etcd")]
            BackendSpec::Etcd { .. } => "etcd",
            #[cfg(feature = "zk")]
            BackendSpec::Zk { .. } => "zk",
        }
    }

    /// What the backend declares, known before connecting (so grades are checked at load time).
    pub fn capabilities(&self) -> Capabilities {
        match self {
            BackendSpec::Memory { .. } => distlock_api::memory::MemoryBackend::default()
                .capabilities()
                .clone(),
            #[cfg(feature = "redis")]
            BackendSpec::Redis { .. } => distlock_redis::CAPABILITIES,
            #[cfg(feature = "redis")]
            BackendSpec::Redlock { .. } => distlock_redis::REDLOCK_CAPABILITIES,
            #[cfg(feature = "etcd")]
            BackendSpec::Etcd { .. } => distlock_etcd::CAPABILITIES,
            #[cfg(feature = "zk")]
            BackendSpec::Zk { .. } => distlock_zk::CAPABILITIES,
        }
    }

    /// Connects a new, independent client.
    ///
    /// # Errors
    /// The backend's own error when it cannot be reached or refuses the options.
    pub async fn connect(&self) -> distlock_api::Result<Arc<dyn LockBackend>> {
        Ok(match self {
            BackendSpec::Memory { store } => Arc::new(memory_store(store).client()),
            #[cfg(feature = "redis")]
            BackendSpec::Redis { topology, options } => {
                Arc::new(distlock_redis::RedisBackend::connect_to(topology, options.clone()).await?)
            }
            #[cfg(feature = "redis")]
            BackendSpec::Redlock { urls, options } => {
                Arc::new(distlock_redis::RedlockBackend::connect(urls, options.clone()).await?)
            }
            #[cfg(feature = "etcd")]
            BackendSpec::Etcd { endpoints, options } => {
                Arc::new(distlock_etcd::EtcdBackend::connect(endpoints, options.clone()).await?)
            }
            #[cfg(feature = "zk")]
            BackendSpec::Zk { connect, options } => {
                Arc::new(distlock_zk::ZkBackend::connect(connect, options.clone()).await?)
            }
        })
    }
}

/// The process-wide in-memory stores, by name, so `memory://x` means the same store everywhere.
fn memory_store(name: &str) -> MemoryStore {
    static STORES: OnceLock<Mutex<BTreeMap<String, MemoryStore>>> = OnceLock::new();
    STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(name.to_string())
        .or_default()
        .clone()
}
