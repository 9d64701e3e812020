//! Releases: the lock key or a shared field deleted by its owner only, the queue's head told,
//! and who listens for it.

use distlock_api::{OwnerSecret, Result};

use crate::client::RedisBackend;
use crate::keys::LockKeys;
use crate::scripts::{self, Call};

/// Whom a release wakes.
#[derive(Clone, Copy)]
pub(crate) enum Tell {
    /// The live head of the name's queue, if any: a lock's or a policy's waiter is granted.
    QueueHead,
    /// The same, once the releaser left the queue (a Redlock holder its arbiter granted).
    LeaveQueue,
    /// Nobody (a Redlock node that keeps no queue, or a waiter that keeps its turn).
    Nobody,
}

/// How a release script is sent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// By its hash: the usual, cheapest send (a `NOSCRIPT` answer is followed by the source).
    Hash,
    /// With its source ([`Call::with_source`]): a clean-up of a request that may still be in
    /// flight, which must run whenever the server gets to it.
    Source,
}

impl RedisBackend {
    /// Releases and tells the queue's head (a Redlock node that is not the name's arbiter keeps
    /// no queue, so there it tells nobody; a plain key has none).
    pub(crate) async fn release_keys(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        sent: Sent,
    ) -> Result<bool> {
        let tell = if keys.is_plain() {
            Tell::Nobody
        } else {
            Tell::QueueHead
        };
        self.release_telling(keys, secret, tell, sent).await
    }

    /// Releases a shared grant (a permit, a read lease) and grants the queue's heads that fit.
    pub(crate) async fn release_shared(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        sent: Sent,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let mut call = Call::new(&scripts::RELEASE_SHARED, 6);
        call.arg(keys.shared())
            .arg(keys.queue())
            .arg(keys.alive())
            .arg(keys.asks())
            .arg(&keys.lock)
            .arg(keys.fence())
            .arg(&secret.expose_hex_bytes()[..]);
        let call = match sent {
            Sent::Hash => call,
            Sent::Source => call.with_source(),
        };
        let n: i64 = self.run_repeatable(&call, &mut conn).await?;
        Ok(n == 1)
    }

    /// Releases (compare-and-delete), then wakes whom `tell` says.
    pub(crate) async fn release_telling(
        &self,
        keys: &LockKeys,
        secret: &OwnerSecret,
        tell: Tell,
        sent: Sent,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let mut call = match tell {
            Tell::Nobody => Call::new(&scripts::RELEASE, 1),
            _ => Call::new(&scripts::RELEASE, 6),
        };
        call.arg(&keys.lock);
        if !matches!(tell, Tell::Nobody) {
            call.arg(keys.queue())
                .arg(keys.alive())
                .arg(keys.fence())
                .arg(keys.asks())
                .arg(keys.shared());
        }
        call.arg(&secret.expose_hex_bytes()[..]);
        // The script's second argument: see `scripts::RELEASE`.
        match tell {
            Tell::QueueHead => call.arg("head"),
            Tell::LeaveQueue => call.arg("leave"),
            Tell::Nobody => call.arg("none"),
        };
        let call = match sent {
            Sent::Hash => call,
            Sent::Source => call.with_source(),
        };
        let n: i64 = self.run_repeatable(&call, &mut conn).await?;
        Ok(n == 1)
    }

    /// Publishes a release of `keys`' lock on its channel (for a Redlock release whose arbiter
    /// did not answer).
    pub(crate) async fn announce_release(&self, keys: &LockKeys) -> Result<()> {
        let mut conn = self.conn.clone();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(keys.channel()).arg(1);
        let _: i64 = self.with_timeout(publish.query_async(&mut conn)).await?;
        Ok(())
    }

    /// How many connections listen for `keys`' release announcements (`PUBSUB NUMSUB`): the
    /// Redlock waiters one announcement wakes together.
    pub(crate) async fn listeners(&self, keys: &LockKeys) -> Result<usize> {
        let mut conn = self.conn.clone();
        let mut numsub = redis::cmd("PUBSUB");
        numsub.arg("NUMSUB").arg(keys.channel());
        let counts: Vec<(String, usize)> = self.with_timeout(numsub.query_async(&mut conn)).await?;
        Ok(counts.first().map_or(0, |(_, n)| *n))
    }
}
