//! `cargo xtask module-cycles`: fails when the modules of a crate under `crates/` import each
//! other in a loop.
//!
//! For every crate root (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) it walks the `mod` tree
//! and builds a graph of intra-crate references at the granularity of top-level modules, and one
//! level deeper for directory modules (`a/mod.rs` or `a.rs` + `a/`: node `a::b`). An edge A -> B
//! is any reference from A's code to B: `use crate::b::..`, `use super::..`, `use self::..`,
//! `use b::..` (a child module), or a path such as `crate::b::f()`, `super::X` or `b::f()` in
//! code (macro bodies included), with imported names followed (`use crate::b; b::f()` is an edge
//! to b, or to b::c for a directory module) and re-exports resolved to the module that defines
//! the item (`crate::X` where lib.rs says `pub use b::X` is an edge to b). Not edges: `mod`
//! declarations, a module re-exporting its own descendants (`pub use b::X` in lib.rs),
//! references to itself, comments, doc links and strings, and everything under `#[cfg(test)]`
//! (test modules using `super::*`).
//!
//! Prints every loop (a strongly connected component, with the file:line of each edge in it)
//! and exits 1 if there is one; exits 0 with a one-line summary otherwise.
//!
//! The sources are parsed with `syn` (a file it cannot parse is an error, exit 2); paths are
//! resolved by name, as the compiler would for the cases above, without type information.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use syn::ext::IdentExt;
use syn::visit::{self, Visit};
use syn::visit_mut::VisitMut;

/// Exit status: 0 no loops, 1 a loop, 2 a crate that cannot be read or parsed.
pub fn main(crates_dir: &Path) -> u8 {
    match run(crates_dir) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("module-cycles: {e}");
            2
        }
    }
}

