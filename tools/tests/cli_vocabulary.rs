//! One CLI vocabulary (issue 47, item 5): docs/cli.md is what the clap
//! definitions say, and no long flag name means two things across the
//! `symphony` subcommands, the three daemons and netbench: the same kind
//! of value (a list of names is never a number elsewhere) and the same
//! default.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use tools::cli_doc::FlagUse;

fn symphony(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_symphony")).args(args).output().expect("run symphony");
    assert!(out.status.success(), "symphony {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A default as a number where the flag takes numbers (`2000` and
/// `2000.0` are one default), else as written.
fn normalised(kind: &str, default: &str) -> String {
    match default.parse::<f64>() {
        Ok(v) if kind.starts_with("number") => format!("{v}"),
        _ => default.to_string(),
    }
}

/// Every name (long flag or alias) used with more than one kind of value,
/// or with more than one default, with the commands
/// that disagree.
fn conflicts(uses: &[FlagUse]) -> Vec<String> {
    let mut by_name: BTreeMap<&str, Vec<&FlagUse>> = BTreeMap::new();
    for u in uses {
        by_name.entry(&u.flag).or_default().push(u);
        for a in &u.aliases {
            by_name.entry(a).or_default().push(u);
        }
    }
    let mut found = Vec::new();
    for (name, uses) in by_name {
        let kinds: BTreeSet<&str> = uses.iter().map(|u| u.kind.as_str()).collect();
        if kinds.len() > 1 {
            let who: Vec<String> = uses.iter().map(|u| format!("{} ({})", u.command, u.kind)).collect();
            found.push(format!("--{name} takes different kinds of value: {}", who.join(", ")));
            continue;
        }
        let defaults: BTreeSet<String> =
            uses.iter().filter_map(|u| u.default.as_deref().map(|d| normalised(&u.kind, d))).collect();
        if defaults.len() > 1 {
            let who: Vec<String> = uses
                .iter()
                .filter_map(|u| u.default.as_ref().map(|d| format!("{} ({d})", u.command)))
                .collect();
            found.push(format!("--{name} has different defaults: {}", who.join(", ")));
        }
    }
    found
}

#[test]
fn docs_cli_md_matches_the_definitions() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md");
    let rendered = symphony(&["docs", "cli"]);
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        rendered == on_disk,
        "docs/cli.md differs from the clap definitions; regenerate it with\n  \
         cargo run --release -p tools --bin symphony -- docs cli > docs/cli.md"
    );
}

#[test]
fn one_meaning_per_flag_name() {
    let uses: Vec<FlagUse> = serde_json::from_str(&symphony(&["docs", "flags"])).expect("flag inventory");
    // The walk reaches every command line: each daemon and netbench's
    // subcommands, not only the `symphony` tree.
    for command in ["symphony up", "symphony-scheduler", "symphony-frontend", "symphony-backend", "netbench local"] {
        assert!(uses.iter().any(|u| u.command == command), "no flags of {command} in the inventory");
    }
    let found = conflicts(&uses);
    assert!(found.is_empty(), "one flag name, several meanings (rename one, or give both one default):\n{}", found.join("\n"));
}

#[test]
fn the_check_catches_both_kinds_of_conflict() {
    let flag = |command: &str, flag: &str, kind: &str, default: Option<&str>| FlagUse {
        command: command.into(),
        flag: flag.into(),
        aliases: Vec::new(),
        kind: kind.into(),
        default: default.map(String::from),
    };
    // A list of names against a count.
    let found = conflicts(&[flag("a", "models", "text", Some("all")), flag("b", "models", "number", Some("20"))]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("different kinds"), "{found:?}");
    // Two defaults.
    let found = conflicts(&[flag("a", "idle", "text", Some("park")), flag("b", "idle", "text", Some("wait"))]);
    assert!(found.len() == 1 && found[0].contains("different defaults"), "{found:?}");
    // One default written two ways, and a flag without one.
    let fine = [
        flag("a", "delay-us", "number", Some("2000")),
        flag("b", "delay-us", "number", Some("2000.0")),
        flag("c", "delay-us", "number", None),
    ];
    assert!(conflicts(&fine).is_empty());
    // A run size is no exception: a capacity test states its size rather
    // than default to another command's.
    let sizes = [flag("a", "gpus", "number", Some("8")), flag("b", "gpus", "number", Some("1000"))];
    assert_eq!(conflicts(&sizes).len(), 1);
    // An old spelling kept as an alias counts as the name it spells.
    let mut old = flag("a", "models", "text", Some("all"));
    old.aliases.push("zoo-models".into());
    assert!(!conflicts(&[old, flag("b", "zoo-models", "number", Some("3"))]).is_empty());
}
