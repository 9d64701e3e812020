//! Runs every interop test the matrix names (one at a time: each starts its own servers and
//! peers) and writes `docs/interop-matrix.md` with their outcomes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use distlock_conformance::interop;

fn main() {
    // The workspace root: this crate's parent directory.
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    let mut results = HashMap::new();
    for (file, test) in interop::tests() {
        let ok = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&root)
            .args(["test", "-q", "-p", "distlock-conformance", "--test", file])
            .args(["--", "--exact", test, "--test-threads=1"])
            .status()
            .is_ok_and(|s| s.success());
        eprintln!("{file}::{test}: {}", if ok { "pass" } else { "FAIL" });
        results.insert((file.to_string(), test.to_string()), ok);
    }
    let path = root.join(interop::PATH);
    if let Err(e) = std::fs::write(&path, interop::render(Some(&results))) {
        eprintln!("cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
    let failed = results.values().filter(|ok| !**ok).count();
    println!("wrote {} ({failed} failed)", path.display());
    if failed > 0 {
        std::process::exit(1);
    }
}
