//! The workspace's shape, as `docs/architecture.md` states it: no import circle between the
//! files of any crate (a file's `crate::` paths outside its tests), and the same rooms in every
//! backend.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: [&str; 9] = [
    "lock-api",
    "backend-redis",
    "backend-etcd",
    "backend-zk",
    "distlock",
    "cli",
    "conformance-tests",
    "chaos",
    "benches",
];

/// The rooms every backend has (`docs/architecture.md`).
const ROOMS: [&str; 9] = [
    "lib.rs",
    "backend.rs",
    "client.rs",
    "queue.rs",
    "wait.rs",
    "config.rs",
    "url.rs",
    "election.rs",
    "inspect.rs",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The top-level modules of a crate's `src/` (a file `m.rs` or a folder `m/`) and their text
/// outside `#[cfg(test)]` (which, by this workspace's habit, closes each file).
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("src") {
        let path = entry.expect("entry").path();
        let (name, files) = if path.is_dir() {
            let files: Vec<PathBuf> = std::fs::read_dir(&path)
                .expect("module folder")
                .map(|e| e.expect("entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "rs"))
                .collect();
            (
                path.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned(),
                files,
            )
        } else if path.extension().is_some_and(|x| x == "rs") {
            (
                path.file_stem()
                    .expect("stem")
                    .to_string_lossy()
                    .into_owned(),
                vec![path],
            )
        } else {
            continue;
        };
        let text: String = files
            .iter()
            .map(|f| {
                let t = std::fs::read_to_string(f).expect("source");
                t.split("#[cfg(test)]")
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        out.insert(name, text);
    }
    out
}

/// The modules of the same crate that `text` names through `crate::`.
fn imports(text: &str, known: &BTreeSet<String>, own: &str) -> BTreeSet<String> {
    text.match_indices("crate::")
        .filter_map(|(at, _)| {
            let rest = &text[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            (known.contains(name) && name != own).then(|| name.to_string())
        })
        .collect()
}

/// One circle among `graph`'s modules, if any.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_circle() {
    for krate in CRATES {
        let mods = modules(&workspace().join(krate).join("src"));
        let known: BTreeSet<String> = mods.keys().cloned().collect();
        let graph: BTreeMap<String, BTreeSet<String>> = mods
            .iter()
            .map(|(name, text)| (name.clone(), imports(text, &known, name)))
            .collect();
        assert_eq!(circle(&graph), None, "{krate}: an import circle");
    }
}

#[test]
fn the_checker_finds_a_circle() {
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let known = BTreeSet::from(["lease".to_string(), "owner".to_string()]);
    assert_eq!(
        imports("use crate::lease::X;\nuse crate::owner;", &known, "owner"),
        BTreeSet::from(["lease".to_string()])
    );
}

#[test]
fn every_backend_has_the_same_rooms() {
    for backend in ["backend-redis", "backend-etcd", "backend-zk"] {
        let src = workspace().join(backend).join("src");
        for room in ROOMS {
            assert!(src.join(room).is_file(), "{backend} has no {room}");
        }
    }
}
