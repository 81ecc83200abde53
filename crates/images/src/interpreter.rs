//! The `code-interpreter-v1` template: `base` plus Jupyter kernels for Python (ipykernel with the
//! Bulkhead startup module), JavaScript/TypeScript (Deno's Jupyter kernel), Bash (bash_kernel),
//! SQL (DuckDB through an ipykernel), R (Debian's IRkernel) and Java (JJava, a JShell kernel),
//! and `/opt/bulkhead/interpreter/kernels.json`, which tells the agent how to start each kernel.
//!
//! Java: JJava (PyPI `jjava`, the maintained fork of IJava) is a Jupyter kernel built on the
//! JDK's `jdk.jshell` API; its wheel carries the kernel jar, so nothing comes from GitHub. We run
//! its jar directly rather than through its launcher jar (which only starts a second JVM with
//! the same `--add-opens`): one JVM per Java context instead of two.
//!
//! Why Deno and not tslab for JavaScript/TypeScript: both install from npm without GitHub, but
//! tslab prints the last expression with `console.log` (no `execute_result`, so E2B's
//! `result.text` stays empty), refuses to run cells with type errors (even in `--js` mode, it
//! compiles with `checkJs`), and aborts requests that arrive within 200 ms of an error. Deno's
//! kernel strips types without checking them, answers with `execute_result`, supports top-level
//! await, `npm:` imports and `Symbol.for("Jupyter.display")`, like E2B's JavaScript runtime.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::recipe::{BuildStep, FileAsset};

include!(concat!(env!("OUT_DIR"), "/interpreter_assets.rs"));

/// Template id the E2B code-interpreter SDKs ask for by default.
pub const TEMPLATE_ID: &str = "code-interpreter-v1";

/// Where the assets land in the tree (`interpreter/<rel>` → `<dir>/<rel>`).
pub const INTERPRETER_DIR: &str = "/opt/bulkhead/interpreter";
/// The kernel table the agent reads at start.
pub const KERNELS_JSON: &str = "/opt/bulkhead/interpreter/kernels.json";

const PYTHON: &str = "/usr/bin/python3";
const DENO: &str = "/usr/local/bin/deno";
const R: &str = "/usr/bin/R";
const JAVA: &str = "/usr/bin/java";
/// Where pip puts the `jjava` wheel's kernel directory (its `data` scheme is `/usr/local`).
const JJAVA_JAR: &str = "/usr/local/share/jupyter/kernels/java/jjava.jar";
pub(crate) const STARTUP: &str = "/opt/bulkhead/interpreter/python/bulkhead_startup.py";
const SQL_STARTUP: &str = "/opt/bulkhead/interpreter/python/bulkhead_sql.py";

/// PyPI packages, each pinned, including every dependency, so one recipe hash always yields
/// the same tree. Resolved for CPython 3.11 (bookworm) on manylinux wheels.
const PIP_PACKAGES: &[&str] = &[
    // What the template promises.
    "ipykernel==7.4.0",
    // Pins for code written by LLMs against the APIs they were trained on: matplotlib 3.10
    // takes both `boxplot(labels=...)` (removed in 3.11) and `tick_labels=` (new in 3.9);
    // pandas 2.3 keeps `df[c].fillna(v, inplace=True)` and chained assignment working, which
    // pandas 3's copy-on-write turns into silent no-ops; numpy 2.3 is what pandas 2.3 was
    // released against.
    "numpy==2.3.5",
    "pandas==2.3.3",
    "matplotlib==3.10.9",
    "scipy==1.17.1",
    "seaborn==0.13.2",
    "openpyxl==3.1.5",
    "pillow==13.0.0",
    "requests==2.34.2",
    "orjson==3.13.0",
    "bash_kernel==0.10.0",
    "duckdb==2.0.0",
    "jjava==1.0a8",
    // Their dependencies.
    "asttokens==3.0.2",
    "certifi==2026.10.18",
    "charset_normalizer==3.5.2",
    "comm==0.2.3",
    "contourpy==1.3.3",
    "cycler==0.12.1",
    "debugpy==1.8.22",
    "et-xmlfile==2.0.0",
    "executing==2.3.0",
    "filetype==1.2.0",
    "fonttools==4.68.0",
    "idna==3.20",
    "ipython==9.18.1",
    "ipython-pygments-lexers==1.1.1",
    "jedi==0.20.1",
    "jupyter-client==8.10.0",
    "jupyter-core==5.9.1",
    "kiwisolver==1.5.1",
    "matplotlib-inline==0.2.2",
    "nest-asyncio2==1.7.4",
    "packaging==26.3",
    "parso==0.8.7",
    "pexpect==4.9.0",
    "platformdirs==4.14.7",
    "prompt_toolkit==3.0.53",
    "psutil==7.2.2",
    "ptyprocess==0.7.0",
    "pure-eval==0.2.4",
    "pygments==2.21.0",
    "pyparsing==3.3.3",
    "python-dateutil==4.0.0",
    // DuckDB needs pytz to hand TIMESTAMPTZ values to Python (pandas 2.3 depends on it too).
    "pytz==2026.6",
    "pyzmq==27.3.0",
    "stack_data==0.6.3",
    "tornado==6.6.1",
    "traitlets==5.16.1",
    "typing_extensions==4.16.0",
    "tzdata==2026.6",
    "urllib3==2.8.0",
    "wcwidth==0.9.4",
];

