//! Integration tests of the code-interpreter API (port 49999) against REAL Jupyter kernels:
//! ipykernel, bash_kernel and a DuckDB-backed SQL kernel from a host venv, driven through the
//! agent's real router in-process (`E2b-Sandbox-Port: 49999`, as the host proxy forwards it).
//!
//! The venv: `python3 -m venv /var/cache/bulkhead/venv-agent-kernels &&
//! /var/cache/bulkhead/venv-agent-kernels/bin/pip install ipykernel bash_kernel duckdb`
//! (or `BULKHEAD_TEST_KERNEL_VENV=<dir>`). The tests are gated with `#[requires(KernelVenv)]`:
//! plain `cargo test` reports them as ignored, `--include-ignored` fails them without the venv.
//! Kernels run as the test's own user (`KernelUser::Current`), with HOME in a temp dir.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use bulkhead_agent::interpreter::manifest::Manifest;
use bulkhead_agent::interpreter::{Interpreter, InterpreterConfig, KernelUser};
use bulkhead_agent::{AppState, Config};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const WAIT: Duration = Duration::from_secs(60);

/// The SQL context's startup module, a minimal stand-in for the template's `bulkhead_sql`:
/// one persistent DuckDB connection, the last statement's rows displayed with `e2b/data`.
const SQL_STARTUP: &str = r#"
import duckdb as _duckdb
from IPython.display import display as _display
_bulkhead_sql_con = _duckdb.connect()
def _bulkhead_sql_run(sql):
    rel = _bulkhead_sql_con.sql(sql)
    if rel is None:
        return
    rows = rel.fetchall()
    cols = rel.columns
    _display({"text/plain": str(rows), "e2b/data": {c: [r[i] for r in rows] for i, c in enumerate(cols)}}, raw=True)
"#;

struct Harness {
    router: Router,
    interpreter: Arc<Interpreter>,
    dir: tempfile::TempDir,
}

impl Harness {
    async fn new(default_contexts: &[&str]) -> Self {
        let venv = bulkhead_testkit::kernel_venv();
        let python = venv.join("bin/python").to_string_lossy().into_owned();
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let sql_startup = dir.path().join("sql_startup.py");
        std::fs::write(&sql_startup, SQL_STARTUP).unwrap();
        let manifest = json!({
            "version": 1,
            "default_contexts": default_contexts,
            "languages": {
                "python": {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                           "env": {"BULKHEAD_MANIFEST_VAR": "from-manifest"}},
                "bash": {"argv": [python, "-m", "bash_kernel", "-f", "{connection_file}"], "aliases": ["sh"]},
                "sql": {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                                 format!("--IPKernelApp.exec_files={}", sql_startup.display())],
                        "aliases": ["duckdb"]},
                // A lazily started Python (standing in for Deno): its argv carries a marker the
                // tests look for among processes, and in-memory history as in the template.
                "lazypy": {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                                    "--HistoryManager.hist_file=:memory:"],
                           "dialect": "python", "start_lazily": true},
                "broken": {"argv": [python, "-c", "import sys; sys.stderr.write('no luck here\\n'); sys.exit(3)", "{connection_file}"]},
            }
        });
        let path = dir.path().join("kernels.json");
        std::fs::write(&path, manifest.to_string()).unwrap();
        let manifest = Manifest::load(&path).unwrap().unwrap();
        let state = AppState::new(&Config {
            default_user: "root".to_owned(),
            max_background_processes: 10,
        });
        let interpreter = Interpreter::new(
            manifest,
            InterpreterConfig {
                runtime_dir: dir.path().join("run"),
                kernel_user: KernelUser::Current { home: home.clone() },
                default_cwd: home,
                start_timeout: WAIT,
            },
            state.clone(),
        );
        interpreter.start_default_contexts();
        let router =
            bulkhead_agent::server::app_with_interpreter(state, Some(Arc::clone(&interpreter)));
        Self {
            router,
            interpreter,
            dir,
        }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> http::Response<Body> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("E2b-Sandbox-Id", "test")
            .header("E2b-Sandbox-Port", "49999")
            .header("Content-Type", "application/json");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        tokio::time::timeout(
            WAIT,
            self.router.clone().oneshot(builder.body(body).unwrap()),
        )
        .await
        .expect("response in time")
        .unwrap()
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, String) {
        let response = self.request(method, path, body, &[]).await;
        let status = response.status();
        (status, read_all(response).await)
    }

    /// Runs code and returns all NDJSON lines (asserting the framing).
    async fn run(&self, body: Value) -> Vec<Value> {
        let response = self.request("POST", "/execute", Some(body), &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        let text = read_all(response).await;
        let lines = parse_lines(&text);
        assert_eq!(
            lines.last(),
            Some(&json!({"type": "end_of_execution"})),
            "last line must be end_of_execution: {text}"
        );
        lines
    }

    async fn py(&self, code: &str) -> Vec<Value> {
        self.run(json!({"code": code, "context_id": null, "language": null, "env_vars": null}))
            .await
    }

    async fn in_context(&self, id: &str, code: &str) -> Vec<Value> {
        self.run(json!({"code": code, "context_id": id})).await
    }

    async fn create(&self, body: Value) -> Value {
        let (status, text) = self.call("POST", "/contexts", Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        serde_json::from_str(&text).unwrap()
    }
}

async fn read_all(response: http::Response<Body>) -> String {
    let bytes = tokio::time::timeout(WAIT, response.into_body().collect())
        .await
        .expect("body in time")
        .unwrap()
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn parse_lines(text: &str) -> Vec<Value> {
    assert!(text.ends_with('\n'), "NDJSON ends with a newline: {text:?}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

fn of_type<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["type"] == kind).collect()
}

fn main_text(lines: &[Value]) -> Option<String> {
    lines
        .iter()
        .find(|l| l["type"] == "result" && l["is_main_result"] == true)
        .and_then(|l| l["text"].as_str())
        .map(str::to_owned)
}

fn stdout(lines: &[Value]) -> String {
    of_type(lines, "stdout")
        .iter()
        .filter_map(|l| l["text"].as_str())
        .collect()
}

/// Removes terminal colour sequences (IPython colours its tracebacks, as on E2B).
fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn no_error(lines: &[Value]) {
    assert!(
        of_type(lines, "error").is_empty(),
        "unexpected error: {lines:?}"
    );
}

/// Reads lines from a streaming body as they arrive, with their arrival times.
async fn next_lines(body: &mut Body, buffer: &mut String) -> Option<Vec<(Instant, Value)>> {
    let frame = tokio::time::timeout(WAIT, body.frame())
        .await
        .expect("frame in time")?
        .unwrap();
    let Ok(data) = frame.into_data() else {
        return Some(Vec::new());
    };
    buffer.push_str(std::str::from_utf8(&data).unwrap());
    let mut out = Vec::new();
    while let Some(pos) = buffer.find('\n') {
        let line: String = buffer.drain(..=pos).collect();
        out.push((
            Instant::now(),
            serde_json::from_str(line.trim_end()).unwrap(),
        ));
    }
    Some(out)
}

mod contexts;
mod python;
