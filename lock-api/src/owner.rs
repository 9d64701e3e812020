//! Owner handles: re-entrancy.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use crate::admission::Admission;
use crate::name::LockName;

/// A hold is per backend, name and admission: an owner's read lease is not its write lease.
pub(crate) type HoldKey = (usize, LockName, Admission);

/// A held lease's shared state, as the owner keeps it (the lease's own type, which this file
/// need not know: the client that re-enters takes it back with a downcast).
pub(crate) type HeldState = Arc<dyn Any + Send + Sync>;

/// A re-entrancy owner. Async tasks have no thread identity, so the caller creates an `Owner`
/// and passes it down (clones are the same owner). An acquire of a name this owner already holds
/// through the same backend is granted at once, keeps the fencing token, and adds one to the
/// hold count; the lock is released when every one of those leases is released or dropped.
#[derive(Clone, Default)]
pub struct Owner {
    holds: Arc<Mutex<HashMap<HoldKey, Weak<dyn Any + Send + Sync>>>>,
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.lock().len();
        f.debug_struct("Owner").field("held_names", &n).finish()
    }
}

impl Owner {
    /// A new owner holding nothing.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<HoldKey, Weak<dyn Any + Send + Sync>>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn held(&self, key: &HoldKey) -> Option<HeldState> {
        let mut holds = self.lock();
        match holds.get(key).and_then(Weak::upgrade) {
            Some(shared) => Some(shared),
            None => {
                holds.remove(key);
                None
            }
        }
    }

    pub(crate) fn insert(&self, key: HoldKey, shared: HeldState) {
        self.lock().insert(key, Arc::downgrade(&shared));
    }

    pub(crate) fn forget<T>(&self, key: &HoldKey, shared: &T) {
        let mut holds = self.lock();
        if holds
            .get(key)
            .is_some_and(|w| std::ptr::addr_eq(w.as_ptr(), shared))
        {
            holds.remove(key);
        }
    }
}
