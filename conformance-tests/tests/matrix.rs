//! The checked-in matrix matches what the backends declare, and every backend has its tests.

use distlock_conformance::{deployments, interop, matrix};

#[test]
fn checked_in_matrix_is_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let on_disk = std::fs::read_to_string(root.join(matrix::PATH)).unwrap_or_default();
    let expected = matrix::render(&deployments::all(), None);
    assert!(
        on_disk == expected,
        "{} is out of date: run `cargo build -p distlock-conformance --bins && cargo run -p distlock-conformance --bin conformance-matrix`",
        matrix::PATH
    );
}

#[test]
fn every_backend_has_its_test_module() {
    let source = include_str!("conformance.rs");
    for f in deployments::all() {
        let call = format!("conformance_tests!({}, deployments::", f.label);
        assert!(
            source.contains(&call),
            "tests/conformance.rs lacks `{call}...`"
        );
    }
}

#[test]
fn checked_in_interop_matrix_is_current_and_names_real_tests() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let on_disk = std::fs::read_to_string(root.join(interop::PATH)).unwrap_or_default();
    assert!(
        on_disk == interop::render(None),
        "{} is out of date: run `cargo run -p distlock-conformance --bin interop-matrix`",
        interop::PATH
    );
    for (file, test) in interop::tests() {
        let path = root.join(format!("conformance-tests/tests/{file}.rs"));
        let source = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            source.contains(&format!("async fn {test}()")),
            "{} has no test `{test}`",
            path.display()
        );
    }
}
