//! The repeat grant, for backends whose every write takes the next number of one cluster-wide
//! sequence (ZooKeeper's zxid, etcd's revision): a client that takes the same lock again on an
//! otherwise idle cluster is granted on its enqueue write alone, with no queue read.
//!
//! Why it is safe: say our grant's queue entry was written at number `z`, our own release
//! deleted it (its reply came back, so it took a number between), and our next entry in the
//! same queue is written at `z + 2`. Then exactly one write lies between the two, and it is that
//! release: nobody created or deleted anything anywhere (nor re-created a parent). Our old entry
//! was granted after `z` with nothing ahead of it left; anything ahead at `z` would have been
//! deleted after `z`, a write in between; so at `z` the queue held our old entry alone, and now it
//! holds our new one alone, which therefore holds the lock. Any other write anywhere makes the
//! gap larger, and the backend reads the queue as usual. A per-queue counter (ZooKeeper's
//! sequence suffix) could not prove this: a parent re-created meanwhile restarts it.
//!
//! Whether to leave the queue read out of the enqueue is a guess: on a busy cluster the gap is
//! rarely 2, and an enqueue sent alone then costs a separate read. So it goes alone only when the
//! last enqueue that could have used the repeat grant did; otherwise the read rides with it as
//! usual and the gap is still checked, to learn for the next time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// What one backend client remembers for the repeat grant: its latest grant, and whether its
/// own release of it went through. Holds one grant whatever the number of names (only the latest
/// write can be one number before the next).
#[derive(Debug, Default)]
pub struct RepeatGrant {
    last: Mutex<Option<Last>>,
    /// Whether the last enqueue that had a released grant behind it missed the gap of 2 (the
    /// next one then carries the queue read again).
    missed: AtomicBool,
}

#[derive(Debug)]
struct Last {
    queue: String,
    resource: String,
    number: i64,
    released: bool,
}

/// Our own released grant in a queue, taken before an enqueue there.
#[derive(Debug)]
pub struct RepeatPrior {
    number: i64,
    alone: bool,
}

impl RepeatPrior {
    /// Whether to send the enqueue without the queue read (the last such guess was right).
    pub fn send_alone(&self) -> bool {
        self.alone
    }
}

impl RepeatGrant {
    /// Remembers a grant: `resource` in `queue`, written at `number`. A later grant replaces
    /// it (its write is a write in between anyway).
    pub fn granted(&self, queue: &str, resource: &str, number: i64) {
        *self.lock() = Some(Last {
            queue: queue.to_string(),
            resource: resource.to_string(),
            number,
            released: false,
        });
    }

    /// Our own delete of `resource` went through; only then does the proof hold.
    pub fn released(&self, resource: &str) {
        if let Some(last) = self.lock().as_mut()
            && last.resource == resource
        {
            last.released = true;
        }
    }

    /// Whether the latest grant is ours in `queue`, released (what [`RepeatGrant::take`] would
    /// take), without taking it.
    pub fn released_in(&self, queue: &str) -> bool {
        released_in(&self.lock(), queue)
    }

    /// Before an enqueue in `queue`: our released grant there, if the latest grant is one. Taken,
    /// so two enqueues at once do not both lean on it (only one can get `z + 2` anyway).
    pub fn take(&self, queue: &str) -> Option<RepeatPrior> {
        let mut last = self.lock();
        if !released_in(&last, queue) {
            return None;
        }
        let number = last.take().map(|l| l.number)?;
        Some(RepeatPrior {
            number,
            alone: !self.missed.load(Ordering::Relaxed),
        })
    }

    /// After the enqueue, written at `number`: whether it proves our entry is alone in its
    /// queue. Remembered, to decide whether the next one is sent alone.
    pub fn proves_alone(&self, prior: &RepeatPrior, number: i64) -> bool {
        let alone = prior.number.checked_add(2) == Some(number);
        self.missed.store(!alone, Ordering::Relaxed);
        alone
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Last>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn released_in(last: &Option<Last>, queue: &str) -> bool {
    last.as_ref()
        .is_some_and(|l| l.released && l.queue == queue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_released_grant_in_the_same_queue_counts() {
        let r = RepeatGrant::default();
        r.granted("/l/a", "/l/a/n1", 10);
        assert!(r.take("/l/a").is_none(), "not released yet");
        r.released("/l/a/other");
        assert!(r.take("/l/a").is_none(), "another entry was released");
        r.released("/l/a/n1");
        assert!(r.take("/l/b").is_none(), "another queue");
        let prior = r.take("/l/a").expect("released here");
        assert!(prior.send_alone());
        assert!(r.take("/l/a").is_none(), "taken once");
        assert!(r.proves_alone(&prior, 12));
    }

    #[test]
    fn a_gap_other_than_two_proves_nothing_and_the_next_enqueue_carries_the_read() {
        let r = RepeatGrant::default();
        r.granted("/l/a", "/l/a/n1", 10);
        r.released("/l/a/n1");
        let prior = r.take("/l/a").expect("released here");
        assert!(!r.proves_alone(&prior, 13));
        r.granted("/l/a", "/l/a/n2", 13);
        r.released("/l/a/n2");
        let prior = r.take("/l/a").expect("released here");
        assert!(!prior.send_alone(), "the last guess missed");
        assert!(r.proves_alone(&prior, 15));
        r.granted("/l/a", "/l/a/n3", 15);
        r.released("/l/a/n3");
        assert!(r.take("/l/a").expect("released here").send_alone());
    }
}
