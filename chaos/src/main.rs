//! `distlock-chaos`: the fault campaign.
//!
//! ```sh
//! cargo run --release -p distlock-chaos -- campaign --minutes 150  # the full one: docs/faults.md
//! cargo run --release -p distlock-chaos -- campaign --minutes 150 --stop-after 60  # a part
//! cargo run --release -p distlock-chaos -- campaign --minutes 150 --resume  # go on after a stop
//! cargo run -p distlock-chaos -- campaign --short --jobs 2 --out target/faults-short.md  # runs two at once
//! cargo run -p distlock-chaos -- campaign --workloads rwlock --minutes 5 --out target/rw.md
//! cargo run -p distlock-chaos -- campaign --only election/etcd3/kill-server --minutes 1
//! ```
//!
//! `campaign` starts real servers, a resource process and client processes (this same binary,
//! as `resource` and `client`), injects faults, checks the merged history and writes the report;
//! it exits 1 when a run shows a violation that is not the known hazard of its fault. Each run's
//! findings are kept as it ends (`faults-runs.jsonl` beside `faults.md`, see `record.rs`).

mod campaign;
mod check;
mod client;
mod deployment;
mod history;
mod nemesis;
mod observer;
mod record;
mod report;
mod resource;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use campaign::Run;
use deployment::Deployment;
use nemesis::Nemesis;
use workload::{CROWD, Workload};

