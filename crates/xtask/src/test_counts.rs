//! `cargo xtask test-counts SUITES.tsv`: per-suite test counts for `scripts/test.sh`, and the
//! rule that nothing may be skipped.
//!
//! SUITES.tsv has one line per report, tab-separated, written by `scripts/test.sh` as the suites
//! run:
//!
//! ```text
//! cargo  <cargo test log>  <cargo test --no-run --message-format=json output>
//! junit  <suite name>      <pytest --junitxml file>
//! tap    <suite name>      <node --test TAP file>
//! ```
//!
//! Prints a table (suite, run, passed, failed, skipped/ignored) and exits 1 when any suite
//! skipped or ignored a test, or left no report (it crashed, or never started): a skip in CI
//! means a host capability is missing, and that must be red, not green nothing.

use std::collections::HashMap;
use std::path::Path;

use regex::Regex;

#[derive(Debug, Default, PartialEq)]
struct Row {
    suite: String,
    run: u64,
    passed: u64,
    failed: u64,
    skipped: u64,
    note: String,
}

impl Row {
    fn note(suite: impl Into<String>, note: impl Into<String>) -> Row {
        Row {
            suite: suite.into(),
            note: note.into(),
            ..Row::default()
        }
    }
}

/// Exit status: 0 every test ran, 1 a skip or a missing report, 2 a bad invocation.
pub fn main(suites: &Path) -> u8 {
    let text = match std::fs::read_to_string(suites) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("test-counts: {}: {e}", suites.display());
            return 2;
        }
    };
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        let [kind, a, b] = fields[..] else {
            rows.push(Row::note(line, "malformed SUITES.tsv line"));
            continue;
        };
        match kind {
            "cargo" => rows.extend(cargo_rows(&read(a), &read(b))),
            "junit" => rows.push(junit_row(a, Path::new(b))),
            "tap" => rows.push(tap_row(a, Path::new(b))),
            _ => rows.push(Row::note(a, format!("unknown report kind {kind:?}"))),
        }
    }
    let (table, bad) = table(&rows);
    print!("{table}");
    u8::from(bad > 0)
}

