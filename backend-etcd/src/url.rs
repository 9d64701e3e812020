//! The scheme this crate serves and its options, read from a [`BackendUrl`]:
//! `etcd://[user:password@]h1:p1,h2:p2[/prefix]` with `session_ttl`, `op_timeout`,
//! `connect_timeout`, `keepalive`, `user` / `password` (instead of the authority's), and TLS with
//! `ca=<pem path>` (plus `cert=` and `key=` for a client certificate, `tls_domain=`).

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
}