/// Checks every crate root under `crates_dir`; `Ok(true)` when there is no loop.
fn run(crates_dir: &Path) -> Result<bool, String> {
    let mut crate_dirs: Vec<PathBuf> = std::fs::read_dir(crates_dir)
        .map_err(|e| format!("{}: {e}", crates_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    crate_dirs.sort();
    let shown_from = crates_dir.parent().unwrap_or(Path::new(""));
    let (mut found, mut roots) = (0, 0);
    for crate_dir in crate_dirs {
        for root_file in crate_roots(&crate_dir.join("src")) {
            roots += 1;
            let rel = root_file.strip_prefix(&crate_dir).unwrap_or(&root_file);
            let dir_name = crate_dir.file_name().unwrap_or_default().to_string_lossy();
            let label = format!("{dir_name} ({})", rel.display());
            let krate = Crate::load(&root_file)?;
            let edges = krate.edges();
            for comp in cycles(&edges) {
                found += 1;
                println!("{label}: import loop between {}", comp.join(", "));
                let members: HashSet<&String> = comp.iter().collect();
                for ((a, b), (file, line)) in &edges {
                    if members.contains(a) && members.contains(b) {
                        let file = file.strip_prefix(shown_from).unwrap_or(file);
                        println!("    {a} -> {b}    ({}:{line})", file.display());
                    }
                }
            }
        }
    }
    if found > 0 {
        println!(
            "{found} import loop(s) in {roots} crate roots: move what both sides need into a leaf module"
        );
        return Ok(false);
    }
    println!("no import loops between the modules of {roots} crate roots");
    Ok(true)
}

/// `src/lib.rs`, `src/main.rs` and `src/bin/*.rs`, those that exist, in that order.
fn crate_roots(src: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [src.join("lib.rs"), src.join("main.rs")]
        .into_iter()
        .filter(|f| f.exists())
        .collect();
    if let Ok(rd) = std::fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs") && p.is_file())
            .collect();
        bins.sort();
        files.extend(bins);
    }
    files
}

type ModId = usize;

struct Module {
    path: Segs,
    /// The file the module's code is in (its own, or the file of an inline module).
    file: PathBuf,
    /// Owns a directory of child files (`mod.rs`, or `a.rs` + `a/`).
    is_dir: bool,
    /// Child modules (file or inline), in declaration order.
    children: Vec<(String, ModId)>,
    /// `pub use` names: name -> absolute path.
    reexports: HashMap<String, Segs>,
    /// `pub use x::*`: absolute paths of x.
    globs: Vec<Segs>,
    /// Items defined in the module's code (fn, struct, enum, trait, type, const, static, union,
    /// macro_rules), methods and associated items included.
    defines: HashSet<String>,
    /// Names imported by `use` in this module: name -> absolute path.
    aliases: HashMap<String, Segs>,
}

struct Crate {
    modules: Vec<Module>,
    /// The parsed file of each file module (not inline ones), `#[cfg(test)]` items removed.
    files: HashMap<ModId, syn::File>,
}

const ROOT: ModId = 0;

impl Crate {
    fn load(root_file: &Path) -> Result<Crate, String> {
        let mut c = Crate {
            modules: Vec::new(),
            files: HashMap::new(),
        };
        c.load_file(Vec::new(), root_file, true)?;
        c.collect();
        Ok(c)
    }

    fn new_module(&mut self, path: Segs, file: &Path, is_dir: bool) -> ModId {
        self.modules.push(Module {
            path,
            file: file.to_path_buf(),
            is_dir,
            children: Vec::new(),
            reexports: HashMap::new(),
            globs: Vec::new(),
            defines: HashSet::new(),
            aliases: HashMap::new(),
        });
        self.modules.len() - 1
    }

    /// Parses `file` as the module at `path` and loads its `mod` tree.
    fn load_file(&mut self, path: Segs, file: &Path, owns_dir: bool) -> Result<ModId, String> {
        let src = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut ast = syn::parse_file(&src).map_err(|e| {
            let at = e.span().start();
            format!("{}:{}:{}: {e}", file.display(), at.line, at.column + 1)
        })?;
        DropCfgTest.visit_file_mut(&mut ast);
        let id = self.new_module(path, file, false);
        let dir = file.parent().unwrap_or(Path::new(""));
        let base = if owns_dir {
            dir.to_path_buf()
        } else {
            dir.join(file.file_stem().unwrap_or_default())
        };
        let mut finder = ModFinder::default();
        finder.visit_file(&ast);
        self.load_mods(id, &finder.found, &base, file)?;
        self.files.insert(id, ast);
        Ok(id)
    }

    /// Adds the modules declared in `parent`'s code: files next to it (`base/x.rs`,
    /// `base/x/mod.rs`) and inline `mod x { }`, recursively.
    fn load_mods(
        &mut self,
        parent: ModId,
        mods: &[&syn::ItemMod],
        base: &Path,
        file: &Path,
    ) -> Result<(), String> {
        for m in mods {
            let name = m.ident.unraw().to_string();
            let mut path = self.modules[parent].path.clone();
            path.push(name.clone());
            match &m.content {
                None => {
                    let candidates = [
                        (base.join(format!("{name}.rs")), false),
                        (base.join(&name).join("mod.rs"), true),
                    ];
                    let Some((cand, owns)) = candidates.into_iter().find(|(c, _)| c.exists())
                    else {
                        continue;
                    };
                    let child = self.load_file(path, &cand, owns)?;
                    self.modules[child].is_dir = owns || base.join(&name).is_dir();
                    self.modules[parent].children.push((name, child));
                }
                Some((_, items)) => {
                    let child = self.new_module(path, file, false);
                    self.modules[parent].children.push((name.clone(), child));
                    let mut finder = ModFinder::default();
                    for item in items {
                        finder.visit_item(item);
                    }
                    self.load_mods(child, &finder.found, &base.join(&name), file)?;
                }
            }
        }
        Ok(())
    }

    fn child(&self, m: ModId, name: &str) -> Option<ModId> {
        self.modules[m]
            .children
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| *c)
    }

    /// Every module, depth first in declaration order.
    fn modules_dfs(&self) -> Vec<ModId> {
        let mut out = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(m) = stack.pop() {
            out.push(m);
            stack.extend(self.modules[m].children.iter().rev().map(|(_, c)| *c));
        }
        out
    }

    /// The file modules, depth first.
    fn file_modules(&self) -> Vec<ModId> {
        self.modules_dfs()
            .into_iter()
            .filter(|m| self.files.contains_key(m))
            .collect()
    }

    fn module(&self, path: &[String]) -> Option<ModId> {
        let mut m = ROOT;
        for seg in path {
            m = self.child(m, seg)?;
        }
        Some(m)
    }

    /// Absolute segments for a path written in `scope`, or None if it leads outside the crate.
    fn absolute(
        &self,
        scope: ModId,
        segs: &[String],
        aliases: Option<&HashMap<String, Segs>>,
    ) -> Option<Segs> {
        let first = segs.first()?.as_str();
        if first == "crate" || first == "$crate" {
            return Some(segs[1..].to_vec());
        }
        if first == "super" || first == "self" {
            let mut path = self.modules[scope].path.clone();
            let mut rest = segs;
            while let Some(s) = rest.first().filter(|s| *s == "super" || *s == "self") {
                if s == "super" {
                    path.pop();
                }
                rest = &rest[1..];
            }
            path.extend(rest.iter().cloned());
            return Some(path);
        }
        if self.child(scope, first).is_some() {
            let mut path = self.modules[scope].path.clone();
            path.extend(segs.iter().cloned());
            return Some(path);
        }
        let target = aliases?.get(first)?;
        let mut path = target.clone();
        path.extend(segs[1..].iter().cloned());
        Some(path)
    }

    /// Fills each module's imports, re-exports and definitions.
    fn collect(&mut self) {
        for fm in self.file_modules() {
            let mut c = Collector {
                krate: self,
                scopes: vec![fm],
                uses: Vec::new(),
                defines: Vec::new(),
            };
            c.visit_file(&self.files[&fm]);
            let (uses, defines) = (c.uses, c.defines);
            for (scope, segs, alias, is_pub) in uses {
                let Some(abs) = self.absolute(scope, &segs, None) else {
                    continue;
                };
                if abs.last().is_some_and(|s| s == "*") {
                    if is_pub {
                        self.modules[scope]
                            .globs
                            .push(abs[..abs.len() - 1].to_vec());
                    }
                    continue;
                }
                let name = alias.or_else(|| segs.last().cloned()).unwrap_or_default();
                if is_pub {
                    self.modules[scope]
                        .reexports
                        .insert(name.clone(), abs.clone());
                }
                self.modules[scope].aliases.insert(name, abs);
            }
            for (scope, name) in defines {
                self.modules[scope].defines.insert(name);
            }
        }
    }

    /// The module that defines what the absolute path names: re-exports (`pub use`, globs
    /// included) are followed to where the item is.
    fn resolve(&self, abs: &[String], depth: usize) -> ModId {
        let mut m = ROOT;
        for (i, seg) in abs.iter().enumerate() {
            if let Some(c) = self.child(m, seg) {
                m = c;
                continue;
            }
            let module = &self.modules[m];
            if depth < 16 && !module.defines.contains(seg) {
                if let Some(target) = module.reexports.get(seg) {
                    let mut p = target.clone();
                    p.extend(abs[i + 1..].iter().cloned());
                    return self.resolve(&p, depth + 1);
                }
                for g in &module.globs {
                    let mut p = g.clone();
                    p.extend(abs[i..].iter().cloned());
                    let target = self.resolve(&p, depth + 1);
                    if Some(target) != self.module(g) || self.modules[target].defines.contains(seg)
                    {
                        return target;
                    }
                }
            }
            break;
        }
        m
    }

    /// The graph node a module belongs to: the root (`lib`, `main`, the bin's name), a
    /// top-level module, or one level deeper under a directory module.
    fn node(&self, m: ModId) -> String {
        let path = &self.modules[m].path;
        if path.is_empty() {
            let file = &self.modules[ROOT].file;
            return file
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
        }
        let top = self.module(&path[..1]).map(|t| self.modules[t].is_dir);
        if top == Some(true) && path.len() > 1 {
            return path[..2].join("::");
        }
        path[0].clone()
    }

    fn add(&self, edges: &mut Edges, r: &Reference, target: ModId) {
        let (a, b) = (self.node(r.scope), self.node(target));
        if a == b {
            return;
        }
        // A module re-exporting its own descendants is not a dependency of its code.
        let scope_path = &self.modules[r.scope].path;
        if r.reexport && self.modules[target].path.starts_with(scope_path) {
            return;
        }
        let file = self.modules[r.scope].file.clone();
        edges.entry((a, b)).or_insert((file, r.line));
    }

    /// The graph: per file module (depth first), its `use` declarations, then the paths in its
    /// code, each in source order (the first reference of an edge is the one shown).
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for fm in self.file_modules() {
            let mut refs = RefFinder {
                krate: self,
                scopes: vec![fm],
                uses_only: true,
                found: Vec::new(),
            };
            refs.visit_file(&self.files[&fm]);
            refs.uses_only = false;
            refs.scopes = vec![fm];
            refs.visit_file(&self.files[&fm]);
            for r in refs.found {
                if r.is_use {
                    let mut segs = r.segs.clone();
                    if segs.last().is_some_and(|s| s == "self") {
                        segs.pop();
                    }
                    if segs.is_empty() {
                        continue;
                    }
                    let Some(mut abs) = self.absolute(r.scope, &segs, None) else {
                        continue;
                    };
                    let glob = abs.last().is_some_and(|s| s == "*");
                    if glob {
                        abs.pop();
                    }
                    let target = self.resolve(&abs, 0);
                    // `use crate::a;` (a module) only names it: its uses in code are the edges.
                    if !glob && self.modules[target].path == abs && !r.reexport {
                        continue;
                    }
                    self.add(&mut edges, &r, target);
                } else {
                    let aliases = &self.modules[r.scope].aliases;
                    let Some(abs) = self.absolute(r.scope, &r.segs, Some(aliases)) else {
                        continue;
                    };
                    self.add(&mut edges, &r, self.resolve(&abs, 0));
                }
            }
        }
        edges
    }
}