fn usage(problem: &str) -> ! {
    eprintln!(
        "{problem}\nusage:\n  distlock-chaos campaign [--short | --minutes N] [--out FILE] [--resume] [--stop-after M] [--jobs N]\n  \
         distlock-chaos campaign [--workloads W,..] [--only W/D/N,..] ...\n  \
         distlock-chaos client --url U --workload W --resource ADDR --history FILE --id N --ttl-ms MS [--hold-ms MS]\n  \
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
            "short" | "resume" => String::new(),
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
            let workload = Workload::parse(&need("workload")).unwrap_or_else(|| {
                usage("--workload: lock, crowd-N, semaphore-N, rwlock or election")
            });
            let args = client::ClientArgs {
                url: need("url"),
                workload,
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

/// The short campaign: every deployment under the fault whose hazard the lock must show or
/// survive, the consensus clusters under a server kill (etcd) and a member cut from its peers
/// (ZooKeeper, the classic follower split), PostgreSQL under a server kill and a failover to its
/// synchronous standby; then each primitive
/// on each backend family (Redis, etcd, ZooKeeper; PostgreSQL's read-write lock, whose queue
/// admits readers in batches) under a fault that reaches its holders or its waiters, and a
/// crowd on etcd with clients killed (dead keys in a queue whose waiters follow keys of their
/// own, and give up waits from any place in it).
fn short_plan() -> Vec<Run> {
    use Deployment::*;
    use Nemesis::*;
    let lock = [
        (Redis, CutClient),
        (Redis, ClockJump),
        (RedisSentinel, Failover),
        (RedisCluster, CutClient),
        (Redlock, PauseClient),
        (Etcd, PauseClient),
        (Etcd3, KillServer),
        (Zk, DelayClient),
        (Zk3, PartitionMember),
        (Postgres, KillServer),
        (PostgresSync, Failover),
    ]
    .map(|(d, n)| (Workload::Lock, d, n));
    let primitives = [
        (Workload::Crowd(CROWD), Etcd, KillClient),
        (Workload::Semaphore(2), Redis, KillClient),
        (Workload::Semaphore(2), Etcd, CutClient),
        (Workload::Semaphore(2), Zk, KillClient),
        (Workload::RwLock, Redis, DelayClient),
        (Workload::RwLock, Etcd, KillClient),
        (Workload::RwLock, Zk, CutClient),
        (Workload::Election, Redis, CutClient),
        (Workload::Election, Etcd, KillClient),
        (Workload::Election, Zk, ResetClient),
        (Workload::RwLock, Postgres, CutClient),
    ];
    lock.into_iter()
        .chain(primitives)
        .map(|(workload, deployment, nemesis)| Run {
            workload,
            deployment,
            nemesis,
        })
        .collect()
}

fn campaign(f: &std::collections::BTreeMap<String, String>) {
    let short = f.contains_key("short");
    let out = PathBuf::from(
        f.get("out")
            .cloned()
            .unwrap_or_else(|| "docs/faults.md".into()),
    );
    let mut plan: Vec<Run> = if short {
        short_plan()
    } else {
        campaign::plan()
    };
    // `--workloads lock,rwlock`: those workloads of the plan alone.
    if let Some(list) = f.get("workloads") {
        let wanted: Vec<Workload> = list
            .split(',')
            .map(|w| {
                Workload::parse(w).unwrap_or_else(|| {
                    usage(&format!(
                        "--workloads {list}: {w:?} is not lock, crowd-N, semaphore-N, rwlock or election"
                    ))
                })
            })
            .collect();
        plan.retain(|r| wanted.contains(&r.workload));
    }
    // `--only lock/redis/pause-client,rwlock/etcd3/kill-server`: those runs of the full plan.
    if let Some(only) = f.get("only") {
        let wanted: Vec<&str> = only.split(',').collect();
        plan = campaign::plan()
            .into_iter()
            .filter(|r| wanted.contains(&r.label().as_str()))
            .collect();
        if plan.len() != wanted.len() {
            usage(&format!(
                "--only {only}: use <workload>/<deployment>/<nemesis> triples of the plan"
            ));
        }
    }
    // Each (workload, deployment) gets its workload's share of the campaign (by what 10 000
    // operations take), split equally among its runs: a deployment with one fault (the Sentinel
    // failover) gets as many operations as the others. A short run lasts long enough for one
    // fault after the clients settle.
    let (length_of, schedule): (Box<dyn Fn(Run) -> Duration + Sync>, String) = if short {
        // One fault each (they come 2 TTLs apart after a TTL's settling); the lock's runs a
        // little longer, as they were.
        (
            Box::new(|r: Run| {
                let extra = if r.workload.is_lock() { 6 } else { 4 };
                r.deployment.ttl() * 2 + Duration::from_secs(extra)
            }),
            "each lock run 2 TTLs + 6 s, each other run 2 TTLs + 4 s".to_string(),
        )
    } else {
        let minutes: f64 = f
            .get("minutes")
            .map(|m| {
                m.parse()
                    .unwrap_or_else(|_| usage("--minutes takes a number"))
            })
            .unwrap_or(30.0);
        let mut groups: Vec<(Workload, Deployment)> = Vec::new();
        for r in &plan {
            if !groups.contains(&(r.workload, r.deployment)) {
                groups.push((r.workload, r.deployment));
            }
        }
        let weights: f64 = groups.iter().map(|(w, _)| w.weight()).sum();
        let share = move |w: Workload| minutes * 60.0 * w.weight() / weights.max(1.0);
        let runs = plan.clone();
        let length = move |r: Run| {
            let n = runs
                .iter()
                .filter(|x| (x.workload, x.deployment) == (r.workload, r.deployment))
                .count()
                .max(1);
            // Whole seconds keep the report readable.
            Duration::from_secs((share(r.workload) / n as f64).round().max(1.0) as u64)
        };
        let mut shares: Vec<String> = Vec::new();
        for (w, _) in &groups {
            let text = format!("{} {}s", w.label(), share(*w).round());
            if !shares.contains(&text) {
                shares.push(text);
            }
        }
        let text = format!(
            "each workload on each deployment, in all: {}, shared equally among its runs",
            shares.join(", ")
        );
        (Box::new(length), text)
    };
    let command = std::iter::once("cargo run".to_string())
        .chain((!short).then(|| "--release".to_string()))
        .chain(["-p distlock-chaos -- campaign".to_string()])
        .chain(
            std::env::args()
                .skip(2)
                .map(|a| if a.contains(',') { format!("'{a}'") } else { a }),
        )
        .collect::<Vec<_>>()
        .join(" ");
    // Every run is kept as it ends; `--resume` goes on where a stopped campaign left off.
    let records_path = record::path_for(&out);
    let dir = out.parent().map(PathBuf::from).unwrap_or_default();
    let _ = std::fs::create_dir_all(&dir);
    let mut kept = if f.contains_key("resume") {
        record::load(&records_path).unwrap_or_else(|e| usage(&e))
    } else {
        let _ = std::fs::remove_file(&records_path);
        Vec::new()
    };
    let commit = record::commit();
    // `--stop-after M`: no run starts that would end more than M minutes from now (a run's
    // servers, settling and clean-up count as a minute); `--resume` runs the rest.
    let stop_at = f.get("stop-after").map(|m| {
        let m: f64 = m
            .parse()
            .ok()
            .filter(|m: &f64| m.is_finite() && *m >= 0.0)
            .unwrap_or_else(|| usage("--stop-after takes a number of minutes"));
        std::time::Instant::now() + Duration::from_secs_f64(m * 60.0)
    });
    // `--jobs N`: N runs at once (each on servers, proxies and processes of its own), taken in
    // the plan's order; each run's lines are printed as it ends.
    let jobs: usize = f.get("jobs").map_or(1, |n| {
        n.parse()
            .ok()
            .filter(|n| *n >= 1)
            .unwrap_or_else(|| usage("--jobs takes a whole number, at least 1"))
    });
    let todo: Vec<Run> = plan
        .iter()
        .copied()
        .filter(|r| !kept.iter().any(|k| k.run == r.label()))
        .collect();
    let next = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let kept_now = Mutex::new(&mut kept);
    let one = |r: Run| {
        let length = length_of(r);
        if stop_at
            .is_some_and(|at| std::time::Instant::now() + length + Duration::from_secs(60) > at)
        {
            eprintln!("== stopping before {}: --resume runs the rest", r.label());
            stopped.store(true, Ordering::SeqCst);
            return;
        }
        if jobs == 1 {
            eprintln!("== {} for {length:?}", r.label());
        }
        let result = campaign::run(r, length);
        let fi = &result.findings;
        // One run's lines together, whatever else ends meanwhile.
        let mut kept = kept_now.lock().unwrap_or_else(PoisonError::into_inner);
        if jobs > 1 {
            eprintln!("== {} for {length:?}", r.label());
        }
        eprintln!(
            "   {} acquisitions, {} lease violations, {} token violations, {} left on the servers: {} unexpected",
            fi.acquisitions,
            fi.lease_violations(),
            fi.token_violations(),
            fi.leftovers,
            result.unexpected()
        );
        if report::has_timeline(&result) {
            let svg = report::svg(&result, Duration::from_secs(20));
            let _ = std::fs::write(dir.join(report::timeline_file(&result)), svg);
        }
        let kept_run = record::Record {
            run: r.label(),
            seconds: length.as_secs(),
            commit: commit.clone(),
            findings: result.findings,
        };
        if let Err(e) = record::append(&records_path, &kept_run) {
            usage(&format!("cannot write {}: {e}", records_path.display()));
        }
        kept.push(kept_run);
    };
    std::thread::scope(|s| {
        for _ in 0..jobs.min(todo.len()) {
            s.spawn(|| {
                while !stopped.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(r) = todo.get(i) else { break };
                    one(*r);
                }
            });
        }
    });
    // The report covers the plan's runs, in its order, whichever session ran them.
    let runs: Vec<campaign::RunResult> = plan
        .iter()
        .filter_map(|r| {
            let k = kept.iter().find(|k| k.run == r.label())?;
            Some(k.result(*r))
        })
        .collect();
    let mut commits: Vec<&str> = Vec::new();
    for k in &kept {
        if !commits.contains(&k.commit.as_str()) {
            commits.push(&k.commit);
        }
    }
    let mut schedule = if commits.is_empty() {
        schedule
    } else {
        format!("{schedule}; run at commit {}", commits.join(", "))
    };
    if runs.len() < plan.len() {
        // A campaign stopped early says so in its report.
        schedule = format!(
            "{schedule}; {} of the plan's {} runs so far, `--resume` runs the rest",
            runs.len(),
            plan.len()
        );
    }
    let text = report::markdown(&runs, &command, &schedule);
    if let Err(e) = std::fs::write(&out, text) {
        usage(&format!("cannot write {}: {e}", out.display()));
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
