//! [`Locks`]: the two grade profiles, built from a [`Config`] and checked at load time.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    AcquireOptions, Election, Guarantee, Held, Lease, LockBackend, LockClient, LockError, Owner,
    Ran, RwLock, Semaphore,
};

use crate::config::{Config, OptionValue};
use crate::error::ConfigError;
use crate::spec::{BackendSpec, parse_duration};

/// Builds a backend client from a URL (see [`BackendSpec`]).
///
/// # Errors
/// [`ConfigError`] for a bad URL; [`ConfigError::Backend`] when it cannot connect.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, ConfigError> {
    let spec = BackendSpec::parse("url", url, &BTreeMap::new())?;
    spec.connect().await.map_err(|source| ConfigError::Backend {
        backend: crate::spec::redact(url),
        source,
    })
}

#[derive(Debug, Clone)]
struct Profile {
    backend: String,
    client: LockClient,
}

/// Lock clients for the two grades. Call sites say what they need:
/// `locks.efficiency("cache:42")` or `locks.correctness("payment:7")`.
///
/// Guarantees: the correctness profile, when present, is a backend whose declared capabilities
/// give `Correctness` (checked at load time), and every correctness lease carries a fencing
/// token. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Locks {
    efficiency: Profile,
    correctness: Option<Profile>,
    defaults: AcquireOptions,
}

fn text(v: &OptionValue) -> String {
    v.to_string()
}

fn lease_defaults(config: &Config) -> Result<AcquireOptions, ConfigError> {
    let mut opts = AcquireOptions::default();
    if let Some(ttl) = &config.lease.ttl {
        opts.ttl = parse_duration("lease.ttl", &text(ttl))?;
    }
    if let Some(every) = &config.lease.renew_every {
        opts = opts.renew_every(parse_duration("lease.renew_every", &text(every))?);
    }
    opts.validate().map_err(|e| lease_refused(e, None))?;
    Ok(opts)
}

/// A lease option refused by the library, as the configuration key it came from (and the
/// backend whose TTL refused it, if one did).
fn lease_refused(e: LockError, backend: Option<&str>) -> ConfigError {
    match e {
        LockError::InvalidConfig { key, value, reason } => ConfigError::InvalidValue {
            key: format!("lease.{key}"),
            value,
            reason: match backend {
                Some(name) => format!("{reason} (on backend {name})"),
                None => reason,
            },
        },
        other => ConfigError::invalid("lease", "", other.to_string()),
    }
}

