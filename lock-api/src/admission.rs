//! The admission queue: one per backend, with the policies that say whom it admits.
//!
//! Every backend keeps, per name, one queue of entries in arrival order (the memory store's list,
//! etcd's revision-ordered keys, ZooKeeper's sequential nodes). Each entry carries a *limit*, and
//! one rule decides for all primitives:
//!
//! > an entry is admitted while the number of entries ahead of it is below the smallest limit
//! > among itself and those ahead.
//!
//! | primitive | its entries' limit | what the rule gives |
//! |---|---|---|
//! | lock, read-write lock's writer ([`Admission::Exclusive`]) | 1 | the head alone |
//! | semaphore of N ([`Admission::Permit`]) | N | the first N |
//! | read-write lock's reader ([`Admission::Shared`]) | unbounded | every reader ahead of the first writer |
//!
//! The admitted entries are always a prefix of the queue (further back, more entries are ahead
//! and the smallest limit can only fall), so no entry is admitted past one that waits: FIFO, and
//! a waiting writer holds back every reader that arrived after it (no writer starvation).

use crate::error::{LockError, Result};

/// How a queued entry is admitted ([module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Admitted alone, with nobody ahead: a lock, or a read-write lock's writer.
    Exclusive,
    /// One of at most `N` permits of a semaphore: admitted while fewer than `N` entries are
    /// ahead. Every entry of one name must carry the same `N` ([`Admission::check_ahead`]).
    Permit(u32),
    /// A read-write lock's reader: admitted while no exclusive entry is ahead.
    Shared,
}

impl Admission {
    /// The limit this entry writes into its queue entry (1, N, or `u32::MAX`).
    pub fn limit(self) -> u32 {
        match self {
            Admission::Exclusive => 1,
            Admission::Permit(n) => n,
            Admission::Shared => u32::MAX,
        }
    }

    /// Whether this entry is admitted behind entries with limits `ahead` (the rule of the
    /// [module docs](self)).
    pub fn admitted(self, ahead: impl IntoIterator<Item = u32>) -> bool {
        let mut count: u64 = 0;
        let mut smallest = self.limit();
        for limit in ahead {
            count += 1;
            smallest = smallest.min(limit);
        }
        count < u64::from(smallest)
    }

    /// Refuses a permit whose limit differs from that of an entry ahead of it: all users of one
    /// semaphore must agree on N, so a different N is an error naming both, never a silent mix.
    /// Locks and read-write locks mix limits by design and pass.
    ///
    /// # Errors
    /// [`LockError::LimitMismatch`] naming `name`, our limit and theirs.
    pub fn check_ahead(self, name: &str, ahead: impl IntoIterator<Item = u32>) -> Result<()> {
        let Admission::Permit(ours) = self else {
            return Ok(());
        };
        match ahead.into_iter().find(|l| *l != ours) {
            Some(theirs) => Err(LockError::LimitMismatch {
                name: name.to_string(),
                ours,
                theirs,
            }),
            None => Ok(()),
        }
    }

    /// The policy an entry of `limit` was queued with ([`Admission::limit`] read back; a permit
    /// of 1 is exclusive).
    pub fn of_limit(limit: u32) -> Admission {
        match limit {
            1 => Admission::Exclusive,
            u32::MAX => Admission::Shared,
            n => Admission::Permit(n),
        }
    }

    /// The text a backend appends to an entry's owner secret to record its limit: nothing for 1
    /// (so a lock's entry is the bare secret, as before policies existed), `#<limit>` otherwise.
    pub fn entry_suffix(self) -> String {
        match self.limit() {
            1 => String::new(),
            n => format!("#{n}"),
        }
    }
}

/// How many entries at the front of a queue whose entries have `limits` (in queue order) are
/// admitted: the holders, by the rule of the [module docs](self).
pub fn admitted_count(limits: &[u32]) -> usize {
    let mut smallest = u32::MAX;
    limits
        .iter()
        .enumerate()
        .take_while(|(ahead, limit)| {
            smallest = smallest.min(**limit);
            (*ahead as u64) < u64::from(smallest)
        })
        .count()
}

/// The limit recorded in entry data `<secret>[#<limit>][~<holder>][:<value>]`
/// ([`Admission::entry_suffix`], [`crate::HolderInfo`]); 1 when none is, or when it does not
/// parse (a lock's entry, written before policies existed).
pub fn entry_limit(entry: &[u8]) -> u32 {
    let head = crate::holder::head(entry);
    let head = head
        .iter()
        .position(|b| *b == b'~')
        .map_or(head, |at| &head[..at]);
    head.iter()
        .position(|b| *b == b'#')
        .and_then(|at| std::str::from_utf8(&head[at + 1..]).ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u32 = u32::MAX;

    #[test]
    fn one_rule_gives_each_primitive() {
        // A lock: the head alone.
        assert!(Admission::Exclusive.admitted([]));
        assert!(!Admission::Exclusive.admitted([1]));
        // A semaphore of 3: the first three.
        let p = Admission::Permit(3);
        assert!(p.admitted([3, 3]));
        assert!(!p.admitted([3, 3, 3]));
        // Readers share; a writer waits for them all; readers behind a writer wait for it.
        assert!(Admission::Shared.admitted([MAX, MAX]));
        assert!(!Admission::Exclusive.admitted([MAX]));
        assert!(!Admission::Shared.admitted([MAX, 1]));
        assert!(!Admission::Shared.admitted([1]));
    }

    #[test]
    fn a_permit_with_another_limit_is_refused_naming_both() {
        let err = Admission::Permit(4)
            .check_ahead("pool", [4, 5])
            .expect_err("mismatch");
        assert!(matches!(
            err,
            LockError::LimitMismatch { ours: 4, theirs: 5, ref name } if name == "pool"
        ));
        assert!(Admission::Permit(4).check_ahead("pool", [4, 4]).is_ok());
        assert!(Admission::Shared.check_ahead("rw", [1, MAX]).is_ok());
    }

    #[test]
    fn the_admitted_prefix_is_counted_by_the_same_rule() {
        assert_eq!(admitted_count(&[]), 0);
        assert_eq!(admitted_count(&[1, 1]), 1);
        assert_eq!(admitted_count(&[3, 3, 3, 3]), 3);
        assert_eq!(admitted_count(&[MAX, MAX, 1, MAX]), 2);
        assert_eq!(admitted_count(&[1, MAX]), 1);
        for a in [
            Admission::Exclusive,
            Admission::Permit(5),
            Admission::Shared,
        ] {
            assert_eq!(Admission::of_limit(a.limit()), a);
        }
    }

    #[test]
    fn entries_record_their_limit() {
        assert_eq!(entry_limit(b"abc"), 1);
        assert_eq!(entry_limit(b"abc:leader#7"), 1);
        let reader = format!("abc{}", Admission::Shared.entry_suffix());
        assert_eq!(entry_limit(reader.as_bytes()), MAX);
        let permit = format!("abc{}:v", Admission::Permit(4).entry_suffix());
        assert_eq!(entry_limit(permit.as_bytes()), 4);
        assert_eq!(Admission::Exclusive.entry_suffix(), "");
    }
}
