//! Leader election on the lock: the leader's value is appended to its own lock key
//! ([`scripts::ANNOUNCE`]), so one `GET` reads the leader, its term and its value, and the value
//! expires and is deleted with the lock. Observers hear announcements on the name's leader
//! channel ([`crate::keys::LockKeys::leader`]).

use distlock_api::{FencingToken, GrantKey, Leader, LockName, Result};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use crate::RedisBackend;
use crate::scripts::{self, Call};

impl RedisBackend {
    /// Appends `value` to our lock key if it is still ours with `token`, and tells observers.
    pub(crate) async fn announce_lock(
        &self,
        key: &GrantKey,
        token: FencingToken,
        value: &str,
    ) -> Result<bool> {
        let keys = self.keys(&key.name);
        let mut call = Call::new(&scripts::ANNOUNCE, 1);
        call.arg(&keys.lock)
            .arg(&key.secret.expose_hex_bytes()[..])
            .arg(token.get())
            .arg(value)
            .arg(keys.leader())
            .arg(key.holder.segment());
        let n: i64 = self.run(&call, &mut self.conn().clone()).await?;
        Ok(n == 1)
    }

    /// The lock's holder, if it announced a value: one `GET` on the master (the secret it
    /// carries stays here).
    pub(crate) async fn lock_leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let keys = self.keys(name);
        let mut get = redis::cmd("GET");
        get.arg(&keys.lock);
        let value: Option<String> = self
            .with_timeout(get.query_async(&mut self.conn().clone()))
            .await?;
        Ok(value.as_deref().and_then(parse_leader))
    }

    /// One hint per message on the name's leader channel (and per reconnect, when one may have
    /// been missed).
    pub(crate) async fn announcements(&self, name: &LockName) -> Result<BoxStream<'static, ()>> {
        let keys = self.keys(name);
        let sub = self.subscribe(&keys.leader().to_string()).await?;
        Ok(futures_util::stream::unfold(sub, |mut sub| async move {
            sub.released().await;
            Some(((), sub))
        })
        .boxed())
    }
}

/// `<secret>:<token>[<holder>]:<value>` to its term and value; `None` for a lock without a value.
fn parse_leader(lock: &str) -> Option<Leader> {
    let (_secret, rest) = lock.split_once(':')?;
    let (token, value) = rest.split_once(':')?;
    // The holder segment has no `:` of its own (see `scripts`).
    let token = token.split_once('~').map_or(token, |(t, _)| t);
    Some(Leader {
        term: FencingToken(token.parse().ok()?),
        value: value.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_value_gives_its_leader_only_once_announced() {
        assert_eq!(parse_leader("ab:7"), None);
        let l = parse_leader("ab:7:http://a:1").expect("announced");
        assert_eq!((l.term.get(), l.value.as_str()), (7, "http://a:1"));
        assert_eq!(parse_leader("ab:x:v"), None);
        assert_eq!(parse_leader("ab:7:").map(|l| l.value), Some(String::new()));
        assert_eq!(parse_leader("ab:7~1,2,h,c"), None);
        let l = parse_leader("ab:7~1,2,h,c:v~:x").expect("announced with its holder");
        assert_eq!((l.term.get(), l.value.as_str()), (7, "v~:x"));
    }
}
