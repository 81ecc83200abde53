//! Embeds every file under `interpreter/` (the code-interpreter template's assets) into the
//! library with `include_bytes!`, so an installed binary carries them. New files are picked up
//! without code changes: cargo re-runs this script when anything in the directory changes.
//! Test code (`tests/` directories), caches and dotfiles are left out of the image.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let dir = manifest.join("interpreter");
    println!("cargo:rerun-if-changed=interpreter");
    let mut files = Vec::new();
    if dir.is_dir() {
        collect(&dir, &dir, &mut files);
    }
    files.sort();
    let mut out = String::from(
        "/// (path relative to `interpreter/`, contents), sorted by path.\n\
         pub(crate) static INTERPRETER_ASSETS: &[(&str, &[u8])] = &[\n",
    );
    for (rel, abs) in &files {
        // Debug formatting gives valid Rust string literals for any path.
        writeln!(
            out,
            "    ({rel:?}, include_bytes!({:?})),",
            abs.display().to_string()
        )
        .expect("write to a String");
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"))
        .join("interpreter_assets.rs");
    std::fs::write(dest, out).expect("write interpreter_assets.rs");
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.')
            || name == "__pycache__"
            || name == "tests"
            || name.ends_with(".pyc")
        {
            continue;
        }
        let path = e.path();
        let ft = e
            .file_type()
            .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
        if ft.is_dir() {
            collect(root, &path, out);
        } else if ft.is_file() {
            let rel = path
                .strip_prefix(root)
                .expect("below the root")
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, path));
        }
    }
}
