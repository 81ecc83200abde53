//! Reading a crate's sources with `syn`: dropping `#[cfg(test)]` code, finding `mod` items, `use` trees and the paths code refers to (in token streams too: macro bodies).

/// An absolute path inside the crate, as segments from the crate root.
pub(super) type Segs = Vec<String>;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use syn::ext::IdentExt;

use syn::visit_mut::{self, VisitMut};

/// Is this exactly `#[cfg(test)]`?
pub(super) fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string() == "test")
    })
}

pub(super) fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

pub(super) fn impl_item_attrs(item: &syn::ImplItem) -> &[syn::Attribute] {
    match item {
        syn::ImplItem::Const(i) => &i.attrs,
        syn::ImplItem::Fn(i) => &i.attrs,
        syn::ImplItem::Type(i) => &i.attrs,
        syn::ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

pub(super) fn trait_item_attrs(item: &syn::TraitItem) -> &[syn::Attribute] {
    match item {
        syn::TraitItem::Const(i) => &i.attrs,
        syn::TraitItem::Fn(i) => &i.attrs,
        syn::TraitItem::Type(i) => &i.attrs,
        syn::TraitItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

pub(super) fn stmt_is_cfg_test(stmt: &syn::Stmt) -> bool {
    match stmt {
        syn::Stmt::Item(i) => is_cfg_test(item_attrs(i)),
        syn::Stmt::Local(l) => is_cfg_test(&l.attrs),
        syn::Stmt::Macro(m) => is_cfg_test(&m.attrs),
        syn::Stmt::Expr(..) => false,
    }
}

/// Removes everything under `#[cfg(test)]`: items, associated items, statements, fields,
/// variants and match arms.
pub(super) struct DropCfgTest;

impl VisitMut for DropCfgTest {
    fn visit_file_mut(&mut self, f: &mut syn::File) {
        f.items.retain(|i| !is_cfg_test(item_attrs(i)));
        visit_mut::visit_file_mut(self, f);
    }
    fn visit_item_mod_mut(&mut self, m: &mut syn::ItemMod) {
        if let Some((_, items)) = &mut m.content {
            items.retain(|i| !is_cfg_test(item_attrs(i)));
        }
        visit_mut::visit_item_mod_mut(self, m);
    }
    fn visit_item_impl_mut(&mut self, i: &mut syn::ItemImpl) {
        i.items.retain(|x| !is_cfg_test(impl_item_attrs(x)));
        visit_mut::visit_item_impl_mut(self, i);
    }
    fn visit_item_trait_mut(&mut self, t: &mut syn::ItemTrait) {
        t.items.retain(|x| !is_cfg_test(trait_item_attrs(x)));
        visit_mut::visit_item_trait_mut(self, t);
    }
    fn visit_block_mut(&mut self, b: &mut syn::Block) {
        b.stmts.retain(|s| !stmt_is_cfg_test(s));
        visit_mut::visit_block_mut(self, b);
    }
    fn visit_fields_named_mut(&mut self, f: &mut syn::FieldsNamed) {
        f.named = std::mem::take(&mut f.named)
            .into_iter()
            .filter(|x| !is_cfg_test(&x.attrs))
            .collect();
        visit_mut::visit_fields_named_mut(self, f);
    }
    fn visit_item_enum_mut(&mut self, e: &mut syn::ItemEnum) {
        e.variants = std::mem::take(&mut e.variants)
            .into_iter()
            .filter(|x| !is_cfg_test(&x.attrs))
            .collect();
        visit_mut::visit_item_enum_mut(self, e);
    }
    fn visit_expr_match_mut(&mut self, m: &mut syn::ExprMatch) {
        m.arms.retain(|a| !is_cfg_test(&a.attrs));
        visit_mut::visit_expr_match_mut(self, m);
    }
}

/// One leaf of a `use` tree: (segments, alias); `*` is a segment.
pub(super) fn use_leaves(
    tree: &syn::UseTree,
    prefix: &mut Segs,
    out: &mut Vec<(Segs, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.unraw().to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut segs = prefix.clone();
            segs.push(n.ident.unraw().to_string());
            out.push((segs, None));
        }
        syn::UseTree::Rename(r) => {
            let mut segs = prefix.clone();
            segs.push(r.ident.unraw().to_string());
            out.push((segs, Some(r.rename.unraw().to_string())));
        }
        syn::UseTree::Glob(_) => {
            let mut segs = prefix.clone();
            segs.push("*".into());
            out.push((segs, None));
        }
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix, out);
            }
        }
    }
}

pub(super) fn is_pub(vis: &syn::Visibility) -> bool {
    !matches!(vis, syn::Visibility::Inherited)
}

pub(super) fn is_colon(t: &TokenTree, spacing: Option<Spacing>) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == ':' && spacing.is_none_or(|s| p.spacing() == s))
}

/// Paths of two or more segments in a token stream (a macro body or invocation): `a::b`,
/// `$crate::a`, not `::a` and not the tail after generics (`a::<T>::b` yields `a` alone, which
/// is no path).
pub(super) fn token_paths(tokens: TokenStream, out: &mut Vec<(Segs, usize)>) {
    let t: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < t.len() {
        if let TokenTree::Group(g) = &t[i] {
            if g.delimiter() != Delimiter::None || !g.stream().is_empty() {
                token_paths(g.stream(), out);
            }
            i += 1;
            continue;
        }
        let after_colons = i >= 2 && is_colon(&t[i - 1], None) && is_colon(&t[i - 2], None);
        let (first, line, mut j) = match (&t[i], t.get(i + 1)) {
            (TokenTree::Punct(p), Some(TokenTree::Ident(id))) if p.as_char() == '$' => {
                (format!("${id}"), p.span().start().line, i + 2)
            }
            (TokenTree::Ident(id), _) => (id.unraw().to_string(), id.span().start().line, i + 1),
            _ => {
                i += 1;
                continue;
            }
        };
        if after_colons {
            i = j;
            continue;
        }
        let mut segs = vec![first];
        while j + 2 < t.len() && is_colon(&t[j], Some(Spacing::Joint)) && is_colon(&t[j + 1], None)
        {
            let TokenTree::Ident(next) = &t[j + 2] else {
                break;
            };
            segs.push(next.unraw().to_string());
            j += 3;
        }
        if segs.len() >= 2 {
            out.push((segs, line));
        }
        i = j;
    }
}

/// Item names a token stream defines: `fn|struct|enum|trait|type|const|static|union NAME` and
/// `macro_rules! NAME`.
pub(super) fn token_defines(tokens: TokenStream, out: &mut dyn FnMut(String)) {
    let t: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tt) in t.iter().enumerate() {
        match tt {
            TokenTree::Group(g) => token_defines(g.stream(), out),
            TokenTree::Ident(kw) => {
                let kw = kw.to_string();
                let keyword = matches!(
                    kw.as_str(),
                    "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union"
                );
                let name = if keyword {
                    t.get(i + 1)
                } else if kw == "macro_rules"
                    && matches!(t.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == '!')
                {
                    t.get(i + 2)
                } else {
                    None
                };
                if let Some(TokenTree::Ident(name)) = name {
                    out(name.unraw().to_string());
                }
            }
            _ => {}
        }
    }
}
