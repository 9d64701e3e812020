//! Election: the leader's value in its own entry, the head read by observers, and their hints
//! (a NOTIFY on the name's leader channel at every announcement and whenever an entry with a
//! value goes).

use std::sync::{Arc, Weak};

use distlock_api::{FencingToken, GrantKey, Leader, LockName, Result};
use futures_util::stream::BoxStream;
use tokio::sync::watch;
use tokio_postgres::types::Type;

use crate::backend::token_param;
use crate::client::{Inner, PostgresBackend};

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
    /// item per message, and one after a reconnect. The last observer of a channel dropped,
    /// the client UNLISTENs.
    pub(crate) async fn announcements(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        let channel: String = self
            .query_value(
                &self.inner.sql.leader_channel,
                &[(&name.as_str(), Type::TEXT)],
            )
            .await?;
        let observer = {
            let _order = self.inner.listens.lock().await;
            let (rx, fresh) = self.inner.notifier.observe(&channel);
            let observer = Observer {
                rx: Some(rx),
                backend: Arc::downgrade(&self.inner),
                channel: channel.clone(),
            };
            if fresh {
                self.listen("LISTEN", &channel).await?;
            }
            observer
        };
        Ok(Box::pin(futures_util::stream::unfold(
            observer,
            |mut o| async move {
                let rx = o.rx.as_mut()?;
                rx.changed().await.ok().map(|()| ((), o))
            },
        )))
    }
}

/// One observer's hints; dropped, its channel is unlistened when it was the last (and the
/// client lives: it does not keep the client alive).
struct Observer {
    rx: Option<watch::Receiver<u64>>,
    backend: Weak<Inner>,
    channel: String,
}

impl Drop for Observer {
    fn drop(&mut self) {
        drop(self.rx.take());
        let (Ok(rt), Some(inner)) = (
            tokio::runtime::Handle::try_current(),
            self.backend.upgrade(),
        ) else {
            return;
        };
        let (backend, channel) = (PostgresBackend { inner }, std::mem::take(&mut self.channel));
        rt.spawn(async move {
            let _order = backend.inner.listens.lock().await;
            if backend.inner.notifier.unobserve(&channel) {
                if let Err(error) = backend.listen("UNLISTEN", &channel).await {
                    tracing::debug!(%error, "distlock postgres: UNLISTEN failed; a new connection will not listen");
                }
            }
        });
    }
}
