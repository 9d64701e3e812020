//! PostgreSQL: one server shared by the scenarios (unique names keep them apart), and a server
//! of its own for the scenarios that kill it. Cut clients go through a
//! [`Proxy`](crate::harness::Proxy).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{Capabilities, LockBackend, LockName};
use distlock_postgres::{PostgresBackend, PostgresOptions};

use crate::Factory;
use crate::deployment::{Cut, Deployment, ProxyCut, ServerFaults, shared_or_new};
use crate::harness::{PostgresServer, ServerProcess};

/// The PostgreSQL backend's factory.
pub const FACTORY: Factory = Factory {
    label: "postgres",
    // A stock server keeps grants durably: the correctness grade.
    capabilities: || distlock_postgres::CAPABILITIES.clone(),
    shared: || Box::pin(async { deploy(true).await as Arc<dyn Deployment> }),
    isolated: Some(|| Box::pin(async { deploy(false).await as Arc<dyn Deployment> })),
    survives_a_member_kill: false,
};

/// The schema of the suite's clients.
pub const SCHEMA: &str = "distlock_test";

/// The options every client of the suite uses, against `hosts`.
pub fn options(hosts: Vec<String>) -> PostgresOptions {
    PostgresOptions {
        hosts,
        schema: SCHEMA.into(),
        op_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        ..PostgresOptions::default()
    }
}

/// A connection for the harness's own reads and writes, driven in the background.
///
/// # Panics
/// When the server cannot be reached (the test cannot go on).
pub async fn admin(server: &PostgresServer) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
}

async fn deploy(shared: bool) -> Arc<PostgresDeployment> {
    static SHARED: OnceLock<Arc<PostgresServer>> = OnceLock::new();
    let server = shared_or_new(&SHARED, shared, || {
        PostgresServer::start().unwrap_or_else(|e| panic!("{e}"))
    })
    .await;
    // The first client installs the layout the admin connection reads.
    drop(
        PostgresBackend::connect(options(vec![format!("127.0.0.1:{}", server.port())]))
            .await
            .expect("connect"),
    );
    let admin = admin(&server).await;
    Arc::new(PostgresDeployment {
        server,
        admin: tokio::sync::Mutex::new(admin),
        owns_server: !shared,
    })
}

/// A PostgreSQL deployment: the server, and an admin connection that reads the table.
pub struct PostgresDeployment {
    server: Arc<PostgresServer>,
    /// Replaced after the server restarts (its backends die with it).
    admin: tokio::sync::Mutex<tokio_postgres::Client>,
    owns_server: bool,
}

impl PostgresDeployment {
    fn hosts(&self) -> Vec<String> {
        vec![format!("127.0.0.1:{}", self.server.port())]
    }

    /// The admin connection, opened again when the server restarted.
    async fn admin(&self) -> tokio::sync::MutexGuard<'_, tokio_postgres::Client> {
        let mut admin = self.admin.lock().await;
        if admin.is_closed() {
            *admin = self::admin(&self.server).await;
        }
        admin
    }
}

impl ServerFaults for PostgresDeployment {
    fn processes(&self) -> Vec<&ServerProcess> {
        vec![self.server.process()]
    }
}

#[async_trait]
impl Deployment for PostgresDeployment {
    fn label(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        distlock_postgres::CAPABILITIES.clone()
    }

    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            PostgresBackend::connect(options(self.hosts()))
                .await
                .expect("connect"),
        )
    }

    async fn cuttable_client(&self) -> (Arc<dyn LockBackend>, Box<dyn Cut>) {
        let proxy = ProxyCut::to_ports([self.server.port()]);
        let client = PostgresBackend::connect(options(proxy.addrs()))
            .await
            .expect("connect through proxy");
        (Arc::new(client), Box::new(proxy))
    }

    async fn artifacts(&self, name: &LockName) -> usize {
        crate::leftovers::postgres(&*self.admin().await, SCHEMA, name).await
    }

    async fn delete_lock(&self, name: &LockName) {
        let n = self
            .admin()
            .await
            .execute(
                &format!("DELETE FROM {SCHEMA}.entry WHERE name = $1 AND granted"),
                &[&name.as_str()],
            )
            .await
            .expect("delete");
        assert!(n > 0, "nothing to delete");
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn expiry_slack(&self) -> Duration {
        Duration::from_millis(200)
    }

    fn url(&self) -> Option<String> {
        Some(format!(
            "{}?schema={SCHEMA}&op_timeout=1s",
            self.server.url()
        ))
    }

    fn servers(&self) -> Option<&dyn ServerFaults> {
        self.owns_server.then_some(self as &dyn ServerFaults)
    }

    async fn server_expiry(&self, name: &LockName) -> Option<Duration> {
        let rows = self
            .admin()
            .await
            .query(
                &format!(
                    "SELECT ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint \
                     FROM {SCHEMA}.entry WHERE name = $1 AND granted ORDER BY seq LIMIT 1"
                ),
                &[&name.as_str()],
            )
            .await
            .expect("expiry");
        let ms: i64 = rows.first()?.get(0);
        u64::try_from(ms).ok().map(Duration::from_millis)
    }
}
