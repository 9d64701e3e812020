//! The scheme this crate serves and its options, read from a [`BackendUrl`]:
//! `postgres://[user[:password]@]host:port[,host:port...][/dbname]` (also `postgresql://`)
//! with `schema`, `op_timeout`, `connect_timeout`, `user` / `password` (instead of the
//! authority's), and TLS with `ca=<pem path>` (plus `cert=` and `key=` for a client
//! certificate).

use distlock_api::Result;
use distlock_api::url::BackendUrl;

use crate::config::{MAX_SCHEMA_LEN, PostgresOptions, PostgresTls, valid_schema};

/// The schemes this crate serves.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// Every option a `postgres` URL (or a configuration table) takes; any other is refused.
pub const OPTIONS: &[&str] = &[
    "schema",
    "op_timeout",
    "connect_timeout",
    "user",
    "password",
    "ca",
    "cert",
    "key",
];

/// The options, from a `postgres://` URL.
///
/// # Errors
/// `InvalidConfig` naming the option or the URL at fault.
pub fn from_url(url: &mut BackendUrl) -> Result<PostgresOptions> {
    let mut o = PostgresOptions {
        hosts: url.endpoints()?,
        ..PostgresOptions::default()
    };
    let db = url.path.trim_matches('/');
    if db.contains('/') {
        return Err(url.invalid(format!("{db:?} is not a database name (one path segment)")));
    }
    if !db.is_empty() {
        o.dbname = db.to_string();
    }
    if let Some(schema) = url.take("schema") {
        if !valid_schema(&schema) {
            return Err(url.invalid_option(
                "schema",
                schema,
                format!(
                    "must be a lower-case identifier ([a-z_][a-z0-9_]*) of at most {MAX_SCHEMA_LEN} bytes"
                ),
            ));
        }
        o.schema = schema;
    }
    match url.take_tls_files()? {
        (Some(ca_pem), client_identity) => {
            o.tls = Some(PostgresTls {
                ca_pem,
                client_identity,
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
    url.take_duration("op_timeout", &mut o.op_timeout)?;
    url.take_duration("connect_timeout", &mut o.connect_timeout)?;
    if let Some(user) = url.take("user").or(url.user.as_ref().map(|u| u.0.clone())) {
        o.credentials.0 = user;
    }
    if let Some(password) = url
        .take("password")
        .or(url.user.as_ref().map(|u| u.1.clone()))
    {
        o.credentials.1 = password;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use distlock_api::LockError;

    use super::*;

    fn parse(text: &str) -> Result<PostgresOptions> {
        let mut url = BackendUrl::parse("url", text, &BTreeMap::new()).expect("parses");
        let o = from_url(&mut url)?;
        url.finish()?;
        Ok(o)
    }

    /// [`OPTIONS`] is exactly what [`from_url`] takes.
    #[test]
    fn the_option_list_is_what_the_reader_takes() {
        for name in OPTIONS.iter().chain(&["colour"]) {
            let value = match *name {
                "schema" => "s",
                // Files: refused for not existing, which is not "unknown option".
                "ca" | "cert" | "key" => "/nonexistent",
                _ => "1s",
            };
            let unknown = match parse(&format!("postgres://127.0.0.1:1?{name}={value}")) {
                Err(LockError::InvalidConfig { reason, .. }) => reason.contains("unknown option"),
                _ => false,
            };
            assert_eq!(unknown, *name == "colour", "{name}");
        }
    }

    #[test]
    fn the_authority_path_and_options_are_read() {
        let o = parse("postgres://app:pw@db1:5432,db2:5433/orders?schema=locks&op_timeout=2s")
            .expect("valid");
        assert_eq!(o.hosts, ["db1:5432", "db2:5433"]);
        assert_eq!(o.dbname, "orders");
        assert_eq!(o.credentials, ("app".to_string(), "pw".to_string()));
        assert_eq!(o.schema, "locks");
        assert_eq!(o.op_timeout, std::time::Duration::from_secs(2));
        assert!(!format!("{o:?}").contains("pw"), "{o:?}");
    }

    /// A schema goes into the layout's SQL: anything but a plain identifier is refused, named.
    #[test]
    fn a_schema_that_is_not_a_plain_identifier_is_refused() {
        for bad in ["Locks", "a;drop", "1x", "", &"x".repeat(MAX_SCHEMA_LEN + 1)] {
            match parse(&format!("postgres://h:1?schema={bad}")) {
                Err(LockError::InvalidConfig { key, .. }) => assert!(key.ends_with("schema")),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
