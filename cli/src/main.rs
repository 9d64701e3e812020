//! `distlock`: run a program under a distributed lock, inspect locks, check a configuration.
//!
//! ```sh
//! distlock --backend redis://127.0.0.1:6379 run nightly-backup -- ./backup.sh
//! distlock --config distlock.toml run --correctness --wait 30s payments-migration -- ./migrate
//! distlock --backend etcd://127.0.0.1:2379/app elect --correctness scheduler -- ./schedule
//! distlock --backend etcd://127.0.0.1:2379/app status nightly-backup --json
//! distlock --config distlock.toml check
//! ```
//!
//! The backends come from `--backend URL`, or from `--config FILE` and the `DISTLOCK_*`
//! variables, as the library's `Locks::load` reads them; with none of them the command refuses
//! to run (an in-process store would lock nothing another process sees). Exit statuses: see `exit.rs` and the guide.

mod check;
mod exit;
mod guard;
mod kind;
mod run;
mod status;
mod terminal;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use distlock::{Config, ConfigError, Guarantee, Locks};
use kind::Kind;

#[derive(Parser)]
#[command(
    name = "distlock",
    version,
    about = "Run a program under a distributed lock; inspect locks"
)]
struct Cli {
    #[command(flatten)]
    source: Source,
    /// More log lines on stderr (-v: the library's info and debug lines); `RUST_LOG`, when set,
    /// chooses instead. Warnings (a lease lost, renewals failing) always show.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Serve the library's metrics for Prometheus at http://ADDR/metrics while the command
    /// runs (e.g. 127.0.0.1:9464): acquire durations, leases held and lost, renewals.
    #[arg(long, global = true, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    #[command(subcommand)]
    command: Command,
}

/// Where the backends come from.
#[derive(Args)]
struct Source {
    /// A backend URL (redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://,
    /// etcd://, zk://, postgres://, memory://); it serves both grades where it can.
    #[arg(long, global = true, conflicts_with = "config")]
    backend: Option<String>,
    /// A TOML configuration file (the library's format); `DISTLOCK_*` variables override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command once the lock is held; terminate it if the lock is lost.
    Run(RunArgs),
    /// Run a command while leading the election NAME; terminate it if the leadership is lost.
    /// The next leader's command starts only once this one is gone.
    Elect(ElectArgs),
    /// Show who holds each lock, with its token, time to live and waiters.
    Status(StatusArgs),
    /// Load and check the configuration, connect, and show each profile's backend.
    Check,
}

/// What `run` and `elect` share: the name, the lease, the wait, the command.
#[derive(Args)]
struct Held {
    /// The lock name.
    name: String,
    /// Take a correctness lock (etcd, ZooKeeper or PostgreSQL: the command gets a fencing token).
    #[arg(long)]
    correctness: bool,
    /// The lease TTL (renewed by the watchdog while the command runs), e.g. 30s.
    #[arg(long, value_parser = duration)]
    ttl: Option<Duration>,
    /// Wait this long at most for the lock (default: for as long as it takes; 0 tries once, as
    /// --no-wait does).
    #[arg(long, value_parser = wait, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Fail at once (exit 75) if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// The exit status when the lock is held (--no-wait) or the wait runs out, instead of 75
    /// (as flock's -E): for commands that exit 75 themselves.
    #[arg(short = 'E', long, value_parser = clap::value_parser!(u8))]
    conflict_exit_code: Option<u8>,
    /// After the lock is lost, how long the command has between SIGTERM and SIGKILL (default
    /// and most: half the lost signal's lead, 10 % of the TTL, so the command is gone before
    /// anyone else can hold the lock; a longer value is cut, with a warning).
    #[arg(long, value_parser = duration)]
    kill_after: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<OsString>,
}

/// `distlock run`.
#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    held: Held,
    /// Let at most N commands run at once under this name (a semaphore of N permits; every
    /// user of the name must give the same N).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), conflicts_with_all = ["shared", "exclusive"])]
    limit: Option<u32>,
    /// Take the name's read-write lock shared (as flock's -s): with other --shared runs, never
    /// with an --exclusive one; a waiting --exclusive run goes before later --shared ones.
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    shared: bool,
    /// Take the name's read-write lock exclusively (as flock's -x): alone, never with a
    /// --shared run.
    #[arg(short = 'x', long)]
    exclusive: bool,
}

