//! [`PostgresBackend`]: connecting (the server's facts and grade, the layout, LISTEN), the one
//! pipelined connection every request shares, replaced when it fails or a request goes
//! unanswered, and the error mapping.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use distlock_api::{Capabilities, LockError, OwnerSecret, Reconnect, Result};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls, Row};

use crate::backend::{CAPABILITIES, EFFICIENCY_CAPABILITIES};
use crate::config::{MAX_SCHEMA_LEN, PostgresOptions, valid_schema};
use crate::grade::ServerFacts;
use crate::notify::Notifier;
use crate::sql;

/// The lock contract over PostgreSQL: a lease table with one FIFO queue per name (see the crate
/// docs). Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct PostgresBackend {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("server", &self.inner.server)
            .field("options", &self.inner.options)
            .field("grade", &self.inner.capabilities.guarantee)
            .finish()
    }
}

pub(crate) struct Inner {
    pub(crate) options: PostgresOptions,
    /// `postgres <host:port,...>`, for errors.
    pub(crate) server: String,
    /// This client's wake-up channel ([`sql::client_channel`]).
    pub(crate) channel: String,
    pub(crate) sql: Statements,
    pub(crate) notifier: Arc<Notifier>,
    capabilities: Capabilities,
    /// Why the server is graded efficiency only, when it is.
    downgrade: Option<String>,
    live: Mutex<Option<Live>>,
    /// Held while a connection is opened, so concurrent callers open one.
    connecting: tokio::sync::Mutex<()>,
    /// Held while an observer's LISTEN or UNLISTEN is decided and sent, so the server gets
    /// them in the order they were decided.
    pub(crate) listens: tokio::sync::Mutex<()>,
}

/// The statements, in the client's schema.
pub(crate) struct Statements {
    pub(crate) acquire: String,
    pub(crate) admit: String,
    pub(crate) release: String,
    pub(crate) announce: String,
    pub(crate) renew: String,
    pub(crate) entries: String,
    pub(crate) leader_channel: String,
    sweep: String,
}

struct Live {
    client: Arc<Client>,
    driver: AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(live) = lock(&self.live).take() {
            live.driver.abort();
        }
    }
}

