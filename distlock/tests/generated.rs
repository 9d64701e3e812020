//! Generated inputs for every place a user's text enters the facade: backend URLs of every
//! scheme, TOML configurations and `DISTLOCK_*` variables. Every input is accepted or refused
//! with a typed error naming it, never a panic; no password from a URL or a configuration shows
//! in a `Display` or `Debug` output or a log line.
//!
//! 10 000 cases per target by default; `PROPTEST_CASES=1000000` soaks.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use distlock::{BackendSpec, Config, ConfigError, Locks, SCHEMES};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A password no generated part can contain by chance.
const SECRET: &str = "Pz7qXk9wVt";

fn schemes() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(SCHEMES.iter().map(|s| s.name).collect::<Vec<_>>())
            .prop_map(str::to_string),
        "[a-z+]{0,10}",
    ]
}

/// Option names of every backend (and some nobody takes), with values of every shape.
/// Option names of every backend (and some nobody takes), with values of every shape; the
/// `password` option, when drawn, carries the secret.
fn options() -> impl Strategy<Value = Vec<(String, String)>> {
    let names: Vec<&str> = distlock::redis::url::REDIS_OPTIONS
        .iter()
        .chain(distlock::redis::url::REDLOCK_OPTIONS)
        .chain(distlock::etcd::url::OPTIONS)
        .chain(distlock::zk::url::OPTIONS)
        .copied()
        .chain(["colour", "password", "user"])
        .collect();
    prop::collection::vec(
        (
            proptest::sample::select(names).prop_map(str::to_string),
            prop_oneof![
                "[0-9]{1,4}(ms|s|m|h)?",
                "-?[0-9.]{1,6}",
                "(lose|wait:[0-9]{1,2}s|open|creator|[0-9]{2}ms\\.\\.[0-9]{3}ms)",
                "[a-zA-Z0-9%/._~-]{0,16}",
            ],
        )
            .prop_map(|(k, v)| {
                let v = if k == "password" {
                    SECRET.to_string()
                } else {
                    v
                };
                (k, v)
            }),
        0..6,
    )
}

fn urls() -> impl Strategy<Value = String> {
    (
        schemes(),
        prop::option::of("[a-z]{1,6}"),
        prop::collection::vec(
            prop_oneof![
                "127\\.0\\.0\\.1:[0-9]{1,5}",
                "\\[::1\\]:[0-9]{1,5}",
                "[a-z][a-z0-9.-]{0,10}(:[0-9]{0,6})?",
                "",
            ],
            0..4,
        ),
        "(/[a-zA-Z0-9%._-]{0,10}){0,2}",
        options(),
    )
        .prop_map(|(scheme, user, hosts, path, options)| {
            let auth = user.map(|u| format!("{u}:{SECRET}@")).unwrap_or_default();
            let query: Vec<String> = options.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(
                "{scheme}://{auth}{}{path}?{}",
                hosts.join(","),
                query.join("&")
            )
        })
}

