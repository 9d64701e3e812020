//! The schemes this crate serves and their options, read from a [`BackendUrl`]:
//!
//! * `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS): one server;
//! * `redis+cluster://[user:password@]h1:p1,h2:p2,...` (`rediss+cluster://` for TLS): a Redis
//!   Cluster reached through any of the nodes;
//! * `redis+sentinel://[user:password@]s1:p1,s2:p2/<service>`: the master the Sentinels name
//!   for `<service>` (the credentials are the data nodes');
//! * `redlock://[user:password@]h1:p1,h2:p2,h3:p3`: Redlock over independent masters.
//!
//! Options: `prefix`, `layout=distlock|plain` ([`crate::RedisLayout`]; with `plain` the key is
//! `<prefix><name>` verbatim, and the prefix is empty unless given), `op_timeout`,
//! `connect_timeout`, `min_replicas`, `replica_timeout`, and for TLS `ca=<pem path>` (plus
//! `cert=` and `key=`); Redlock: `prefix`, `node_timeout`,
//! `connect_timeout`, `drift_factor`, `retry_count`, `retry_delay=<min>..<max>`.

use distlock_api::Result;
use distlock_api::url::{BackendUrl, parse_duration};

use crate::config::{RedisLayout, RedisOptions, RedisTls, RedisTopology, RedlockOptions};

/// Every option a `redis`, `rediss`, `redis+cluster`, `rediss+cluster` or `redis+sentinel` URL
/// (or a configuration table) takes; any other is refused.
pub const REDIS_OPTIONS: &[&str] = &[
    "prefix",
    "layout",
    "op_timeout",
    "connect_timeout",
    "min_replicas",
    "replica_timeout",
    "ca",
    "cert",
    "key",
];

/// Every option a `redlock` URL (or a configuration table) takes; any other is refused.
pub const REDLOCK_OPTIONS: &[&str] = &[
    "prefix",
    "node_timeout",
    "connect_timeout",
    "drift_factor",
    "retry_count",
    "retry_delay",
];

/// Where and how to connect, from a `redis`, `rediss`, `redis+cluster`, `rediss+cluster` or
/// `redis+sentinel` URL.
///
/// # Errors
/// `InvalidConfig` naming the option or the URL at fault.
pub fn redis_from_url(url: &mut BackendUrl) -> Result<(RedisTopology, RedisOptions)> {
    let mut o = RedisOptions::default();
    let prefix = url.take("prefix");
    o.layout = match url.take("layout").as_deref() {
        None | Some("distlock") => RedisLayout::Distlock,
        Some("plain") => RedisLayout::Plain {
            prefix: prefix.clone().unwrap_or_default(),
        },
        Some(other) => {
            return Err(url.invalid_option("layout", other, "use distlock or plain"));
        }
    };
    if let Some(v) = prefix {
        o.prefix = v;
    }
    url.take_duration("op_timeout", &mut o.op_timeout)?;
    url.take_duration("connect_timeout", &mut o.connect_timeout)?;
    url.take_duration("replica_timeout", &mut o.replica_timeout)?;
    url.take_parsed(
        "min_replicas",
        "a whole number",
        |_| true,
        &mut o.min_replicas,
    )?;
    let tls = url.scheme.starts_with("rediss");
    let (ca_pem, client_identity) = url.take_tls_files()?;
    if ca_pem.is_some() || client_identity.is_some() {
        if !tls {
            return Err(url.invalid_option(
                "ca",
                distlock_api::url::redact(&url.base),
                "TLS options need a rediss:// URL",
            ));
        }
        o.tls = Some(RedisTls {
            ca_pem,
            client_identity,
        });
    }
    let node_scheme = if tls { "rediss" } else { "redis" };
    let auth = url.userinfo();
    let topology = match url.scheme.as_str() {
        "redis+cluster" | "rediss+cluster" => RedisTopology::Cluster(
            url.endpoints()?
                .iter()
                .map(|h| format!("{node_scheme}://{auth}{h}"))
                .collect(),
        ),
        "redis+sentinel" => {
            let service = url.path.trim_matches('/');
            if service.is_empty() {
                return Err(url.invalid("name the master: redis+sentinel://host:26379/<service>"));
            }
            RedisTopology::Sentinel {
                sentinels: url
                    .endpoints()?
                    .iter()
                    .map(|h| format!("redis://{h}"))
                    .collect(),
                service: service.to_string(),
                node_auth: url
                    .user
                    .as_ref()
                    .map(|_| format!("redis://{auth}localhost")),
            }
        }
        scheme => {
            if url.hosts.is_empty() || url.hosts.contains(',') {
                return Err(url.invalid(format!("{scheme}:// takes exactly one host[:port]")));
            }
            RedisTopology::Single(url.base.clone())
        }
    };
    Ok((topology, o))
}