/// How often a client deletes long-expired entries ([`sql::SWEEP`]).
const SWEEP_PERIOD: Duration = Duration::from_secs(60);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PostgresBackend {
    /// Connects, reads what decides the grade, installs the layout if it is missing or of
    /// another version, and LISTENs on this client's channel.
    ///
    /// # Errors
    /// `InvalidConfig` for a schema that is not a plain identifier; a non-retryable backend
    /// error for a standby (it cannot write a grant); a retryable one when no server answers.
    pub async fn connect(options: PostgresOptions) -> Result<Self> {
        if !valid_schema(&options.schema) {
            return Err(LockError::invalid_config(
                "postgres.schema",
                &options.schema,
                format!("must be a lower-case identifier of at most {MAX_SCHEMA_LEN} bytes"),
            ));
        }
        let server = format!("postgres {}", options.hosts.join(","));
        let channel = sql::client_channel(&options.schema, &OwnerSecret::random()?.expose_hex());
        let in_schema = |s| sql::in_schema(s, &options.schema);
        let statements = Statements {
            acquire: in_schema(sql::ACQUIRE),
            admit: in_schema(sql::ADMIT),
            release: in_schema(sql::RELEASE),
            announce: in_schema(sql::ANNOUNCE),
            renew: in_schema(sql::RENEW),
            entries: in_schema(sql::ENTRIES),
            leader_channel: in_schema(sql::LEADER_CHANNEL),
            sweep: in_schema(sql::SWEEP),
        };
        let notifier = Arc::new(Notifier::default());
        let (live, facts) = open(&options, &server, &channel, &notifier, true).await?;
        let downgrade = facts.downgrade();
        let capabilities = match downgrade {
            None => CAPABILITIES,
            Some(_) => EFFICIENCY_CAPABILITIES,
        };
        let backend = PostgresBackend {
            inner: Arc::new(Inner {
                options,
                server,
                channel,
                sql: statements,
                notifier,
                capabilities,
                downgrade,
                live: Mutex::new(Some(live)),
                connecting: tokio::sync::Mutex::new(()),
                listens: tokio::sync::Mutex::new(()),
            }),
        };
        backend.sweep_every(SWEEP_PERIOD);
        Ok(backend)
    }

    /// Deletes long-expired entries of every name every `period` while the client lives.
    fn sweep_every(&self, period: Duration) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let backend = PostgresBackend { inner };
                if let Err(error) = backend.query(&backend.inner.sql.sweep, &[]).await {
                    tracing::debug!(%error, "distlock postgres: sweeping expired entries failed");
                }
            }
        });
    }

    /// What this client declares: [`CAPABILITIES`] when the server keeps grants durably (checked
    /// at connect), [`EFFICIENCY_CAPABILITIES`] otherwise.
    pub(crate) fn declared(&self) -> &Capabilities {
        &self.inner.capabilities
    }

    /// Why the server is graded efficiency only (the first check it failed at connect), or
    /// `None` when it keeps the correctness grade's promises.
    pub fn downgrade_reason(&self) -> Option<&str> {
        self.inner.downgrade.as_deref()
    }

    /// The live connection, or a new one (after a failure or an unanswered request). A new one
    /// wakes every waiter and observer: messages sent while none was open are lost.
    async fn client(&self) -> Result<Arc<Client>> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _one = self.inner.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let i = &self.inner;
        // The same hosts: the pooler probe of the first connection stands (it costs a second
        // connection, and reconnects come in bursts, after a failover above all).
        let (live, facts) = open(&i.options, &i.server, &i.channel, &i.notifier, false).await?;
        if i.downgrade.is_none() {
            if let Some(why) = facts.downgrade() {
                live.driver.abort();
                return Err(LockError::backend(
                    i.server.clone(),
                    false,
                    format!(
                        "connected at the correctness grade, the server no longer keeps it: {why}"
                    ),
                ));
            }
        }
        let client = live.client.clone();
        *lock(&i.live) = Some(live);
        i.notifier.wake_all();
        Ok(client)
    }

    fn current(&self) -> Option<Arc<Client>> {
        lock(&self.inner.live)
            .as_ref()
            .filter(|l| !l.client.is_closed())
            .map(|l| l.client.clone())
    }

    /// Drops `client`'s connection if it is still the current one: a request on it went
    /// unanswered, and its replies may never come (a silent partition).
    fn forget(&self, client: &Arc<Client>) {
        let mut live = lock(&self.inner.live);
        if live
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(&l.client, client))
        {
            if let Some(l) = live.take() {
                l.driver.abort();
            }
        }
    }

    /// One statement (unnamed, typed: no prepare round trip), cut off after `op_timeout`.
    pub(crate) async fn query(
        &self,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        self.query_until(
            Instant::now() + self.inner.options.op_timeout,
            statement,
            params,
        )
        .await
    }

    /// [`PostgresBackend::query`], cut off at `deadline`. A statement whose commit the server
    /// kept on the primary alone (its wait for the synchronous standby cancelled) failed: a
    /// failover could lose what it wrote, a grant above all.
    pub(crate) async fn query_until(
        &self,
        deadline: Instant,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        let client = tokio::time::timeout_at(deadline, self.client())
            .await
            .map_err(|_| self.no_answer())??;
        let local_only = self.inner.notifier.local_only_commits();
        match tokio::time::timeout_at(deadline, client.query_typed(statement, params)).await {
            Ok(Ok(_)) if self.inner.notifier.local_only_commits() != local_only => {
                Err(LockError::backend(
                    self.inner.server.clone(),
                    true,
                    "the commit's wait for the synchronous standby was cancelled: it is kept on \
                     the primary alone, where a failover could lose it, so it counts as failed",
                ))
            }
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => {
                if client.is_closed() {
                    self.forget(&client);
                }
                Err(self.error(&e))
            }
            Err(_) => {
                self.forget(&client);
                Err(self.no_answer())
            }
        }
    }

    /// The first column of a one-row answer.
    pub(crate) async fn query_value<T>(
        &self,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<T>
    where
        T: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        let rows = self.query(statement, params).await?;
        let row = rows
            .first()
            .ok_or_else(|| LockError::backend(self.inner.server.clone(), false, "no row"))?;
        row.try_get(0).map_err(|e| self.error(&e))
    }

    fn no_answer(&self) -> LockError {
        LockError::backend(self.inner.server.clone(), true, "no answer in time")
    }

    /// A client error as a [`LockError`]: retryable when the connection failed or the server
    /// asks to retry ([`retryable_state`]).
    pub(crate) fn error(&self, e: &tokio_postgres::Error) -> LockError {
        let retryable = e.code().is_none_or(|c| retryable_state(c.code()));
        LockError::backend(self.inner.server.clone(), retryable, describe(e))
    }

    /// `LISTEN` or `UNLISTEN` (`command`) on an observer's `channel`, on the current connection
    /// (every new one LISTENs on the observed channels).
    pub(crate) async fn listen(&self, command: &str, channel: &str) -> Result<()> {
        let client = self.client().await?;
        let statement = format!("{command} \"{channel}\"");
        match tokio::time::timeout(
            self.inner.options.op_timeout,
            client.batch_execute(&statement),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => {
                self.forget(&client);
                Err(self.no_answer())
            }
        }
    }
}

