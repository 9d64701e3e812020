//! `distlock-chaos`: the fault campaign.
//!
//! ```sh
//! cargo run --release -p distlock-chaos -- campaign --minutes 30   # the full one: docs/faults.md
//! cargo run -p distlock-chaos -- campaign --short --out target/faults-short.md
//! ```
//!
//! `campaign` starts real servers, a resource process and client processes (this same binary,
//! as `resource` and `client`), injects faults, checks the merged history and writes the report;
//! it exits 1 when a run shows a violation that is not the known hazard of its fault.

mod campaign;
mod check;
mod client;
mod history;
mod report;
mod resource;

use std::path::PathBuf;
use std::time::Duration;

use campaign::{Deployment, Nemesis};

fn usage(problem: &str) -> ! {
    eprintln!(
        "{problem}\nusage:\n  distlock-chaos campaign [--short | --minutes N] [--out FILE]\n  \
         distlock-chaos client --url U --name N --resource ADDR --history FILE --id N --ttl-ms MS [--hold-ms MS]\n  \
         distlock-chaos resource --history FILE"
    );
    std::process::exit(2);
}

/// `--flag value` pairs after the subcommand.
fn flags(args: &[String]) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(name) = flag.strip_prefix("--") else {
            usage(&format!("unexpected argument {flag:?}"));
        };
        let value = match name {
            "short" => String::new(),
            _ => it
                .next()
                .cloned()
                .unwrap_or_else(|| usage(&format!("--{name} needs a value"))),
        };
        out.insert(name.to_string(), value);
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        usage("no command");
    };
    let f = flags(rest);
    let need = |k: &str| {
        f.get(k)
            .cloned()
            .unwrap_or_else(|| usage(&format!("--{k} is needed")))
    };
    match command.as_str() {
        "resource" => {
            let history = PathBuf::from(need("history"));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .unwrap_or_else(|e| usage(&format!("bind: {e}")));
                let addr = listener.local_addr().expect("address");
                println!("{addr}");
                let rec = history::Recorder::open(&history, history::RESOURCE)
                    .unwrap_or_else(|e| usage(&format!("history: {e}")));
                resource::serve(listener, rec).await;
            });
        }
        "client" => {
            let parse = |k: &str| -> u64 {
                need(k)
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("--{k} takes a number")))
            };
            let args = client::ClientArgs {
                url: need("url"),
                name: need("name"),
                resource: need("resource"),
                history: PathBuf::from(need("history")),
                id: parse("id") as u32,
                ttl: Duration::from_millis(parse("ttl-ms")),
                max_sleep: Duration::from_millis(20),
                hold: Duration::from_millis(f.get("hold-ms").map_or(0, |_| parse("hold-ms"))),
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(client::run(args));
        }
        "campaign" => campaign(&f),
        other => usage(&format!("unknown command {other:?}")),
    }
}

fn campaign(f: &std::collections::BTreeMap<String, String>) {
    let short = f.contains_key("short");
    let out = PathBuf::from(
        f.get("out")
            .cloned()
            .unwrap_or_else(|| "docs/faults.md".into()),
    );
    // The short campaign: every deployment under the fault whose hazard it must show or
    // survive, the consensus clusters under a server kill, a few seconds each.
    let plan: Vec<(Deployment, Nemesis)> = if short {
        vec![
            (Deployment::Redis, Nemesis::CutClient),
            (Deployment::Redis, Nemesis::ClockJump),
            (Deployment::RedisSentinel, Nemesis::Failover),
            (Deployment::Redlock, Nemesis::PauseClient),
            (Deployment::Etcd, Nemesis::PauseClient),
            (Deployment::Etcd3, Nemesis::KillServer),
            (Deployment::Zk, Nemesis::DelayClient),
            (Deployment::Zk3, Nemesis::KillServer),
        ]
    } else {
        campaign::plan()
    };
    // `--only redis/pause-client,etcd3/kill-server`: those runs of the plan alone.
    let plan: Vec<(Deployment, Nemesis)> = match f.get("only") {
        Some(only) => {
            let wanted: Vec<&str> = only.split(',').collect();
            let picked: Vec<_> = campaign::plan()
                .into_iter()
                .filter(|(d, n)| wanted.contains(&format!("{}/{}", d.label(), n.label()).as_str()))
                .collect();
            if picked.len() != wanted.len() {
                usage(&format!(
                    "--only {only}: use <deployment>/<nemesis> pairs of the plan"
                ));
            }
            picked
        }
        None => plan,
    };
    // Each deployment gets the same share of the campaign, split equally among its runs: a
    // deployment with one fault (the Sentinel failover) gets as many acquisitions as the others.
    let (length_of, schedule): (Box<dyn Fn(Deployment) -> Duration>, String) = if short {
        let each = Duration::from_secs(14);
        (Box::new(move |_| each), format!("each run {each:?}"))
    } else {
        let minutes: f64 = f
            .get("minutes")
            .map(|m| {
                m.parse()
                    .unwrap_or_else(|_| usage("--minutes takes a number"))
            })
            .unwrap_or(30.0);
        let mut deployments: Vec<Deployment> = Vec::new();
        for (d, _) in &plan {
            if !deployments.contains(d) {
                deployments.push(*d);
            }
        }
        let share = minutes * 60.0 / deployments.len().max(1) as f64;
        let runs = plan.clone();
        let length = move |d: Deployment| {
            let n = runs.iter().filter(|(r, _)| *r == d).count().max(1);
            // Whole seconds keep the report readable.
            Duration::from_secs((share / n as f64).round().max(1.0) as u64)
        };
        let text = format!(
            "each deployment {:?} in all, shared equally among its runs",
            Duration::from_secs(share.round() as u64)
        );
        (Box::new(length), text)
    };
    let command = if short {
        format!(
            "cargo run -p distlock-chaos -- campaign --short --out {}",
            out.display()
        )
    } else {
        format!(
            "cargo run --release -p distlock-chaos -- campaign --minutes {}",
            f.get("minutes").map_or("30", String::as_str)
        )
    };
    let mut runs = Vec::new();
    for (d, n) in plan {
        let length = length_of(d);
        eprintln!("== {} under {} for {length:?}", d.label(), n.label());
        let r = campaign::run(d, n, length);
        let fi = &r.findings;
        eprintln!(
            "   {} acquisitions, {} overlaps, {} fenced violations, {} lost elements, {} token-order violations: {} unexpected",
            fi.acquisitions,
            fi.overlaps,
            fi.fenced_violations,
            fi.lost_elements,
            fi.token_order_violations,
            r.unexpected()
        );
        runs.push(r);
    }
    let text = report::markdown(&runs, &command, &schedule);
    let dir = out.parent().map(PathBuf::from).unwrap_or_default();
    let _ = std::fs::create_dir_all(&dir);
    if let Err(e) = std::fs::write(&out, text) {
        usage(&format!("cannot write {}: {e}", out.display()));
    }
    for r in runs.iter().filter(|r| r.nemesis == Nemesis::PauseClient) {
        let svg = report::svg(r, Duration::from_secs(20));
        let _ = std::fs::write(
            dir.join(format!("faults-{}.svg", r.deployment.label())),
            svg,
        );
    }
    let unexpected: usize = runs.iter().map(campaign::RunResult::unexpected).sum();
    println!(
        "wrote {} ({unexpected} unexpected violations)",
        out.display()
    );
    if unexpected > 0 {
        std::process::exit(1);
    }
}