/// The masters and the algorithm's options, from a `redlock://` URL.
///
/// # Errors
/// `InvalidConfig` naming the option or the URL at fault; fewer than 3 masters or an even
/// number of them.
pub fn redlock_from_url(url: &mut BackendUrl) -> Result<(Vec<String>, RedlockOptions)> {
    let mut o = RedlockOptions::default();
    if let Some(v) = url.take("prefix") {
        o.prefix = v;
    }
    url.take_duration("node_timeout", &mut o.node_timeout)?;
    url.take_duration("connect_timeout", &mut o.connect_timeout)?;
    url.take_parsed(
        "drift_factor",
        "a fraction in [0, 0.5)",
        |f: &f64| (0.0..0.5).contains(f),
        &mut o.drift_factor,
    )?;
    let mut rounds = 0u32;
    url.take_parsed(
        "retry_count",
        "a positive integer",
        |n: &u32| *n > 0,
        &mut rounds,
    )?;
    o.retry_count = (rounds > 0).then_some(rounds);
    if let Some(v) = url.take("retry_delay") {
        let bad = |reason: &str| url.invalid_option("retry_delay", &v, reason);
        let (lo, hi) = v
            .split_once("..")
            .ok_or_else(|| bad("use <min>..<max>, e.g. 50ms..250ms"))?;
        let key = "retry_delay";
        let lo = parse_duration(key, lo).map_err(|_| bad("use <min>..<max>, e.g. 50ms..250ms"))?;
        let hi = parse_duration(key, hi).map_err(|_| bad("use <min>..<max>, e.g. 50ms..250ms"))?;
        if lo > hi {
            return Err(bad("min above max"));
        }
        o.retry_delay = (lo, hi);
    }
    let hosts = url.endpoints()?;
    if hosts.len() < 3 || hosts.len() % 2 == 0 {
        return Err(url.invalid("Redlock needs an odd number of masters, at least 3"));
    }
    let auth = url.userinfo();
    Ok((
        hosts.iter().map(|h| format!("redis://{auth}{h}")).collect(),
        o,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use distlock_api::LockError;

    use super::*;

    /// The option lists say exactly what the readers take: each listed option is read (a bad
    /// value is an error about that option, never "unknown"), and an unlisted one is left over.
    #[test]
    fn the_option_lists_are_what_the_readers_take() {
        type Reader = fn(&mut BackendUrl) -> Result<()>;
        let redis: Reader = |u| redis_from_url(u).map(drop);
        let redlock: Reader = |u| redlock_from_url(u).map(drop);
        for (base, options, read) in [
            ("rediss://127.0.0.1:1", REDIS_OPTIONS, redis),
            (
                "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
                REDLOCK_OPTIONS,
                redlock,
            ),
        ] {
            for name in options.iter().chain(&["colour"]) {
                let mut url =
                    BackendUrl::parse("url", &format!("{base}?{name}=x"), &BTreeMap::new())
                        .expect("parses");
                let unknown = match read(&mut url).and_then(|()| url.finish()) {
                    Err(LockError::InvalidConfig { reason, .. }) => {
                        reason.contains("unknown option")
                    }
                    _ => false,
                };
                assert_eq!(unknown, *name == "colour", "{base}: {name}");
            }
        }
    }

    #[test]
    fn the_layout_is_distlock_or_plain_and_a_plain_prefix_is_verbatim() {
        let read = |q: &str| {
            let mut url = BackendUrl::parse("url", &format!("redis://h:1?{q}"), &BTreeMap::new())
                .expect("parses");
            redis_from_url(&mut url).map(|(_, o)| o.layout)
        };
        let plain = |p: &str| RedisLayout::Plain { prefix: p.into() };
        assert_eq!(read("").expect("default"), RedisLayout::Distlock);
        assert_eq!(read("layout=plain").expect("plain"), plain(""));
        assert_eq!(
            read("layout=plain&prefix=lock:").expect("prefixed"),
            plain("lock:")
        );
        assert_eq!(
            read("prefix=app&layout=distlock").expect("ours"),
            RedisLayout::Distlock
        );
        assert!(matches!(
            read("layout=redlock"),
            Err(LockError::InvalidConfig { key, value, .. }) if key.contains("layout") && value == "redlock"
        ));
    }
}
