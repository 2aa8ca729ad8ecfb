//! The daemon shell: what every role's process does around its node, once.
//!
//! - [`CommonArgs`]: the options every daemon shares, under one name each
//!   (`--config`, `--transport`, `--idle`, `--metrics`, `--join-token-file`,
//!   `--heartbeat-ms`, `--dead-after-ms`, `--control-delay-us`,
//!   `--exit-with-parent`, `--log-format`, `--log-level`, `--link-tls-*`). A role's
//!   command line is its own options plus `#[command(flatten)] CommonArgs`.
//! - [`load`]: one config loader for any such command line: flags over
//!   the environment (`SYMPHONY_<OPTION>`) over the `--config` TOML file
//!   (keys = long names with '_' for '-', unknown keys refused) over the
//!   defaults. Every value, whatever its source, goes through the same clap
//!   value parser, so a bad transport or address is refused the same way
//!   from a flag, a variable or a file, naming where it came from.
//! - [`logging`]: `tracing` events to stderr, human or JSON lines.
//! - [`SetupError`], [`SchedulerUnreachable`]: the start-up errors every
//!   node daemon shares ([`setup()`] for `map_err`).
//! - [`metrics`], [`MetricsEndpoint`]: the registry behind every
//!   daemon's `/metrics` and the HTTP endpoint that serves it.
//! - [`Acceptor`]: the thread that takes a listener's connections for a
//!   daemon's poll loop.
//! - [`main`]: the entry point of every daemon ([`Daemon`]): load, log,
//!   resolve, stop signals, run; exit code 0 after a stop signal, 2 for a
//!   bad command line or configuration, 1 for a failure at run time.
//!
//! What a daemon prints on stdout (its `READY ...` line) is output for
//! its launcher, not a log line: the roles print it themselves.

mod accept;
mod endpoint;
mod link_tls;
mod load;
pub mod logging;
pub mod metrics;
mod setup;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use dataplane::control::{self, parse_idle, TransportKind};
use dataplane::idle::IdleStrategy;
use dataplane::join::{JoinError, JoinToken};
use dataplane::time::Duration;

pub use accept::Acceptor;
pub use link_tls::LinkTlsArgs;
pub use endpoint::{MetricsEndpoint, METRICS_MAX_CLIENTS, METRICS_REQUEST_DEADLINE};
pub use load::{env_var_name, load, load_from, Origin};
pub use logging::{LogArgs, LogFormat};
pub use setup::{setup, SchedulerUnreachable, SetupError};

/// A configuration that cannot be used, and where the bad value came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A bad command line, or `--help`/`--version` (clap renders it; its
    /// `use_stderr()` tells an error from help).
    #[error("{0}")]
    Cli(#[from] clap::Error),
    /// The `--config` file cannot be read.
    #[error("cannot read the config file {}: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The `--config` file is not TOML.
    #[error("config file {}: not valid TOML: {source}", file.display())]
    Parse {
        /// The file.
        file: PathBuf,
        /// Where and why.
        source: Box<toml::de::Error>,
    },
    /// The `--config` file has a key that names no option.
    #[error("config file {}: unknown key `{key}` (keys are the long option names with '_' for '-': {valid})", file.display())]
    UnknownKey {
        /// The file.
        file: PathBuf,
        /// The key.
        key: String,
        /// Every valid key.
        valid: String,
    },
    /// A value from the environment or the file that its option refuses.
    #[error("{origin}: {message}")]
    BadValue {
        /// The variable or the file and key.
        origin: Origin,
        /// What is wrong with it.
        message: String,
    },
    /// A value (or combination) the role refuses after parsing.
    #[error("--{option}: {why}")]
    Invalid {
        /// The option's long name.
        option: String,
        /// What is wrong.
        why: String,
    },
    /// A required option is missing.
    #[error("--{option} is required ({what})")]
    Missing {
        /// The option's long name.
        option: &'static str,
        /// What it is.
        what: &'static str,
    },
    /// The join token cannot be had.
    #[error(transparent)]
    JoinToken(#[from] JoinError),
}

impl ConfigError {
    /// `--option: why`.
    pub fn invalid(option: &str, why: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            option: option.to_string(),
            why: why.to_string(),
        }
    }
}

