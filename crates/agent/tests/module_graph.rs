//! The agent's modules import one another without loops.
//!
//! Reads `src/`, takes every file as a module (`a.rs` and `a/mod.rs` are `a`, `a/b.rs` is
//! `a::b`, `lib.rs` is the crate root), and draws an edge from a module to every module its
//! code names: `crate::a::b::…` and `super::…` paths (in `use` lines or inline, including
//! `{…}` groups one level deep), `self::child::…`, and a parent naming a declared child
//! (`child::item`). A path is resolved to the longest module prefix it names; `crate::item`
//! for an item defined in `lib.rs` is an edge to the crate root, so a helper living in the root
//! that the root's own modules call would show up as a loop. Comments and `#[cfg(test)] mod
//! tests` blocks are left out (tests may import anything). The test fails naming the modules of
//! every loop it finds (strongly connected components of more than one module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module path of a source file relative to `src/` (`""` for the crate root).
fn module_of(relative: &Path) -> Option<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop()?;
    let stem = file.strip_suffix(".rs")?;
    match stem {
        "lib" if parts.is_empty() => {}
        "main" if parts.is_empty() => return None, // The binary is another crate.
        "mod" => {}
        _ => parts.push(stem.to_owned()),
    }
    Some(parts.join("::"))
}

fn collect(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, root, out);
        } else if let Some(module) = module_of(path.strip_prefix(root).unwrap()) {
            out.insert(module, std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The code without comments and unit-test modules.
fn code_only(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn join(base: &str, rest: &str) -> String {
    match (base.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_owned(),
        (_, true) => base.to_owned(),
        _ => format!("{base}::{rest}"),
    }
}

/// The longest prefix of `path` (a `::`-separated path from the crate root) that is a module.
fn resolve(path: &str, modules: &BTreeSet<String>) -> String {
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    (0..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|candidate| modules.contains(candidate))
        .unwrap_or_default()
}

/// Paths following `prefix` in `code`: `prefix a::b::c` and `prefix {a::b, c}`.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // Part of a longer path or identifier.
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let item = item.trim();
                let path: String = item.chars().take_while(|c| is_ident(*c)).collect();
                out.push(path);
            }
        } else {
            out.push(rest.chars().take_while(|c| is_ident(*c)).collect());
        }
    }
    out
}

fn build_graph(sources: &BTreeMap<String, String>) -> Graph {
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, text) in sources {
        let code = code_only(text);
        let mut targets = BTreeSet::new();
        for path in paths_after(&code, "crate::") {
            targets.insert(resolve(&path, &modules));
        }
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        for path in paths_after(&code, "super::") {
            // `super::super::x` climbs further.
            let mut base = parent.to_owned();
            let mut path = path.as_str();
            while let Some(rest) = path.strip_prefix("super::") {
                base = base.rsplit_once("::").map_or("", |(p, _)| p).to_owned();
                path = rest;
            }
            targets.insert(resolve(&join(&base, path), &modules));
        }
        for path in paths_after(&code, "self::") {
            targets.insert(resolve(&join(module, &path), &modules));
        }
        // A parent naming its own child module (`child::item`, `pub use child::x`).
        for child in modules.iter().filter_map(|m| {
            let rest = if module.is_empty() {
                m.as_str()
            } else {
                m.strip_prefix(module.as_str())?.strip_prefix("::")?
            };
            (!rest.is_empty() && !rest.contains("::")).then_some(rest)
        }) {
            if !paths_after(&code, &format!("{child}::")).is_empty() {
                targets.insert(join(module, child));
            }
        }
        targets.remove(module);
        graph.insert(module.clone(), targets);
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan).
fn loops(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found
}

#[test]
fn no_import_loops_between_agent_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = BTreeMap::new();
    collect(&src, &src, &mut sources);
    let graph = build_graph(&sources);
    // The checker itself must see the edges that matter.
    assert!(graph["state"].contains("metrics"), "{graph:#?}");
    assert!(
        graph["files::upload"].contains("files::error"),
        "{graph:#?}"
    );
    assert!(graph["control"].contains("state"), "{graph:#?}");
    let found = loops(&graph);
    assert!(
        found.is_empty(),
        "modules importing one another in a loop: {found:?}\n{graph:#?}"
    );
}

#[test]
fn the_checker_finds_loops() {
    let sources = BTreeMap::from([
        (
            String::new(),
            "pub mod a;\npub mod b;\npub fn helper() {}".to_owned(),
        ),
        (
            "a".to_owned(),
            "use crate::b::X;\nfn f() { crate::helper() }".to_owned(),
        ),
        ("b".to_owned(), "pub mod c;\nfn g() { c::h() }".to_owned()),
        (
            "b::c".to_owned(),
            "use super::{X, Y};\n// crate::a in a comment".to_owned(),
        ),
    ]);
    let graph = build_graph(&sources);
    assert_eq!(graph["a"], BTreeSet::from(["b".to_owned(), String::new()]));
    assert_eq!(graph["b"], BTreeSet::from(["b::c".to_owned()]));
    assert_eq!(graph["b::c"], BTreeSet::from(["b".to_owned()]));
    assert_eq!(
        loops(&graph),
        vec![vec!["b".to_owned(), "b::c".to_owned()]],
        "{graph:#?}"
    );
}
