//! The checker: what a merged history shows, counted.
//!
//! 1. **Overlaps**: holding intervals of different clients that overlap. A client holds from
//!    its grant until the first of its release, its lost signal, and its death (a `kill-client`
//!    fault); a paused client holds through its pause, as it believes it does.
//! 2. **Fenced violations**: writes the register accepted below a token it had accepted, or
//!    with a token it had accepted from another client (two holders with one token).
//! 3. **Lost elements**: acknowledged additions to the lock-set missing from it at the end.
//! 4. **Token-order violations**: an acquire that completed before another began, yet carries a
//!    token at least as high.
//! 5. **Unavailability**: the longest time some client waited and none held.
//! 6. **Lost-signal latency**: from the start of a cut to the cut holder's lost signal.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::history::{Entry, Event};

/// What one history shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Grants.
    pub acquisitions: usize,
    /// Pairs of overlapping holding intervals of different clients.
    pub overlaps: usize,
    /// Register writes accepted out of token order or with another holder's token.
    pub fenced_violations: usize,
    /// Acknowledged lock-set elements missing at the end.
    pub lost_elements: usize,
    /// Grants whose token is not above every token granted before they were asked for.
    pub token_order_violations: usize,
    /// The longest time with a client waiting and none holding, in ns.
    pub worst_unavailability: u64,
    /// Lost-signal latencies after cuts of a holder, in ns.
    pub lost_latencies: Vec<u64>,
}

/// One client's holding interval.
#[derive(Debug, Clone, Copy)]
struct Held {
    client: u32,
    from: u64,
    to: u64,
}

/// Checks `history` (time-ordered) of a run that ended at `end`.
pub fn check(history: &[Entry], end: u64) -> Findings {
    let mut f = Findings::default();
    let killed: HashMap<u32, u64> = history
        .iter()
        .filter_map(|e| match &e.ev {
            Event::FaultStart { kind, target } if kind == "kill-client" => {
                Some((target.parse().ok()?, e.t))
            }
            _ => None,
        })
        .collect();
    // Holding intervals, and each grant with the time its acquire was asked.
    let mut open: HashMap<u32, u64> = HashMap::new();
    let mut asked: HashMap<u32, u64> = HashMap::new();
    let mut waiting: BTreeMap<u64, i64> = BTreeMap::new();
    let mut held = Vec::new();
    let mut grants: Vec<(u64, u64, u64)> = Vec::new(); // (asked, granted, token)
    for e in history {
        match &e.ev {
            Event::AcquireInvoke => {
                asked.insert(e.p, e.t);
                *waiting.entry(e.t).or_default() += 1;
            }
            Event::AcquireOk { token } => {
                f.acquisitions += 1;
                open.insert(e.p, e.t);
                if let Some(a) = asked.remove(&e.p) {
                    *waiting.entry(e.t).or_default() -= 1;
                    if let Some(t) = token {
                        grants.push((a, e.t, *t));
                    }
                }
            }
            Event::AcquireFail { .. } if asked.remove(&e.p).is_some() => {
                *waiting.entry(e.t).or_default() -= 1;
            }
            Event::ReleaseInvoke | Event::Lost { .. } => {
                if let Some(from) = open.remove(&e.p) {
                    held.push(Held {
                        client: e.p,
                        from,
                        to: e.t,
                    });
                }
            }
            _ => {}
        }
    }
    for (client, from) in open {
        held.push(Held {
            client,
            from,
            to: end,
        });
    }
    // A killed client wait or holds no more.
    for h in &mut held {
        if let Some(k) = killed.get(&h.client)
            && *k < h.to
            && *k >= h.from
        {
            h.to = *k;
        }
    }
    for (client, at) in asked {
        let stop = killed
            .get(&client)
            .copied()
            .filter(|k| *k >= at)
            .unwrap_or(end);
        *waiting.entry(stop).or_default() -= 1;
    }
    held.sort_by_key(|h| h.from);
    for (i, a) in held.iter().enumerate() {
        for b in &held[i + 1..] {
            if b.from >= a.to {
                break;
            }
            if b.client != a.client {
                f.overlaps += 1;
            }
        }
    }
    f.token_order_violations = token_order_violations(&mut grants);
    f.fenced_violations = fenced_violations(history);
    f.lost_elements = lost_elements(history);
    f.worst_unavailability = worst_unavailability(&waiting, &held, end);
    f.lost_latencies = lost_latencies(history, &held);
    f
}

