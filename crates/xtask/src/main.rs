//! Repository checks that are not part of the product, run by `scripts/test.sh` (and by hand
//! through the `cargo xtask` alias in `.cargo/config.toml`):
//!
//! - `cargo xtask module-cycles [CRATES_DIR]`: fails when the modules of a crate import each
//!   other in a loop ([`module_cycles`]).
//! - `cargo xtask test-counts SUITES.tsv`: the per-suite test table at the end of a CI run, and
//!   the rule that no test may be skipped ([`test_counts`]).

mod module_cycles;
mod test_counts;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  module-cycles [CRATES_DIR]   fail on import loops between the modules of a crate
                               (default: the workspace's crates/)
  test-counts SUITES.tsv       tests run per suite; fail on any skipped test or missing report";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let code = match args.as_slice() {
        ["module-cycles"] => module_cycles::main(&workspace_root().join("crates")),
        ["module-cycles", dir] => module_cycles::main(&PathBuf::from(dir)),
        ["test-counts", suites] => test_counts::main(&PathBuf::from(suites)),
        ["help" | "-h" | "--help"] => {
            println!("{USAGE}");
            0
        }
        _ => {
            eprintln!("{USAGE}");
            2
        }
    };
    ExitCode::from(code)
}

/// The workspace root: two levels above this crate's manifest (`crates/xtask`), as `cargo run`
/// says at run time (or as it was at build time).
fn workspace_root() -> PathBuf {
    let here = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    here.ancestors().nth(2).map(PathBuf::from).unwrap_or(here)
}
