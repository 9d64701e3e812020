//! One plain read round trip per backend, the yardstick for hand-over latency.

use tokio::time::Instant;

use crate::stats::{Stats, stats};
use crate::uncontended::redis_conns;

/// What to ping.
pub enum Ping {
    Redis(Vec<redis::aio::MultiplexedConnection>),
    Etcd(Box<etcd_client::Client>),
    Zk(zookeeper_client::Client),
    Postgres(tokio_postgres::Client),
}

impl Ping {
    pub async fn redis(urls: &[String]) -> Self {
        Ping::Redis(redis_conns(urls).await)
    }

    async fn once(&self) {
        match self {
            // Redlock's round trip is the slowest of its nodes answering a parallel request.
            Ping::Redis(conns) => {
                futures_util::future::join_all(conns.iter().map(|c| async move {
                    let _: String = redis::cmd("PING")
                        .query_async(&mut c.clone())
                        .await
                        .expect("PING");
                }))
                .await;
            }
            Ping::Etcd(c) => {
                (**c).clone().get("bench/rtt", None).await.expect("get");
            }
            Ping::Zk(c) => {
                c.check_stat("/").await.expect("exists");
            }
            Ping::Postgres(c) => {
                c.query_typed("SELECT 1", &[]).await.expect("SELECT 1");
            }
        }
    }

    /// p50 of `n` round trips.
    pub async fn measure(&self, n: usize) -> Stats {
        let mut samples = Vec::with_capacity(n);
        let start = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            self.once().await;
            samples.push(t.elapsed());
        }
        stats(samples, start.elapsed())
    }
}
