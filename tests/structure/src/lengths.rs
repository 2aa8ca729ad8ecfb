//! Files too long before their tests, and production functions too long.

use syn::spanned::Spanned;
use syn::visit::Visit;

use crate::tree::{is_test_attr, SourceFile};
use crate::Finding;

/// The most lines a file may have before its first test item.
pub const MAX_FILE_LINES: usize = 1200;
/// The most lines a production function may have, signature to closing
/// brace.
pub const MAX_FN_LINES: usize = 120;

/// A file's length before its tests: the line before its first test
/// item, or its whole length.
pub fn production_lines(f: &SourceFile) -> usize {
    f.test_ranges.iter().map(|&(a, _)| a.saturating_sub(1)).min().unwrap_or(f.lines.len())
}

/// Every file over [`MAX_FILE_LINES`] and function over [`MAX_FN_LINES`].
pub fn check(files: &[SourceFile]) -> Vec<Finding> {
    let mut out = Vec::new();
    for f in files {
        let n = production_lines(f);
        if n > MAX_FILE_LINES {
            out.push(Finding { key: format!("file-lines {}", f.path), size: n });
        }
        let mut v = Functions { file: f, scope: Vec::new(), found: Vec::new() };
        v.visit_file(&f.ast);
        for (name, lines) in v.found {
            if lines > MAX_FN_LINES {
                out.push(Finding { key: format!("fn-lines {}::{name}", f.path), size: lines });
            }
        }
    }
    out
}

/// Walks a file's functions outside test code, naming each by the type or
/// trait it belongs to.
struct Functions<'a> {
    file: &'a SourceFile,
    scope: Vec<String>,
    found: Vec<(String, usize)>,
}

impl Functions<'_> {
    fn record(&mut self, name: &syn::Ident, attrs: &[syn::Attribute], span: proc_macro2::Span) {
        if is_test_attr(attrs) || self.file.is_test_line(span.start().line) {
            return;
        }
        let mut full = self.scope.clone();
        full.push(name.to_string());
        self.found.push((full.join("::"), span.end().line + 1 - span.start().line));
    }
}

impl<'ast> Visit<'ast> for Functions<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test_attr(&m.attrs) {
            return;
        }
        self.scope.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.scope.pop();
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(&f.sig.ident, &f.attrs, f.span());
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test_attr(&i.attrs) {
            return;
        }
        let ty = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default(),
            _ => "impl".to_string(),
        };
        self.scope.push(ty);
        syn::visit::visit_item_impl(self, i);
        self.scope.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.sig.ident, &f.attrs, f.span());
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.scope.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.scope.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if f.default.is_some() {
            self.record(&f.sig.ident, &f.attrs, f.span());
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}