mod scc;
mod syntax;

use scc::{Edges, cycles};
use syntax::*;

#[cfg(test)]
mod tests;

/// The `mod` declarations of one module's code (in function bodies too), not those inside
/// them (their own modules load them).
#[derive(Default)]
struct ModFinder<'a> {
    found: Vec<&'a syn::ItemMod>,
}

impl<'a> Visit<'a> for ModFinder<'a> {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        self.found.push(m);
    }
}

/// Enters and leaves inline modules, so the visitor knows whose code it is in.
fn in_inline_mod<'a, V: Visit<'a>>(
    v: &mut V,
    krate: &Crate,
    scopes: impl Fn(&mut V) -> &mut Vec<ModId>,
    m: &'a syn::ItemMod,
) {
    let Some((_, items)) = &m.content else {
        return;
    };
    let current = *scopes(v).last().expect("a scope");
    let Some(child) = krate.child(current, &m.ident.unraw().to_string()) else {
        return;
    };
    scopes(v).push(child);
    for item in items {
        v.visit_item(item);
    }
    scopes(v).pop();
}

/// Gathers, per module, its `use` leaves and the names of the items it defines.
struct Collector<'k> {
    krate: &'k Crate,
    scopes: Vec<ModId>,
    /// (scope, segments with a trailing `self` dropped, alias, is `pub`)
    uses: Vec<(ModId, Segs, Option<String>, bool)>,
    defines: Vec<(ModId, String)>,
}

