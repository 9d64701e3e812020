//! What an election's observers were told.

use std::collections::HashMap;

use crate::history::{Entry, Event};

/// Reports of a term below one the same observer (through the same call) reported before.
pub fn going_back(history: &[Entry]) -> usize {
    let mut last: HashMap<(u32, &str), u64> = HashMap::new();
    let mut n = 0;
    for e in history {
        if let Event::Observed { term, via, .. } = &e.ev {
            let seen = last.entry((e.p, via.as_str())).or_insert(*term);
            if *term < *seen {
                n += 1;
            }
            *seen = (*seen).max(*term);
        }
    }
    n
}

/// Reports of a leader no candidate was elected as: a value no candidate campaigned with or
/// proclaimed, or one reported under another term than its candidate was granted. (A candidate
/// killed before it recorded its grant has no recorded term: its value is taken at its word.)
pub fn foreign_reports(history: &[Entry]) -> usize {
    // Each value's term, once its candidate recorded one; `None` while it is not known.
    let mut term_of: HashMap<&str, Option<u64>> = HashMap::new();
    let mut campaigning: HashMap<u32, &str> = HashMap::new();
    let mut leading: HashMap<u32, u64> = HashMap::new();
    for e in history {
        match &e.ev {
            Event::AcquireInvoke { value: Some(v), .. } => {
                campaigning.insert(e.p, v);
                term_of.insert(v, None);
            }
            Event::AcquireOk { token: Some(t), .. } => {
                if let Some(v) = campaigning.remove(&e.p) {
                    term_of.insert(v, Some(*t));
                }
                leading.insert(e.p, *t);
            }
            Event::Proclaim { value } => {
                term_of.insert(value, leading.get(&e.p).copied());
            }
            _ => {}
        }
    }
    history
        .iter()
        .filter(|e| match &e.ev {
            Event::Observed { term, value, .. } => match term_of.get(value.as_str()) {
                None => true,
                Some(Some(t)) => t != term,
                Some(None) => false,
            },
            _ => false,
        })
        .count()
}
