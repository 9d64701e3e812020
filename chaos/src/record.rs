//! What a campaign keeps of each run: its label, length, the commit it ran at and its findings
//! (not its history), one JSON line per run next to the report. A full campaign outlasts a
//! working session: `--resume` runs only what the file lacks, and the report covers every run
//! in it.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::campaign::{Run, RunResult};
use crate::check::Findings;

/// One run, as kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// `workload/deployment/nemesis`.
    pub run: String,
    /// How long the clients ran, in seconds.
    pub seconds: u64,
    /// The commit the campaign was built from (`git rev-parse --short HEAD`, or "unknown").
    pub commit: String,
    /// What the checker and the leftover count found.
    pub findings: Findings,
}

impl Record {
    /// This record as the result of `r` (its run): its findings, no history.
    pub fn result(&self, r: Run) -> RunResult {
        RunResult {
            workload: r.workload,
            deployment: r.deployment,
            nemesis: r.nemesis,
            findings: self.findings.clone(),
            history: Vec::new(),
            span: (0, 0),
        }
    }
}

/// The records file of the report at `out`: `faults.md` keeps `faults-runs.jsonl`.
pub fn path_for(out: &Path) -> PathBuf {
    let stem = out.file_stem().map_or_else(
        || "faults".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    out.with_file_name(format!("{stem}-runs.jsonl"))
}

/// Every record in `path` (none when it does not exist).
///
/// # Errors
/// A line that does not parse, with its number.
pub fn load(path: &Path) -> Result<Vec<Record>, String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Appends `record` to `path` at once: a campaign stopped later keeps every run it finished.
///
/// # Errors
/// The file cannot be written.
pub fn append(path: &Path, record: &Record) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let line = serde_json::to_string(record).map_err(std::io::Error::other)?;
    writeln!(f, "{line}")
}

/// The commit this binary's source is at, as git says in the working directory.
pub fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_kept_beside_the_report_and_read_back_in_order() {
        assert_eq!(
            path_for(Path::new("docs/faults.md")),
            PathBuf::from("docs/faults-runs.jsonl")
        );
        let dir = distlock_conformance::harness::TempDir::new("records").expect("dir");
        let file = dir.path().join("faults-runs.jsonl");
        assert!(load(&file).expect("no file yet").is_empty());
        for (i, run) in ["lock/redis/kill-client", "election/zk3/partition-member"]
            .iter()
            .enumerate()
        {
            let findings = Findings {
                operations: 10 + i,
                lost_latencies: vec![5, 7],
                ..Findings::default()
            };
            let r = Record {
                run: (*run).to_string(),
                seconds: 30,
                commit: "abc1234".into(),
                findings,
            };
            append(&file, &r).expect("append");
        }
        let kept = load(&file).expect("load");
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1].run, "election/zk3/partition-member");
        assert_eq!(kept[1].findings.operations, 11);
        assert_eq!(kept[0].findings.lost_latencies, vec![5, 7]);
        std::fs::write(&file, "{\"run\": 1}\n").expect("write");
        let e = load(&file).expect_err("a bad line");
        assert!(e.contains("faults-runs.jsonl:1:"), "the line is named: {e}");
    }
}