impl RunArgs {
    fn kind(&self) -> Kind {
        match (self.limit, self.shared, self.exclusive) {
            (Some(n), _, _) => Kind::Permit(n),
            (None, true, _) => Kind::Read,
            (None, false, true) => Kind::Write,
            (None, false, false) => Kind::Lock,
        }
    }
}

/// `distlock elect`.
#[derive(Args)]
struct ElectArgs {
    #[command(flatten)]
    held: Held,
    /// The value observers of the election read while this command leads (default:
    /// `<host>:<pid>` of `distlock`).
    #[arg(long)]
    value: Option<String>,
}

/// `distlock status`.
#[derive(Args)]
struct StatusArgs {
    /// The lock names.
    #[arg(required = true)]
    names: Vec<String>,
    /// Read the correctness profile's backend.
    #[arg(long)]
    correctness: bool,
    /// One JSON object per lock, in an array.
    #[arg(long)]
    json: bool,
}

fn duration(text: &str) -> Result<Duration, String> {
    distlock::parse_duration("duration", text).map_err(|e| e.to_string())
}

fn wait(text: &str) -> Result<Duration, String> {
    distlock::parse_wait("--wait", text).map_err(|e| e.to_string())
}

fn grade(correctness: bool) -> Guarantee {
    if correctness {
        Guarantee::Correctness
    } else {
        Guarantee::Efficiency
    }
}

/// Log lines go to stderr: `RUST_LOG` if set, else warnings, or more with `-v`.
fn logs(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => {
            "warn,distlock=debug,distlock_api=debug,distlock_redis=debug,distlock_etcd=debug,distlock_zk=debug"
        }
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// The configuration the options name.
fn config(source: &Source) -> Result<Config, ConfigError> {
    match (&source.backend, &source.config) {
        // The URL names the backend; the lease settings still come from `DISTLOCK_LEASE__*`.
        (Some(url), _) => Ok(Config {
            lease: Config::load(None)?.lease,
            ..Config::for_url(url)
        }),
        (None, file) => Config::load(file.as_deref()),
    }
}

/// The exit status for a configuration that cannot be used.
fn config_failed(e: &ConfigError) -> u8 {
    match e {
        ConfigError::Backend { .. } => exit::UNAVAILABLE,
        _ => exit::CONFIG,
    }
}

/// Connects the profiles, or says why not (and with which exit status).
async fn locks(source: &Source) -> Result<(Config, Locks), ExitCode> {
    let loaded = match config(source) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("distlock: {e}");
            return Err(ExitCode::from(config_failed(&e)));
        }
    };
    // Neither option nor variable named a backend: the default in-process store would lock
    // nothing another process sees, so two runs would overlap without a word.
    if source.backend.is_none()
        && source.config.is_none()
        && loaded.backends == Config::default().backends
    {
        eprintln!(
            "distlock: no backend: give --backend URL or --config FILE (or \
             DISTLOCK_BACKENDS__<name>__URL); an in-process store (--backend memory://) is \
             only for trying the command"
        );
        return Err(ExitCode::from(exit::USAGE));
    }
    match Locks::from_config(&loaded).await {
        Ok(l) => Ok((loaded, l)),
        Err(e) => {
            eprintln!("distlock: {e}");
            Err(ExitCode::from(config_failed(&e)))
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == guard::SUBCOMMAND) {
        let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
        return guard::main(&rest);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return if usage {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    logs(cli.verbose);
    if let Some(addr) = cli.metrics_addr {
        let served = metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install();
        if let Err(e) = served {
            eprintln!("distlock: --metrics-addr {addr}: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    }
    let (loaded, locks) = match locks(&cli.source).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    match cli.command {
        Command::Run(args) => run::run(&locks, &args.held, args.kind()).await,
        Command::Elect(args) => {
            let value = args.value.unwrap_or_else(kind::this_process);
            run::run(&locks, &args.held, Kind::Leader(value)).await
        }
        Command::Status(args) => status::status(&locks, args).await,
        Command::Check => check::check(&loaded, &locks).await,
    }
}
