//! docs/cli.md and the flag inventory, both read off the clap definitions
//! themselves (never a copy of them): [`markdown`] renders every command's
//! options; [`flag_uses`] lists every long flag with the kind of value it
//! takes and its default, which `tools/tests/cli_vocabulary.rs` holds to
//! one meaning per name across all commands.

use std::any::TypeId;

use clap::{Arg, ArgAction, Command};
use serde::{Deserialize, Serialize};

/// One long flag of one command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlagUse {
    /// The command, e.g. `symphony up` or `symphony-scheduler`.
    pub command: String,
    /// The long name, without `--`.
    pub flag: String,
    /// Other names it answers to (hidden aliases included).
    pub aliases: Vec<String>,
    /// `switch`, `number`, `number list` or `text` ([`value_kind`]).
    pub kind: String,
    /// The default, as clap shows it (`None`: none).
    pub default: Option<String>,
}

/// What kind of value a flag takes: a switch takes none; a number (any
/// integer or float type, whatever parses it) or several; otherwise text
/// (names, lists of names, paths, addresses, choices).
pub fn value_kind(arg: &Arg) -> &'static str {
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count) {
        return "switch";
    }
    let ty = arg.get_value_parser().type_id();
    let numbers = [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i8>(),
        TypeId::of::<i16>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<isize>(),
        TypeId::of::<f32>(),
        TypeId::of::<f64>(),
    ];
    let several = arg.get_value_delimiter().is_some() || matches!(arg.get_action(), ArgAction::Append);
    match (numbers.iter().any(|n| ty == *n), several) {
        (true, true) => "number list",
        (true, false) => "number",
        (false, _) => "text",
    }
}

/// Help and version flags clap adds: not part of the vocabulary.
fn is_builtin(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version)
}

fn default_of(arg: &Arg) -> Option<String> {
    let values: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    if values.is_empty() || matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count) {
        None
    } else {
        Some(values.join(","))
    }
}

/// Every visible command under `cmd` (itself first), with its full name.
fn walk<'a>(cmd: &'a Command, name: String, out: &mut Vec<(String, &'a Command)>) {
    out.push((name.clone(), cmd));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        walk(sub, format!("{name} {}", sub.get_name()), out);
    }
}

fn all(commands: &[Command]) -> Vec<(String, &Command)> {
    let mut out = Vec::new();
    for c in commands {
        walk(c, c.get_name().to_string(), &mut out);
    }
    out
}

/// Every long flag of every visible command under `commands`.
pub fn flag_uses(commands: &[Command]) -> Vec<FlagUse> {
    let mut uses = Vec::new();
    for (name, cmd) in all(commands) {
        for arg in cmd.get_arguments().filter(|a| !is_builtin(a)) {
            let Some(long) = arg.get_long() else { continue };
            uses.push(FlagUse {
                command: name.clone(),
                flag: long.to_string(),
                aliases: arg.get_all_aliases().unwrap_or_default().into_iter().map(String::from).collect(),
                kind: value_kind(arg).to_string(),
                default: default_of(arg),
            });
        }
    }
    uses
}

/// Markdown table cell text: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

fn option_name(arg: &Arg) -> String {
    let value = || {
        let names: Vec<String> = match arg.get_value_names() {
            Some(n) => n.iter().map(|s| s.to_string()).collect(),
            None => vec![arg.get_id().as_str().to_ascii_uppercase()],
        };
        names.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>().join(" ")
    };
    let takes_value = !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count);
    let mut s = match (arg.get_long(), arg.get_short()) {
        (Some(l), Some(c)) => format!("-{c}, --{l}"),
        (Some(l), None) => format!("--{l}"),
        (None, Some(c)) => format!("-{c}"),
        (None, None) => return value(),
    };
    if takes_value {
        s.push(' ');
        s.push_str(&value());
    }
    s
}

/// docs/cli.md: for every visible command, its description, usage and a
/// table of its options (default and help as `--help` shows them).
pub fn markdown(commands: &[Command]) -> String {
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from the clap definitions by `symphony docs cli > docs/cli.md`; do not edit by hand \
         (`tools/tests/cli_vocabulary.rs` fails when this file differs from the definitions, and when \
         one flag name has two meanings: a different kind of value or a different default).\n\n\
         The daemons (`symphony-scheduler`, `symphony-frontend`, `symphony-backend`, also run as \
         `symphony daemon scheduler|frontend|backend`) read every option also from the environment, \
         as `SYMPHONY_<OPTION>` (`--heartbeat-ms` is `SYMPHONY_HEARTBEAT_MS`), and from the TOML file \
         named by `--config`; a flag wins over the environment, which wins over the file.\n",
    );
    for (name, cmd) in all(commands) {
        out.push_str(&format!("\n## `{name}`\n\n"));
        if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
            out.push_str(&format!("{}\n\n", cell(&about.to_string())));
        }
        if cmd.has_subcommands() {
            let subs: Vec<String> =
                cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| format!("`{}`", s.get_name())).collect();
            out.push_str(&format!("Subcommands: {}.\n\n", subs.join(", ")));
        }
        let args: Vec<&Arg> = cmd.get_arguments().filter(|a| !is_builtin(a) && !a.is_hide_set()).collect();
        if args.is_empty() {
            continue;
        }
        out.push_str("| Option | Default | Description |\n|---|---|---|\n");
        for arg in args {
            let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
            let mut default = default_of(arg).map(|d| format!("`{d}`")).unwrap_or_default();
            if arg.is_required_set() {
                default = "required".into();
            }
            out.push_str(&format!("| `{}` | {} | {} |\n", option_name(arg), default, cell(&help)));
        }
    }
    out
}