/// The refusal is typed and says where: a key, a scheme or a profile.
fn named(e: &ConfigError) -> bool {
    match e {
        ConfigError::UnknownScheme { key, .. }
        | ConfigError::FeatureOff { key, .. }
        | ConfigError::InvalidValue { key, .. } => !key.is_empty(),
        ConfigError::UnknownBackend { profile, .. }
        | ConfigError::GradeMismatch { profile, .. } => !profile.is_empty(),
        ConfigError::Parse(_) | ConfigError::Backend { .. } => true,
        _ => false,
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_backend_url_is_parsed_or_refused_naming_it_and_hides_secrets(url in urls()) {
        match BackendSpec::parse("backends.x.url", &url, &BTreeMap::new()) {
            Ok(spec) => {
                let shown = format!("{spec:?}");
                prop_assert!(!shown.contains(SECRET), "{}", shown);
                // Parsing the same text twice gives the same spec.
                let again = BackendSpec::parse("backends.x.url", &url, &BTreeMap::new());
                prop_assert_eq!(format!("{:?}", again.map_err(|e| e.to_string())), format!("Ok({})", shown));
            }
            Err(e) => {
                prop_assert!(named(&e), "{:?}", e);
                let shown = format!("{e} {e:?}");
                prop_assert!(!shown.contains(SECRET), "{}", shown);
            }
        }
    }

    #[test]
    fn every_toml_configuration_is_loaded_or_refused_naming_it(
        keys in prop::collection::vec(
            prop_oneof![
                Just("efficiency".to_string()),
                Just("correctness".to_string()),
                Just("lease.ttl".to_string()),
                Just("lease.renew_every".to_string()),
                Just("lease.lead".to_string()),
                "backends\\.[a-z]{1,4}\\.(url|options\\.[a-z_]{1,12}|colour)",
                "[a-z_.]{1,16}",
            ],
            0..6,
        ),
        urls in prop::collection::vec(urls().prop_map(|u| format!("{u:?}")), 6),
        values in prop::collection::vec(
            prop_oneof![
                "\"[a-z0-9 ]{0,8}\"",
                "-?[0-9]{1,5}",
                Just("true".to_string()),
                Just("[1, 2]".to_string()),
                Just("{ a = 1 }".to_string()),
            ],
            6,
        ),
    ) {
        // URLs (and so passwords) where URLs go; anything elsewhere.
        let toml: String = keys
            .iter()
            .zip(urls.iter().zip(&values))
            .map(|(k, (u, v))| format!("{k} = {}\n", if k.ends_with(".url") { u } else { v }))
            .collect();
        match Config::from_toml(&toml) {
            Ok(c) => {
                let shown = format!("{c:?}");
                prop_assert!(!shown.contains(SECRET), "{}", shown);
            }
            Err(e) => prop_assert!(named(&e), "{:?}", e),
        }
    }

    #[test]
    fn every_set_of_distlock_variables_is_loaded_or_refused_naming_it(
        vars in prop::collection::vec(
            (
                prop_oneof![
                    Just("DISTLOCK_EFFICIENCY".to_string()),
                    Just("DISTLOCK_LEASE__TTL".to_string()),
                    "DISTLOCK_BACKENDS__[A-Z]{1,3}__(URL|OPTIONS__[A-Z_]{1,10})",
                    "DISTLOCK_[A-Z_]{1,12}",
                ],
                (urls(), prop_oneof!["[a-z0-9 ]{0,8}", "[0-9]{1,3}s"]),
            ),
            0..4,
        ),
    ) {
        let mut outcome = Ok(());
        // figment's own closure type: its error is figment's.
        #[allow(clippy::result_large_err)]
        figment::Jail::expect_with(|jail| {
            // URLs (and so passwords) where URLs go; anything elsewhere.
            for (k, (url, other)) in &vars {
                jail.set_env(k, if k.ends_with("__URL") { url } else { other });
            }
            outcome = match Config::load(None) {
                Ok(c) if format!("{c:?}").contains(SECRET) => Err(format!("{c:?}")),
                Ok(_) => Ok(()),
                Err(e) if !named(&e) => Err(format!("{e:?}")),
                Err(e) if format!("{e}").contains(SECRET) => Err(format!("{e}")),
                Err(_) => Ok(()),
            };
            Ok(())
        });
        prop_assert!(outcome.is_ok(), "{:?}", outcome);
    }
}

/// A `tracing` writer that keeps everything written, to search log lines for secrets.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// No password reaches a log line, an error or a `Debug` output on the paths a secret takes:
/// loading a configuration with passwords in URLs and options, and connecting to servers that
/// cannot be reached (each backend logs and fails).
#[tokio::test(flavor = "current_thread")]
async fn no_secret_reaches_a_log_line() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let toml = format!(
        "efficiency = \"r\"\ncorrectness = \"e\"\n\
         [backends.r]\nurl = \"redis://u:{SECRET}@127.0.0.1:1?connect_timeout=200ms\"\n\
         [backends.e]\nurl = \"etcd://u:{SECRET}@127.0.0.1:1?connect_timeout=200ms\"\n\
         options = {{ password = \"{SECRET}\" }}\n\
         [backends.z]\nurl = \"zk://u:{SECRET}@127.0.0.1:1?connect_timeout=200ms\"\n"
    );
    let config = Config::from_toml(&toml).expect("parses");
    assert!(!format!("{config:?}").contains(SECRET));
    let outcome = Locks::from_config(&config).await;
    let shown = match &outcome {
        Ok(_) => panic!("connected to nothing"),
        Err(e) => format!("{e} {e:?}"),
    };
    assert!(!shown.contains(SECRET), "{shown}");
    for url in [
        "redlock://u:{S}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "zk://u:{S}@127.0.0.1:1?connect_timeout=200ms",
    ] {
        let url = url.replace("{S}", SECRET);
        if let Err(e) = distlock::connect(&url).await {
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(SECRET), "{shown}");
        }
    }
    let written =
        String::from_utf8_lossy(&logs.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(
        !written.contains(SECRET),
        "a log line carries a password:\n{written}"
    );
}

#[test]
fn targets_report_their_case_counts() {
    for target in [
        "backend URLs",
        "TOML configurations",
        "DISTLOCK_* variables",
    ] {
        let _ = writeln!(
            std::io::stderr(),
            "generated: {target}: {} cases",
            config().cases
        );
    }
}
