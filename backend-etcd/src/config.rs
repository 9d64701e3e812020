//! Options of the etcd backend.

use std::time::Duration;

/// How an [`crate::EtcdBackend`] talks to etcd.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Namespace of every key (see [`crate::keys`]). Default `distlock`.
    pub prefix: String,
    /// TTL of the client's session lease, shared by all its locks: the time after which a dead
    /// client's locks are freed. Whole seconds (rounded up, at least 2 s, which is also etcd's
    /// own floor with default election settings). Default 10 s.
    pub session_ttl: Duration,
    /// Every request is cut off after this and reported as a retryable error. Default 5 s.
    pub op_timeout: Duration,
    /// Connecting is cut off after this. Default 5 s.
    pub connect_timeout: Duration,
    /// HTTP/2 ping interval on a connection with a request or stream open (none is sent on an
    /// idle connection). A stock etcd refuses pings more often than every 5 s
    /// (`--grpc-keepalive-min-time`) and closes the connection (`too_many_pings`), so this stays
    /// above that; a dead connection is found by the session's own keep-alive (every TTL / 3)
    /// and by `op_timeout` anyway. Default 10 s.
    pub keepalive: Duration,
    /// User and password for etcd authentication.
    pub credentials: Option<(String, String)>,
    /// TLS to the members (then endpoints are dialled over HTTPS).
    pub tls: Option<EtcdTls>,
}

/// TLS settings: the CA that signed the members' certificates, and optionally a client
/// certificate for etcd's client-certificate authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM of the CA certificate(s) to trust.
    pub ca_pem: Vec<u8>,
    /// PEM of a client certificate and its private key.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to check the members' certificates against, when it is not the endpoint host.
    pub domain: Option<String>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem", &format!("{} bytes", self.ca_pem.len()))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<redacted>"),
            )
            .field("domain", &self.domain)
            .finish()
    }
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("prefix", &self.prefix)
            .field("session_ttl", &self.session_ttl)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("keepalive", &self.keepalive)
            .field(
                "credentials",
                &self
                    .credentials
                    .as_ref()
                    .map(|(user, _)| (user, "<redacted>")),
            )
            .finish()
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            prefix: "distlock".to_string(),
            session_ttl: Duration::from_secs(10),
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
            credentials: None,
            tls: None,
        }
    }
}

impl EtcdOptions {
    /// The session TTL in whole seconds, as etcd takes it.
    pub fn session_ttl_secs(&self) -> i64 {
        (self.session_ttl.as_millis().div_ceil(1000) as i64).max(2)
    }
}