impl Collector<'_> {
    fn scope(&self) -> ModId {
        *self.scopes.last().expect("a scope")
    }
    fn define(&mut self, ident: &syn::Ident) {
        self.defines.push((self.scope(), ident.unraw().to_string()));
    }
}

impl<'a> Visit<'a> for Collector<'_> {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        let krate = self.krate;
        in_inline_mod(self, krate, |v| &mut v.scopes, m);
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut leaves = Vec::new();
        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for (mut segs, alias) in leaves {
            if segs.last().is_some_and(|s| s == "self") {
                segs.pop();
            }
            if !segs.is_empty() {
                self.uses.push((self.scope(), segs, alias, is_pub(&u.vis)));
            }
        }
    }
    fn visit_item_fn(&mut self, i: &'a syn::ItemFn) {
        self.define(&i.sig.ident);
        visit::visit_item_fn(self, i);
    }
    fn visit_item_struct(&mut self, i: &'a syn::ItemStruct) {
        self.define(&i.ident);
        visit::visit_item_struct(self, i);
    }
    fn visit_item_enum(&mut self, i: &'a syn::ItemEnum) {
        self.define(&i.ident);
        visit::visit_item_enum(self, i);
    }
    fn visit_item_union(&mut self, i: &'a syn::ItemUnion) {
        self.define(&i.ident);
        visit::visit_item_union(self, i);
    }
    fn visit_item_trait(&mut self, i: &'a syn::ItemTrait) {
        self.define(&i.ident);
        visit::visit_item_trait(self, i);
    }
    fn visit_item_trait_alias(&mut self, i: &'a syn::ItemTraitAlias) {
        self.define(&i.ident);
        visit::visit_item_trait_alias(self, i);
    }
    fn visit_item_type(&mut self, i: &'a syn::ItemType) {
        self.define(&i.ident);
        visit::visit_item_type(self, i);
    }
    fn visit_item_const(&mut self, i: &'a syn::ItemConst) {
        self.define(&i.ident);
        visit::visit_item_const(self, i);
    }
    fn visit_item_static(&mut self, i: &'a syn::ItemStatic) {
        self.define(&i.ident);
        visit::visit_item_static(self, i);
    }
    fn visit_item_macro(&mut self, i: &'a syn::ItemMacro) {
        if let Some(ident) = &i.ident {
            self.define(ident);
        }
        visit::visit_item_macro(self, i);
    }
    fn visit_impl_item_fn(&mut self, i: &'a syn::ImplItemFn) {
        self.define(&i.sig.ident);
        visit::visit_impl_item_fn(self, i);
    }
    fn visit_impl_item_const(&mut self, i: &'a syn::ImplItemConst) {
        self.define(&i.ident);
        visit::visit_impl_item_const(self, i);
    }
    fn visit_impl_item_type(&mut self, i: &'a syn::ImplItemType) {
        self.define(&i.ident);
        visit::visit_impl_item_type(self, i);
    }
    fn visit_trait_item_fn(&mut self, i: &'a syn::TraitItemFn) {
        self.define(&i.sig.ident);
        visit::visit_trait_item_fn(self, i);
    }
    fn visit_trait_item_const(&mut self, i: &'a syn::TraitItemConst) {
        self.define(&i.ident);
        visit::visit_trait_item_const(self, i);
    }
    fn visit_trait_item_type(&mut self, i: &'a syn::TraitItemType) {
        self.define(&i.ident);
        visit::visit_trait_item_type(self, i);
    }
    fn visit_foreign_item_fn(&mut self, i: &'a syn::ForeignItemFn) {
        self.define(&i.sig.ident);
        visit::visit_foreign_item_fn(self, i);
    }
    fn visit_foreign_item_static(&mut self, i: &'a syn::ForeignItemStatic) {
        self.define(&i.ident);
        visit::visit_foreign_item_static(self, i);
    }
    fn visit_foreign_item_type(&mut self, i: &'a syn::ForeignItemType) {
        self.define(&i.ident);
        visit::visit_foreign_item_type(self, i);
    }
    fn visit_macro(&mut self, m: &'a syn::Macro) {
        // Items a macro invocation or a macro_rules body spells out (`fn name`, `struct Name`).
        let scope = self.scope();
        token_defines(m.tokens.clone(), &mut |name| {
            self.defines.push((scope, name))
        });
        visit::visit_macro(self, m);
    }
}