impl Locks {
    /// Loads `path` (TOML, optional) and `DISTLOCK_*` variables, checks them, and connects.
    ///
    /// # Errors
    /// Any [`ConfigError`]; grade mismatches and bad values are found before connecting.
    pub async fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::from_config(&Config::load(path)?).await
    }

    /// Checks `config` and connects the backends its profiles use.
    ///
    /// # Errors
    /// As [`Locks::load`].
    pub async fn from_config(config: &Config) -> Result<Self, ConfigError> {
        let defaults = lease_defaults(config)?;
        let mut specs = BTreeMap::new();
        for (name, b) in &config.backends {
            let options: BTreeMap<String, String> = b
                .options
                .iter()
                .map(|(k, v)| (k.clone(), text(v)))
                .collect();
            specs.insert(
                name.clone(),
                BackendSpec::parse(&format!("backends.{name}.url"), &b.url, &options)?,
            );
        }
        let have = || specs.keys().cloned().collect::<Vec<_>>().join(", ");
        let only = (specs.len() == 1)
            .then(|| specs.keys().next().cloned())
            .flatten();
        let pick =
            |profile: &str, chosen: &Option<String>| -> Result<Option<String>, ConfigError> {
                match chosen {
                    Some(name) if specs.contains_key(name) => Ok(Some(name.clone())),
                    Some(name) => Err(ConfigError::UnknownBackend {
                        profile: profile.to_string(),
                        backend: crate::spec::redact(name),
                        have: have(),
                    }),
                    None => Ok(only.clone()),
                }
            };
        let efficiency = pick("efficiency", &config.efficiency)?.ok_or_else(|| {
            ConfigError::invalid(
                "efficiency",
                "",
                format!(
                    "several backends ({}): name the one for efficiency locks",
                    have()
                ),
            )
        })?;
        let correctness = match pick("correctness", &config.correctness)? {
            Some(name) => {
                let caps = specs[&name].capabilities();
                match (
                    caps.refusal(Guarantee::Correctness),
                    config.correctness.is_some(),
                ) {
                    (None, _) => Some(name),
                    (Some(missing), true) => {
                        return Err(ConfigError::GradeMismatch {
                            profile: "correctness".into(),
                            backend: name.clone(),
                            kind: specs[&name].kind().into(),
                            missing: missing.into(),
                        });
                    }
                    // The only backend cannot give correctness and nobody asked it to.
                    (Some(_), false) => None,
                }
            }
            None => None,
        };
        let mut clients: BTreeMap<String, LockClient> = BTreeMap::new();
        for name in std::iter::once(&efficiency).chain(correctness.as_ref()) {
            if !clients.contains_key(name) {
                // A correctness profile asked for is graded as its server connects
                // (PostgreSQL's durability settings decide its grade).
                let wanted = if Some(name) == correctness.as_ref() && config.correctness.is_some() {
                    Guarantee::Correctness
                } else {
                    Guarantee::Efficiency
                };
                let backend = specs[name].connect_graded(wanted).await.map_err(|source| {
                    ConfigError::Backend {
                        backend: name.clone(),
                        source,
                    }
                })?;
                clients.insert(name.clone(), LockClient::new(backend));
            }
        }
        // A profile nobody asked for goes where the connected server cannot give it.
        let correctness = correctness.filter(|name| {
            clients[name]
                .capabilities()
                .refusal(Guarantee::Correctness)
                .is_none()
        });
        // The lease settings against the TTL each backend really gives (a session's on etcd and
        // ZooKeeper, known once connected): refused here, not at the first acquire.
        for (name, client) in &clients {
            client
                .checked_ttl(&defaults)
                .map_err(|e| lease_refused(e, Some(name)))?;
        }
        let profile = |name: &String| Profile {
            backend: name.clone(),
            client: clients[name].clone(),
        };
        Ok(Locks {
            efficiency: profile(&efficiency),
            correctness: correctness.as_ref().map(profile),
            defaults,
        })
    }

    /// An efficiency lock on `name` (a rare double run only wastes work).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock::Locks::load(None).await?; // no file: the embedded memory backend
    /// let lease = locks.efficiency("cache:42").try_now().await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn efficiency(&self, name: &str) -> Acquire<'_> {
        Acquire {
            profile: Ok(&self.efficiency),
            name: name.to_string(),
            opts: self.defaults.clone().guarantee(Guarantee::Efficiency),
        }
    }

    /// A correctness lock on `name` (a double run loses money): from the correctness profile,
    /// always with a fencing token the protected resource must check.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock::Locks::load(None).await?;
    /// let lease = locks.correctness("payment:7").wait(Duration::from_secs(5)).await?;
    /// let token = lease.fencing_token().expect("correctness leases are fenced");
    /// # let _ = token;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn correctness(&self, name: &str) -> Acquire<'_> {
        Acquire {
            profile: self.correctness.as_ref().ok_or(&self.efficiency),
            name: name.to_string(),
            opts: self.defaults.clone().guarantee(Guarantee::Correctness),
        }
    }

    /// The election named `name` on the profile of `grade`, campaigning with the lease defaults
    /// of the configuration (a `Correctness` election needs the correctness profile: etcd or
    /// ZooKeeper; its terms are fencing tokens there).
    ///
    /// # Errors
    /// `Unsupported` for a correctness election without a correctness profile, or on a backend
    /// without terms (Redlock); `InvalidName` for a bad name.
    ///
    /// # Examples
    /// ```
    /// use distlock::{Guarantee, StreamExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock::Locks::load(None).await?; // no file: the embedded memory backend
    /// let election = locks.election("scheduler", Guarantee::Correctness)?;
    /// let mut leaders = election.observe();
    /// let leadership = election.campaign("replica-1:8080").await?;
    /// // ... act as the leader, writing with `leadership.term()` as the fencing token ...
    /// let leader = leaders.next().await.expect("a stream never ends")?;
    /// assert_eq!((leader.term, leader.value.as_str()), (leadership.term(), "replica-1:8080"));
    /// leadership.resign().await?;
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: &str, grade: Guarantee) -> Result<Election, LockError> {
        let call = self.graded(name, grade);
        Ok(call.client()?.election(name)?.options(call.opts))
    }

    /// The semaphore `name` with `permits` permits on the profile of `grade`, with the lease
    /// defaults of the configuration: at most `permits` holders at once across every replica.
    ///
    /// # Errors
    /// `Unsupported` for a correctness semaphore without a correctness profile, or on a backend
    /// whose queue admits locks only (Redlock); `InvalidConfig` for 0 permits; `InvalidName`.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use distlock::Guarantee;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock::Locks::load(None).await?;
    /// let exports = locks.semaphore("exports", 4, Guarantee::Efficiency)?;
    /// let permit = exports.acquire(Duration::from_secs(5)).await?; // one of at most 4
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(
        &self,
        name: &str,
        permits: u32,
        grade: Guarantee,
    ) -> Result<Semaphore, LockError> {
        let call = self.graded(name, grade);
        Ok(call.client()?.semaphore(name, permits)?.options(call.opts))
    }

    /// The read-write lock `name` on the profile of `grade`, with the lease defaults of the
    /// configuration: many readers or one writer; a waiting writer goes before later readers.
    ///
    /// # Errors
    /// As [`Locks::semaphore`], but for permits.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use distlock::Guarantee;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock::Locks::load(None).await?;
    /// let table = locks.rwlock("routing-table", Guarantee::Correctness)?;
    /// let write = table.write(Duration::from_secs(5)).await?;
    /// let token = write.fencing_token().expect("correctness leases are fenced");
    /// # let _ = token;
    /// write.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn rwlock(&self, name: &str, grade: Guarantee) -> Result<RwLock, LockError> {
        let call = self.graded(name, grade);
        Ok(call.client()?.rwlock(name)?.options(call.opts))
    }

    fn graded(&self, name: &str, grade: Guarantee) -> Acquire<'_> {
        match grade {
            Guarantee::Efficiency => self.efficiency(name),
            Guarantee::Correctness => self.correctness(name),
        }
    }

    /// The client of the profile serving `grade` (to inspect locks, or to use the contract
    /// directly).
    ///
    /// # Errors
    /// `Unsupported` for `Correctness` without a correctness profile.
    pub fn client(&self, grade: Guarantee) -> Result<LockClient, LockError> {
        self.graded("", grade).client().cloned()
    }

    /// The backend name serving each profile: (efficiency, correctness).
    pub fn profiles(&self) -> (&str, Option<&str>) {
        (
            &self.efficiency.backend,
            self.correctness.as_ref().map(|p| p.backend.as_str()),
        )
    }
}

