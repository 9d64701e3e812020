//! `distlock check`: the configuration loads, its profiles connect and answer a read, and what
//! each one gives.

use std::process::ExitCode;

use distlock::{Config, Guarantee, LockError, Locks, redact};

use crate::exit;

/// The name whose status `check` reads: any name proves the server answers; nothing is written.
const PROBE: &str = "distlock-check";

pub async fn check(config: &Config, locks: &Locks) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    let (efficiency, correctness) = locks.profiles();
    let efficiency_name = Some(efficiency);
    for (profile, name, grade) in [
        ("efficiency", Some(efficiency), Guarantee::Efficiency),
        ("correctness", correctness, Guarantee::Correctness),
    ] {
        let (Some(name), Ok(client)) = (name, locks.client(grade)) else {
            println!("{profile}: none (no backend here gives it)");
            continue;
        };
        let url = config
            .backends
            .get(name)
            .map_or_else(String::new, |b| redact(&b.url));
        let caps = client.capabilities();
        println!(
            "{profile}: {name} = {url} ({}): guarantee {}, fencing {:?}, fifo {}, ttl granularity {:?}",
            client.backend().kind(),
            caps.guarantee,
            caps.fencing,
            caps.fifo,
            caps.ttl_granularity,
        );
        // A backend that connects lazily (etcd) is only proven by a request; once per backend.
        if profile == "correctness" && Some(name) == efficiency_name {
            continue;
        }
        match client.inspect(PROBE).await {
            Ok(_) | Err(LockError::Unsupported { .. }) => {}
            Err(e) => {
                eprintln!("distlock: {profile}: {name} = {url}: {e}");
                code = ExitCode::from(exit::for_error(&e));
            }
        }
    }
    code
}
