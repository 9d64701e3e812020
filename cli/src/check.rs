//! `distlock check`: the configuration loads, its profiles connect, and what each one gives.

use std::process::ExitCode;

use distlock::{Config, Guarantee, Locks, redact};

pub fn check(config: &Config, locks: &Locks) -> ExitCode {
    let (efficiency, correctness) = locks.profiles();
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
    }
    ExitCode::SUCCESS
}
