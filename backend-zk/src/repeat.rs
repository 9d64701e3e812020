//! The repeat grant: a client that takes the same lock again on an otherwise idle ensemble is
//! granted on its create alone, with no queue read.
//!
//! Why it is safe: ZooKeeper gives every write of the ensemble the next zxid (`epoch << 32 |
//! counter`; a failed write and a session's start or end take one too). Say our node for a
//! directory was created at zxid `z`, granted, then deleted by our own release (its reply came
//! back), and our next create there gets czxid `z + 2`. Then exactly one write lies between the
//! two creates, and it is that delete. So nobody created or deleted anything anywhere, and no
//! container was removed or re-created. Our old node was granted after `z`, with nothing ahead of
//! it left: whatever was ahead at `z` would have been deleted after `z`, a write in between; so
//! at `z` the directory held our old node alone, and now it holds our new node alone, which
//! therefore holds the lock. Any other write anywhere makes the gap larger and the queue is read
//! as usual. (The sequence suffix could not prove this: a container re-created meanwhile
//! restarts it.)
//!
//! Whether to send the create alone is a guess: on a busy ensemble the gap is rarely 2, and a
//! create sent alone then costs a separate queue read. So the create goes alone only when the
//! last create that could have used the repeat grant did; otherwise the queue read rides behind
//! it as usual and the gap is still checked, to learn for the next time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// What one client remembers: its latest grant, and whether it released it itself.
#[derive(Default)]
pub(crate) struct Repeat {
    last: Mutex<Option<Last>>,
    /// Whether the last create that had a released grant behind it missed the gap of 2 (the
    /// next one then carries the queue read again).
    missed: AtomicBool,
}

struct Last {
    path: String,
    czxid: i64,
    released: bool,
}

/// Our own released grant in a directory, taken before a create there.
pub(crate) struct Prior {
    czxid: i64,
    /// Send the create without the queue read behind it.
    pub(crate) alone: bool,
}

impl Repeat {
    /// Remembers a grant (a later one replaces it: its create is a write in between anyway).
    pub(crate) fn granted(&self, path: &str, czxid: i64) {
        *self.lock() = Some(Last {
            path: path.to_string(),
            czxid,
            released: false,
        });
    }

    /// Our delete of `path` went through (only then does the proof above hold).
    pub(crate) fn released(&self, path: &str) {
        if let Some(last) = self.lock().as_mut()
            && last.path == path
        {
            last.released = true;
        }
    }

    /// Before a create in `dir`: our released grant there, if the latest grant is one. Taken, so
    /// two creates at once do not both lean on it (only one of them can get `z + 2` anyway).
    pub(crate) fn take(&self, dir: &str) -> Option<Prior> {
        let mut last = self.lock();
        let fits = last
            .as_ref()
            .is_some_and(|l| l.released && l.path.rsplit_once('/').is_some_and(|(d, _)| d == dir));
        if !fits {
            return None;
        }
        let czxid = last.take().map(|l| l.czxid)?;
        Some(Prior {
            czxid,
            alone: !self.missed.load(Ordering::Relaxed),
        })
    }

    /// After the create: whether its czxid proves our new node is alone in the directory.
    /// Remembered, to decide whether the next one is sent alone.
    pub(crate) fn proves_alone(&self, prior: &Prior, czxid: i64) -> bool {
        let alone = prior.czxid.checked_add(2) == Some(czxid);
        self.missed.store(!alone, Ordering::Relaxed);
        alone
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Last>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_released_grant_in_the_same_directory_counts() {
        let r = Repeat::default();
        r.granted("/l/a/n1", 10);
        assert!(r.take("/l/a").is_none(), "not released yet");
        r.released("/l/a/other");
        assert!(r.take("/l/a").is_none(), "another node was released");
        r.released("/l/a/n1");
        assert!(r.take("/l/b").is_none(), "another directory");
        let prior = r.take("/l/a").expect("released here");
        assert!(prior.alone);
        assert!(r.take("/l/a").is_none(), "taken once");
        assert!(r.proves_alone(&prior, 12));
    }

    #[test]
    fn a_gap_other_than_two_proves_nothing_and_the_next_create_carries_the_read() {
        let r = Repeat::default();
        r.granted("/l/a/n1", 10);
        r.released("/l/a/n1");
        let prior = r.take("/l/a").expect("released here");
        assert!(!r.proves_alone(&prior, 13));
        r.granted("/l/a/n2", 13);
        r.released("/l/a/n2");
        let prior = r.take("/l/a").expect("released here");
        assert!(!prior.alone, "the last guess missed");
        assert!(r.proves_alone(&prior, 15));
        r.granted("/l/a/n3", 15);
        r.released("/l/a/n3");
        assert!(r.take("/l/a").expect("released here").alone);
    }
}