/// One reference from a module's code: a `use` leaf or a path of two or more segments.
struct Reference {
    scope: ModId,
    segs: Segs,
    line: usize,
    is_use: bool,
    /// A `pub use` (a re-export).
    reexport: bool,
}

/// The references of one file, in source order: with `uses_only`, its `use` declarations;
/// without, the paths in its code (outside `use` declarations, inside macro bodies too).
struct RefFinder<'k> {
    krate: &'k Crate,
    scopes: Vec<ModId>,
    uses_only: bool,
    found: Vec<Reference>,
}

impl RefFinder<'_> {
    fn scope(&self) -> ModId {
        *self.scopes.last().expect("a scope")
    }
    fn path(&mut self, segs: Segs, line: usize) {
        if !self.uses_only && segs.len() >= 2 {
            self.found.push(Reference {
                scope: self.scope(),
                segs,
                line,
                is_use: false,
                reexport: false,
            });
        }
    }
}

impl<'a> Visit<'a> for RefFinder<'_> {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        let krate = self.krate;
        in_inline_mod(self, krate, |v| &mut v.scopes, m);
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        if !self.uses_only {
            return;
        }
        let line = match &u.vis {
            syn::Visibility::Inherited => u.use_token.span.start().line,
            syn::Visibility::Public(p) => p.span.start().line,
            syn::Visibility::Restricted(r) => r.pub_token.span.start().line,
        };
        let mut leaves = Vec::new();
        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for (segs, _) in leaves {
            self.found.push(Reference {
                scope: self.scope(),
                segs,
                line,
                is_use: true,
                reexport: is_pub(&u.vis),
            });
        }
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        if p.leading_colon.is_none() {
            let segs = p
                .segments
                .iter()
                .map(|s| s.ident.unraw().to_string())
                .collect();
            let line = p
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.path(segs, line);
        }
        visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'a syn::Macro) {
        visit::visit_macro(self, m);
        if !self.uses_only {
            let mut paths = Vec::new();
            token_paths(m.tokens.clone(), &mut paths);
            for (segs, line) in paths {
                self.path(segs, line);
            }
        }
    }
    fn visit_meta_list(&mut self, l: &'a syn::MetaList) {
        visit::visit_meta_list(self, l);
        if !self.uses_only {
            let mut paths = Vec::new();
            token_paths(l.tokens.clone(), &mut paths);
            for (segs, line) in paths {
                self.path(segs, line);
            }
        }
    }
}
