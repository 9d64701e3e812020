//! The checker shown histories that must pass and histories that must fail, one at least per
//! property.

use super::*;
use crate::history::{Entry, Event};

fn at(t: u64, p: u32, ev: Event) -> Entry {
    Entry { t, p, ev }
}

fn grant(t: u64, p: u32, token: u64) -> [Entry; 2] {
    [
        at(t - 1, p, invoke()),
        at(
            t,
            p,
            Event::AcquireOk {
                token: Some(token),
                shared: false,
            },
        ),
    ]
}

fn invoke() -> Event {
    Event::AcquireInvoke {
        shared: false,
        value: None,
    }
}

fn ok(token: u64) -> Event {
    Event::AcquireOk {
        token: Some(token),
        shared: false,
    }
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
    let f = check(&clean(), 60, None);
    assert_eq!((f.operations, f.acquisitions), (4, 2));
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
    assert_eq!(check(&h, 30, None).overlaps, 1);
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
    assert_eq!(check(&h, 50, None).overlaps, 0);
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
    assert_eq!(check(&h, 10, None).fenced_violations, 2);
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
    assert_eq!(check(&h, 60, None).lost_elements, 1);
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
    assert_eq!(check(&h, 60, None).token_order_violations, 1);
    // Concurrent acquires may be granted in either order.
    let h = vec![
        at(1, 1, invoke()),
        at(2, 2, invoke()),
        at(3, 2, ok(9)),
        at(4, 1, ok(8)),
    ];
    assert_eq!(check(&h, 10, None).token_order_violations, 0);
}

#[test]
fn unavailability_is_the_longest_wait_with_nobody_holding() {
    let mut h = Vec::new();
    h.extend(grant(10, 1, 1));
    h.push(at(12, 2, invoke()));
    h.push(release(20, 1));
    h.push(at(90, 2, ok(2))); // 70 ns stuck
    h.push(release(95, 2));
    assert_eq!(check(&h, 100, None).worst_unavailability, 70);
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
    assert_eq!(check(&h, 100, None).lost_latencies, vec![45]);
}

fn shared_grant(t: u64, p: u32, token: u64) -> [Entry; 2] {
    [
        at(
            t - 1,
            p,
            Event::AcquireInvoke {
                shared: true,
                value: None,
            },
        ),
        at(
            t,
            p,
            Event::AcquireOk {
                token: Some(token),
                shared: true,
            },
        ),
    ]
}

fn sorted(mut h: Vec<Entry>) -> Vec<Entry> {
    h.sort_by_key(|e| e.t);
    h
}

#[test]
fn a_semaphore_counts_holders_beyond_its_permits() {
    let mut h = Vec::new();
    h.extend(shared_grant(10, 1, 1));
    h.extend(shared_grant(12, 2, 2));
    h.push(release(20, 1));
    h.extend(shared_grant(21, 3, 3)); // 1 left: two hold, fine
    h.extend(shared_grant(25, 4, 4)); // 2 and 3 hold: a third
    h.push(release(30, 2));
    h.push(release(31, 3));
    h.push(release(32, 4));
    let h = sorted(h);
    assert_eq!(check(&h, 40, Some(2)).overlaps, 1);
    assert_eq!(check(&h, 40, Some(3)).overlaps, 0);
}

#[test]
fn readers_share_and_a_writer_is_alone() {
    let mut h = Vec::new();
    h.extend(shared_grant(10, 1, 1));
    h.extend(shared_grant(12, 2, 2)); // two readers: fine
    h.push(release(20, 1));
    h.extend(grant(22, 3, 3)); // a writer while reader 2 reads
    h.push(release(25, 2));
    h.push(release(30, 3));
    h.extend(grant(40, 4, 4)); // a writer alone: fine
    h.push(release(45, 4));
    let f = check(&sorted(h), 50, None);
    assert_eq!(f.overlaps, 1);
    // The writers' waits: 1 ns each.
    assert_eq!(f.worst_writer_wait, 1);
}

#[test]
fn a_writers_longest_wait_is_reported() {
    let mut h = Vec::new();
    h.extend(shared_grant(10, 1, 1));
    h.push(at(11, 2, invoke()));
    h.push(release(60, 1));
    h.push(at(61, 2, ok(2)));
    assert_eq!(check(&sorted(h), 70, None).worst_writer_wait, 50);
}

#[test]
fn torn_reads_and_crowded_registries_are_counted() {
    let h = vec![
        at(
            1,
            1,
            Event::TornRead {
                before: "TOKEN 1".into(),
                after: "TOKEN 2".into(),
            },
        ),
        at(
            2,
            1000,
            Event::Entered {
                client: 1,
                inside: 2,
            },
        ),
        at(
            3,
            1000,
            Event::Entered {
                client: 2,
                inside: 3,
            },
        ),
    ];
    let f = check(&h, 10, Some(2));
    assert_eq!((f.torn_reads, f.crowded), (1, 1));
    assert_eq!(f.lease_violations(), 2);
}

#[test]
fn a_token_granted_twice_is_counted() {
    let mut h = Vec::new();
    h.extend(grant(10, 1, 5));
    h.push(release(20, 1));
    h.extend(grant(30, 1, 5)); // the same client again (re-entry): fine
    h.push(release(40, 1));
    h.extend(grant(50, 2, 5)); // another client: a term handed out twice
    let f = check(&sorted(h), 60, None);
    assert_eq!(f.duplicate_tokens, 1);
}

fn observed(t: u64, p: u32, term: u64, value: &str, via: &str) -> Entry {
    at(
        t,
        p,
        Event::Observed {
            term,
            value: value.into(),
            via: via.into(),
        },
    )
}

fn campaign(t: u64, p: u32, term: u64, value: &str) -> [Entry; 2] {
    [
        at(
            t - 1,
            p,
            Event::AcquireInvoke {
                shared: false,
                value: Some(value.into()),
            },
        ),
        at(t, p, ok(term)),
    ]
}

#[test]
fn observers_going_back_are_counted() {
    let mut h = Vec::new();
    h.extend(campaign(10, 1, 7, "a"));
    h.push(release(20, 1));
    h.extend(campaign(30, 2, 9, "b"));
    h.push(observed(11, 500, 7, "a", "observe"));
    h.push(observed(31, 500, 9, "b", "observe"));
    h.push(observed(32, 500, 7, "a", "leader")); // another call: its own sequence
    h.push(observed(33, 501, 9, "b", "observe"));
    h.push(observed(34, 501, 7, "a", "observe")); // back
    let f = check(&sorted(h), 40, None);
    assert_eq!((f.observers_back, f.foreign_reports), (1, 0));
}

#[test]
fn a_leader_no_one_was_elected_as_is_counted() {
    let mut h = Vec::new();
    h.extend(campaign(10, 1, 7, "a"));
    h.push(at(12, 1, Event::Proclaim { value: "a2".into() }));
    h.push(release(20, 1));
    // A candidate killed before it recorded its grant: taken at its word.
    h.push(at(
        21,
        3,
        Event::AcquireInvoke {
            shared: false,
            value: Some("c".into()),
        },
    ));
    h.push(observed(11, 500, 7, "a", "observe"));
    h.push(observed(13, 500, 7, "a2", "observe"));
    h.push(observed(22, 500, 8, "c", "observe"));
    let clean = sorted(h.clone());
    assert_eq!(check(&clean, 40, None).foreign_reports, 0);
    h.push(observed(23, 501, 9, "a", "leader")); // a's value under another term
    h.push(observed(24, 501, 9, "z", "leader")); // nobody's value
    assert_eq!(check(&sorted(h), 40, None).foreign_reports, 2);
}
