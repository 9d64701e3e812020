//! Backend URLs: `memory://`, `redis://`, `etcd://`, `zk://`, parsed into a [`BackendSpec`]
//! with typed errors, then connected. Options come from the query string or from a table; both
//! use the same names (see each scheme below).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use distlock_api::memory::MemoryStore;
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

/// The schemes this build accepts.
pub fn known_schemes() -> Vec<&'static str> {
    let mut s = vec!["memory"];
    if cfg!(feature = "redis") {
        s.extend(REDIS_SCHEMES);
        s.push("redlock");
    }
    if cfg!(feature = "etcd") {
        s.push("etcd");
    }
    if cfg!(feature = "zk") {
        s.push("zk");
    }
    s
}

/// The schemes of a single Redis deployment.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
const REDIS_SCHEMES: [&str; 5] = [
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
];

/// Hides the password of `scheme://user:password@...` and of a `password=` query parameter.
pub fn redact(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(start) = out.find("://").map(|i| i + 3) {
        let end = out[start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| start + i);
        if let Some(at) = out[start..end].rfind('@').map(|i| start + i)
            && let Some(colon) = out[start..at].find(':').map(|i| start + i)
        {
            out.replace_range(colon + 1..at, "<redacted>");
        }
    }
    if let Some(p) = out.find("password=") {
        let end = out[p..].find('&').map_or(out.len(), |i| p + i);
        out.replace_range(p + 9..end, "<redacted>");
    }
    out
}

/// Parses `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds. Zero and negatives are errors.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration, ConfigError> {
    let v = value.trim();
    let (num, unit) = match v.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-')) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| ConfigError::invalid(key, value, "not a duration (use 500ms, 10s, 2m, 1h)"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(ConfigError::invalid(
                key,
                value,
                format!("unknown unit {other:?} (use ms, s, m, h)"),
            ));
        }
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(ConfigError::invalid(key, value, "must be above zero"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The pieces of `scheme://[userinfo@]hosts[/path][?query]`.
struct Parts<'a> {
    scheme: &'a str,
    user: Option<(String, String)>,
    hosts: &'a str,
    path: &'a str,
    query: BTreeMap<String, String>,
}

fn split<'a>(key: &str, url: &'a str) -> Result<Parts<'a>, ConfigError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        ConfigError::invalid(key, redact(url), "not a URL: expected scheme://...")
    })?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => {
            let (u, p) = info.split_once(':').unwrap_or((info, ""));
            (Some((u.to_string(), p.to_string())), hosts)
        }
        None => (None, authority),
    };
    let mut q = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        q.insert(k.to_string(), v.to_string());
    }
    Ok(Parts {
        scheme,
        user,
        hosts,
        path,
        query: q,
    })
}

/// Checks `host:port` entries: at least one, each with a host and a numeric port.
fn endpoints(key: &str, url: &str, hosts: &str) -> Result<Vec<String>, ConfigError> {
    let list: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(String::from)
        .collect();
    if list.is_empty() {
        return Err(ConfigError::invalid(
            key,
            redact(url),
            "empty endpoint list: give at least one host:port",
        ));
    }
    for h in &list {
        let ok = h
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !ok {
            return Err(ConfigError::invalid(
                key,
                redact(url),
                format!("endpoint {h:?} is not host:port"),
            ));
        }
    }
    Ok(list)
}

/// Options not used by a scheme are errors, like unknown keys.
fn take(options: &mut BTreeMap<String, String>, name: &str) -> Option<String> {
    options.remove(name)
}

/// Sets `field` from the duration option `name`, if given.
fn take_duration(
    options: &mut BTreeMap<String, String>,
    base: &str,
    name: &str,
    field: &mut Duration,
) -> Result<(), ConfigError> {
    if let Some(v) = options.remove(name) {
        *field = parse_duration(&format!("{base}.{name}"), &v)?;
    }
    Ok(())
}

/// The TLS files options `ca`, `cert` and `key` (cert and key go together), read from disk.
#[cfg_attr(not(any(feature = "redis", feature = "etcd")), allow(dead_code))]
#[allow(clippy::type_complexity)]
fn tls_files(
    options: &mut BTreeMap<String, String>,
    opt_key: &dyn Fn(&str) -> String,
) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>), ConfigError> {
    let read = |name: &str, path: &str| {
        std::fs::read(path)
            .map_err(|e| ConfigError::invalid(opt_key(name), path, format!("cannot read: {e}")))
    };
    let ca = take(options, "ca").map(|p| read("ca", &p)).transpose()?;
    let identity = match (take(options, "cert"), take(options, "key")) {
        (Some(c), Some(k)) => Some((read("cert", &c)?, read("key", &k)?)),
        (None, None) => None,
        (c, _) => {
            let missing = if c.is_some() { "key" } else { "cert" };
            return Err(ConfigError::invalid(
                opt_key(missing),
                "",
                "cert and key go together",
            ));
        }
    };
    Ok((ca, identity))
}

