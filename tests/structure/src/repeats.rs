//! Repeated code: runs of [`MIN_RUN`] or more identical lines (compared
//! trimmed; blank lines and lone brackets aside) in two places of the
//! production code.

use std::collections::{BTreeMap, HashMap};

use crate::tree::SourceFile;
use crate::Finding;

/// The shortest run of identical lines that counts.
pub const MIN_RUN: usize = 6;

/// A line that says nothing alone: blank, or only brackets and
/// punctuation (`}`, `});`, `],`).
fn is_filler(line: &str) -> bool {
    line.chars().all(|c| c.is_whitespace() || "{}()[];,".contains(c))
}

/// One significant line: its text (trimmed), file index and 1-based line.
struct Line<'a> {
    text: &'a str,
    file: usize,
    line: usize,
}

/// Every pair of places sharing a run of at least [`MIN_RUN`] significant
/// lines, one finding per pair of files, sized by the lines they share.
pub fn check(files: &[SourceFile]) -> Vec<Finding> {
    let mut lines: Vec<Line<'_>> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        for (n, l) in f.lines.iter().enumerate() {
            let t = l.trim();
            if !is_filler(t) && !f.is_test_line(n + 1) {
                lines.push(Line { text: t, file: i, line: n + 1 });
            }
        }
    }
    // Every window of MIN_RUN consecutive significant lines of one file,
    // keyed by its text.
    let mut windows: HashMap<Vec<&str>, Vec<usize>> = HashMap::new();
    for start in 0..lines.len().saturating_sub(MIN_RUN - 1) {
        let w = &lines[start..start + MIN_RUN];
        if w.iter().any(|l| l.file != w[0].file) {
            continue;
        }
        windows.entry(w.iter().map(|l| l.text).collect()).or_default().push(start);
    }
    // Significant lines of each pair of places that are covered by a
    // shared window; a file repeating itself counts as a pair too.
    let mut shared: BTreeMap<(usize, usize), std::collections::BTreeSet<(usize, usize)>> = BTreeMap::new();
    for starts in windows.values().filter(|s| s.len() > 1) {
        for (k, &a) in starts.iter().enumerate() {
            for &b in &starts[k + 1..] {
                if b < a + MIN_RUN && lines[a].file == lines[b].file {
                    continue; // overlapping windows of one repeated line
                }
                let key = (lines[a].file.min(lines[b].file), lines[a].file.max(lines[b].file));
                let set = shared.entry(key).or_default();
                for off in 0..MIN_RUN {
                    set.insert((lines[a + off].file, lines[a + off].line));
                    set.insert((lines[b + off].file, lines[b + off].line));
                }
            }
        }
    }
    shared
        .into_iter()
        .map(|((fa, fb), set)| {
            let key = if fa == fb {
                format!("repeat {}", files[fa].path)
            } else {
                format!("repeat {} ~ {}", files[fa].path, files[fb].path)
            };
            Finding { key, size: set.len() }
        })
        .collect()
}