/// Debian packages for the R and Java kernels: R with IRkernel (and its R dependencies) and the
/// JDK, whose `jdk.jshell` module JJava runs on (a JRE lacks it). Without recommends: R's would
/// pull in a compiler toolchain and X11 fonts, the JDK's the desktop libraries.
const APT_PACKAGES: &[&str] = &["openjdk-17-jdk-headless", "r-base-core", "r-cran-irkernel"];

/// (The JRE's postinst links its man pages into `/usr/share/man/man1`, which the minbase tree
/// does not have.)
fn apt_install_script() -> String {
    format!(
        "echo 'apt-get install {pkgs}'\n\
         mkdir -p /usr/share/man/man1\n\
         apt-get update -qq\n\
         apt-get install -y -qq --no-install-recommends {pkgs}\n\
         apt-get clean\n\
         rm -rf /var/lib/apt/lists/*",
        pkgs = APT_PACKAGES.join(" ")
    )
}

/// npm packages installed globally. `deno` ships its binary in the pinned optional dependency
/// `@deno/linux-x64-glibc` (or arm64), so nothing is downloaded from GitHub.
const NPM_PACKAGES: &[&str] = &["deno@2.9.6"];

/// matplotlib builds its font cache on first import (seconds); do it once at build time in the
/// sandbox user's cache so the first chart is fast. Also checks that every promised module
/// imports, so a broken wheel fails the build rather than the first `run_code`.
const WARM_UP: &str = "setpriv --reuid=1000 --regid=1000 --clear-groups \
    env HOME=/home/user MPLBACKEND=agg python3 -c \
    'import matplotlib.pyplot, numpy, pandas, scipy, seaborn, openpyxl, PIL, requests, orjson, \
    duckdb, ipykernel, bash_kernel; print(\"python modules import\")' && \
    deno --version && \
    test -f /usr/local/share/jupyter/kernels/java/jjava.jar && java -version && \
    Rscript -e 'library(IRkernel); cat(\"IRkernel loads\\n\")'";

