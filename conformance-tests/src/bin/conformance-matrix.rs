//! Runs every scenario against every backend and writes `docs/conformance-matrix.md`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Semaphore;

use distlock_conformance::{SCENARIOS, deployments, matrix, offered};

/// Scenarios run at once, as the test command runs them (`--test-threads=2`).
const AT_ONCE: usize = 2;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let factories = deployments::all();
    let slots = Arc::new(Semaphore::new(AT_ONCE));
    let mut runs = Vec::new();
    for f in &factories {
        for scenario in SCENARIOS {
            if offered(scenario, f).is_err() {
                continue;
            }
            let (f, slots) = (*f, slots.clone());
            runs.push(tokio::spawn(async move {
                let _slot = slots.acquire_owned().await.expect("semaphore");
                // Each scenario in its own task: a failing assertion is a panic we record, not
                // a crash.
                let name = scenario.to_string();
                let ok = tokio::spawn(async move { distlock_conformance::run(&name, &f).await })
                    .await
                    .is_ok();
                eprintln!(
                    "{}::{scenario}: {}",
                    f.label,
                    if ok { "pass" } else { "FAIL" }
                );
                ((f.label.to_string(), scenario.to_string()), ok)
            }));
        }
    }
    let mut results = HashMap::new();
    for run in runs {
        let (key, ok) = run.await.expect("scenario task");
        results.insert(key, ok);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join(matrix::PATH);
    let text = matrix::render(&factories, Some(&results));
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
    let failed = results.values().filter(|ok| !**ok).count();
    println!("wrote {} ({failed} failed)", path.display());
    if failed > 0 {
        std::process::exit(1);
    }
}
