//! Import loops: module A names module B (a `use` or a path in code) and B,
//! directly or through others, names A. A module naming its own ancestor
//! (`super::Config`) is how Rust nests modules and is not counted; loops
//! between siblings and cousins are.

use std::collections::{BTreeMap, BTreeSet};

use syn::visit::Visit;

use crate::tree::{is_test_attr, SourceFile};
use crate::Finding;

/// Every strongly connected set of two or more modules of one crate.
pub fn check(files: &[SourceFile]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut krates: Vec<&str> = files.iter().map(|f| f.krate).collect();
    krates.dedup();
    for krate in krates {
        let mine: Vec<&SourceFile> = files.iter().filter(|f| f.krate == krate).collect();
        let modules: BTreeSet<Vec<String>> = mine.iter().map(|f| f.module.clone()).collect();
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for f in &mine {
            let mut v = Paths { found: Vec::new() };
            for item in &f.ast.items {
                v.visit_item(item);
            }
            let to = edges.entry(f.module.clone()).or_default();
            for p in v.found {
                // Itself and its ancestors are not counted (see the module doc).
                if let Some(m) = resolve(krate, &f.module, &p, &modules).filter(|m| !f.module.starts_with(m)) {
                    to.insert(m);
                }
            }
        }
        for scc in strongly_connected(&edges) {
            if scc.len() > 1 {
                let names: Vec<String> = scc.iter().map(|m| format!("{krate}::{}", m.join("::"))).collect();
                out.push(Finding { key: format!("import-loop {}", names.join(" <-> ")), size: scc.len() });
            }
        }
    }
    out
}

/// The module a path names, if it names one of this crate's modules.
fn resolve(krate: &str, here: &[String], path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut abs: Vec<String>;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            abs = Vec::new();
            rest = &path[1..];
        }
        Some(k) if k == krate => {
            abs = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            abs = here.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            abs = here.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                abs.pop();
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A child module named without `self::`, or (in a crate root) a
            // top-level module.
            let mut child = here.to_vec();
            child.push(first.to_string());
            if !modules.contains(&child) {
                return None;
            }
            abs = here.to_vec();
        }
        None => return None,
    }
    let mut best = None;
    for seg in rest {
        abs.push(seg.clone());
        if modules.contains(&abs) {
            best = Some(abs.clone());
        } else {
            break;
        }
    }
    best
}

/// Collects the paths a file's production code names.
struct Paths {
    found: Vec<Vec<String>>,
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, t: &syn::UseTree) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                full.push(n.ident.to_string());
                self.found.push(full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.found.push(full);
            }
            syn::UseTree::Glob(_) => self.found.push(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_attr(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_attr(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test_attr(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_test_attr(&u.attrs) {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() > 1 {
            self.found.push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }
}

/// Tarjan's strongly connected components.
fn strongly_connected(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next {
                let Some((w, _)) = s.edges.get_key_value(w) else { continue };
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low[v];
                    s.low.insert(v, lv.min(lw));
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low[v];
                    s.low.insert(v, lv.min(iw));
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            scc.sort();
            s.out.push(scc);
        }
    }
    let mut s = State { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), out: Vec::new() };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}