#[derive(Serialize)]
struct KernelsFile {
    version: u32,
    default_contexts: [&'static str; 2],
    languages: BTreeMap<&'static str, Kernel>,
}

#[derive(Serialize)]
struct Kernel {
    argv: Vec<String>,
    env: BTreeMap<&'static str, &'static str>,
    aliases: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warmup: Option<&'static str>,
    /// `message` for kernels that want `interrupt_request` rather than SIGINT (JJava, as its
    /// kernelspec says).
    #[serde(skip_serializing_if = "Option::is_none")]
    interrupt_mode: Option<&'static str>,
    /// The language's default context is listed from the start but its kernel starts on first
    /// use (see the Deno entries).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    start_lazily: bool,
}

/// Deno kernels speak ESM, where `require` is undefined; code written for Node (and for E2B's
/// Node kernel) calls `require('fs')`. The agent runs this as each JS/TS kernel's warm-up cell.
const DENO_WARMUP: &str =
    "globalThis.require = (await import(\"node:module\")).createRequire(\"/home/user/\");";

/// JShell compiles every cell; the C1 compiler alone starts the JVM faster and keeps its code
/// cache small, and the serial collector has the smallest footprint for one small heap.
/// `java.util` is opened so the agent can set environment variables in the running kernel
/// (`System.getenv` is otherwise read-only); `jdk.jshell` as JJava's launcher would.
const JAVA_OPTIONS: &[&str] = &[
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "--add-opens",
    "jdk.jshell/jdk.jshell=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.util=ALL-UNNAMED",
];

/// `--IPKernelApp.exec_files=['a', 'b']`: traitlets parses the value as a Python list literal.
fn exec_files_flag(files: &[&str]) -> String {
    let items: Vec<String> = files.iter().map(|f| format!("'{f}'")).collect();
    format!("--IPKernelApp.exec_files=[{}]", items.join(", "))
}

/// IPython keeps its history in memory, not in `~/.ipython/.../history.sqlite`: a SQLite
/// database open when a warm sandbox is checkpointed turns read-only in every pool clone (the
/// copied file has a new inode), and the kernel then reports "The history saving thread hit an
/// unexpected error" on the first cell. `_ih`, `%history` and `In`/`Out` work as before; only
/// history across kernel restarts (`%history -g`) is lost.
const IN_MEMORY_HISTORY: &str = "--HistoryManager.hist_file=:memory:";

fn ipykernel_argv(exec_files: &[&str]) -> Vec<String> {
    [
        PYTHON,
        "-m",
        "ipykernel_launcher",
        "-f",
        "{connection_file}",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([exec_files_flag(exec_files), IN_MEMORY_HISTORY.to_owned()])
    .collect()
}

/// The contents of `kernels.json` (see the interpreter contract).
pub fn kernels_json() -> String {
    let deno_argv: Vec<String> = [DENO, "jupyter", "--kernel", "--conn", "{connection_file}"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Deno colours its `text/plain` results unless told not to.
    let deno_env = BTreeMap::from([("NO_COLOR", "1"), ("DENO_NO_UPDATE_CHECK", "1")]);
    let languages = BTreeMap::from([
        (
            "python",
            Kernel {
                argv: ipykernel_argv(&[STARTUP]),
                env: BTreeMap::from([("MPLBACKEND", "module://matplotlib_inline.backend_inline")]),
                aliases: vec![],
                warmup: None,
                interrupt_mode: None,
                start_lazily: false,
            },
        ),
        (
            "javascript",
            Kernel {
                argv: deno_argv.clone(),
                env: deno_env.clone(),
                aliases: vec!["js"],
                warmup: Some(DENO_WARMUP),
                // Deno starts on first use: V8's `Math.random` cannot be re-seeded from
                // JavaScript, so a Deno kernel in a heavy template's warm checkpoint would draw
                // the same numbers in every pool clone; and a create should not pay ~0.3 s of
                // CPU for a kernel most sandboxes never use.
                interrupt_mode: None,
                start_lazily: true,
            },
        ),
        (
            "typescript",
            Kernel {
                argv: deno_argv,
                env: deno_env,
                aliases: vec!["ts"],
                warmup: Some(DENO_WARMUP),
                interrupt_mode: None,
                start_lazily: true,
            },
        ),
        (
            "r",
            Kernel {
                argv: [
                    R,
                    "--no-echo",
                    "--no-save",
                    "--no-restore",
                    "-e",
                    "IRkernel::main()",
                    "--args",
                    "{connection_file}",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                env: BTreeMap::new(),
                aliases: vec![],
                warmup: None,
                // R and Java kernels (~60 and ~100 MiB) start with a context's first use, never
                // with the sandbox, so they cost nothing to the many sandboxes that never use
                // them and are never in a pool's checkpoint.
                interrupt_mode: None,
                start_lazily: true,
            },
        ),
        (
            "java",
            Kernel {
                argv: std::iter::once(JAVA)
                    .chain(JAVA_OPTIONS.iter().copied())
                    .chain(["-jar", JJAVA_JAR, "{connection_file}"])
                    .map(|s| s.to_string())
                    .collect(),
                env: BTreeMap::new(),
                aliases: vec![],
                warmup: None,
                interrupt_mode: Some("message"),
                start_lazily: true,
            },
        ),
        (
            "bash",
            Kernel {
                argv: [PYTHON, "-m", "bash_kernel", "-f", "{connection_file}"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                env: BTreeMap::new(),
                aliases: vec!["sh"],
                warmup: None,
                interrupt_mode: None,
                start_lazily: false,
            },
        ),
        (
            "sql",
            Kernel {
                argv: ipykernel_argv(&[STARTUP, SQL_STARTUP]),
                env: BTreeMap::new(),
                aliases: vec!["duckdb"],
                warmup: None,
                interrupt_mode: None,
                start_lazily: false,
            },
        ),
    ]);
    let file = KernelsFile {
        version: 1,
        default_contexts: ["python", "javascript"],
        languages,
    };
    // A struct of strings and maps always serialises.
    let mut json = serde_json::to_string_pretty(&file).unwrap_or_default();
    json.push('\n');
    json
}

/// The embedded assets as file steps, `interpreter/<rel>` → `/opt/bulkhead/interpreter/<rel>`.
fn asset_steps() -> impl Iterator<Item = BuildStep> {
    INTERPRETER_ASSETS.iter().map(|(rel, bytes)| {
        BuildStep::File(FileAsset::new(
            format!("{INTERPRETER_DIR}/{rel}"),
            bytes.to_vec(),
            0o644,
        ))
    })
}

/// Relative paths of the embedded assets (for diagnostics and tests).
pub fn asset_paths() -> Vec<&'static str> {
    INTERPRETER_ASSETS.iter().map(|(rel, _)| *rel).collect()
}

/// The build steps on top of `base`, in order (the order is part of the content hash).
pub(crate) fn layer_steps() -> Vec<BuildStep> {
    // (pip may install system-wide and npm is Node.js 20's: both come with `base`.)
    let mut steps = vec![
        BuildStep::Run {
            command: apt_install_script(),
        },
        BuildStep::Pip {
            packages: PIP_PACKAGES.iter().map(|s| s.to_string()).collect(),
        },
        BuildStep::Npm {
            packages: NPM_PACKAGES.iter().map(|s| s.to_string()).collect(),
        },
    ];
    steps.extend(asset_steps());
    steps.push(BuildStep::File(FileAsset::new(
        KERNELS_JSON,
        kernels_json(),
        0o644,
    )));
    steps.push(BuildStep::Run {
        command: WARM_UP.to_owned(),
    });
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_json_follows_the_contract() {
        let v: serde_json::Value = serde_json::from_str(&kernels_json()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(
            v["default_contexts"],
            serde_json::json!(["python", "javascript"])
        );
        assert_eq!(langs_lazy(&v), ["java", "javascript", "r", "typescript"]);
        let langs = v["languages"].as_object().unwrap();
        let mut names: Vec<&str> = langs.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "bash",
                "java",
                "javascript",
                "python",
                "r",
                "sql",
                "typescript"
            ]
        );
        for (name, k) in langs {
            let argv: Vec<&str> = k["argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            assert!(argv[0].starts_with('/'), "{name}: absolute program");
            assert_eq!(
                argv.iter().filter(|a| **a == "{connection_file}").count(),
                1,
                "{name}: one connection file placeholder"
            );
            assert!(k["env"].is_object() && k["aliases"].is_array(), "{name}");
        }
        assert_eq!(
            langs["python"]["argv"][5],
            "--IPKernelApp.exec_files=['/opt/bulkhead/interpreter/python/bulkhead_startup.py']"
        );
        assert_eq!(
            langs["sql"]["argv"][5],
            "--IPKernelApp.exec_files=['/opt/bulkhead/interpreter/python/bulkhead_startup.py', \
             '/opt/bulkhead/interpreter/python/bulkhead_sql.py']"
        );
        for ipykernel in ["python", "sql"] {
            assert_eq!(
                langs[ipykernel]["argv"][6], "--HistoryManager.hist_file=:memory:",
                "{ipykernel}: no SQLite history open in a checkpoint"
            );
        }
        assert_eq!(
            langs["python"]["env"]["MPLBACKEND"],
            "module://matplotlib_inline.backend_inline"
        );
        assert_eq!(langs["javascript"]["aliases"], serde_json::json!(["js"]));
        assert_eq!(langs["typescript"]["aliases"], serde_json::json!(["ts"]));
        assert_eq!(langs["bash"]["aliases"], serde_json::json!(["sh"]));
        assert_eq!(langs["sql"]["aliases"], serde_json::json!(["duckdb"]));
        assert_eq!(langs["java"]["interrupt_mode"], "message");
        assert!(langs["r"].get("interrupt_mode").is_none());
    }

    fn langs_lazy(v: &serde_json::Value) -> Vec<&str> {
        let mut lazy: Vec<&str> = v["languages"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, k)| k["start_lazily"] == true)
            .map(|(n, _)| n.as_str())
            .collect();
        lazy.sort_unstable();
        lazy
    }

    #[test]
    fn startup_files_the_kernels_load_are_embedded() {
        let paths = asset_paths();
        for f in [STARTUP, SQL_STARTUP] {
            let rel = f
                .strip_prefix(INTERPRETER_DIR)
                .unwrap()
                .trim_start_matches('/');
            assert!(
                paths.contains(&rel),
                "{rel} is not under crates/images/interpreter/"
            );
        }
        assert!(
            paths
                .iter()
                .all(|p| !p.contains("tests/") && !p.ends_with(".pyc")),
            "{paths:?}"
        );
    }
}
