//! Logs: `tracing` events to stderr, as human-readable lines or one JSON
//! object per line, filtered by `--log-level` (or `RUST_LOG`, which, when
//! set, replaces it and can set levels per module, e.g.
//! `RUST_LOG=info,scheduler::daemon=debug`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `2026-11-23T10:00:00.123Z  INFO target: message key=value ...`
    #[default]
    Human,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`).
    Json,
}

/// The logging options (part of [`super::CommonArgs`]; `symphony up`
/// flattens them too).
#[derive(clap::Args, Clone, Debug)]
pub struct LogArgs {
    /// Log line format: human or json.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Least severe level logged: error, warn, info, debug, trace (or
    /// tracing filter directives); RUST_LOG, when set, replaces it.
    #[arg(long, default_value = "info", value_parser = parse_filter)]
    pub log_level: String,
}

fn parse_filter(s: &str) -> Result<String, super::ValueError> {
    EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| super::ValueError::BadLogLevel { value: s.to_string(), why: e.to_string() })
}

/// Starts logging for this process (once: a second call, e.g. from a test
/// or a launcher that started it already, changes nothing).
pub fn init(args: &LogArgs) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|_| EnvFilter::new(&args.log_level)),
        _ => EnvFilter::new(&args.log_level),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match args.log_format {
        LogFormat::Human => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Starts logging for a command-line tool (`symphony`'s commands,
/// `netbench`): notes and progress to stderr as plain lines at info and
/// above, no time or target, coloured only on a terminal, so that results
/// on stdout stay clean to pipe. Once: a second call changes nothing.
pub fn init_cli() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(tracing::Level::INFO)
        .without_time()
        .with_target(false)
        .try_init();
}
