//! Latency samples into throughput and percentiles, and medians over rounds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One measured workload.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Operations (pairs, hand-overs) per second.
    pub per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
}

/// Stats of `samples` taken over `busy` (the time spent producing them).
pub fn stats(mut samples: Vec<Duration>, busy: Duration) -> Stats {
    samples.sort();
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Stats {
        per_sec: samples.len() as f64 / busy.as_secs_f64().max(1e-9),
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

fn mid(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The median of each field over rounds.
pub fn median(rounds: &[Stats]) -> Stats {
    Stats {
        per_sec: mid(rounds.iter().map(|s| s.per_sec).collect()),
        p50_us: mid(rounds.iter().map(|s| s.p50_us).collect()),
        p99_us: mid(rounds.iter().map(|s| s.p99_us).collect()),
    }
}
