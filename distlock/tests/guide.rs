//! The guide's configuration reference is checked against the code: every TOML key and every
//! URL option of every backend it lists exists, and none the code takes is missing.

use std::collections::{BTreeMap, BTreeSet};

use distlock::{BackendConfig, Config, LeaseConfig, OptionValue};
use figment::Figment;
use figment::providers::Serialized;
use figment::value::{Dict, Value};

const GUIDE: &str = include_str!("../../docs/guide.md");

/// The backticked first cell of every row of the tables in the guide's section `heading`, table
/// by table.
fn tables(heading: &str) -> Vec<BTreeSet<String>> {
    let section = GUIDE
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("the guide has no {heading:?}"));
    let section = section.split("\n## ").next().unwrap_or_default();
    let section = section.split("\n### ").next().unwrap_or_default();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    let mut in_table = false;
    for line in section.lines() {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table {
            out.push(BTreeSet::new());
            in_table = true;
        }
        if let Some(row) = line.strip_prefix("| `") {
            let cell = row.split('`').next().unwrap_or_default();
            out.last_mut().expect("a table").insert(cell.to_string());
        }
    }
    out
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_url_option_of_every_backend_is_in_the_guide_and_no_other() {
    let documented = tables("### URL options");
    let code = [
        set(distlock::redis::url::REDIS_OPTIONS),
        set(distlock::redis::url::REDLOCK_OPTIONS),
        set(distlock::etcd::url::OPTIONS),
        set(distlock::zk::url::OPTIONS),
        set(distlock::postgres::url::OPTIONS),
    ];
    assert_eq!(
        documented.len(),
        code.len(),
        "one table per backend: {documented:?}"
    );
    for (doc, code) in documented.iter().zip(&code) {
        assert_eq!(doc, code, "the guide's table against the code's list");
    }
}

/// Every key path of `value`, dotted.
fn paths(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
    match value.as_dict() {
        Some(dict) if !dict.is_empty() => {
            for (k, v) in dict {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                paths(&p, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

#[test]
fn every_configuration_key_is_in_the_guide_with_its_variable() {
    // A configuration with every field set, one backend named <name> and one option <option>.
    let full = Config {
        backends: BTreeMap::from([(
            "<name>".to_string(),
            BackendConfig {
                url: "memory://".into(),
                options: BTreeMap::from([("<option>".to_string(), OptionValue::Int(1))]),
            },
        )]),
        efficiency: Some("x".into()),
        correctness: Some("x".into()),
        lease: LeaseConfig {
            ttl: Some(OptionValue::Int(1)),
            renew_every: Some(OptionValue::Int(1)),
        },
    };
    let dict: Dict = Figment::from(Serialized::defaults(full))
        .extract()
        .expect("serializes");
    let mut code = BTreeSet::new();
    paths("", &Value::from(dict), &mut code);
    let documented = tables("### Keys");
    assert_eq!(documented.len(), 1);
    assert_eq!(
        documented[0], code,
        "the guide's keys against the configuration's fields"
    );
    // Each key's variable follows the one rule: DISTLOCK_ + the path upper-cased, `.` as `__`.
    for key in &code {
        let var = format!("DISTLOCK_{}", key.to_uppercase().replace('.', "__"));
        assert!(
            GUIDE.contains(&format!("| `{key}` | `{var}` |")),
            "the guide does not give {key} its variable {var}"
        );
    }
}
