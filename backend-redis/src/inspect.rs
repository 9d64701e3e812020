//! Reading a name without touching it: one read-only script ([`scripts::INSPECT`]) for the
//! lock key's holder, the shared holders (permits, readers) and the live waiters.

use std::time::Duration;

use distlock_api::{Admission, FencingToken, HolderStatus, LockName, LockStatus, Result};

use crate::RedisBackend;
use crate::scripts::{self, Call};

impl RedisBackend {
    /// The name's holders (token, time to live, kind), in grant order, and its live waiters.
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockStatus> {
        let keys = self.keys(name);
        let mut call = Call::new(&scripts::INSPECT, 3);
        call.arg(&keys.lock).arg(keys.alive()).arg(keys.shared());
        let (token, pttl, waiters, shared): (Option<u64>, i64, usize, Vec<i64>) =
            self.run(&call, &mut self.conn().clone()).await?;
        let left = |ms: i64| u64::try_from(ms).ok().map(Duration::from_millis);
        let mut holders: Vec<HolderStatus> = shared
            .chunks_exact(3)
            .map(|t| HolderStatus {
                token: u64::try_from(t[0]).ok().map(FencingToken),
                expires_in: left(t[1]),
                admission: Admission::of_limit(u32::try_from(t[2]).unwrap_or(u32::MAX)),
            })
            .collect();
        holders.sort_by_key(|h| h.token);
        if pttl != -2 {
            holders.insert(
                0,
                HolderStatus {
                    token: token.map(FencingToken),
                    expires_in: left(pttl),
                    admission: Admission::Exclusive,
                },
            );
        }
        Ok(LockStatus { holders, waiters })
    }
}
