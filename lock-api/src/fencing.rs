//! Fencing tokens and the resource-side check.
//!
//! A lock alone cannot stop a holder that was paused past its TTL from writing after the next
//! holder started (Kleppmann, 2016). The fix belongs in the protected resource: every write
//! carries the writer's [`FencingToken`], and the resource rejects a token lower than the highest
//! it has accepted. [`Fence`] is that check for in-process resources. The same check elsewhere:
//!
//! * SQL: `UPDATE stock SET units = $1, fence = $2 WHERE id = $3 AND fence <= $2` and treat
//!   "0 rows" as a stale writer.
//! * etcd: a txn `If(Value(fence_key) <= token) Then(Put(data), Put(fence_key, token))`, or
//!   the etcd backend's guarded txn that also checks our lock key's create revision.
//! * Redis: a script that compares `HGET res fence` with the token before `HSET`.
//!
//! Tokens are compared as unsigned integers; backends produce them from server-side sequences
//! (etcd revision, ZooKeeper czxid, a Redis counter), never from clocks.

use std::fmt;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// A fencing token: strictly increasing across successive holders of the same lock name on a
/// backend whose [`crate::Fencing`] is monotonic. Re-entrant acquires keep the same token.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as an integer, for storing next to the protected data.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A write was refused because a newer holder already wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: the resource already accepted {highest}")]
pub struct StaleToken {
    /// The token the writer presented.
    pub presented: FencingToken,
    /// The highest token the resource has accepted.
    pub highest: FencingToken,
}

/// The resource-side check: accepts a token at least as high as every token accepted before,
/// rejects lower ones. Equal tokens pass, so one holder may write several times.
///
/// Guarantee: once `check(t)` succeeded, every later `check(u)` with `u < t` fails, however the
/// calls interleave across threads.
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<Option<FencingToken>>,
}

impl Fence {
    /// A fence that has accepted nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `token` and records it, or rejects it as stale.
    ///
    /// # Errors
    /// [`StaleToken`] when a higher token was accepted before.
    ///
    /// # Examples
    /// ```
    /// use distlock_api::{Fence, FencingToken};
    /// let fence = Fence::new();
    /// fence.check(FencingToken(7)).unwrap();
    /// assert!(fence.check(FencingToken(5)).is_err(), "a paused old holder is refused");
    /// ```
    pub fn check(&self, token: FencingToken) -> Result<(), StaleToken> {
        self.guarded(token, || ())
    }

    /// Runs `write` only if `token` passes, atomically with the check (no other check can slip
    /// between them), and records the token.
    ///
    /// # Errors
    /// [`StaleToken`] (and `write` does not run) when a higher token was accepted before.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Mutex;
    /// use distlock_api::{Fence, FencingToken};
    /// let (fence, stock) = (Fence::new(), Mutex::new(100));
    /// fence.guarded(FencingToken(3), || *stock.lock().unwrap() -= 1).unwrap();
    /// assert!(fence.guarded(FencingToken(2), || *stock.lock().unwrap() -= 1).is_err());
    /// assert_eq!(*stock.lock().unwrap(), 99);
    /// ```
    pub fn guarded<R>(
        &self,
        token: FencingToken,
        write: impl FnOnce() -> R,
    ) -> Result<R, StaleToken> {
        let mut highest = self.highest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = *highest
            && token < h
        {
            return Err(StaleToken {
                presented: token,
                highest: h,
            });
        }
        *highest = Some(token);
        Ok(write())
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> Option<FencingToken> {
        *self.highest.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_lower_accepts_equal_and_higher() {
        let f = Fence::new();
        f.check(FencingToken(5)).unwrap();
        f.check(FencingToken(5)).unwrap();
        let err = f.check(FencingToken(4)).unwrap_err();
        assert_eq!(err.highest, FencingToken(5));
        assert_eq!(f.guarded(FencingToken(9), || 1).unwrap(), 1);
        assert!(f.guarded(FencingToken(6), || 2).is_err());
        assert_eq!(f.highest(), Some(FencingToken(9)));
    }

    #[test]
    fn token_serde_is_a_plain_integer() {
        let s = serde_json::to_string(&FencingToken(42)).unwrap();
        assert_eq!(s, "42");
        let t: FencingToken = serde_json::from_str("43").unwrap();
        assert!(t > FencingToken(42));
        assert_eq!(t.to_string(), "43");
    }
}
