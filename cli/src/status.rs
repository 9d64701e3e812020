//! `distlock status`: each name's holders (token, time to live, what each holds) and waiters,
//! read without touching anything. A name is shown as a lock, and also as a semaphore or a
//! read-write lock when those of that name have holders or waiters (`run --limit N` takes a
//! semaphore's permits).

use std::process::ExitCode;

use distlock::{
    Admission, HolderStatus, LockClient, LockStatus, Locks, RWLOCK_LOCK_PREFIX,
    SEMAPHORE_LOCK_PREFIX,
};

use crate::{StatusArgs, exit, grade};

/// The kinds of primitive a name may be used as, and the queue each keeps it in.
const KINDS: [(&str, &str); 3] = [
    ("lock", ""),
    ("semaphore", SEMAPHORE_LOCK_PREFIX),
    ("rwlock", RWLOCK_LOCK_PREFIX),
];

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
        println!("name\tkind\tstate\ttoken\texpires in\twaiters\t({backend})");
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
    for (kind, prefix) in KINDS {
        let status = client.inspect(&format!("{prefix}{name}")).await?;
        if kind == "lock" || !status.holders.is_empty() || status.waiters > 0 {
            rows.push(Row { name, kind, status });
        }
    }
    // Shown as a lock only when nothing else of that name is in use.
    if rows.len() > 1 && rows[0].status == LockStatus::default() {
        rows.remove(0);
    }
    Ok(rows)
}

fn held_as(h: &HolderStatus) -> String {
    match h.admission {
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
                "holds": held_as(h),
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
        return vec![format!("{}\t{}\tfree\t-\t-\t{waiters}", r.name, r.kind)];
    }
    r.status
        .holders
        .iter()
        .map(|h| {
            format!(
                "{}\t{}\theld ({})\t{}\t{}\t{waiters}",
                r.name,
                r.kind,
                held_as(h),
                h.token.map_or_else(dash, |t| t.to_string()),
                h.expires_in.map_or_else(dash, |d| format!("{d:.1?}")),
            )
        })
        .collect()
}
