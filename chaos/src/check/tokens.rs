//! Tokens: in grant order, never shared, and what the fenced register accepted.

use std::collections::HashMap;

use super::holding::Grant;
use crate::history::{Entry, Event};

/// Grants whose token is not above the highest token of the grants completed before they were
/// asked for.
pub fn order_violations(grants: &[Grant]) -> usize {
    let mut by_grant: Vec<(u64, u64)> = grants.iter().map(|g| (g.granted, g.token)).collect();
    by_grant.sort_unstable();
    let mut by_ask: Vec<(u64, u64)> = grants.iter().map(|g| (g.asked, g.token)).collect();
    by_ask.sort_unstable();
    let (mut i, mut highest, mut violations) = (0, None, 0);
    for (asked, token) in by_ask {
        while i < by_grant.len() && by_grant[i].0 < asked {
            highest = highest.max(Some(by_grant[i].1));
            i += 1;
        }
        if highest.is_some_and(|h| token <= h) {
            violations += 1;
        }
    }
    violations
}

/// Grants whose token another client was granted before them.
pub fn duplicates(grants: &[Grant]) -> usize {
    let mut first: HashMap<u64, u32> = HashMap::new();
    let mut n = 0;
    for g in grants {
        match first.get(&g.token) {
            Some(c) if *c != g.client => n += 1,
            Some(_) => {}
            None => {
                first.insert(g.token, g.client);
            }
        }
    }
    n
}

/// Register writes accepted below an accepted token, or with a token it accepted from another
/// client (two holders with one token).
pub fn fenced_violations(history: &[Entry]) -> usize {
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