/// Grants whose token is not above the highest token of the grants completed before they were
/// asked for.
fn token_order_violations(grants: &mut [(u64, u64, u64)]) -> usize {
    let mut by_grant: Vec<(u64, u64)> = grants.iter().map(|(_, g, t)| (*g, *t)).collect();
    by_grant.sort_unstable();
    grants.sort_unstable_by_key(|(a, _, _)| *a);
    let (mut i, mut highest, mut violations) = (0, None, 0);
    for (asked, _, token) in grants.iter() {
        while i < by_grant.len() && by_grant[i].0 < *asked {
            highest = highest.max(Some(by_grant[i].1));
            i += 1;
        }
        if highest.is_some_and(|h| *token <= h) {
            violations += 1;
        }
    }
    violations
}

fn fenced_violations(history: &[Entry]) -> usize {
    let mut highest = None;
    let mut writers: HashMap<u64, u32> = HashMap::new();
    let mut violations = 0;
    for e in history {
        if let Event::Accepted { token, client } = &e.ev {
            let below = highest.is_some_and(|h| *token < h);
            let shared = writers.get(token).is_some_and(|c| c != client);
            if below || shared {
                violations += 1;
            }
            writers.insert(*token, *client);
            highest = highest.max(Some(*token));
        }
    }
    violations
}

fn lost_elements(history: &[Entry]) -> usize {
    let added: BTreeSet<&String> = history
        .iter()
        .filter_map(|e| match &e.ev {
            Event::SetAdd { element } => Some(element),
            _ => None,
        })
        .collect();
    let Some(last) = history.iter().rev().find_map(|e| match &e.ev {
        Event::FinalSet { elements } => Some(elements),
        _ => None,
    }) else {
        return added.len();
    };
    let kept: BTreeSet<&String> = last.iter().collect();
    added.difference(&kept).count()
}

