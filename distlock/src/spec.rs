//! Backend URLs parsed into a [`BackendSpec`] with typed errors, then connected. [`SCHEMES`] is
//! the one list of schemes, whatever this build compiled in: a scheme whose backend's cargo
//! feature is off is refused with an error naming the feature. Each backend crate reads its own
//! options (`distlock_redis::url`, `distlock_etcd::url`, `distlock_zk::url`, `distlock_postgres::url`, on the shared
//! grammar of `distlock_api::url`). Options come from the query string or from a table; both
//! use the same names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

#[cfg(feature = "postgres")]
use distlock_api::LockError;
use distlock_api::memory::MemoryStore;
use distlock_api::url::BackendUrl;
use distlock_api::{Capabilities, Guarantee, LockBackend};

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
    /// Options: `prefix`, `layout=distlock|plain` (`plain`: the key other languages' clients
    /// share), `op_timeout`, `connect_timeout`, `min_replicas` (`WAIT` for that many
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
    /// `zk://[user:password@]h1:p1,h2:p2[/chroot][?root=..&session_timeout=..&on_disconnect=lose|wait:5s&acl=open|creator&layout=curator|kazoo]`.
    #[cfg(feature = "zk")]
    Zk {
        /// The connect string, chroot included.
        connect: String,
        /// Backend options.
        options: distlock_zk::ZkOptions,
    },
    /// `postgres://[user:password@]h1:p1[,h2:p2][/dbname][?schema=..&op_timeout=..&connect_timeout=..]`
    /// (also `postgresql://`): a lease table in the schema (default `distlock`), correctness
    /// grade where the server keeps grants durably (checked at connect).
    #[cfg(feature = "postgres")]
    Postgres {
        /// Servers, database, credentials and the backend's options.
        options: distlock_postgres::PostgresOptions,
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
            #[cfg(feature = "postgres")]
            BackendSpec::Postgres { options } => f
                .debug_struct("Postgres")
                .field("options", options)
                .finish(),
        }
    }
}

/// One URL scheme the facade knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// The scheme as written in a URL (`etcd` in `etcd://...`).
    pub name: &'static str,
    /// The backend kind it builds ([`BackendSpec::kind`]).
    pub kind: &'static str,
    /// The cargo feature of `distlock` that compiles that backend in (`None`: always there).
    pub feature: Option<&'static str>,
}

impl Scheme {
    /// Whether this build has the scheme's backend.
    pub fn compiled_in(&self) -> bool {
        match self.feature {
            None => true,
            Some("redis") => cfg!(feature = "redis"),
            Some("etcd") => cfg!(feature = "etcd"),
            Some("zk") => cfg!(feature = "zk"),
            Some("postgres") => cfg!(feature = "postgres"),
            Some(_) => false,
        }
    }
}

const fn scheme(name: &'static str, kind: &'static str, feature: Option<&'static str>) -> Scheme {
    Scheme {
        name,
        kind,
        feature,
    }
}

/// Every scheme the facade knows, whatever features this build has.
pub const SCHEMES: &[Scheme] = &[
    scheme("memory", "memory", None),
    scheme("redis", "redis", Some("redis")),
    scheme("rediss", "redis", Some("redis")),
    scheme("redis+cluster", "redis", Some("redis")),
    scheme("rediss+cluster", "redis", Some("redis")),
    scheme("redis+sentinel", "redis", Some("redis")),
    scheme("redlock", "redlock", Some("redis")),
    scheme("etcd", "etcd", Some("etcd")),
    scheme("zk", "zk", Some("zk")),
    scheme("postgres", "postgres", Some("postgres")),
    scheme("postgresql", "postgres", Some("postgres")),
];

/// The schemes this build accepts.
pub fn known_schemes() -> Vec<&'static str> {
    SCHEMES
        .iter()
        .filter(|s| s.compiled_in())
        .map(|s| s.name)
        .collect()
}

/// Hides the password of `scheme://user:password@...` and of a `password=` query parameter.
pub fn redact(url: &str) -> String {
    distlock_api::url::redact(url)
}

/// Parses a duration ([`distlock_api::url::parse_duration`]: `500ms`, `10s`, `1h30m`, a bare
/// number of seconds). Zero and negatives are errors.
///
/// # Errors
/// [`ConfigError::InvalidValue`] naming `key` and `value`.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration, ConfigError> {
    distlock_api::url::parse_duration(key, value).map_err(ConfigError::from_backend_url)
}

/// [`parse_duration`] for a wait, where zero means "try once" ([`distlock_api::url::parse_wait`]).
///
/// # Errors
/// As [`parse_duration`].
pub fn parse_wait(key: &str, value: &str) -> Result<Duration, ConfigError> {
    distlock_api::url::parse_wait(key, value).map_err(ConfigError::from_backend_url)
}

