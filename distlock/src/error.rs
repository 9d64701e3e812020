//! Configuration errors: each names the key (or profile) and the value at fault.

use distlock_api::LockError;

/// Why a configuration could not be loaded or a backend could not be built. Never a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The URL's scheme is not one this build knows.
    #[error("{key}: unknown backend scheme {scheme:?} in {url:?} (known: {known})")]
    UnknownScheme {
        /// Where the URL came from.
        key: String,
        /// The scheme.
        scheme: String,
        /// The URL, with any password hidden.
        url: String,
        /// The schemes this build accepts.
        known: String,
    },
    /// The URL's scheme is known, but this build left its backend out: enable the cargo feature.
    #[error(
        "{key}: scheme {scheme:?} needs the backend this build left out: enable the cargo feature \"{feature}\" of distlock (or \"all\")"
    )]
    FeatureOff {
        /// Where the URL came from.
        key: String,
        /// The scheme.
        scheme: String,
        /// The cargo feature that compiles its backend in.
        feature: &'static str,
    },
    /// A value is malformed or out of range.
    #[error("{key} = {value:?}: {reason}")]
    InvalidValue {
        /// The key (`backends.main.url`, `lease.ttl`, `backends.main.options.session_ttl`, ...).
        key: String,
        /// The value, with any password hidden.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A profile names a backend that is not configured.
    #[error(
        "profile {profile:?} names backend {backend:?}, which is not under [backends] (have: {have})"
    )]
    UnknownBackend {
        /// `efficiency` or `correctness`.
        profile: String,
        /// The missing backend name.
        backend: String,
        /// The configured backend names.
        have: String,
    },
    /// A profile points at a backend that cannot give its grade.
    #[error(
        "profile {profile:?} uses backend {backend:?} ({kind}), which cannot give {profile}: {missing}"
    )]
    GradeMismatch {
        /// `correctness`.
        profile: String,
        /// The backend's name in the configuration.
        backend: String,
        /// The backend kind (`redis`, ...).
        kind: String,
        /// The missing capability.
        missing: String,
    },
    /// The file or environment did not parse into the configuration (unknown keys, wrong types).
    #[error("configuration: {0}")]
    Parse(#[from] Box<figment::Error>),
    /// A backend could not be reached or refused its options.
    #[error("backend {backend:?}: {source}")]
    Backend {
        /// The backend's name in the configuration (or the URL for [`crate::connect`]).
        backend: String,
        /// What went wrong.
        #[source]
        source: LockError,
    },
}

impl ConfigError {
    /// A URL or option error from a backend crate's reader, as the facade reports it.
    pub(crate) fn from_backend_url(e: LockError) -> Self {
        match e {
            LockError::InvalidConfig { key, value, reason } => {
                ConfigError::InvalidValue { key, value, reason }
            }
            other => ConfigError::InvalidValue {
                key: "url".into(),
                value: String::new(),
                reason: other.to_string(),
            },
        }
    }

    pub(crate) fn invalid(
        key: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ConfigError::InvalidValue {
            key: key.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}
