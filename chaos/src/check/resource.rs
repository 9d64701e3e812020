//! What the resource saw: the lock-set, the readers' view of the register, the permit registry.

use std::collections::BTreeSet;

use crate::history::{Entry, Event};

/// Acknowledged additions to the lock-set missing from it at the end.
pub fn lost_elements(history: &[Entry]) -> usize {
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

/// Reads that saw the register change while their read lease was live.
pub fn torn_reads(history: &[Entry]) -> usize {
    history
        .iter()
        .filter(|e| matches!(e.ev, Event::TornRead { .. }))
        .count()
}

/// Permit holders that registered while `limit` others were registered.
pub fn crowded(history: &[Entry], limit: usize) -> usize {
    history
        .iter()
        .filter(|e| matches!(e.ev, Event::Entered { inside, .. } if inside > limit))
        .count()
}
