//! The one config loader: flags > environment > `--config` file > defaults.
//!
//! It works on the clap command itself, so any role's command line (its
//! own options plus the flattened [`super::CommonArgs`]) loads the same
//! way, and the option names are defined once, by the clap struct:
//!
//! 1. parse the flags (this also answers `--help`);
//! 2. read the file named by `--config` (or `SYMPHONY_CONFIG`) and refuse
//!    keys that name no option;
//! 3. for each option not given as a flag, take `SYMPHONY_<OPTION>` if set,
//!    else the file's key, and append it as a flag;
//! 4. parse again: every value passes its option's own value parser, and
//!    an error is traced back to the variable or the file and key it came
//!    from.
//!
//! Values: a switch (`--exit-with-parent`) is `true`/`false` in the file and
//! `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off` in the environment; a
//! repeatable option is a TOML list, or `;`-separated in the environment.

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command, Parser};

use super::ConfigError;

/// Where a value the command line did not give came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// An environment variable.
    Env {
        /// Its name.
        var: String,
    },
    /// A key of the `--config` file.
    File {
        /// The file.
        file: PathBuf,
        /// The key.
        key: String,
    },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Env { var } => write!(f, "environment variable {var}"),
            Origin::File { file, key } => write!(f, "config file {}, key `{key}`", file.display()),
        }
    }
}

/// The environment variable of the option `long` (`heartbeat-ms` ->
/// `SYMPHONY_HEARTBEAT_MS`).
pub fn env_var_name(long: &str) -> String {
    format!("SYMPHONY_{}", long.replace('-', "_").to_ascii_uppercase())
}

/// Loads `A` from `argv` (program name first), the process environment
/// and the `--config` file.
pub fn load<A: Parser>(argv: Vec<String>) -> Result<A, ConfigError> {
    load_from(argv, &|var| std::env::var(var).ok())
}

/// [`load`] with the environment given as a lookup (tests).
pub fn load_from<A: Parser>(
    argv: Vec<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<A, ConfigError> {
    let cmd = A::command();
    let flags = cmd.clone().try_get_matches_from(&argv)?;
    let file_path = match flags.try_get_one::<PathBuf>("config") {
        Ok(Some(p)) => Some(p.clone()),
        _ => env(&env_var_name("config")).filter(|v| !v.is_empty()).map(PathBuf::from),
    };
    let table = match &file_path {
        Some(p) => read_table(p, &cmd)?,
        None => toml::Table::new(),
    };
    let mut added: Vec<(String, Origin)> = Vec::new();
    for arg in options(&cmd) {
        let id = arg.get_id().as_str();
        if flags.value_source(id) == Some(ValueSource::CommandLine) {
            continue;
        }
        let Some(long) = arg.get_long() else { continue };
        let var = env_var_name(long);
        let key = long.replace('-', "_");
        let (origin, values) = if let Some(v) = env(&var).filter(|v| !v.is_empty()) {
            let values = match arg.get_action() {
                ArgAction::Append => v.split(';').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
                _ => vec![v],
            };
            (Origin::Env { var }, values)
        } else if let (Some(v), Some(file)) = (table.get(&key), &file_path) {
            let origin = Origin::File { file: file.clone(), key };
            let values = toml_values(v, &origin)?;
            (origin, values)
        } else {
            continue;
        };
        for flag in as_flags(arg, long, values, &origin)? {
            added.push((flag, origin.clone()));
        }
    }
    let mut all = argv;
    all.extend(added.iter().map(|(flag, _)| flag.clone()));
    A::try_parse_from(all).map_err(|e| traced_back(e, &added))
}

/// The options a file or variable may set: every long option but
/// `--config`, `--help` and `--version`.
fn options(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(|a| {
        !matches!(a.get_long(), None | Some("config" | "help" | "version"))
            && !matches!(a.get_action(), ArgAction::Help | ArgAction::Version)
    })
}

fn read_table(path: &Path, cmd: &Command) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        file: path.to_path_buf(),
        source: Box::new(e),
    })?;
    let keys: Vec<String> = options(cmd)
        .filter_map(Arg::get_long)
        .map(|l| l.replace('-', "_"))
        .collect();
    if let Some(unknown) = table.keys().find(|k| !keys.contains(k)) {
        return Err(ConfigError::UnknownKey {
            file: path.to_path_buf(),
            key: unknown.clone(),
            valid: keys.join(", "),
        });
    }
    Ok(table)
}

fn bad(origin: &Origin, message: String) -> ConfigError {
    ConfigError::BadValue {
        origin: origin.clone(),
        message,
    }
}

/// A file value as the text(s) a flag would carry.
fn toml_values(v: &toml::Value, origin: &Origin) -> Result<Vec<String>, ConfigError> {
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(bad(origin, format!("expected a string, number or boolean, found a {}", other.type_str()))),
    };
    match v {
        toml::Value::Array(items) => items.iter().map(scalar).collect(),
        other => scalar(other).map(|s| vec![s]),
    }
}

/// `values` for the option `long` as command-line words.
fn as_flags(arg: &Arg, long: &str, values: Vec<String>, origin: &Origin) -> Result<Vec<String>, ConfigError> {
    match arg.get_action() {
        ArgAction::SetTrue => {
            let [v] = values.as_slice() else {
                return Err(bad(origin, "expected true or false, not a list".into()));
            };
            match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(vec![format!("--{long}")]),
                "false" | "0" | "no" | "off" => Ok(Vec::new()),
                _ => Err(bad(origin, format!("'{v}': expected true or false"))),
            }
        }
        ArgAction::Append => Ok(values.into_iter().map(|v| format!("--{long}={v}")).collect()),
        _ => match values.as_slice() {
            [v] => Ok(vec![format!("--{long}={v}")]),
            _ => Err(bad(origin, format!("--{long} takes one value, not a list"))),
        },
    }
}

/// Names the variable or file key behind a value the second parse
/// refused (a flag's own errors were reported by the first).
fn traced_back(e: clap::Error, added: &[(String, Origin)]) -> ConfigError {
    use clap::error::{ContextKind, ContextValue};
    let flag = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => s.split([' ', '=']).next().unwrap_or("").to_string(),
        _ => String::new(),
    };
    let origin = added
        .iter()
        .find(|(word, _)| !flag.is_empty() && (word == &flag || word.starts_with(&format!("{flag}="))))
        .map(|(_, o)| o.clone());
    match origin {
        Some(origin) => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("").trim_start_matches("error: ");
            ConfigError::BadValue {
                origin,
                message: first.to_string(),
            }
        }
        None => ConfigError::Cli(e),
    }
}