/// One call site's acquire, with the profile's defaults; adjust, then `try_now` or `wait`.
#[derive(Debug)]
pub struct Acquire<'a> {
    /// The profile, or (for a correctness call without one) the efficiency profile's backend.
    profile: Result<&'a Profile, &'a Profile>,
    name: String,
    opts: AcquireOptions,
}

impl Acquire<'_> {
    /// Sets the lease TTL for this call.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.opts.ttl = ttl;
        self
    }

    /// No watchdog: the lease holds for the TTL unless renewed by hand.
    pub fn fixed(mut self) -> Self {
        self.opts = self.opts.fixed();
        self
    }

    /// Makes the acquire re-entrant for `owner`.
    pub fn owner(mut self, owner: &Owner) -> Self {
        self.opts = self.opts.owner(owner);
        self
    }

    fn client(&self) -> Result<&LockClient, LockError> {
        self.profile.map(|p| &p.client).map_err(|only| {
            LockError::unsupported_guarantee(
                only.client.backend().kind(),
                Guarantee::Correctness,
                &format!(
                    "no correctness profile is configured and backend {:?} is efficiency grade; \
                     name an etcd, zk or postgres backend as `correctness`",
                    only.backend
                ),
            )
        })
    }

    /// Takes the lock if free, else fails with `Busy` at once.
    ///
    /// # Errors
    /// As [`LockClient::try_acquire`]; `Unsupported` for a correctness call without a
    /// correctness profile.
    pub async fn try_now(self) -> Result<Lease, LockError> {
        self.client()?.try_acquire(&self.name, &self.opts).await
    }

    /// Takes the lock, waiting up to `timeout`.
    ///
    /// # Errors
    /// As [`LockClient::acquire`]; `Unsupported` as for [`Acquire::try_now`].
    pub async fn wait(self, timeout: Duration) -> Result<Lease, LockError> {
        self.client()?
            .acquire(&self.name, &self.opts, timeout)
            .await
    }

    /// Takes the lock if free (else `Busy` at once) and runs `f` under it: `f` gets the fencing
    /// token and the lost signal, is dropped at its next await if the lease is lost first, and
    /// the lock is released on every path. See [`LockClient::try_run`].
    ///
    /// # Errors
    /// As [`Acquire::try_now`]; once the lock is held, the outcome is in [`Ran`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock::Locks::load(None).await?; // no file: the embedded memory backend
    /// let ran = locks
    ///     .efficiency("cache:rebuild")
    ///     .try_run(|held| async move { held.name().to_string() })
    ///     .await?;
    /// assert_eq!(ran.completed().as_deref(), Some("cache:rebuild"));
    /// # Ok(()) }
    /// ```
    pub async fn try_run<F, Fut, T>(self, f: F) -> Result<Ran<T>, LockError>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        self.client()?.try_run(&self.name, &self.opts, f).await
    }

    /// Like [`Acquire::try_run`], waiting up to `timeout` for the lock.
    ///
    /// # Errors
    /// As [`Acquire::wait`]; once the lock is held, the outcome is in [`Ran`].
    pub async fn run<F, Fut, T>(self, timeout: Duration, f: F) -> Result<Ran<T>, LockError>
    where
        F: FnOnce(Held) -> Fut,
        Fut: Future<Output = T>,
    {
        self.client()?.run(&self.name, &self.opts, timeout, f).await
    }
}
