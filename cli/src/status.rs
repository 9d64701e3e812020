//! `distlock status`: each name's holders (token, time to live, what each holds, and who: host,
//! pid, command and since when, as the holder wrote them) and waiters, read without touching
//! anything. A name is shown as a lock, or as each other kind (semaphore,
//! read-write lock, election: see `kind.rs`) in use under it.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use distlock::{Admission, HolderStatus, LockClient, LockStatus, Locks};

use crate::kind::NAMESPACES;
use crate::{StatusArgs, exit, grade};

struct Row<'a> {
    name: &'a str,
    kind: &'static str,
    status: LockStatus,
}

pub async fn status(locks: &Locks, args: StatusArgs) -> ExitCode {
    let client = match locks.client(grade(args.correctness)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("distlock: {e}");
            return ExitCode::from(exit::for_error(&e));
        }
    };
    let mut rows = Vec::new();
    for name in &args.names {
        match rows_of(&client, name).await {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("distlock: {}", exit::said(name, &e));
                return ExitCode::from(exit::for_error(&e));
            }
        }
    }
    let backend = client.backend().kind();
    if args.json {
        let list: Vec<serde_json::Value> = rows.iter().map(|r| json(r, backend)).collect();
        println!("{}", serde_json::Value::Array(list));
    } else {
        println!(
            "name\tkind\tstate\ttoken\texpires in\twaiters\tsince\thost\tpid\tcommand\t({backend})"
        );
        for r in &rows {
            for l in lines(r) {
                println!("{l}");
            }
        }
    }
    ExitCode::SUCCESS
}

/// The name as a lock, then as each other primitive that has holders or waiters.
async fn rows_of<'a>(client: &LockClient, name: &'a str) -> distlock::Result<Vec<Row<'a>>> {
    let mut rows = Vec::new();
    for space in &NAMESPACES {
        let status = client.inspect(&format!("{}{name}", space.prefix)).await?;
        if space.prefix.is_empty() || !status.holders.is_empty() || status.waiters > 0 {
            rows.push(Row {
                name,
                kind: space.label,
                status,
            });
        }
    }
    // Shown as a lock only when nothing else of that name is in use.
    if rows.len() > 1 && rows[0].status == LockStatus::default() {
        rows.remove(0);
    }
    Ok(rows)
}

fn held_as(kind: &str, h: &HolderStatus) -> String {
    match h.admission {
        Admission::Exclusive if kind == "election" => "leader".to_string(),
        Admission::Exclusive => "exclusive".to_string(),
        Admission::Shared => "shared".to_string(),
        Admission::Permit(n) => format!("permit of {n}"),
    }
}

fn json(r: &Row<'_>, backend: &str) -> serde_json::Value {
    let first = r.status.holder();
    let holders: Vec<serde_json::Value> = r
        .status
        .holders
        .iter()
        .map(|h| {
            serde_json::json!({
                "token": h.token.map(|t| t.get()),
                "expires_in_ms": h.expires_in.map(|d| d.as_millis() as u64),
                "holds": held_as(r.kind, h),
                "holder": h.holder.as_ref().map(|w| serde_json::json!({
                    "host": &*w.host,
                    "pid": w.pid,
                    "command": &*w.command,
                    "since": since(w.since),
                    "since_ms": w.since.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
                })),
            })
        })
        .collect();
    serde_json::json!({
        "name": r.name,
        "kind": r.kind,
        "backend": backend,
        "held": first.is_some(),
        "token": first.and_then(|h| h.token).map(|t| t.get()),
        "expires_in_ms": first.and_then(|h| h.expires_in).map(|d| d.as_millis() as u64),
        "holders": holders,
        "waiters": r.status.waiters,
    })
}

/// One line per holder (one "free" line when there is none).
fn lines(r: &Row<'_>) -> Vec<String> {
    let dash = || "-".to_string();
    let waiters = r.status.waiters;
    if r.status.holders.is_empty() {
        return vec![format!(
            "{}\t{}\tfree\t-\t-\t{waiters}\t-\t-\t-\t-",
            r.name, r.kind
        )];
    }
    r.status
        .holders
        .iter()
        .map(|h| {
            // An entry written by another language's recipe names nobody.
            let who = h.holder.as_ref().map_or_else(
                || "-\t-\t-\t-".to_string(),
                |w| {
                    format!(
                        "{}\t{}\t{}\t{}",
                        since(w.since),
                        w.host,
                        w.pid,
                        w.command.replace(['\t', '\n'], " ")
                    )
                },
            );
            format!(
                "{}\t{}\theld ({})\t{}\t{}\t{waiters}\t{who}",
                r.name,
                r.kind,
                held_as(r.kind, h),
                h.token.map_or_else(dash, |t| t.to_string()),
                h.expires_in.map_or_else(dash, |d| format!("{d:.1?}")),
            )
        })
        .collect()
}

/// When a holder took its entry, by its own clock: RFC 3339 in UTC, to the second.
fn since(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
