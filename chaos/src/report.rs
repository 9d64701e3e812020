//! `docs/faults.md`: one table per workload, one row per deployment and nemesis in it, and
//! timeline pictures.

use std::fmt::Write;
use std::time::Duration;

use crate::campaign::RunResult;
use crate::deployment::Deployment;
use crate::history::{Event, NEMESIS, RESOURCE};
use crate::nemesis::Nemesis;
use crate::workload::Workload;

fn ms(ns: u64) -> String {
    format!("{}", ns / 1_000_000)
}

fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[i])
}

type Column = (&'static str, fn(&RunResult) -> String);

fn latency(r: &RunResult) -> String {
    let mut lat = r.findings.lost_latencies.clone();
    lat.sort_unstable();
    match (percentile(&lat, 0.5), percentile(&lat, 0.99)) {
        (Some(a), Some(b)) => format!("{} / {}", ms(a), ms(b)),
        _ => "-".into(),
    }
}

fn verdict(r: &RunResult) -> String {
    let unexpected = r.unexpected();
    let (lease_hazard, token_hazard) = r.deployment.hazards(r.nemesis);
    let f = &r.findings;
    let shown = f.lease_violations() + f.token_violations();
    if unexpected > 0 {
        format!("**FAIL** ({unexpected} unexpected)")
    } else if shown > 0 && (lease_hazard || token_hazard) {
        "pass (violations expected: the known hazard)".to_string()
    } else {
        "pass".to_string()
    }
}

fn tokens(r: &RunResult) -> String {
    if r.deployment == Deployment::Redlock {
        "- (no tokens)".to_string()
    } else {
        format!(
            "{} / {}",
            r.findings.token_order_violations, r.findings.duplicate_tokens
        )
    }
}

/// The columns of `workload`'s table, after deployment and nemesis.
fn columns(workload: Workload) -> Vec<Column> {
    let head: [Column; 2] = [
        ("operations", |r| r.findings.operations.to_string()),
        ("acquisitions", |r| r.findings.acquisitions.to_string()),
    ];
    let tail: [Column; 5] = [
        ("worst unavailability (ms)", |r| {
            ms(r.findings.worst_unavailability)
        }),
        ("lost-signal latency p50 / p99 (ms)", latency),
        ("left on the servers", |r| r.findings.leftovers.to_string()),
        ("clean after (ms)", |r| ms(r.findings.clean_after)),
        ("verdict", verdict),
    ];
    let middle: Vec<Column> = match workload {
        Workload::Lock | Workload::Crowd(_) => vec![
            ("overlaps", |r| r.findings.overlaps.to_string()),
            ("fenced violations", |r| {
                r.findings.fenced_violations.to_string()
            }),
            ("lost elements", |r| r.findings.lost_elements.to_string()),
            ("token order / duplicates", tokens),
        ],
        Workload::Semaphore(_) => vec![
            ("holders beyond N", |r| r.findings.overlaps.to_string()),
            ("registered beyond N at the resource", |r| {
                r.findings.crowded.to_string()
            }),
            ("token order / duplicates", tokens),
        ],
        Workload::RwLock => vec![
            ("a writer with another holder", |r| {
                r.findings.overlaps.to_string()
            }),
            ("torn reads", |r| r.findings.torn_reads.to_string()),
            ("lost elements", |r| r.findings.lost_elements.to_string()),
            ("fenced violations", |r| {
                r.findings.fenced_violations.to_string()
            }),
            ("token order / duplicates", tokens),
            ("worst writer wait (ms)", |r| {
                ms(r.findings.worst_writer_wait)
            }),
        ],
        Workload::Election => vec![
            ("two leaders at once", |r| r.findings.overlaps.to_string()),
            ("fenced violations", |r| {
                r.findings.fenced_violations.to_string()
            }),
            ("term order / duplicates", tokens),
            ("observers going back", |r| {
                r.findings.observers_back.to_string()
            }),
            ("leaders never elected", |r| {
                r.findings.foreign_reports.to_string()
            }),
        ],
    };
    head.into_iter().chain(middle).chain(tail).collect()
}

fn title(workload: Workload) -> String {
    match workload {
        Workload::Lock => "Lock: 5 clients, the fenced register and the lock-set".into(),
        Workload::Crowd(n) => format!(
            "Crowd: a lock of {n} clients, the fenced register and the lock-set (a queue long \
             enough that etcd's waiters follow keys of their own; some waits time out or are \
             dropped, from any place in it)"
        ),
        Workload::Semaphore(n) => format!(
            "Semaphore of {n}: {} clients registering at the resource while they hold a permit",
            workload.clients()
        ),
        Workload::RwLock => {
            "Read-write lock: 5 clients, 70 % reads (the register read twice), 30 % writes (as the lock's)".into()
        }
        Workload::Election => {
            "Election: 5 candidates leading, proclaiming and resigning, 2 observers".into()
        }
    }
}

/// The report of `runs`, made by `command` on `schedule` (how long the runs were).
pub fn markdown(runs: &[RunResult], command: &str, schedule: &str) -> String {
    let mut out = String::new();
    let total: usize = runs.iter().map(|r| r.findings.operations).sum();
    let _ = writeln!(
        out,
        "# Fault campaign\n\nGenerated by `{command}`: {} runs ({schedule}), {total} operations in all \
         (acquire attempts, releases, proclamations, observers' reports). \
         Each run starts its own servers, a resource process and client processes on one name; \
         faults every few TTLs. How the history is checked: `chaos/src/check/`.\n\n\
         **Workloads.** Lock clients hold the lock while they write a fenced register (with \
         their token) and add an element to an unfenced lock-set (read, sleep up to 20 ms, write \
         back); they wait up to 5 s each time. The other primitives' clients mix waits, waits \
         of 1-300 ms, tries and waits dropped 0-150 ms after they began (the cancel path). \
         Permit holders register at the resource while they work and leave at once when their \
         lost signal fires; readers read the register twice and report a change between the two \
         under a live lease; writers and leaders do the lock's work with their token or term; \
         observers record what `observe()` and `leader()` report. Once every client is killed, the \
         servers are read raw until they hold nothing under the name (keys, queue entries, hash \
         fields, znodes), for at most two TTLs and 10 s: anything left then fails the run; \
         `clean after` is how long that took.\n\n\
         A violation is **expected** where it is the known hazard of that fault: no lease \
         survives a pause past its TTL without the resource's own check (the fenced register \
         refuses the stale writer; the unfenced lock-set loses an element; a second permit \
         holder or a writer gets in), one Redis server (or Redis Cluster master, for the names \
         in its slots) that crashes forgets its locks and its token counter (tokens go back, \
         and the register sees one token from two holders), and a Redlock node restarted \
         empty within the TTL gives a second majority (`kill-server`; `kill-server-late` restarts \
         it only after 1.5 TTLs, Redlock's delayed-restart rule, and must show nothing), a \
         server's wall clock stepped forward by 2 TTLs (`clock-jump`, through a preloaded clock \
         shim: Redis counts TTLs on its wall clock, so locks expire early), and a Sentinel \
         failover (`failover`: the master killed, the replica promoted; replication is \
         asynchronous, so the last locks and counter steps can be missing there). `redis-aof` \
         is one Redis server with an append-only file synced at every write; `redis-sentinel` a \
         master and a replica behind one Sentinel; `redis-cluster` three masters without replicas, \
         each client its own ACL user, cut by switching it off (no proxy: no `delay-client`); \
         `postgres` one PostgreSQL server with stock settings (fsync on: a killed server keeps \
         every committed grant and its sequence, so it must show nothing); `postgres-sync` a \
         primary and a synchronous standby, clients listing both, failed over by promoting the \
         standby (every acknowledged grant was flushed there first, so it must show nothing; \
         commits wait until the old primary is rebuilt as the new one's standby). \
         `delay-client` delays one client's traffic by \
         half a TTL each way for 1.5 TTLs; `reset-client` closes its connections at once. \
         Anything else fails the campaign.\n",
        runs.len(),
    );
    let mut workloads: Vec<Workload> = Vec::new();
    for r in runs {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload);
        }
    }
    for w in workloads {
        let cols = columns(w);
        let _ = writeln!(out, "## {}\n", title(w));
        let heads: Vec<&str> = cols.iter().map(|(h, _)| *h).collect();
        let _ = writeln!(out, "| deployment | nemesis | {} |", heads.join(" | "));
        let aligns: Vec<&str> = cols
            .iter()
            .map(|(h, _)| match *h {
                "verdict"
                | "lost-signal latency p50 / p99 (ms)"
                | "token order / duplicates"
                | "term order / duplicates" => "---",
                _ => "---:",
            })
            .collect();
        let _ = writeln!(out, "|---|---|{}|", aligns.join("|"));
        for r in runs.iter().filter(|r| r.workload == w) {
            let cells: Vec<String> = cols.iter().map(|(_, f)| f(r)).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                r.deployment.label(),
                r.nemesis.label(),
                cells.join(" | ")
            );
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "## Timelines\n");
    for r in runs.iter().filter(|r| has_timeline(r)) {
        let _ = writeln!(
            out,
            "![{} on {} under {}]({})\n",
            r.workload.label(),
            r.deployment.label(),
            r.nemesis.label(),
            timeline_file(r)
        );
    }
    out
}

