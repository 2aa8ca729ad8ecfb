//! `structure-check`: the shape of the workspace's production code (issue
//! 48): no file over 1,200 lines before its tests, no function over 120
//! lines, no module importing a module that imports it, no run of six or
//! more identical lines in two places.
//!
//! What the tree breaks today is listed in `tests/structure/baseline.txt`,
//! one finding per line (`SIZE<TAB>KEY`), and may only shrink: the check
//! fails on a finding the baseline lacks, on one that grew, and on a
//! baseline line that is no longer true (so each improvement is recorded
//! and cannot be undone unnoticed). `--write-baseline` rewrites the file
//! from the tree.
//!
//! Usage: `structure-check [--root DIR] [--write-baseline]`.

mod imports;
mod lengths;
mod repeats;
mod tree;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

/// One thing the tree breaks, with its size (lines, or modules in a loop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What and where, stable across edits elsewhere.
    pub key: String,
    /// How big it is.
    pub size: usize,
}

const BASELINE: &str = "tests/structure/baseline.txt";

fn main() -> ExitCode {
    let mut root = PathBuf::from(".");
    let mut write = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--root" => match args.next() {
                Some(r) => root = PathBuf::from(r),
                None => return usage("--root needs a folder"),
            },
            "--write-baseline" => write = true,
            "-h" | "--help" => {
                println!("structure-check [--root DIR] [--write-baseline]\n  checks file and function lengths, import loops and repeated code against {BASELINE}");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    let files = match tree::read(&root) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("structure-check: {e}");
            return ExitCode::from(2);
        }
    };
    let mut found = lengths::check(&files);
    found.extend(imports::check(&files));
    found.extend(repeats::check(&files));
    found.sort_by(|a, b| a.key.cmp(&b.key));
    let path = root.join(BASELINE);
    if write {
        let text: String = found.iter().map(|f| format!("{}\t{}\n", f.size, f.key)).collect();
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("structure-check: {}: {e}", path.display());
            return ExitCode::from(2);
        }
        println!("structure-check: wrote {} findings to {}", found.len(), path.display());
        return ExitCode::SUCCESS;
    }
    let baseline = match std::fs::read_to_string(&path) {
        Ok(t) => parse_baseline(&t),
        Err(e) => {
            eprintln!("structure-check: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let problems = compare(&found, &baseline);
    summary(&found);
    if problems.is_empty() {
        println!("structure-check: ok ({} findings, all in the baseline and none grown)", found.len());
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("{p}");
        }
        eprintln!("structure-check: {} problems; fix them, or record an improvement with `cargo run --release -p structure-check -- --write-baseline`", problems.len());
        ExitCode::FAILURE
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("structure-check: {why}\nusage: structure-check [--root DIR] [--write-baseline]");
    ExitCode::from(2)
}

/// `SIZE<TAB>KEY` lines; anything else is ignored.
fn parse_baseline(text: &str) -> BTreeMap<String, usize> {
    text.lines()
        .filter_map(|l| {
            let (size, key) = l.split_once('\t')?;
            Some((key.to_string(), size.trim().parse().ok()?))
        })
        .collect()
}

/// What the tree does against the baseline that the ratchet forbids.
fn compare(found: &[Finding], baseline: &BTreeMap<String, usize>) -> Vec<String> {
    let mut out = Vec::new();
    for f in found {
        match baseline.get(&f.key) {
            None => out.push(format!("new: {} ({})", f.key, f.size)),
            Some(&b) if f.size > b => out.push(format!("grew: {} ({b} -> {})", f.key, f.size)),
            Some(&b) if f.size < b => out.push(format!("shrank (record it): {} ({b} -> {})", f.key, f.size)),
            Some(_) => {}
        }
    }
    for key in baseline.keys() {
        if !found.iter().any(|f| &f.key == key) {
            out.push(format!("gone (record it): {key}"));
        }
    }
    out
}

fn summary(found: &[Finding]) {
    let count = |p: &str| found.iter().filter(|f| f.key.starts_with(p)).count();
    println!(
        "structure-check: {} files over {} lines, {} functions over {} lines, {} import loops, {} pairs of places sharing runs of {}+ lines",
        count("file-lines"),
        lengths::MAX_FILE_LINES,
        count("fn-lines"),
        lengths::MAX_FN_LINES,
        count("import-loop"),
        count("repeat"),
        repeats::MIN_RUN
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, module: &[&str], text: &str) -> tree::SourceFile {
        let ast = syn::parse_file(text).expect("parses");
        tree::SourceFile {
            path: path.into(),
            krate: "k",
            module: module.iter().map(|s| s.to_string()).collect(),
            lines: text.lines().map(String::from).collect(),
            ast,
            test_ranges: Vec::new(),
        }
    }

    #[test]
    fn a_loop_between_siblings_is_found_and_a_child_naming_its_parent_is_not() {
        let files = [
            file("a.rs", &["a"], "use crate::b::X;\npub struct Y;"),
            file("b.rs", &["b"], "pub struct X;\nfn f() -> crate::a::Y { todo!() }"),
            file("c/mod.rs", &["c"], "mod d;\nuse d::Z;"),
            file("c/d.rs", &["c", "d"], "use super::Z2;\npub struct Z;"),
        ];
        let found = imports::check(&files);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "import-loop k::a <-> k::b");
    }

    #[test]
    fn long_functions_and_repeats_are_found() {
        let body: String = (0..130).map(|i| format!("    let x{i} = {i};\n")).collect();
        let text = format!("fn long() {{\n{body}}}\nfn short() {{}}\n");
        let found = lengths::check(&[file("l.rs", &["l"], &text)]);
        assert_eq!(found, vec![Finding { key: "fn-lines l.rs::long".into(), size: 132 }]);

        let run: String = (0..7).map(|i| format!("    let v{i} = g({i});\n")).collect();
        let a = file("a.rs", &["a"], &format!("fn a() {{\n{run}}}\n"));
        let b = file("b.rs", &["b"], &format!("fn b() {{\n    other();\n{run}}}\n"));
        let found = repeats::check(&[a, b]);
        assert_eq!(found, vec![Finding { key: "repeat a.rs ~ b.rs".into(), size: 14 }]);
        // Five shared lines are not a run.
        let short: String = (0..5).map(|i| format!("    let v{i} = g({i});\n")).collect();
        let a = file("a.rs", &["a"], &format!("fn a() {{\n{short}}}\n"));
        let b = file("b.rs", &["b"], &format!("fn b() {{\n{short}}}\n"));
        assert!(repeats::check(&[a, b]).is_empty());
    }

    #[test]
    fn the_ratchet_refuses_new_grown_and_stale_findings() {
        let base = parse_baseline("10\tfile-lines a.rs\n5\tfn-lines b.rs::f\n3\trepeat x.rs\n");
        let found = [
            Finding { key: "file-lines a.rs".into(), size: 10 },
            Finding { key: "fn-lines b.rs::f".into(), size: 6 },
            Finding { key: "import-loop k::a <-> k::b".into(), size: 2 },
        ];
        let p = compare(&found, &base);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("grew") && p[1].starts_with("new") && p[2].starts_with("gone"), "{p:?}");
        assert!(compare(&found[..1], &parse_baseline("10\tfile-lines a.rs\n")).is_empty());
    }
}