impl Reconnect for PostgresBackend {
    fn identity(&self) -> Weak<dyn Any + Send + Sync> {
        Arc::downgrade(&self.inner) as Weak<Inner>
    }

    /// A new client of the same servers with the same options (see
    /// [`distlock_api::LockBackend::reconnect`]).
    async fn reconnected(&self) -> Result<Self> {
        PostgresBackend::connect(self.inner.options.clone()).await
    }
}

/// Whether a SQLSTATE says the same call may succeed later: a serialization failure or deadlock
/// (class 40), a connection failure (08), a shutdown (57P), or a server out of resources (53:
/// disk, memory, connections), which takes the call once it has room again, as every backend's
/// full server does.
fn retryable_state(code: &str) -> bool {
    ["40", "08", "57P", "53"]
        .iter()
        .any(|c| code.starts_with(c))
}

/// The server's message with its SQLSTATE, or the client's error with its causes (a TLS
/// handshake's names the certificate problem).
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// Opens a connection: its driver, the server's facts (a standby is refused), a pooler in
/// transaction mode refused (probed when `probe_pooler`), the layout, and LISTEN on the client's
/// channel and every observed leader channel.
async fn open(
    o: &PostgresOptions,
    server: &str,
    channel: &str,
    notifier: &Arc<Notifier>,
    probe_pooler: bool,
) -> Result<(Live, ServerFacts)> {
    let fail = |retryable: bool, e: String| LockError::backend(server.to_string(), retryable, e);
    let mut config = o.client_config()?;
    // Grants commit durably whatever the server's default (a crash after an asynchronous
    // commit reissued a token in the brief's measurement): set per transaction by the layout's
    // functions, since a pooler refuses startup options.
    config.application_name("distlock");
    let live = dial(o, &config, notifier, channel, fail).await?;
    let setup = async {
        let c = &live.client;
        let facts = ServerFacts::read(c)
            .await
            .map_err(|e| fail(true, describe(&e)))?;
        if facts.in_recovery {
            return Err(fail(
                false,
                "the server is a standby (pg_is_in_recovery): a grant needs the primary".into(),
            ));
        }
        if probe_pooler && pooled(o, &config, c, fail).await? {
            return Err(fail(
                false,
                "a pooler in transaction mode stands between us and the server (our server \
                 process changed between two statements): notifications and the queue's \
                 session cannot work through it; connect to the server, or to a pooler in \
                 session mode"
                    .into(),
            ));
        }
        let installed = c
            .query_typed(&sql::in_schema(sql::VERSION_QUERY, &o.schema), &[])
            .await
            .ok()
            .and_then(|rows| rows.first().and_then(|r| r.try_get::<_, i64>(0).ok()));
        if installed != Some(sql::VERSION) {
            let migrate = format!("BEGIN;{}COMMIT;", sql::in_schema(sql::MIGRATE, &o.schema));
            c.batch_execute(&migrate)
                .await
                .map_err(|e| fail(false, format!("installing the layout: {}", describe(&e))))?;
        }
        let mut listen = format!("LISTEN \"{channel}\";");
        for observed in notifier.observed() {
            listen.push_str(&format!("LISTEN \"{observed}\";"));
        }
        c.batch_execute(&listen)
            .await
            .map_err(|e| fail(true, describe(&e)))?;
        Ok(facts)
    };
    match tokio::time::timeout(o.op_timeout.max(Duration::from_secs(5)), setup).await {
        Ok(Ok(facts)) => Ok((live, facts)),
        Ok(Err(e)) => {
            live.driver.abort();
            Err(e)
        }
        Err(_) => {
            live.driver.abort();
            Err(fail(
                true,
                "no answer while setting up the connection".into(),
            ))
        }
    }
}