/// The file's text (lossy), or nothing when it cannot be read.
fn read(path: &str) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The table, and how many rows are bad (a skip or a note).
fn table(rows: &[Row]) -> (String, usize) {
    let mut out = String::new();
    let width = rows
        .iter()
        .map(|r| r.suite.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    out += &format!(
        "{:<width$}  {:>5} {:>6} {:>6} {:>7}\n",
        "suite", "run", "passed", "failed", "skipped"
    );
    let mut bad = 0;
    for r in rows {
        let flag = if !r.note.is_empty() {
            format!("  <- {}", r.note)
        } else if r.skipped > 0 {
            "  <- SKIPPED: a test did not run".to_string()
        } else {
            String::new()
        };
        if !flag.is_empty() {
            bad += 1;
        }
        out += &format!(
            "{:<width$}  {:>5} {:>6} {:>6} {:>7}{flag}\n",
            r.suite, r.run, r.passed, r.failed, r.skipped
        );
    }
    let sum = |f: fn(&Row) -> u64| rows.iter().map(f).sum::<u64>();
    out += &format!(
        "{:<width$}  {:>5} {:>6} {:>6} {:>7}\n",
        "total",
        sum(|r| r.run),
        sum(|r| r.passed),
        sum(|r| r.failed),
        sum(|r| r.skipped)
    );
    if bad > 0 {
        out += &format!(
            "{bad} suite(s) skipped tests or left no report: every test must run here \
             (a skipped or ignored test means a missing host capability; see docs/testing.md)\n"
        );
    }
    (out, bad)
}

/// The package a `package_id` names: "path+file:///x/agent#bulkhead-agent@0.1.0",
/// "path+file:///x/bulkhead#0.1.0" (the name is the directory's), or the older
/// "bulkhead-agent 0.1.0 (path+...)".
fn package_name(id: &str) -> String {
    let new = Regex::new(r"#([^@#/]+)@").expect("regex");
    let dir = Regex::new(r"/([^/#]+)#[^@#/]+$").expect("regex");
    let old = Regex::new(r"^(\S+) ").expect("regex");
    [new, dir, old]
        .iter()
        .find_map(|re| re.captures(id).map(|c| c[1].to_string()))
        .unwrap_or_else(|| id.to_string())
}

/// One row per test binary and per crate's doc-tests, from `cargo test`'s own output.
fn cargo_rows(log: &str, artifacts: &str) -> Vec<Row> {
    let mut packages = HashMap::new(); // executable file name -> package name
    for line in artifacts.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let exe = msg["executable"].as_str().filter(|e| !e.is_empty());
        if let (Some("compiler-artifact"), Some(exe), Some(id)) =
            (msg["reason"].as_str(), exe, msg["package_id"].as_str())
        {
            let file = Path::new(exe).file_name().unwrap_or_default();
            packages.insert(file.to_string_lossy().into_owned(), package_name(id));
        }
    }
    let running = Regex::new(r"^\s*Running (.+?) \((.+)\)\s*$").expect("regex");
    let doc = Regex::new(r"^\s*Doc-tests (\S+)\s*$").expect("regex");
    let result = Regex::new(
        r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out",
    )
    .expect("regex");
    let hash = Regex::new(r"-[0-9a-f]{16}$").expect("regex");
    let (mut rows, mut current): (Vec<Row>, Option<String>) = (Vec::new(), None);
    let crashed = "no result (crashed?)";
    for line in log.lines() {
        if let Some(m) = running.captures(line) {
            if let Some(c) = current.take() {
                rows.push(Row::note(c, crashed));
            }
            let exe = Path::new(&m[2])
                .file_name()
                .unwrap_or_default()
                .to_string_lossy();
            let package = packages
                .get(exe.as_ref())
                .cloned()
                .unwrap_or_else(|| hash.replace(&exe, "").into_owned());
            current = Some(format!("{package}: {}", &m[1]));
        } else if let Some(m) = doc.captures(line) {
            if let Some(c) = current.take() {
                rows.push(Row::note(c, crashed));
            }
            current = Some(format!("{}: doc-tests", m[1].replace('_', "-")));
        } else if let Some(m) = result.captures(line)
            && let Some(suite) = current.take()
        {
            let n = |i: usize| m[i].parse::<u64>().unwrap_or(0);
            let (passed, failed, ignored) = (n(1), n(2), n(3));
            rows.push(Row {
                suite,
                run: passed + failed,
                passed,
                failed,
                skipped: ignored,
                note: String::new(),
            });
        }
    }
    if let Some(c) = current {
        rows.push(Row::note(c, crashed));
    }
    if rows.is_empty() {
        rows.push(Row::note("cargo test", "no test binary ran"));
    }
    rows
}

