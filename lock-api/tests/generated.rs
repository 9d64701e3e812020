//! Generated inputs for every parser of the contract crate: lock names, durations and backend
//! URLs. Properties, not only "no panic": every input is accepted or refused with a typed error
//! that names it; the name encoding is injective and stable.
//!
//! 10 000 cases per target by default; `PROPTEST_CASES=1000000 cargo test -p distlock-api
//! --test generated` soaks.

use std::collections::BTreeMap;
use std::io::Write;

use distlock_api::url::{BackendUrl, parse_duration};
use distlock_api::{HASHED_PREFIX_LEN, LockError, LockName, MAX_ENCODED_LEN, MAX_NAME_BYTES};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig {
        cases,
        // Where proptest would store failures: this crate keeps its regressions as tests.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Says how many cases a target ran, past the test harness's capture.
fn report(target: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "generated: {target}: {} cases",
        config().cases
    );
}

/// Names from every corner: plain, unicode, control characters, the escape characters, path
/// shapes, and lengths around the hashing threshold and the byte limit.
fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z0-9:/._%~ -]{1,40}",
        "[%~]{1,300}",
        prop::collection::vec(any::<char>(), 190..260).prop_map(|c| c.into_iter().collect()),
        prop::collection::vec(
            prop::sample::select(vec!['a', 'Z', '0', '/', '%', '~', 'é', '\u{1F512}']),
            250..1030,
        )
        .prop_map(|c| c.into_iter().collect()),
        "(\\.\\.?/){1,5}[a-z]{0,3}",
        "[\\x00-\\x1f\\x7f]{1,3}[a-z]{0,3}",
    ]
}

fn valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_BYTES && !name.chars().any(char::is_control)
}

/// Only the characters the encoding promises: safe in a Redis key, an etcd key segment and a
/// ZooKeeper node name.
fn safe(encoded: &str) -> bool {
    encoded
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_:@+=,%~".contains(&b))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_name_is_accepted_or_refused_naming_it(name in names()) {
        match LockName::new(name.clone()) {
            Ok(n) => {
                prop_assert!(valid(&name));
                prop_assert_eq!(n.as_str(), name.as_str());
                let e = n.encoded();
                prop_assert!(safe(e), "unsafe encoding {:?}", e);
                prop_assert!(e.len() <= HASHED_PREFIX_LEN + 1 + 64 || e.len() <= MAX_ENCODED_LEN);
                prop_assert!(e != "." && e != ".." && !e.contains('/'));
            }
            Err(LockError::InvalidName { name: quoted, .. }) => {
                prop_assert!(!valid(&name));
                prop_assert_eq!(quoted, name);
            }
            Err(other) => prop_assert!(false, "untyped refusal {:?}", other),
        }
    }

    #[test]
    fn two_different_names_never_share_an_encoding(a in names(), b in names()) {
        if let (Ok(x), Ok(y)) = (LockName::new(a.clone()), LockName::new(b.clone())) {
            prop_assert_eq!(a == b, x.encoded() == y.encoded(), "{:?} / {:?}", a, b);
        }
    }

    #[test]
    fn a_name_and_the_text_of_its_encoding_never_collide(name in names()) {
        if let (Ok(n), Ok(lookalike)) = (LockName::new(name.clone()), LockName::new(LockName::new(name.clone()).map(|n| n.encoded().to_string()).unwrap_or_default())) {
            prop_assert_eq!(n.as_str() == lookalike.as_str(), n.encoded() == lookalike.encoded());
        }
    }

    #[test]
    fn every_duration_is_accepted_above_zero_or_refused_naming_it(text in prop_oneof![
        any::<String>(),
        "-?[0-9]{0,20}(\\.[0-9]{0,5})?(ms|s|m|h|d|us|)",
        "[0-9]{15,40}h",
    ]) {
        match parse_duration("lease.ttl", &text) {
            Ok(d) => prop_assert!(!d.is_zero()),
            Err(LockError::InvalidConfig { key, value, .. }) => {
                prop_assert_eq!(key, "lease.ttl");
                prop_assert_eq!(value, text);
            }
            Err(other) => prop_assert!(false, "untyped refusal {:?}", other),
        }
    }

    #[test]
    fn every_url_is_parsed_or_refused_naming_it_and_hides_its_password(
        scheme in "[a-z+]{0,12}",
        user in "[a-z]{0,6}",
        password in "[A-Za-z0-9]{8,12}",
        hosts in prop::collection::vec(
            prop_oneof![
                "[a-z0-9.-]{0,12}:[0-9]{0,6}",
                "\\[[0-9a-f:]{2,12}\\]:[0-9]{1,5}",
                "[a-z]{1,8}",
            ],
            0..4,
        ),
        path in "(/[a-zA-Z0-9%._-]{0,10}){0,3}",
        query in prop::collection::vec(("[a-z_]{1,12}", "[a-zA-Z0-9%&=.:/ -]{0,12}"), 0..5),
        junk in any::<String>(),
    ) {
        let auth = if user.is_empty() { String::new() } else { format!("{user}:{password}@") };
        let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let url = format!("{scheme}://{auth}{}{path}?{}", hosts.join(","), query.join("&"));
        for candidate in [url.as_str(), junk.as_str()] {
            match BackendUrl::parse("url", candidate, &BTreeMap::new()) {
                Ok(parsed) => {
                    let shown = format!("{parsed:?}");
                    prop_assert!(user.is_empty() || !shown.contains(&password), "{}", shown);
                }
                Err(e @ LockError::InvalidConfig { .. }) => {
                    let shown = format!("{e} {e:?}");
                    prop_assert!(shown.contains("url"), "{}", shown);
                    prop_assert!(user.is_empty() || !shown.contains(&password), "{}", shown);
                }
                Err(other) => prop_assert!(false, "untyped refusal {:?}", other),
            }
        }
    }
}

#[test]
fn targets_report_their_case_counts() {
    for target in [
        "lock names",
        "name pairs (injective encoding)",
        "names against their encodings",
        "durations",
        "backend URLs",
    ] {
        report(target);
    }
}

/// Encodings are stable across versions: a changed encoding would move every lock of a running
/// deployment to a new key, and two versions side by side would not exclude each other.
#[test]
fn the_encoding_of_these_names_never_changes() {
    let long = "x/".repeat(150);
    for (name, encoded) in [
        ("job", "job"),
        ("payment:7", "payment:7"),
        ("a/b", "a%2Fb"),
        ("a%2Fb", "a%252Fb"),
        ("..", "%2E%2E"),
        ("stock sku-42", "stock%20sku-42"),
        ("é", "%C3%A9"),
        ("~", "%7E"),
        ("user@host+x=1,2", "user@host+x=1,2"),
        (
            long.as_str(),
            "x%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2Fx%2F~55c73ddafc52b2d59c692a958dd21014c9f43db7d55248f889b3e43fa8e48d56",
        ),
    ] {
        assert_eq!(
            LockName::new(name).expect("valid").encoded(),
            encoded,
            "{name:?}"
        );
    }
}