/// The options every daemon shares (flattened into each role's command
/// line). Validated values: a bad transport, idle strategy or address is
/// refused by the loader, listing what is valid.
#[derive(clap::Args, Clone, Debug)]
pub struct CommonArgs {
    /// TOML file with any of the options (keys: the long names with '_'
    /// for '-'); SYMPHONY_<OPTION> variables and flags override it.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Transport between the daemons: shm, tcp, tcp-blocking, rdma.
    #[arg(long, default_value = "shm", value_parser = TransportKind::parse)]
    pub transport: TransportKind,
    /// Idle strategy of the poll loop: spin, yield, park, wait, park:US.
    #[arg(long, default_value = "park", value_parser = parse_idle)]
    pub idle: IdleStrategy,
    /// Prometheus /metrics listen address, HOST:PORT (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0", value_parser = parse_socket_addr)]
    pub metrics: SocketAddr,
    /// File holding the cluster's join token (else the environment's
    /// SYMPHONY_JOIN_TOKEN; never a flag's value).
    #[arg(long, value_name = "FILE")]
    pub join_token_file: Option<PathBuf>,
    /// Heartbeat interval toward each peer, ms.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// A peer silent this long is dead, ms.
    #[arg(long, default_value_t = 1000)]
    pub dead_after_ms: u64,
    /// One-way control delay bound, µs: the scheduler charges it and
    /// announces it at registration [scheduler default: 1000]; a backend
    /// adopts the announced bound unless this overrides it.
    #[arg(long, value_parser = parse_delay_us)]
    pub control_delay_us: Option<f64>,
    /// Exit (SIGTERM) when the parent process dies.
    #[arg(long)]
    pub exit_with_parent: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub rdma: RdmaArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub link_tls: LinkTlsArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub log: LogArgs,
}

/// [`CommonArgs`] resolved.
#[derive(Clone, Debug)]
pub struct Common {
    /// Transport.
    pub transport: TransportKind,
    /// Idle strategy.
    pub idle: IdleStrategy,
    /// /metrics address.
    pub metrics: SocketAddr,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Silence after which a peer is dead.
    pub dead_after: Duration,
    /// The control delay bound given here (`None`: the role's default, or
    /// the one the scheduler announces).
    pub control_delay: Option<Duration>,
    /// The join token (file, else environment), if any.
    pub join_token: Option<JoinToken>,
    /// Die with the parent.
    pub exit_with_parent: bool,
}

/// The RDMA device, port and GID of `--transport rdma`, shared by the
/// daemons and netbench; the `SYMPHONY_RDMA_*` variables
/// ([`dataplane::control::RdmaSelection`]) stay a fallback for each.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RdmaArgs {
    /// RDMA device of `--transport rdma`, e.g. mlx5_0 or rxe0 (env
    /// SYMPHONY_RDMA_DEVICE) [default: the first device with an active port].
    #[arg(long, value_name = "NAME")]
    pub rdma_device: Option<String>,
    /// RDMA port of `--transport rdma`, from 1 (env SYMPHONY_RDMA_PORT)
    /// [default: 1].
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u8).range(1..))]
    pub rdma_port: Option<u8>,
    /// GID table index of `--transport rdma` (env SYMPHONY_RDMA_GID_INDEX)
    /// [default: RoCE v2 with an IPv4-mapped address, then RoCE v2, then any].
    #[arg(long, value_name = "INDEX")]
    pub gid_index: Option<u32>,
}

impl RdmaArgs {
    /// Makes these the process's RDMA selection (see
    /// [`control::select_rdma`]); the first call wins.
    pub fn select(&self) {
        control::select_rdma(control::RdmaSelection {
            device: self.rdma_device.clone(),
            port: self.rdma_port,
            gid_index: self.gid_index,
        });
    }
}

