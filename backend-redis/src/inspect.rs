//! Reading a name without touching it: one read-only script ([`scripts::INSPECT`]) for the
//! lock key's holder, the shared holders (permits, readers) and the live waiters. (The plain
//! layout reads its one key: `plain.rs`.)

use std::time::Duration;

use distlock_api::{
    Admission, FencingToken, HolderInfo, HolderStatus, LockError, LockName, LockStatus, Result,
};

use crate::RedisBackend;
use crate::scripts::{self, Call};

impl RedisBackend {
    /// The name's holders (token, time to live, kind, who), in grant order, and its live waiters.
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockStatus> {
        let keys = self.keys(name);
        let mut call = Call::new(&scripts::INSPECT, 3);
        call.arg(&keys.lock).arg(keys.alive()).arg(keys.shared());
        type Shared = (i64, i64, i64, String);
        let (token, pttl, waiters, shared, who): (Option<u64>, i64, usize, Vec<Shared>, String) =
            self.run(&call, &mut self.conn().clone()).await?;
        let left = |ms: i64| u64::try_from(ms).ok().map(Duration::from_millis);
        let mut holders: Vec<HolderStatus> = shared
            .into_iter()
            .map(|(token, ms, limit, who)| HolderStatus {
                token: u64::try_from(token).ok().map(FencingToken),
                expires_in: left(ms),
                admission: Admission::of_limit(u32::try_from(limit).unwrap_or(u32::MAX)),
                holder: HolderInfo::in_head(who.as_bytes()),
            })
            .collect();
        holders.sort_by_key(|h| h.token);
        if pttl == -4 {
            // Another recipe's lock on our key, which acquires refuse too.
            return Err(LockError::ForeignEntry {
                name: name.to_string(),
                entry: keys.lock,
            });
        }
        if pttl != -2 {
            holders.insert(
                0,
                HolderStatus {
                    token: token.map(FencingToken),
                    expires_in: left(pttl),
                    admission: Admission::Exclusive,
                    holder: HolderInfo::in_head(who.as_bytes()),
                },
            );
        }
        Ok(LockStatus { holders, waiters })
    }
}