fn no_leftovers(key: &str, options: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    match options.iter().next() {
        Some((k, v)) => Err(ConfigError::invalid(
            format!("{key}.{k}"),
            v.clone(),
            "unknown option for this backend",
        )),
        None => Ok(()),
    }
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
        let parts = split(key, url)?;
        let mut options = parts.query.clone();
        options.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        let options_base = key
            .strip_suffix(".url")
            .map_or_else(|| format!("{key}.options"), |b| format!("{b}.options"));
        let opt_key = |k: &str| format!("{options_base}.{k}");
        let spec = match parts.scheme {
            "memory" => BackendSpec::Memory {
                store: parts.hosts.to_string(),
            },
            #[cfg(feature = "redis")]
            scheme if REDIS_SCHEMES.contains(&scheme) => {
                let mut o = distlock_redis::RedisOptions::default();
                if let Some(v) = take(&mut options, "prefix") {
                    o.prefix = v;
                }
                take_duration(&mut options, &options_base, "op_timeout", &mut o.op_timeout)?;
                take_duration(
                    &mut options,
                    &options_base,
                    "connect_timeout",
                    &mut o.connect_timeout,
                )?;
                take_duration(
                    &mut options,
                    &options_base,
                    "replica_timeout",
                    &mut o.replica_timeout,
                )?;
                if let Some(v) = take(&mut options, "min_replicas") {
                    o.min_replicas = v.parse().map_err(|_| {
                        ConfigError::invalid(opt_key("min_replicas"), &v, "a whole number")
                    })?;
                }
                let tls = scheme.starts_with("rediss");
                let (ca, client_identity) = tls_files(&mut options, &opt_key)?;
                if !tls && (ca.is_some() || client_identity.is_some()) {
                    return Err(ConfigError::invalid(
                        opt_key("ca"),
                        redact(url),
                        "TLS options need a rediss:// URL",
                    ));
                }
                if tls && (ca.is_some() || client_identity.is_some()) {
                    o.tls = Some(distlock_redis::RedisTls {
                        ca_pem: ca,
                        client_identity,
                    });
                }
                let node_scheme = if tls { "rediss" } else { "redis" };
                let auth = parts
                    .user
                    .as_ref()
                    .map_or(String::new(), |(u, p)| format!("{u}:{p}@"));
                let topology = match scheme {
                    "redis+cluster" | "rediss+cluster" => distlock_redis::RedisTopology::Cluster(
                        endpoints(key, url, parts.hosts)?
                            .iter()
                            .map(|h| format!("{node_scheme}://{auth}{h}"))
                            .collect(),
                    ),
                    "redis+sentinel" => {
                        let service = parts.path.trim_matches('/');
                        if service.is_empty() {
                            return Err(ConfigError::invalid(
                                key,
                                redact(url),
                                "name the master: redis+sentinel://host:26379/<service>",
                            ));
                        }
                        distlock_redis::RedisTopology::Sentinel {
                            sentinels: endpoints(key, url, parts.hosts)?
                                .iter()
                                .map(|h| format!("redis://{h}"))
                                .collect(),
                            service: service.to_string(),
                            node_auth: parts
                                .user
                                .as_ref()
                                .map(|_| format!("redis://{auth}localhost")),
                        }
                    }
                    _ => {
                        if parts.hosts.is_empty() || parts.hosts.contains(',') {
                            return Err(ConfigError::invalid(
                                key,
                                redact(url),
                                format!("{scheme}:// takes exactly one host[:port]"),
                            ));
                        }
                        let base = url.split_once('?').map_or(url, |(b, _)| b);
                        distlock_redis::RedisTopology::Single(base.to_string())
                    }
                };
                BackendSpec::Redis {
                    topology,
                    options: o,
                }
            }
            #[cfg(feature = "redis")]
            "redlock" => {
                let mut o = distlock_redis::RedlockOptions::default();
                if let Some(v) = take(&mut options, "prefix") {
                    o.prefix = v;
                }
                take_duration(
                    &mut options,
                    &options_base,
                    "node_timeout",
                    &mut o.node_timeout,
                )?;
                take_duration(
                    &mut options,
                    &options_base,
                    "connect_timeout",
                    &mut o.connect_timeout,
                )?;
                if let Some(v) = take(&mut options, "drift_factor") {
                    o.drift_factor = v
                        .parse::<f64>()
                        .ok()
                        .filter(|f| (0.0..0.5).contains(f))
                        .ok_or_else(|| {
                            ConfigError::invalid(
                                opt_key("drift_factor"),
                                &v,
                                "a fraction in [0, 0.5)",
                            )
                        })?;
                }
                if let Some(v) = take(&mut options, "retry_count") {
                    o.retry_count = v.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        ConfigError::invalid(opt_key("retry_count"), &v, "a positive integer")
                    })?;
                }
                if let Some(v) = take(&mut options, "retry_delay") {
                    let k = opt_key("retry_delay");
                    let (lo, hi) = v.split_once("..").ok_or_else(|| {
                        ConfigError::invalid(&k, &v, "use <min>..<max>, e.g. 50ms..250ms")
                    })?;
                    o.retry_delay = (parse_duration(&k, lo)?, parse_duration(&k, hi)?);
                    if o.retry_delay.0 > o.retry_delay.1 {
                        return Err(ConfigError::invalid(k, v, "min above max"));
                    }
                }
                let hosts = endpoints(key, url, parts.hosts)?;
                if hosts.len() < 3 || hosts.len() % 2 == 0 {
                    return Err(ConfigError::invalid(
                        key,
                        redact(url),
                        "Redlock needs an odd number of masters, at least 3",
                    ));
                }
                let auth = parts
                    .user
                    .as_ref()
                    .map_or(String::new(), |(u, p)| format!("{u}:{p}@"));
                BackendSpec::Redlock {
                    urls: hosts.iter().map(|h| format!("redis://{auth}{h}")).collect(),
                    options: o,
                }
            }
            #[cfg(feature = "etcd")]
            "etcd" => {
                let mut o = distlock_etcd::EtcdOptions::default();
                let prefix = parts.path.trim_matches('/');
                if !prefix.is_empty() {
                    o.prefix = prefix.to_string();
                }
                take_duration(
                    &mut options,
                    &options_base,
                    "session_ttl",
                    &mut o.session_ttl,
                )?;
                take_duration(&mut options, &options_base, "op_timeout", &mut o.op_timeout)?;
                take_duration(
                    &mut options,
                    &options_base,
                    "connect_timeout",
                    &mut o.connect_timeout,
                )?;
                let (ca, client_identity) = tls_files(&mut options, &opt_key)?;
                if let Some(ca_pem) = ca {
                    o.tls = Some(distlock_etcd::EtcdTls {
                        ca_pem,
                        client_identity,
                        domain: take(&mut options, "tls_domain"),
                    });
                } else if client_identity.is_some() {
                    return Err(ConfigError::invalid(
                        opt_key("ca"),
                        "",
                        "a client certificate needs the server's CA (ca=<pem path>)",
                    ));
                }
                let user = take(&mut options, "user").or(parts.user.as_ref().map(|u| u.0.clone()));
                let password =
                    take(&mut options, "password").or(parts.user.as_ref().map(|u| u.1.clone()));
                o.credentials = user.map(|u| (u, password.unwrap_or_default()));
                BackendSpec::Etcd {
                    endpoints: endpoints(key, url, parts.hosts)?,
                    options: o,
                }
            }
            #[cfg(feature = "zk")]
            "zk" => {
                let mut o = distlock_zk::ZkOptions::default();
                if let Some(v) = take(&mut options, "root") {
                    o.root = v;
                }
                take_duration(
                    &mut options,
                    &options_base,
                    "session_timeout",
                    &mut o.session_timeout,
                )?;
                take_duration(&mut options, &options_base, "op_timeout", &mut o.op_timeout)?;
                take_duration(
                    &mut options,
                    &options_base,
                    "connect_timeout",
                    &mut o.connect_timeout,
                )?;
                if let Some(v) = take(&mut options, "on_disconnect") {
                    o.on_disconnect = match v.as_str() {
                        "lose" => distlock_zk::OnDisconnect::Lose,
                        w if w.starts_with("wait:") => distlock_zk::OnDisconnect::WaitUpTo(
                            parse_duration(&opt_key("on_disconnect"), &w[5..])?,
                        ),
                        _ => {
                            return Err(ConfigError::invalid(
                                opt_key("on_disconnect"),
                                v,
                                "use lose or wait:<duration>",
                            ));
                        }
                    };
                }
                if let Some(v) = take(&mut options, "acl") {
                    o.acl = match v.as_str() {
                        "open" => distlock_zk::NodeAcl::Open,
                        "creator" => distlock_zk::NodeAcl::CreatorOnly,
                        _ => {
                            return Err(ConfigError::invalid(
                                opt_key("acl"),
                                v,
                                "use open or creator",
                            ));
                        }
                    };
                }
                o.digest = parts.user.as_ref().map(|(u, p)| format!("{u}:{p}"));
                let hosts = endpoints(key, url, parts.hosts)?.join(",");
                let chroot = parts.path.trim_end_matches('/');
                BackendSpec::Zk {
                    connect: format!("{hosts}{chroot}"),
                    options: o,
                }
            }
            other => {
                return Err(ConfigError::UnknownScheme {
                    key: key.to_string(),
                    scheme: other.to_string(),
                    url: redact(url),
                    known: known_schemes().join(", "),
                });
            }
        };
        no_leftovers(&options_base, &options)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("k", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("k", "10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("k", "2m").unwrap(), Duration::from_secs(120));
        for bad in ["0s", "-5s", "abc", "5 parsecs", ""] {
            assert!(parse_duration("k", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(
            redact("redis://u:hunter2@h:1/0"),
            "redis://u:<redacted>@h:1/0"
        );
        assert_eq!(
            redact("etcd://h:1?user=u&password=hunter2&x=1"),
            "etcd://h:1?user=u&password=<redacted>&x=1"
        );
        assert_eq!(redact("zk://h:1/app"), "zk://h:1/app");
    }
}
