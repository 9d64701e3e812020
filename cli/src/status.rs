//! `distlock status`: each lock's holder, token, time to live and waiters, read without touching
//! the lock.

use std::process::ExitCode;

use distlock::{LockStatus, Locks};

use crate::{StatusArgs, exit, grade};

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
        match client.inspect(name).await {
            Ok(s) => rows.push((name.as_str(), s)),
            Err(e) => {
                eprintln!("distlock: {name}: {e}");
                return ExitCode::from(exit::for_error(&e));
            }
        }
    }
    let backend = client.backend().kind();
    if args.json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, s)| {
                let holder = s.holder.as_ref();
                serde_json::json!({
                    "name": name,
                    "backend": backend,
                    "held": holder.is_some(),
                    "token": holder.and_then(|h| h.token).map(|t| t.get()),
                    "expires_in_ms": holder.and_then(|h| h.expires_in).map(|d| d.as_millis() as u64),
                    "waiters": s.waiters,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(list));
    } else {
        println!("name\tstate\ttoken\texpires in\twaiters\t({backend})");
        for (name, s) in &rows {
            println!("{}", line(name, s));
        }
    }
    ExitCode::SUCCESS
}

fn line(name: &str, s: &LockStatus) -> String {
    let dash = || "-".to_string();
    match &s.holder {
        None => format!("{name}\tfree\t-\t-\t{}", s.waiters),
        Some(h) => format!(
            "{name}\theld\t{}\t{}\t{}",
            h.token.map_or_else(dash, |t| t.to_string()),
            h.expires_in.map_or_else(dash, |d| format!("{d:.1?}")),
            s.waiters
        ),
    }
}
