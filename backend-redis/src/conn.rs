//! The deployments one Redis client can run on, behind one connection type: a single server (or
//! the master that Sentinel names) over one self-reconnecting multiplexed RESP3 connection, or a
//! Redis Cluster (one multiplexed connection per node, routed by hash slot). Release messages
//! arrive as RESP3 pushes on the same connections, so there is no extra subscriber connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    Client, Cmd, ConnectionInfo, ErrorKind, Pipeline, ProtocolVersion, PushInfo, RedisFuture,
    RedisResult, TlsCertificates, Value,
};

use crate::config::{RedisOptions, RedisTls};

/// Where a connection hands the server's pushes, and who says which channels to subscribe again
/// on a new connection: the notifier (`notify.rs`).
pub(crate) trait Pushes: Send + Sync + 'static {
    /// Called for every push; must not block.
    fn on_push(&self, push: PushInfo);
    /// Every waiter retries now (the connection moved to another server).
    fn wake_all(&self);
    /// The channels someone waits on.
    fn channels(&self) -> Vec<String>;
}

/// A connection to whichever deployment the client was built for. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConn>),
}

/// The current master as Sentinel names it; re-asked when the master stops taking writes.
pub(crate) struct SentinelConn {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<ConnectionManager>,
    notifier: Arc<dyn Pushes>,
    options: RedisOptions,
}

fn certificates(tls: &RedisTls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls
            .client_identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    }
}

fn resp3(info: ConnectionInfo) -> ConnectionInfo {
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    info.set_redis_settings(settings)
}

fn client(info: ConnectionInfo, options: &RedisOptions) -> RedisResult<Client> {
    match &options.tls {
        Some(tls) => Client::build_with_tls(resp3(info), certificates(tls)),
        None => Client::open(resp3(info)),
    }
}

async fn manager(
    client: Client,
    notifier: &Arc<dyn Pushes>,
    options: &RedisOptions,
) -> RedisResult<ConnectionManager> {
    let n = notifier.clone();
    let config = ConnectionManagerConfig::new()
        .set_push_sender(move |push| {
            n.on_push(push);
            Ok::<(), std::convert::Infallible>(())
        })
        .set_automatic_resubscription()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.op_timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(1));
    client.get_connection_manager_with_config(config).await
}

impl Conn {
    pub(crate) async fn single(
        info: ConnectionInfo,
        notifier: &Arc<dyn Pushes>,
        options: &RedisOptions,
    ) -> RedisResult<Self> {
        Ok(Conn::Single(
            manager(client(info, options)?, notifier, options).await?,
        ))
    }

    pub(crate) async fn cluster(
        nodes: Vec<ConnectionInfo>,
        notifier: &Arc<dyn Pushes>,
        options: &RedisOptions,
    ) -> RedisResult<Self> {
        let n = notifier.clone();
        let mut builder = ClusterClientBuilder::new(nodes.into_iter().map(resp3))
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(move |push| {
                n.on_push(push);
                Ok::<(), std::convert::Infallible>(())
            })
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.op_timeout)
            .retries(2);
        if let Some(tls) = &options.tls {
            builder = builder.certs(certificates(tls));
        }
        Ok(Conn::Cluster(
            builder.build()?.get_async_connection().await?,
        ))
    }

    pub(crate) async fn sentinel(
        sentinels: Vec<ConnectionInfo>,
        service: &str,
        node: Option<ConnectionInfo>,
        notifier: &Arc<dyn Pushes>,
        options: &RedisOptions,
    ) -> RedisResult<Self> {
        let mut node_info = SentinelNodeConnectionInfo::default();
        if let Some(node) = node {
            node_info = node_info.set_redis_connection_info(node.redis_settings().clone());
        }
        if options.tls.is_some() {
            node_info = node_info.set_tls_mode(redis::TlsMode::Secure);
        }
        let mut sentinel = SentinelClient::build(
            sentinels,
            service,
            Some(node_info),
            SentinelServerType::Master,
        )?;
        let master = sentinel.async_get_client().await?;
        let current = manager(
            client(master.get_connection_info().clone(), options)?,
            notifier,
            options,
        )
        .await?;
        Ok(Conn::Sentinel(Arc::new(SentinelConn {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(current),
            notifier: notifier.clone(),
            options: options.clone(),
        })))
    }

    /// Subscribes this client's connection to a release channel.
    pub(crate) async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        match self {
            Conn::Single(c) => c.clone().subscribe(channel).await,
            Conn::Cluster(c) => c.clone().subscribe(channel).await,
            Conn::Sentinel(s) => s.current().subscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&self, channel: &str) -> RedisResult<()> {
        match self {
            Conn::Single(c) => c.clone().unsubscribe(channel).await,
            Conn::Cluster(c) => c.clone().unsubscribe(channel).await,
            Conn::Sentinel(s) => s.current().unsubscribe(channel).await,
        }
    }

    /// `WAIT replicas timeout` on the connection that carried the write to `slot`: how many
    /// replicas acknowledged every write sent so far on it.
    pub(crate) async fn wait_replicas(
        &self,
        slot: u16,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<u32> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout.as_millis() as u64);
        let acked: i64 = match self {
            Conn::Cluster(c) => {
                let route = Route::new(slot, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                redis::from_redis_value(c.clone().route_command(wait, routing).await?)?
            }
            other => wait.query_async(&mut other.clone()).await?,
        };
        Ok(acked.max(0) as u32)
    }
}

impl SentinelConn {
    fn current(&self) -> ConnectionManager {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// After a failover the old master refuses writes (or is gone): ask Sentinel again and move
    /// to the new master, taking the release subscriptions along.
    async fn follow_master(&self) {
        let Ok(mut sentinel) = self.sentinel.try_lock() else {
            return; // another caller is already on it
        };
        let Ok(master) = sentinel.async_get_client().await else {
            return;
        };
        let Ok(c) = client(master.get_connection_info().clone(), &self.options) else {
            return;
        };
        let Ok(next) = manager(c, &self.notifier, &self.options).await else {
            return;
        };
        for channel in self.notifier.channels() {
            let _ = next.clone().subscribe(&channel).await;
        }
        tracing::info!(master = %master.get_connection_info().addr(), "distlock redis: following the master Sentinel names");
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = next;
        self.notifier.wake_all();
    }
}

/// Errors after which Sentinel is asked for the master again.
fn master_moved(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(s) => Box::pin(async move {
                let r = s.current().req_packed_command(cmd).await;
                if let Err(e) = &r
                    && master_moved(e)
                {
                    s.follow_master().await;
                }
                r
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(s) => Box::pin(async move {
                let r = s
                    .current()
                    .req_packed_commands(pipeline, offset, count)
                    .await;
                if let Err(e) = &r
                    && master_moved(e)
                {
                    s.follow_master().await;
                }
                r
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(s) => s.current().get_db(),
        }
    }
}
