//! Who held when: holding intervals, grants and waits, read from the clients' records.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use crate::history::{Entry, Event};

/// One client's holding interval.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    pub client: u32,
    pub from: u64,
    pub to: u64,
    /// A read lease or a permit.
    pub shared: bool,
}

/// One grant with a token.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub client: u32,
    /// When it was asked for.
    pub asked: u64,
    pub granted: u64,
    pub token: u64,
}

/// What the clients' records say about holding.
pub struct Holding {
    pub acquisitions: usize,
    pub held: Vec<Held>,
    pub grants: Vec<Grant>,
    /// Changes of the number of waiting clients, by time.
    pub waiting: BTreeMap<u64, i64>,
    pub worst_writer_wait: u64,
}

impl Holding {
    /// Reads `history` of a run that ended at `end`.
    pub fn of(history: &[Entry], end: u64) -> Self {
        let killed: HashMap<u32, u64> = history
            .iter()
            .filter_map(|e| match &e.ev {
                Event::FaultStart { kind, target } if kind == "kill-client" => {
                    Some((target.parse().ok()?, e.t))
                }
                _ => None,
            })
            .collect();
        let mut h = Holding {
            acquisitions: 0,
            held: Vec::new(),
            grants: Vec::new(),
            waiting: BTreeMap::new(),
            worst_writer_wait: 0,
        };
        let mut open: HashMap<u32, (u64, bool)> = HashMap::new();
        let mut asked: HashMap<u32, (u64, bool)> = HashMap::new();
        for e in history {
            match &e.ev {
                Event::AcquireInvoke { shared, .. } => {
                    asked.insert(e.p, (e.t, *shared));
                    *h.waiting.entry(e.t).or_default() += 1;
                }
                Event::AcquireOk { token, shared } => {
                    h.acquisitions += 1;
                    open.insert(e.p, (e.t, *shared));
                    if let Some((a, asked_shared)) = asked.remove(&e.p) {
                        *h.waiting.entry(e.t).or_default() -= 1;
                        if !asked_shared {
                            h.worst_writer_wait = h.worst_writer_wait.max(e.t - a);
                        }
                        if let Some(t) = token {
                            h.grants.push(Grant {
                                client: e.p,
                                asked: a,
                                granted: e.t,
                                token: *t,
                            });
                        }
                    }
                }
                Event::AcquireFail { .. } if asked.remove(&e.p).is_some() => {
                    *h.waiting.entry(e.t).or_default() -= 1;
                }
                Event::ReleaseInvoke | Event::Lost { .. } => {
                    if let Some((from, shared)) = open.remove(&e.p) {
                        h.held.push(Held {
                            client: e.p,
                            from,
                            to: e.t,
                            shared,
                        });
                    }
                }
                _ => {}
            }
        }
        for (client, (from, shared)) in open {
            h.held.push(Held {
                client,
                from,
                to: end,
                shared,
            });
        }
        // A killed client waits or holds no more.
        for held in &mut h.held {
            if let Some(k) = killed.get(&held.client)
                && *k < held.to
                && *k >= held.from
            {
                held.to = *k;
            }
        }
        for (client, (at, _)) in asked {
            let stop = killed
                .get(&client)
                .copied()
                .filter(|k| *k >= at)
                .unwrap_or(end);
            *h.waiting.entry(stop).or_default() -= 1;
        }
        h.held.sort_by_key(|x| x.from);
        h
    }
}

/// Pairs of overlapping intervals of different clients where one is exclusive, plus the shared
/// grants that found `shared_limit` or more other shared holders already holding.
pub fn exclusion_violations(held: &[Held], shared_limit: Option<usize>) -> usize {
    let mut n = 0;
    for (i, a) in held.iter().enumerate() {
        for b in &held[i + 1..] {
            if b.from >= a.to {
                break;
            }
            if b.client != a.client && (!a.shared || !b.shared) {
                n += 1;
            }
        }
    }
    if let Some(limit) = shared_limit {
        // The ends of the shared intervals begun so far (sorted by start), earliest first.
        let mut holding: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
        for a in held.iter().filter(|h| h.shared) {
            while holding.peek().is_some_and(|Reverse(to)| *to <= a.from) {
                holding.pop();
            }
            if holding.len() >= limit {
                n += 1;
            }
            holding.push(Reverse(a.to));
        }
    }
    n
}

/// The longest span in which the waiting count is above zero and no interval is open.
pub fn worst_unavailability(waiting: &BTreeMap<u64, i64>, held: &[Held], end: u64) -> u64 {
    let mut changes: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    for (t, d) in waiting {
        changes.entry(*t).or_default().0 += d;
    }
    for h in held {
        changes.entry(h.from).or_default().1 += 1;
        changes.entry(h.to).or_default().1 -= 1;
    }
    let (mut waiters, mut holders, mut since, mut worst) = (0i64, 0i64, None, 0);
    for (t, (dw, dh)) in changes {
        waiters += dw;
        holders += dh;
        let stuck = waiters > 0 && holders <= 0;
        match (stuck, since) {
            (true, None) => since = Some(t),
            (false, Some(s)) => {
                worst = worst.max(t - s);
                since = None;
            }
            _ => {}
        }
    }
    if let Some(s) = since {
        worst = worst.max(end.saturating_sub(s));
    }
    worst
}

/// For each cut of a client that held at the cut: the time to its lost signal.
pub fn lost_latencies(history: &[Entry], held: &[Held]) -> Vec<u64> {
    let mut out = Vec::new();
    for (i, e) in history.iter().enumerate() {
        let Event::FaultStart { kind, target } = &e.ev else {
            continue;
        };
        let Ok(client) = target.parse::<u32>() else {
            continue;
        };
        if kind != "cut-client"
            || !held
                .iter()
                .any(|h| h.client == client && h.from <= e.t && e.t < h.to)
        {
            continue;
        }
        if let Some(lost) = history[i..]
            .iter()
            .find(|x| x.p == client && matches!(x.ev, Event::Lost { .. }))
        {
            out.push(lost.t - e.t);
        }
    }
    out
}