/// A pytest `--junitxml` report: `<testsuites><testsuite tests= failures= errors= skipped=>`
/// (or a bare `<testsuite>`).
fn junit_row(suite: &str, xml: &Path) -> Row {
    let text = match std::fs::read_to_string(xml) {
        Ok(t) => t,
        Err(e) => return Row::note(suite, format!("no report ({:?})", e.kind())),
    };
    let doc = match roxmltree::Document::parse(&text) {
        Ok(d) => d,
        Err(_) => return Row::note(suite, "no report (ParseError)"),
    };
    let root = doc.root_element();
    let suites: Vec<roxmltree::Node> = if root.has_tag_name("testsuite") {
        vec![root]
    } else {
        root.children()
            .filter(|n| n.has_tag_name("testsuite"))
            .collect()
    };
    let attr = |name: &str| -> u64 {
        suites
            .iter()
            .map(|s| {
                s.attribute(name)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    };
    let (tests, failed, skipped) = (
        attr("tests"),
        attr("failures") + attr("errors"),
        attr("skipped"),
    );
    let run = tests.saturating_sub(skipped);
    Row {
        suite: suite.to_string(),
        run,
        passed: run.saturating_sub(failed),
        failed,
        skipped,
        note: String::new(),
    }
}

/// A `node --test` TAP report: the run's summary, its last `# key N` lines.
fn tap_row(suite: &str, tap: &Path) -> Row {
    let text = match std::fs::read(tap) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return Row::note(suite, format!("no report ({:?})", e.kind())),
    };
    tap_summary(suite, &text)
}

fn tap_summary(suite: &str, text: &str) -> Row {
    let line =
        Regex::new(r"(?m)^# (tests|pass|fail|cancelled|skipped|todo) (\d+)\s*$").expect("regex");
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for c in line.captures_iter(text) {
        let key = c.get(1).expect("group").as_str();
        counts.insert(key, c[2].parse().unwrap_or(0));
    }
    let Some(&tests) = counts.get("tests") else {
        return Row::note(suite, "no summary in the report (crashed?)");
    };
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    let skipped = get("skipped") + get("todo");
    let failed = get("fail") + get("cancelled");
    Row {
        suite: suite.to_string(),
        run: tests.saturating_sub(skipped),
        passed: get("pass"),
        failed,
        skipped,
        note: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_rows_name_packages_and_flag_ignored_and_crashed_binaries() {
        let artifacts = concat!(
            r#"{"reason":"compiler-artifact","package_id":"path+file:///x/crates/agent#bulkhead-agent@0.1.0","executable":"/t/debug/deps/it-0123456789abcdef"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","package_id":"path+file:///x/crates/bulkhead#0.1.0","executable":"/t/debug/deps/bulkhead-fedcba9876543210"}"#,
            "\nnot json\n",
        );
        let log = "\
     Running tests/it/main.rs (target/debug/deps/it-0123456789abcdef)
test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s
     Running unittests src/main.rs (target/debug/deps/bulkhead-fedcba9876543210)
     Running unittests src/lib.rs (target/debug/deps/other-00112233445566ff)
test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s
   Doc-tests bulkhead_cli
test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.0s
";
        let rows = cargo_rows(log, artifacts);
        let names: Vec<&str> = rows.iter().map(|r| r.suite.as_str()).collect();
        assert_eq!(
            names,
            [
                "bulkhead-agent: tests/it/main.rs",
                "bulkhead: unittests src/main.rs",
                "other: unittests src/lib.rs",
                "bulkhead-cli: doc-tests"
            ]
        );
        assert_eq!((rows[0].run, rows[0].skipped), (5, 1));
        assert_eq!(rows[1].note, "no result (crashed?)");
        assert_eq!((rows[2].run, rows[2].failed), (3, 2));
        let (_, bad) = table(&rows);
        assert_eq!(bad, 2);
    }

    #[test]
    fn package_ids_old_and_new() {
        assert_eq!(
            package_name("path+file:///x/agent#bulkhead-agent@0.1.0"),
            "bulkhead-agent"
        );
        assert_eq!(package_name("path+file:///x/bulkhead#0.1.0"), "bulkhead");
        assert_eq!(
            package_name("bulkhead-agent 0.1.0 (path+file:///x)"),
            "bulkhead-agent"
        );
    }

    #[test]
    fn junit_and_tap_reports() {
        let dir = std::env::temp_dir().join(format!("xtask-counts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let xml = dir.join("r.xml");
        std::fs::write(
            &xml,
            r#"<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="10" failures="1" errors="1" skipped="2"/></testsuites>"#,
        )
        .unwrap();
        let r = junit_row("py", &xml);
        assert_eq!((r.run, r.passed, r.failed, r.skipped), (8, 6, 2, 2));
        std::fs::write(&xml, "<testsuites><testsuite").unwrap();
        assert_eq!(junit_row("py", &xml).note, "no report (ParseError)");
        assert!(
            junit_row("py", &dir.join("missing.xml"))
                .note
                .starts_with("no report")
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let tap = "TAP version 13\nok 1 - a\n# tests 3\n# pass 2\n# fail 0\n# cancelled 0\n# skipped 1\n# todo 0\n";
        let r = tap_summary("js", tap);
        assert_eq!((r.run, r.passed, r.failed, r.skipped), (2, 2, 0, 1));
        assert_eq!(
            tap_summary("js", "ok 1\n").note,
            "no summary in the report (crashed?)"
        );
    }
}