/// Whether `run` gets a timeline: every lock run under a pause, and each other workload's run
/// on one etcd member under a pause.
pub fn has_timeline(run: &RunResult) -> bool {
    run.nemesis == Nemesis::PauseClient
        && (run.workload == Workload::Lock || run.deployment == Deployment::Etcd)
}

/// The file name of `run`'s timeline, next to the report.
pub fn timeline_file(run: &RunResult) -> String {
    match run.workload {
        Workload::Lock => format!("faults-{}.svg", run.deployment.label()),
        w => format!("faults-{}-{}.svg", w.label(), run.deployment.label()),
    }
}

/// A timeline of the first `window` of `run`: one row per client, holding spans in green, lost
/// signals as red ticks, refused fenced writes as orange ticks, faults shaded grey.
pub fn svg(run: &RunResult, window: Duration) -> String {
    let (begin, end) = run.span;
    let end = end.min(begin + window.as_nanos() as u64);
    let width = 900.0;
    let x = |t: u64| {
        120.0 + (t.saturating_sub(begin)) as f64 / (end - begin).max(1) as f64 * (width - 130.0)
    };
    let mut clients: Vec<u32> = run
        .history
        .iter()
        .map(|e| e.p)
        .filter(|p| *p != NEMESIS && *p != RESOURCE)
        .collect();
    clients.sort_unstable();
    clients.dedup();
    let row = |p: u32| 30.0 + 22.0 * clients.iter().position(|c| *c == p).unwrap_or(0) as f64;
    let height = 50.0 + 22.0 * clients.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"10\" y=\"16\">{} on {} under {}: first {:?} (green: holding; red: lost signal; orange: refused fenced write; grey: fault)</text>\n",
        run.workload.label(),
        run.deployment.label(),
        run.nemesis.label(),
        window
    );
    let mut fault_from = None;
    for e in &run.history {
        if e.t > end {
            break;
        }
        match &e.ev {
            Event::FaultStart { .. } => fault_from = Some(e.t),
            Event::FaultEnd { .. } => {
                if let Some(f) = fault_from.take() {
                    let _ = writeln!(
                        s,
                        "<rect x=\"{:.1}\" y=\"22\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#ddd\"/>",
                        x(f),
                        (x(e.t) - x(f)).max(1.0),
                        height - 30.0
                    );
                }
            }
            _ => {}
        }
    }
    for p in &clients {
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{:.1}\">client {p}</text>",
            row(*p) + 12.0
        );
        let mut from = None;
        for e in run.history.iter().filter(|e| e.p == *p && e.t <= end) {
            match &e.ev {
                Event::AcquireOk { .. } => from = Some(e.t),
                Event::ReleaseInvoke | Event::Lost { .. } => {
                    if let Some(f) = from.take() {
                        let _ = writeln!(
                            s,
                            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"14\" fill=\"#4a4\"/>",
                            x(f),
                            row(*p),
                            (x(e.t) - x(f)).max(0.5)
                        );
                    }
                    if matches!(e.ev, Event::Lost { .. }) {
                        let _ = writeln!(
                            s,
                            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"2\" height=\"18\" fill=\"#d22\"/>",
                            x(e.t),
                            row(*p) - 2.0
                        );
                    }
                }
                Event::WriteRefused { .. } => {
                    let _ = writeln!(
                        s,
                        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"2\" height=\"18\" fill=\"#e80\"/>",
                        x(e.t),
                        row(*p) - 2.0
                    );
                }
                _ => {}
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
