//! The loop finder on small crates written to a temporary directory.

use super::*;

/// A crate tree in a temporary directory: (relative path, source) pairs.
fn tree(files: &[(&str, &str)]) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("xtask-cycles-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, src) in files {
        let p = dir.join("crates/k").join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, src).unwrap();
    }
    std::fs::write(dir.join("crates/k/Cargo.toml"), "").unwrap();
    dir
}

fn edges_of(files: &[(&str, &str)]) -> Vec<(String, String)> {
    let dir = tree(files);
    let k = Crate::load(&dir.join("crates/k/src/lib.rs")).unwrap();
    let e = k.edges().into_keys().collect();
    std::fs::remove_dir_all(dir).unwrap();
    e
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[test]
fn a_loop_between_two_modules_fails_and_a_leaf_passes() {
    let looped = tree(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        (
            "src/b.rs",
            "pub struct B;\nfn f() -> crate::a::A { todo!() }\n",
        ),
    ]);
    assert!(!run(&looped.join("crates")).unwrap());
    std::fs::remove_dir_all(looped).unwrap();
    let leaf = tree(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        ("src/b.rs", "pub struct B;\n"),
    ]);
    assert!(run(&leaf.join("crates")).unwrap());
    std::fs::remove_dir_all(leaf).unwrap();
}

#[test]
fn naming_a_module_is_no_edge_but_using_it_is() {
    let e = edges_of(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b;\n"),
        ("src/b.rs", "pub fn f() {}\n"),
    ]);
    assert!(e.is_empty(), "{e:?}");
    let e = edges_of(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b;\nfn g() { b::f() }\n"),
        ("src/b.rs", "pub fn f() {}\n"),
    ]);
    assert_eq!(e, vec![pair("a", "b")]);
}

#[test]
fn reexports_resolve_to_the_defining_module() {
    let e = edges_of(&[
        ("src/lib.rs", "mod a;\nmod b;\npub use b::B;\n"),
        ("src/a.rs", "fn f(_: crate::B) {}\n"),
        ("src/b.rs", "pub struct B;\n"),
    ]);
    assert_eq!(e, vec![pair("a", "b")]);
    let e = edges_of(&[
        ("src/lib.rs", "mod a;\nmod b;\npub use b::*;\n"),
        ("src/a.rs", "fn f(_: crate::B) {}\n"),
        ("src/b.rs", "pub struct B;\n"),
    ]);
    assert_eq!(e, vec![pair("a", "b")]);
}

#[test]
fn directory_modules_are_split_one_level_deeper() {
    let e = edges_of(&[
        ("src/lib.rs", "mod d;\n"),
        ("src/d/mod.rs", "mod x;\nmod y;\n"),
        ("src/d/x.rs", "use super::y::Y;\n"),
        ("src/d/y.rs", "pub struct Y;\n"),
    ]);
    assert_eq!(e, vec![pair("d::x", "d::y")]);
}

#[test]
fn tests_comments_strings_and_macro_bodies() {
    let e = edges_of(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "// crate::b::f()\nconst S: &str = \"crate::b::f\";\n\
             #[cfg(test)]\nmod tests { use crate::b::f; }\n",
        ),
        (
            "src/b.rs",
            "pub fn f() { println!(\"{}\", crate::a::S); }\n",
        ),
    ]);
    assert_eq!(e, vec![pair("b", "a")]);
}
