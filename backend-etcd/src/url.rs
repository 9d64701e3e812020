//! The scheme this crate serves and its options, read from a [`BackendUrl`]:
//! `etcd://[user:password@]h1:p1,h2:p2[/prefix]` with `session_ttl`, `op_timeout`,
//! `connect_timeout`, `keepalive`, `user` / `password` (instead of the authority's), and TLS with
//! `ca=<pem path>` (plus `cert=` and `key=` for a client certificate, `tls_domain=`).

use std::time::Duration;

use distlock_api::Result;
use distlock_api::url::BackendUrl;

use crate::config::{EtcdOptions, EtcdTls};

/// Every option an `etcd` URL (or a configuration table) takes; any other is refused.
pub const OPTIONS: &[&str] = &[
    "session_ttl",
    "op_timeout",
    "connect_timeout",
    "keepalive",
    "ca",
    "cert",
    "key",
    "tls_domain",
    "user",
    "password",
];

/// The shortest session TTL a URL may ask for.
const MIN_SESSION_TTL: Duration = Duration::from_secs(2);

/// The members and the options, from an `etcd://` URL.
///
/// # Errors
/// `InvalidConfig` naming the option or the URL at fault.
pub fn from_url(url: &mut BackendUrl) -> Result<(Vec<String>, EtcdOptions)> {
    let mut o = EtcdOptions::default();
    let prefix = url.path.trim_matches('/');
    if !prefix.is_empty() {
        o.prefix = prefix.to_string();
    }
    url.take_duration("session_ttl", &mut o.session_ttl)?;
    // etcd counts lease TTLs in whole seconds; below 2 the keep-alive's period leaves no room.
    if o.session_ttl < MIN_SESSION_TTL {
        return Err(url.invalid_option(
            "session_ttl",
            format!("{:?}", o.session_ttl),
            format!("must be at least {MIN_SESSION_TTL:?} (etcd leases count whole seconds)"),
        ));
    }
    url.take_duration("op_timeout", &mut o.op_timeout)?;
    url.take_duration("connect_timeout", &mut o.connect_timeout)?;
    url.take_duration("keepalive", &mut o.keepalive)?;
    let (ca, client_identity) = url.take_tls_files()?;
    let domain = url.take("tls_domain");
    match (ca, client_identity, domain) {
        (Some(ca_pem), client_identity, domain) => {
            o.tls = Some(EtcdTls {
                ca_pem,
                client_identity,
                domain,
            });
        }
        (None, Some(_), _) => {
            return Err(url.invalid_option(
                "ca",
                "",
                "a client certificate needs the server's CA (ca=<pem path>)",
            ));
        }
        (None, None, Some(domain)) => {
            return Err(url.invalid_option(
                "tls_domain",
                domain,
                "TLS options need the server's CA (ca=<pem path>)",
            ));
        }
        (None, None, None) => {}
    }
    let user = url.take("user").or(url.user.as_ref().map(|u| u.0.clone()));
    let password = url
        .take("password")
        .or(url.user.as_ref().map(|u| u.1.clone()));
    o.credentials = user.map(|u| (u, password.unwrap_or_default()));
    Ok((url.endpoints()?, o))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use distlock_api::LockError;

    use super::*;

    /// [`OPTIONS`] is exactly what [`from_url`] takes.
    #[test]
    fn the_option_list_is_what_the_reader_takes() {
        for name in OPTIONS.iter().chain(&["colour"]) {
            let mut url = BackendUrl::parse(
                "url",
                &format!("etcd://127.0.0.1:1?{name}=x"),
                &BTreeMap::new(),
            )
            .expect("parses");
            let unknown = match from_url(&mut url).map(drop).and_then(|()| url.finish()) {
                Err(LockError::InvalidConfig { reason, .. }) => reason.contains("unknown option"),
                _ => false,
            };
            assert_eq!(unknown, *name == "colour", "{name}");
        }
    }

    /// A session TTL under 2 s is refused, naming the option (it was raised to 2 s silently).
    #[test]
    fn a_session_ttl_under_two_seconds_is_refused() {
        for (ttl, ok) in [("1s", false), ("1500ms", false), ("2s", true)] {
            let mut url = BackendUrl::parse(
                "url",
                &format!("etcd://127.0.0.1:1?session_ttl={ttl}"),
                &BTreeMap::new(),
            )
            .expect("parses");
            match from_url(&mut url) {
                Ok(_) => assert!(ok, "{ttl} accepted"),
                Err(LockError::InvalidConfig { key, reason, .. }) => {
                    assert!(!ok, "{ttl}: {reason}");
                    assert!(key.ends_with("session_ttl"), "{key}");
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}
