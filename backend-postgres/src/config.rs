//! Options of the PostgreSQL backend.

use std::time::Duration;

use distlock_api::{LockError, Result};

/// The longest schema name: the notification channels (`<schema>_c_<32 hex>`) must stay within
/// PostgreSQL's 63-byte identifiers.
pub const MAX_SCHEMA_LEN: usize = 28;

/// How a [`crate::PostgresBackend`] reaches PostgreSQL and where it keeps its table.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// `host:port` of each server, tried in order; the first that is a primary serves (a standby
    /// is refused: it cannot write a grant).
    pub hosts: Vec<String>,
    /// The database. Default `postgres`.
    pub dbname: String,
    /// User and password. Default user `postgres`, no password.
    pub credentials: (String, String),
    /// The schema of the lease table and its functions (created at connect). A plain lower-case
    /// identifier of at most [`MAX_SCHEMA_LEN`] bytes. Default `distlock`.
    pub schema: String,
    /// Every request is cut off after this and reported as a retryable error; the connection is
    /// then replaced (a reply that did not come may never come). Default 5 s.
    pub op_timeout: Duration,
    /// Connecting is cut off after this. Default 5 s.
    pub connect_timeout: Duration,
    /// TLS to the servers (required when set: no fall-back to plain text).
    pub tls: Option<PostgresTls>,
}

/// TLS settings: the CA that signed the servers' certificates (checked, with the host name),
/// and optionally a client certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresTls {
    /// PEM of the CA certificate(s) to trust.
    pub ca_pem: Vec<u8>,
    /// PEM of a client certificate and its private key.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for PostgresTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTls")
            .field("ca_pem", &format!("{} bytes", self.ca_pem.len()))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            hosts: vec!["127.0.0.1:5432".to_string()],
            dbname: "postgres".to_string(),
            credentials: ("postgres".to_string(), String::new()),
            schema: "distlock".to_string(),
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            tls: None,
        }
    }
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("hosts", &self.hosts)
            .field("dbname", &self.dbname)
            .field("user", &self.credentials.0)
            .field("password", &"<redacted>")
            .field("schema", &self.schema)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

impl PostgresOptions {
    /// A tokio-postgres configuration for these servers (the primary among several), database
    /// and credentials, with the connect timeout and whether TLS is required: the data
    /// connection a guarded transaction ([`crate::guard`]) runs on takes the lock's settings
    /// from here (with [`PostgresOptions::tls_connector`] when TLS is on).
    ///
    /// # Errors
    /// `InvalidConfig` for a host that is not `host:port`.
    pub fn client_config(&self) -> Result<tokio_postgres::Config> {
        let mut config = tokio_postgres::Config::new();
        for h in &self.hosts {
            let (host, port) = h
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                .ok_or_else(|| LockError::invalid_config("postgres.hosts", h, "not host:port"))?;
            config.host(host).port(port);
        }
        let ssl = match self.tls {
            Some(_) => tokio_postgres::config::SslMode::Require,
            None => tokio_postgres::config::SslMode::Disable,
        };
        config
            .user(&self.credentials.0)
            .password(&self.credentials.1)
            .dbname(&self.dbname)
            .connect_timeout(self.connect_timeout)
            .ssl_mode(ssl);
        if self.hosts.len() > 1 {
            // Of several servers, the primary.
            config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        }
        Ok(config)
    }
}

impl PostgresOptions {
    /// The TLS connector of [`PostgresOptions::tls`]: rustls trusting its CA, presenting its
    /// client certificate if any.
    ///
    /// # Errors
    /// `InvalidConfig` naming the PEM that does not parse (or holds no certificate or key).
    pub fn tls_connector(&self) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let pem_error = |what: &str, e: String| {
            LockError::invalid_config(format!("postgres.{what}"), "<pem>", e)
        };
        let certs = |what: &str, pem: &[u8]| {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| pem_error(what, e.to_string()))?;
            if certs.is_empty() {
                return Err(pem_error(what, "no certificate in the PEM".into()));
            }
            Ok(certs)
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs("ca", &tls.ca_pem)? {
            roots
                .add(cert)
                .map_err(|e| pem_error("ca", e.to_string()))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| pem_error("ca", e.to_string()))?
        .with_root_certificates(roots);
        let config = match &tls.client_identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| pem_error("key", e.to_string()))?;
                builder
                    .with_client_auth_cert(certs("cert", cert)?, key)
                    .map_err(|e| pem_error("cert", e.to_string()))?
            }
        };
        Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
    }
}

/// Whether `schema` can be put into the layout's SQL as it is: `[a-z_][a-z0-9_]*`, at most
/// [`MAX_SCHEMA_LEN`] bytes.
pub fn valid_schema(schema: &str) -> bool {
    let mut chars = schema.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && schema.len() <= MAX_SCHEMA_LEN
}