impl CommonArgs {
    /// Checks what one value alone cannot say and reads the join token;
    /// also makes the RDMA and link TLS flags the process's selection.
    pub fn resolve(&self) -> Result<Common, ConfigError> {
        self.rdma.select();
        self.link_tls.select(self.transport)?;
        let (hb, dead) = (self.heartbeat_ms, self.dead_after_ms);
        if hb == 0 || dead <= hb {
            return Err(ConfigError::invalid(
                "heartbeat-ms",
                format!("{hb} with --dead-after-ms {dead}: need 0 < heartbeat < dead-after"),
            ));
        }
        Ok(Common {
            transport: self.transport,
            idle: self.idle,
            metrics: self.metrics,
            heartbeat: Duration::from_millis(hb),
            dead_after: Duration::from_millis(dead),
            control_delay: self
                .control_delay_us
                .map(|us| Duration::from_nanos((us * 1000.0).round() as u64)),
            join_token: JoinToken::from_file_or_env(self.join_token_file.as_deref())?,
            exit_with_parent: self.exit_with_parent,
        })
    }
}

/// A value one of the shell's option parsers refuses (clap shows it with
/// the option's name).
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    /// Not a socket address.
    #[error("'{0}' is not HOST:PORT with an IP address (e.g. 127.0.0.1:0)")]
    NotSocketAddr(String),
    /// Not a delay in range.
    #[error("'{0}': expected microseconds in [0, 1000000]")]
    BadDelay(String),
    /// Not a log level or filter.
    #[error("'{value}': not a level (error, warn, info, debug, trace) or filter: {why}")]
    BadLogLevel {
        /// The text.
        value: String,
        /// The filter parser's complaint.
        why: String,
    },
}

/// A socket address, with a message that says what is expected.
pub fn parse_socket_addr(s: &str) -> Result<SocketAddr, ValueError> {
    s.parse().map_err(|_| ValueError::NotSocketAddr(s.to_string()))
}

/// A delay in µs within [0, 1e6].
fn parse_delay_us(s: &str) -> Result<f64, ValueError> {
    match s.parse::<f64>() {
        Ok(us) if us.is_finite() && (0.0..=1e6).contains(&us) => Ok(us),
        _ => Err(ValueError::BadDelay(s.to_string())),
    }
}

/// A daemon the shell runs: its command line (role options plus
/// [`CommonArgs`]), how it becomes a configuration, and how it runs.
pub trait Daemon: clap::Parser {
    /// The resolved configuration.
    type Config;
    /// Why it stopped other than by a stop signal.
    type Error: std::error::Error;
    /// The shared options inside the command line.
    fn common(&self) -> &CommonArgs;
    /// Checks every role option (the shared ones are resolved already).
    fn configure(self, common: Common) -> Result<Self::Config, ConfigError>;
    /// Runs until a stop signal ([`control::stop_requested`]): `Ok` then.
    fn run(cfg: Self::Config) -> Result<(), Self::Error>;
}

/// The entry point of every daemon binary and of `symphony daemon
/// <role>` (`argv[0]` is the program name): loads the configuration,
/// starts logging, installs the stop signals and runs the daemon. Exit
/// code 0 after a stop signal (and for `--help`), 2 for a bad command line
/// or configuration, 1 for a failure at run time.
pub fn main<A: Daemon>(argv: Vec<String>) -> ExitCode {
    let name = A::command().get_name().to_string();
    let args = match load::<A>(argv) {
        Ok(a) => a,
        Err(ConfigError::Cli(e)) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    logging::init(&args.common().log);
    let cfg = match args.common().resolve().and_then(|c| {
        if c.exit_with_parent {
            control::terminate_with_parent();
        }
        args.configure(c)
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = control::install_stop_signals() {
        tracing::error!(error = %e, "cannot start");
        return ExitCode::from(1);
    }
    match A::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting on an error");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests;
