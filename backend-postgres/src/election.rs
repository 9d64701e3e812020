//! Election: the leader's value in its own entry, the head read by observers, and their hints
//! (a NOTIFY on the name's leader channel at every announcement and whenever an entry with a
//! value goes).

use distlock_api::{FencingToken, GrantKey, Leader, LockName, Result};
use futures_util::stream::BoxStream;
use tokio_postgres::types::Type;

use crate::backend::token_param;
use crate::client::PostgresBackend;

impl PostgresBackend {
    pub(crate) async fn announce_value(
        &self,
        key: &GrantKey,
        token: FencingToken,
        value: &str,
    ) -> Result<bool> {
        let seq = token_param(token)?;
        self.query_value(
            &self.inner.sql.announce,
            &[
                (&key.name.as_str(), Type::TEXT),
                (&key.secret.expose_hex(), Type::TEXT),
                (&seq, Type::INT8),
                (&value, Type::TEXT),
            ],
        )
        .await
    }

    /// The head of the queue, when its holder took it and announced a value.
    pub(crate) async fn head_leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let entries = self.entries(name).await?;
        Ok(entries.into_iter().next().and_then(|head| {
            let value = head.value.filter(|_| head.granted)?;
            Some(Leader {
                term: FencingToken(head.seq),
                value,
            })
        }))
    }

    /// Hints for `name`'s observers: LISTEN on its leader channel (once per client), then one
    /// item per message, and one after a reconnect.
    pub(crate) async fn announcements(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        let channel: String = self
            .query_value(
                &self.inner.sql.leader_channel,
                &[(&name.as_str(), Type::TEXT)],
            )
            .await?;
        let (rx, fresh) = self.inner.notifier.observe(&channel);
        if fresh {
            self.listen(&channel).await?;
        }
        Ok(Box::pin(futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.changed().await.ok().map(|()| ((), rx)) },
        )))
    }
}
