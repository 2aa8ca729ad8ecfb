//! The production source files of the workspace's crates, parsed once:
//! each file's module path, and the line ranges that are tests (`#[cfg(test)]`
//! modules and `#[test]` functions), which no check counts.

use std::path::{Path, PathBuf};

/// The crates whose `src/` is production code, as (crate name in `use`
/// paths, folder).
pub const CRATES: &[(&str, &str)] = &[
    ("dataplane", "dataplane"),
    ("scheduler", "scheduler"),
    ("scheduler_core", "scheduler/core"),
    ("routing", "scheduler/routing"),
    ("etcd_v3", "scheduler/etcd"),
    ("backend", "backend"),
    ("frontend", "frontend"),
    ("tools", "tools"),
    ("netbench", "netbench"),
];

/// One parsed production file.
pub struct SourceFile {
    /// The path relative to the workspace root.
    pub path: String,
    /// The crate it belongs to (its `use` name).
    pub krate: &'static str,
    /// Its module path inside the crate (`["daemon", "plane"]`; empty for
    /// the crate root).
    pub module: Vec<String>,
    /// Its lines.
    pub lines: Vec<String>,
    /// The parsed file.
    pub ast: syn::File,
    /// 1-based inclusive line ranges that are test code.
    pub test_ranges: Vec<(usize, usize)>,
}

impl SourceFile {
    /// Whether 1-based `line` is test code.
    pub fn is_test_line(&self, line: usize) -> bool {
        self.test_ranges.iter().any(|&(a, b)| (a..=b).contains(&line))
    }
}

/// Why the tree could not be read.
#[derive(Debug)]
pub enum TreeError {
    /// A file or folder could not be read.
    Io(PathBuf, std::io::Error),
    /// A file is not valid Rust.
    Parse(PathBuf, syn::Error),
}

impl std::fmt::Display for TreeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TreeError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            TreeError::Parse(p, e) => write!(f, "{}: {e}", p.display()),
        }
    }
}

/// Whether the attributes carry `#[cfg(test)]` (alone or inside `all(..)`)
/// or `#[test]`.
pub fn is_test_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if a.path().is_ident("test") {
            return true;
        }
        if !a.path().is_ident("cfg") {
            return false;
        }
        let text = a.meta.require_list().map(|l| l.tokens.to_string()).unwrap_or_default();
        text == "test" || text.starts_with("all (test") || text.contains("(test ,") || text.ends_with(", test)")
    })
}

/// Reads every production file of every crate in [`CRATES`] under `root`.
/// A file whose parent declares it `#[cfg(test)] mod x;` is test code as a
/// whole and is left out.
pub fn read(root: &Path) -> Result<Vec<SourceFile>, TreeError> {
    let mut out = Vec::new();
    for &(krate, dir) in CRATES {
        let src = root.join(dir).join("src");
        let mut files = Vec::new();
        collect(&src, &mut files)?;
        files.sort();
        let mut parsed = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| TreeError::Io(f.clone(), e))?;
            let ast = syn::parse_file(&text).map_err(|e| TreeError::Parse(f.clone(), e))?;
            parsed.push((f, text, ast));
        }
        let test_files = test_module_files(&src, &parsed);
        for (f, text, ast) in parsed {
            let rel = f.strip_prefix(&src).unwrap_or(&f);
            // src/bin/*.rs and src/main.rs are roots of their own binaries.
            if test_files.contains(&f) || rel.starts_with("bin") && rel.components().count() > 2 {
                continue;
            }
            let module = module_path(rel);
            let test_ranges = test_ranges(&ast);
            let path = f.strip_prefix(root).unwrap_or(&f).to_string_lossy().into_owned();
            out.push(SourceFile { path, krate, module, lines: text.lines().map(String::from).collect(), ast, test_ranges });
        }
    }
    Ok(out)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), TreeError> {
    let entries = std::fs::read_dir(dir).map_err(|e| TreeError::Io(dir.to_path_buf(), e))?;
    for e in entries {
        let e = e.map_err(|e| TreeError::Io(dir.to_path_buf(), e))?;
        let p = e.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

/// `daemon/plane.rs` -> `["daemon", "plane"]`; `daemon/mod.rs`, `lib.rs`
/// and `main.rs` name their folder.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if !matches!(stem, "mod" | "lib" | "main") {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// Files declared `#[cfg(test)] mod name;` (or with a `#[path]`) by a
/// file of the same crate.
fn test_module_files(src: &Path, parsed: &[(PathBuf, String, syn::File)]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (f, _, ast) in parsed {
        let dir = match f.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => f.parent().map(Path::to_path_buf),
            _ => f.parent().map(|p| p.join(f.file_stem().unwrap_or_default())),
        }
        .unwrap_or_else(|| src.to_path_buf());
        for item in &ast.items {
            let syn::Item::Mod(m) = item else { continue };
            if m.content.is_some() || !is_test_attr(&m.attrs) {
                continue;
            }
            let explicit = m.attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
                syn::Meta::NameValue(nv) => match &nv.value {
                    syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
                    _ => None,
                },
                _ => None,
            });
            let name = m.ident.to_string();
            match explicit {
                Some(p) => out.push(f.parent().unwrap_or(src).join(p)),
                None => {
                    out.push(dir.join(format!("{name}.rs")));
                    out.push(dir.join(&name).join("mod.rs"));
                }
            }
        }
    }
    out
}

/// Line ranges of inline `#[cfg(test)]` modules and items and `#[test]`
/// functions at the top level of a file.
fn test_ranges(ast: &syn::File) -> Vec<(usize, usize)> {
    use syn::spanned::Spanned;
    ast.items
        .iter()
        .filter(|item| match item {
            syn::Item::Mod(m) => is_test_attr(&m.attrs),
            syn::Item::Fn(f) => is_test_attr(&f.attrs),
            syn::Item::Impl(i) => is_test_attr(&i.attrs),
            syn::Item::Use(u) => is_test_attr(&u.attrs),
            _ => false,
        })
        .map(|item| {
            let s = item.span();
            (s.start().line, s.end().line)
        })
        .collect()
}