impl BackendSpec {
    /// Parses `url`; `extra` are table options that override query parameters. `key` names where
    /// the URL came from, for errors.
    ///
    /// # Errors
    /// [`ConfigError::UnknownScheme`], [`ConfigError::FeatureOff`] for a scheme whose backend
    /// this build left out, or [`ConfigError::InvalidValue`] naming the key and value.
    pub fn parse(
        key: &str,
        url: &str,
        extra: &BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        // Read by the backends' option readers, of which a memory-only build has none.
        #[allow(unused_mut)]
        let mut parts =
            BackendUrl::parse(key, url, extra).map_err(ConfigError::from_backend_url)?;
        let scheme = parts.scheme.clone();
        let scheme = scheme.as_str();
        #[allow(unused_variables)] // as `parts`
        let read = |r: distlock_api::Result<BackendSpec>| r.map_err(ConfigError::from_backend_url);
        let Some(known) = SCHEMES.iter().find(|s| s.name == scheme) else {
            return Err(ConfigError::UnknownScheme {
                key: key.to_string(),
                scheme: scheme.to_string(),
                url: redact(url),
                known: known_schemes().join(", "),
            });
        };
        if !known.compiled_in() {
            return Err(ConfigError::FeatureOff {
                key: key.to_string(),
                scheme: scheme.to_string(),
                feature: known.feature.unwrap_or_default(),
            });
        }
        let spec = match known.kind {
            #[cfg(feature = "redis")]
            "redis" => read(
                distlock_redis::url::redis_from_url(&mut parts)
                    .map(|(topology, options)| BackendSpec::Redis { topology, options }),
            )?,
            #[cfg(feature = "redis")]
            "redlock" => read(
                distlock_redis::url::redlock_from_url(&mut parts)
                    .map(|(urls, options)| BackendSpec::Redlock { urls, options }),
            )?,
            #[cfg(feature = "etcd")]
            "etcd" => read(
                distlock_etcd::url::from_url(&mut parts)
                    .map(|(endpoints, options)| BackendSpec::Etcd { endpoints, options }),
            )?,
            #[cfg(feature = "zk")]
            "zk" => read(
                distlock_zk::url::from_url(&mut parts)
                    .map(|(connect, options)| BackendSpec::Zk { connect, options }),
            )?,
            #[cfg(feature = "postgres")]
            "postgres" => read(
                distlock_postgres::url::from_url(&mut parts)
                    .map(|options| BackendSpec::Postgres { options }),
            )?,
            _ => BackendSpec::Memory {
                store: parts.hosts.clone(),
            },
        };
        parts.finish().map_err(ConfigError::from_backend_url)?;
        Ok(spec)
    }

    /// The backend kind (`memory`, `redis`, `etcd`, `zk`, `postgres`).
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
            #[cfg(feature = "postgres")]
            BackendSpec::Postgres { .. } => "postgres",
        }
    }

    /// What the backend declares, known before connecting (so grades are checked at load time).
    pub fn capabilities(&self) -> Capabilities {
        match self {
            BackendSpec::Memory { .. } => distlock_api::memory::MemoryBackend::default()
                .capabilities()
                .clone(),
            #[cfg(feature = "redis")]
            BackendSpec::Redis { options, .. } => match options.layout {
                distlock_redis::RedisLayout::Distlock => distlock_redis::CAPABILITIES,
                // Before connecting, whether the server publishes keyspace events is unknown:
                // the polling declaration, which differs from the other only in the wake-up.
                distlock_redis::RedisLayout::Plain { .. } => distlock_redis::PLAIN_CAPABILITIES,
            },
            #[cfg(feature = "redis")]
            BackendSpec::Redlock { .. } => distlock_redis::REDLOCK_CAPABILITIES,
            #[cfg(feature = "etcd")]
            BackendSpec::Etcd { .. } => distlock_etcd::CAPABILITIES,
            #[cfg(feature = "zk")]
            BackendSpec::Zk { options, .. } => match options.layout {
                distlock_zk::Layout::Curator => distlock_zk::CAPABILITIES,
                distlock_zk::Layout::Kazoo => distlock_zk::KAZOO_CAPABILITIES,
            },
            // The best grade; a server that cannot keep it is refused at connect for a
            // correctness profile ([`BackendSpec::connect_graded`]).
            #[cfg(feature = "postgres")]
            BackendSpec::Postgres { .. } => distlock_postgres::CAPABILITIES,
        }
    }

    /// Connects a new, independent client.
    ///
    /// # Errors
    /// The backend's own error when it cannot be reached or refuses the options.
    pub async fn connect(&self) -> distlock_api::Result<Arc<dyn LockBackend>> {
        self.connect_graded(Guarantee::Efficiency).await
    }

    /// [`BackendSpec::connect`] for call sites that need `wanted`: a backend whose grade depends
    /// on the server (PostgreSQL's durability settings) is refused, with the reason, when that
    /// server cannot give it.
    ///
    /// # Errors
    /// As [`BackendSpec::connect`], and `Unsupported` naming the check the server failed.
    pub async fn connect_graded(
        &self,
        wanted: Guarantee,
    ) -> distlock_api::Result<Arc<dyn LockBackend>> {
        let _ = wanted; // read only by the backends whose grade is the server's
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
            #[cfg(feature = "postgres")]
            BackendSpec::Postgres { options } => {
                let backend = distlock_postgres::PostgresBackend::connect(options.clone()).await?;
                if let (Guarantee::Correctness, Some(why)) = (wanted, backend.downgrade_reason()) {
                    return Err(LockError::unsupported_guarantee("postgres", wanted, why));
                }
                Arc::new(backend)
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