/// The longest span in which the waiting count is above zero and no interval is open.
fn worst_unavailability(waiting: &BTreeMap<u64, i64>, held: &[Held], end: u64) -> u64 {
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
fn lost_latencies(history: &[Entry], held: &[Held]) -> Vec<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: u64, p: u32, ev: Event) -> Entry {
        Entry { t, p, ev }
    }

    fn grant(t: u64, p: u32, token: u64) -> [Entry; 2] {
        [
            at(t - 1, p, Event::AcquireInvoke),
            at(t, p, Event::AcquireOk { token: Some(token) }),
        ]
    }

    fn release(t: u64, p: u32) -> Entry {
        at(t, p, Event::ReleaseInvoke)
    }

    fn clean() -> Vec<Entry> {
        let mut h = Vec::new();
        h.extend(grant(10, 1, 1));
        h.push(at(
            11,
            1,
            Event::SetAdd {
                element: "a".into(),
            },
        ));
        h.push(at(
            12,
            1000,
            Event::Accepted {
                token: 1,
                client: 1,
            },
        ));
        h.push(release(20, 1));
        h.extend(grant(30, 2, 2));
        h.push(at(
            31,
            1000,
            Event::Accepted {
                token: 2,
                client: 2,
            },
        ));
        h.push(at(
            32,
            2,
            Event::SetAdd {
                element: "b".into(),
            },
        ));
        h.push(release(40, 2));
        h.push(at(
            50,
            1000,
            Event::FinalSet {
                elements: vec!["a".into(), "b".into()],
            },
        ));
        h
    }

    #[test]
    fn a_clean_history_shows_nothing() {
        let f = check(&clean(), 60);
        assert_eq!(f.acquisitions, 2);
        assert_eq!(
            (
                f.overlaps,
                f.fenced_violations,
                f.lost_elements,
                f.token_order_violations
            ),
            (0, 0, 0, 0)
        );
        // Nobody waited while nobody held, beyond the one nanosecond before each grant.
        assert_eq!(f.worst_unavailability, 1);
    }

    #[test]
    fn overlapping_holders_are_counted() {
        let mut h = Vec::new();
        h.extend(grant(10, 1, 1));
        h.extend(grant(15, 2, 2)); // 2 granted while 1 still holds
        h.push(release(20, 1));
        h.push(release(25, 2));
        h.sort_by_key(|e| e.t);
        assert_eq!(check(&h, 30).overlaps, 1);
    }

    #[test]
    fn a_lost_signal_or_a_kill_ends_the_holding() {
        let mut h = Vec::new();
        h.extend(grant(10, 1, 1));
        h.push(at(
            14,
            1,
            Event::Lost {
                reason: "expired".into(),
            },
        ));
        h.extend(grant(15, 2, 2));
        h.push(release(20, 2));
        h.extend(grant(30, 3, 3));
        h.push(at(
            32,
            2000,
            Event::FaultStart {
                kind: "kill-client".into(),
                target: "3".into(),
            },
        ));
        h.extend(grant(35, 4, 4));
        h.push(release(40, 4));
        h.sort_by_key(|e| e.t);
        assert_eq!(check(&h, 50).overlaps, 0);
    }

    #[test]
    fn fenced_writes_out_of_order_or_shared_are_counted() {
        let h = vec![
            at(
                1,
                1000,
                Event::Accepted {
                    token: 5,
                    client: 1,
                },
            ),
            at(
                2,
                1000,
                Event::Accepted {
                    token: 4,
                    client: 2,
                },
            ), // below 5
            at(
                3,
                1000,
                Event::Accepted {
                    token: 6,
                    client: 2,
                },
            ),
            at(
                4,
                1000,
                Event::Accepted {
                    token: 6,
                    client: 3,
                },
            ), // 6 was client 2's
            at(
                5,
                1000,
                Event::Accepted {
                    token: 6,
                    client: 3,
                },
            ), // same holder again: fine
        ];
        assert_eq!(check(&h, 10).fenced_violations, 2);
    }

    #[test]
    fn lost_elements_are_counted() {
        let mut h = clean();
        h.push(at(
            45,
            2,
            Event::SetAdd {
                element: "c".into(),
            },
        ));
        h.sort_by_key(|e| e.t);
        assert_eq!(check(&h, 60).lost_elements, 1);
    }

    #[test]
    fn tokens_out_of_real_time_order_are_counted() {
        let mut h = Vec::new();
        h.extend(grant(10, 1, 7));
        h.push(release(20, 1));
        h.extend(grant(30, 2, 3)); // asked after 7 was granted, yet lower (a restart forgot)
        h.push(release(40, 2));
        h.extend(grant(50, 3, 8));
        h.sort_by_key(|e| e.t);
        assert_eq!(check(&h, 60).token_order_violations, 1);
        // Concurrent acquires may be granted in either order.
        let h = vec![
            at(1, 1, Event::AcquireInvoke),
            at(2, 2, Event::AcquireInvoke),
            at(3, 2, Event::AcquireOk { token: Some(9) }),
            at(4, 1, Event::AcquireOk { token: Some(8) }),
        ];
        assert_eq!(check(&h, 10).token_order_violations, 0);
    }

    #[test]
    fn unavailability_is_the_longest_wait_with_nobody_holding() {
        let mut h = Vec::new();
        h.extend(grant(10, 1, 1));
        h.push(at(12, 2, Event::AcquireInvoke));
        h.push(release(20, 1));
        h.push(at(90, 2, Event::AcquireOk { token: Some(2) })); // 70 ns stuck
        h.push(release(95, 2));
        assert_eq!(check(&h, 100).worst_unavailability, 70);
    }

    #[test]
    fn lost_signal_latency_after_a_cut_of_a_holder() {
        let mut h = Vec::new();
        h.extend(grant(10, 1, 1));
        h.push(at(
            20,
            2000,
            Event::FaultStart {
                kind: "cut-client".into(),
                target: "1".into(),
            },
        ));
        h.push(at(
            65,
            1,
            Event::Lost {
                reason: "renewals failed".into(),
            },
        ));
        h.push(at(
            70,
            2000,
            Event::FaultStart {
                kind: "cut-client".into(),
                target: "1".into(),
            },
        )); // not holding
        assert_eq!(check(&h, 100).lost_latencies, vec![45]);
    }
}
