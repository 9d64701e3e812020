//! Reading a lock without touching it: one read-only script ([`scripts::INSPECT`]).

use std::time::Duration;

use distlock_api::{FencingToken, HolderStatus, LockName, LockStatus, Result};

use crate::RedisBackend;
use crate::scripts::{self, Call};

impl RedisBackend {
    /// The lock's holder (token, `PTTL`) and its live waiters, in one read-only script.
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockStatus> {
        let keys = self.keys(name);
        let mut call = Call::new(&scripts::INSPECT, 2);
        call.arg(&keys.lock).arg(keys.alive());
        let (token, pttl, waiters): (Option<u64>, i64, usize) =
            self.run(&call, &mut self.conn().clone()).await?;
        Ok(LockStatus {
            holder: (pttl != -2).then(|| HolderStatus {
                token: token.map(FencingToken),
                expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
            }),
            waiters,
        })
    }
}