/// One connection (TLS when the options ask for it), its driver routing notifications on
/// `channel` to `notifier`, cut off at `connect_timeout`.
async fn dial(
    o: &PostgresOptions,
    config: &tokio_postgres::Config,
    notifier: &Arc<Notifier>,
    channel: &str,
    fail: impl Fn(bool, String) -> LockError,
) -> Result<Live> {
    let connecting = async {
        // One driver per connection type (with or without TLS); the client is the same.
        let (client, driver) = match o.tls_connector()? {
            None => {
                let (client, connection) = config
                    .connect(NoTls)
                    .await
                    .map_err(|e| fail(true, describe(&e)))?;
                (
                    client,
                    drive(connection, notifier.clone(), channel.to_string()),
                )
            }
            Some(tls) => {
                let (client, connection) = config
                    .connect(tls)
                    .await
                    .map_err(|e| fail(true, describe(&e)))?;
                (
                    client,
                    drive(connection, notifier.clone(), channel.to_string()),
                )
            }
        };
        Ok::<_, LockError>(Live {
            client: Arc::new(client),
            driver,
        })
    };
    tokio::time::timeout(o.connect_timeout, connecting)
        .await
        .map_err(|_| {
            fail(
                true,
                format!("not connected within {:?}", o.connect_timeout),
            )
        })?
}

/// Whether a pooler in transaction mode stands between `c` and the server: while a second
/// connection holds a server process in a transaction, the process serving `c` changes
/// between two statements (a pooler hands each transaction whichever process is free; the
/// brief measured it with pgbouncer). A direct connection, or a pooler in session mode, keeps
/// its process.
async fn pooled(
    o: &PostgresOptions,
    config: &tokio_postgres::Config,
    c: &Client,
    fail: impl Fn(bool, String) -> LockError + Copy,
) -> Result<bool> {
    let pid = || async {
        c.query_typed_one("SELECT pg_backend_pid()", &[])
            .await
            .and_then(|r| r.try_get::<_, i32>(0))
            .map_err(|e| fail(true, describe(&e)))
    };
    let first = pid().await?;
    let other = dial(o, config, &Arc::new(Notifier::default()), "", fail).await?;
    let holding = other
        .client
        .batch_execute("BEGIN; SELECT 1")
        .await
        .map_err(|e| fail(true, describe(&e)));
    let second = match holding {
        Ok(()) => tokio::time::timeout(o.op_timeout, pid())
            .await
            .unwrap_or_else(|_| Err(fail(true, "no answer while probing for a pooler".into()))),
        Err(e) => Err(e),
    };
    other.driver.abort();
    Ok(second? != first)
}

/// Runs the connection and routes its notifications; when it ends, every waiter re-checks.
fn drive<S, T>(
    mut connection: Connection<S, T>,
    notifier: Arc<Notifier>,
    channel: String,
) -> AbortHandle
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    notifier.deliver(&channel, n.channel(), n.payload());
                }
                Ok(AsyncMessage::Notice(notice)) => notifier.notice(&notice),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "distlock postgres: the connection ended");
                    break;
                }
            }
        }
        notifier.wake_all();
    })
    .abort_handle()
}

#[cfg(test)]
mod tests {
    use super::retryable_state;

    #[test]
    fn a_full_server_is_worth_a_retry_and_a_bad_call_is_not() {
        for code in [
            "40001", "40P01", "08006", "57P01", "53100", "53200", "53300",
        ] {
            assert!(retryable_state(code), "{code}");
        }
        for code in ["42883", "23505", "P0001", "25006", "28P01"] {
            assert!(!retryable_state(code), "{code}");
        }
    }
}
