//! The scheme this crate serves and its options, read from a [`BackendUrl`]:
//! `etcd://[user:password@]h1:p1,h2:p2[/prefix]` with `session_ttl`, `op_timeout`,
//! `connect_timeout`, `keepalive`, `user` / `password` (instead of the authority's), and TLS with
//! `ca=<pem path>` (plus `cert=` and `key=` for a client certificate, `tls_domain=`).

use distlock_api::Result;
use distlock_api::url::BackendUrl;

use crate::config::{EtcdOptions, EtcdTls};

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
    match (ca, client_identity) {
        (Some(ca_pem), client_identity) => {
            o.tls = Some(EtcdTls {
                ca_pem,
                client_identity,
                domain: url.take("tls_domain"),
            });
        }
        (None, Some(_)) => {
            return Err(url.invalid_option(
                "ca",
                "",
                "a client certificate needs the server's CA (ca=<pem path>)",
            ));
        }
        (None, None) => {}
    }
    let user = url.take("user").or(url.user.as_ref().map(|u| u.0.clone()));
    let password = url
        .take("password")
        .or(url.user.as_ref().map(|u| u.1.clone()));
    o.credentials = user.map(|u| (u, password.unwrap_or_default()));
    Ok((url.endpoints()?, o))
}
