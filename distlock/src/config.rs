//! The configuration file and environment: what backends exist and which one serves each grade.
//!
//! ```toml
//! # distlock.toml
//! efficiency = "cache"          # backend for efficiency locks
//! correctness = "main"          # backend for correctness locks (etcd, zk, postgres or memory)
//!
//! [backends.cache]
//! url = "redis://:secret@127.0.0.1:6379/0?prefix=myapp"
//!
//! [backends.main]
//! url = "etcd://10.0.0.1:2379,10.0.0.2:2379/myapp"
//! options = { session_ttl = "10s" }   # same names as the URL's query parameters
//!
//! [lease]
//! ttl = "30s"                   # default lease TTL at every call site
//! renew_every = "10s"           # watchdog period (default ttl / 3)
//! ```
//!
//! Environment variables override the file: `DISTLOCK_` + the key path joined by `__`, for example
//! `DISTLOCK_CORRECTNESS=main`, `DISTLOCK_BACKENDS__MAIN__URL=etcd://...`,
//! `DISTLOCK_LEASE__TTL=20s`. Unknown keys are errors. With no file and no variables, the
//! configuration is one in-process `memory://` backend serving both grades.

use std::collections::BTreeMap;
use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::spec::redact;

/// A scalar option value (TOML lets users write `session_ttl = 10` or `"10s"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OptionValue {
    /// A string.
    Text(String),
    /// An integer (durations: seconds).
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl std::fmt::Display for OptionValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptionValue::Text(s) => f.write_str(s),
            OptionValue::Int(i) => write!(f, "{i}"),
            OptionValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// One backend: a URL and options that override its query parameters.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// `memory://`, `redis://`, `etcd://`, `zk://`, `postgres://` (see [`crate::BackendSpec`]).
    pub url: String,
    /// Options by name, as in the URL's query string.
    #[serde(default)]
    pub options: BTreeMap<String, OptionValue>,
}

impl std::fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options: BTreeMap<&String, String> = self
            .options
            .iter()
            .map(|(k, v)| {
                (
                    k,
                    if k.contains("password") {
                        "<redacted>".to_string()
                    } else {
                        v.to_string()
                    },
                )
            })
            .collect();
        f.debug_struct("BackendConfig")
            .field("url", &redact(&self.url))
            .field("options", &options)
            .finish()
    }
}

/// Lease defaults applied at every call site.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseConfig {
    /// Lease TTL (`30s` when absent).
    pub ttl: Option<OptionValue>,
    /// Watchdog period (TTL / 3 when absent); must be below the TTL.
    pub renew_every: Option<OptionValue>,
}

/// The whole configuration. Its `Debug` shows no password, wherever one was written (a URL in
/// a profile by mistake included).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Backends by name.
    #[serde(default = "default_backends")]
    pub backends: BTreeMap<String, BackendConfig>,
    /// The backend for efficiency locks; may be omitted when there is exactly one backend.
    #[serde(default)]
    pub efficiency: Option<String>,
    /// The backend for correctness locks; may be omitted when there is exactly one backend and
    /// it can give correctness. Loading fails if it names a backend that cannot.
    #[serde(default)]
    pub correctness: Option<String>,
    /// Lease defaults.
    #[serde(default)]
    pub lease: LeaseConfig,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |n: &Option<String>| n.as_deref().map(redact);
        f.debug_struct("Config")
            .field("backends", &self.backends)
            .field("efficiency", &name(&self.efficiency))
            .field("correctness", &name(&self.correctness))
            .field("lease", &self.lease)
            .finish()
    }
}

fn default_backends() -> BTreeMap<String, BackendConfig> {
    BTreeMap::from([(
        "default".to_string(),
        BackendConfig {
            url: "memory://".to_string(),
            options: BTreeMap::new(),
        },
    )])
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backends: default_backends(),
            efficiency: None,
            correctness: None,
            lease: LeaseConfig::default(),
        }
    }
}

impl Config {
    /// The figment that [`Config::load`] extracts: `path` (TOML, optional) then `DISTLOCK_*`
    /// environment variables (but those of [`crate::run_vars`]).
    pub fn figment(path: Option<&Path>) -> Figment {
        let mut f = Figment::new();
        if let Some(p) = path {
            f = f.merge(Toml::file_exact(p));
        }
        // The variables `distlock run` sets for its command are not configuration keys.
        let ignored: Vec<String> = crate::run_vars::ALL
            .iter()
            .map(|v| v.trim_start_matches("DISTLOCK_").to_ascii_lowercase())
            .collect();
        let ignored: Vec<&str> = ignored.iter().map(String::as_str).collect();
        f.merge(Env::prefixed("DISTLOCK_").ignore(&ignored).split("__"))
    }

    /// Loads the TOML file at `path` (if given) and the environment.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] naming the key for unknown keys and wrong types.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::figment(path)
            .extract()
            .map_err(|e| ConfigError::Parse(Box::new(e)))
    }

    /// One backend, named `main`, at `url`: it serves efficiency locks, and correctness locks
    /// too when it can give them.
    pub fn for_url(url: &str) -> Self {
        Config {
            backends: BTreeMap::from([(
                "main".to_string(),
                BackendConfig {
                    url: url.to_string(),
                    options: BTreeMap::new(),
                },
            )]),
            ..Config::default()
        }
    }

    /// Parses a TOML string (no environment).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Figment::new()
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError::Parse(Box::new(e)))
    }
}
