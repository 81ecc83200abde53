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

#[bulkhead_testkit::requires(KernelVenv)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_outputs_state_errors_and_env() {
    let h = Harness::new(&["python"]).await;
    let (status, body) = h.call("GET", "/health", None).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "\"OK\""));

    // State across calls; stdout and the main result.
    let lines = h.py("x = 41").await;
    no_error(&lines);
    assert_eq!(of_type(&lines, "number_of_executions").len(), 1);
    assert!(main_text(&lines).is_none());
    let lines = h.py("print('hi')\nx + 1").await;
    no_error(&lines);
    assert_eq!(stdout(&lines), "hi\n");
    assert_eq!(main_text(&lines).as_deref(), Some("42"));
    let stdout_line = of_type(&lines, "stdout")[0];
    assert!(
        chrono::DateTime::parse_from_rfc3339(stdout_line["timestamp"].as_str().unwrap()).is_ok(),
        "ISO timestamp: {stdout_line}"
    );
    // Quote stripping of text/plain.
    assert_eq!(main_text(&h.py("'abc'").await).as_deref(), Some("abc"));
    // Uniformly indented code is dedented by IPython.
    assert_eq!(
        main_text(&h.py("    a = 1\n    a + 1").await).as_deref(),
        Some("2")
    );

    // display_data vs execute_result, MIME mapping incl. extra.
    let lines = h
        .py("from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\ndisplay({'application/vnd.custom+json': {'k': 1}, 'text/plain': 'c'}, raw=True)\n5")
        .await;
    no_error(&lines);
    let results = of_type(&lines, "result");
    assert_eq!(results.len(), 3, "{lines:?}");
    assert_eq!(results[0]["is_main_result"], false);
    assert_eq!(results[0]["html"], "<b>x</b>");
    assert_eq!(
        results[1]["extra"],
        json!({"application/vnd.custom+json": {"k": 1}})
    );
    assert_eq!(results[2]["is_main_result"], true);
    assert_eq!(results[2]["text"], "5");
    assert_eq!(results[2]["extra"], json!({}));

    // Errors: fields, joined traceback, only the first one, end_of_execution last.
    let lines = h.py("print('before')\n1/0").await;
    let errors = of_type(&lines, "error");
    assert_eq!(errors.len(), 1, "{lines:?}");
    assert_eq!(errors[0]["name"], "ZeroDivisionError");
    assert_eq!(errors[0]["value"], "division by zero");
    let traceback = strip_ansi(errors[0]["traceback"].as_str().unwrap());
    assert!(
        traceback.contains("ZeroDivisionError") && traceback.contains("1/0"),
        "{traceback}"
    );
    assert_eq!(stdout(&lines), "before\n");

    // Streaming: stdout arrives while the cell still runs, stderr separately, in order.
    let response = h
        .request(
            "POST",
            "/execute",
            Some(json!({"code": "import sys, time\nprint('a', flush=True)\nprint('e', file=sys.stderr, flush=True)\ntime.sleep(1.5)\nprint('b')"})),
            &[],
        )
        .await;
    let mut body = response.into_body();
    let mut buffer = String::new();
    let mut seen = Vec::new();
    while let Some(batch) = next_lines(&mut body, &mut buffer).await {
        seen.extend(batch);
    }
    let at = |kind: &str, text: &str| {
        seen.iter()
            .position(|(_, l)| l["type"] == kind && l["text"] == text)
            .unwrap_or_else(|| panic!("no {kind} {text:?} in {seen:?}"))
    };
    let (a, e, b) = (
        at("stdout", "a\n"),
        at("stderr", "e\n"),
        at("stdout", "b\n"),
    );
    assert!(a < e && e < b);
    let gap = seen[b].0 - seen[a].0;
    assert!(
        gap >= Duration::from_millis(1200),
        "'a' must be streamed before the sleep ends (gap {gap:?})"
    );
    assert_eq!(seen.last().unwrap().1, json!({"type": "end_of_execution"}));

    // Per-request env vars: applied (escaped), visible to subprocesses, undone afterwards.
    let tricky = "it's \"quoted\"\nand $HOME `x`";
    let lines = h
        .run(json!({"code": "import os, subprocess\nprint(subprocess.run(['printenv', 'REQ_VAR'], capture_output=True, text=True).stdout, end='')\nos.environ['REQ_VAR']", "env_vars": {"REQ_VAR": tricky}}))
        .await;
    no_error(&lines);
    assert_eq!(stdout(&lines), format!("{tricky}\n"));
    let lines = h.py("import os\nstr(os.environ.get('REQ_VAR'))").await;
    assert_eq!(main_text(&lines).as_deref(), Some("None"));
    // The manifest's variables reach the kernel; a request override is restored afterwards.
    let lines = h
        .run(json!({"code": "os.environ['BULKHEAD_MANIFEST_VAR']", "env_vars": {"BULKHEAD_MANIFEST_VAR": "req"}}))
        .await;
    assert_eq!(main_text(&lines).as_deref(), Some("req"));
    assert_eq!(
        main_text(&h.py("os.environ['BULKHEAD_MANIFEST_VAR']").await).as_deref(),
        Some("from-manifest")
    );

    // Sandbox-wide variables set by /init after the kernel started (warm pool) are applied
    // before the next execution, and a request override falls back to them.
    let init = Request::builder()
        .method("POST")
        .uri("/init")
        .header("Content-Type", "application/json")
        .body(Body::from(
            json!({"envVars": {"GLOBAL_X": "g"}}).to_string(),
        ))
        .unwrap();
    let response = h.router.clone().oneshot(init).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        main_text(&h.py("os.environ['GLOBAL_X']").await).as_deref(),
        Some("g")
    );
    let lines = h
        .run(json!({"code": "os.environ['GLOBAL_X']", "env_vars": {"GLOBAL_X": "r"}}))
        .await;
    assert_eq!(main_text(&lines).as_deref(), Some("r"));
    assert_eq!(
        main_text(&h.py("os.environ['GLOBAL_X']").await).as_deref(),
        Some("g")
    );

    // Request validation, as E2B answers it.
    let (status, text) = h
        .call(
            "POST",
            "/execute",
            Some(json!({"code": "1", "context_id": "x", "language": "python"})),
        )
        .await;
    assert_eq!(
        (status, text.as_str()),
        (
            StatusCode::BAD_REQUEST,
            "Only one of context_id or language can be provided"
        )
    );
    let (status, text) = h
        .call(
            "POST",
            "/execute",
            Some(json!({"code": "1", "context_id": "nope"})),
        )
        .await;
    assert_eq!(
        (status, text.as_str()),
        (StatusCode::NOT_FOUND, "Context nope not found")
    );
    let (status, text) = h
        .call(
            "POST",
            "/execute",
            Some(json!({"code": "1", "language": "r"})),
        )
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(text.contains("\"r\""), "{text}");
    let (status, _) = h
        .call("POST", "/execute", Some(json!({"language": "python"})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = h
        .call(
            "POST",
            "/execute",
            Some(json!({"code": "1", "env_vars": {"A=B": "c"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // With an access token, /execute needs it (the SDKs send it there); /contexts do not.
    let init = Request::builder()
        .method("POST")
        .uri("/init")
        .body(Body::from(json!({"accessToken": "secret"}).to_string()))
        .unwrap();
    let response = h.router.clone().oneshot(init).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = h
        .request("POST", "/execute", Some(json!({"code": "1"})), &[])
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = h
        .request(
            "POST",
            "/execute",
            Some(json!({"code": "1"})),
            &[("X-Access-Token", "secret")],
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        main_text(&parse_lines(&read_all(response).await)).as_deref(),
        Some("1")
    );
    // Every route but /health needs the token (issue 22 row 10), the contexts too.
    assert_eq!(
        h.call("GET", "/contexts", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let response = h
        .request("GET", "/contexts", None, &[("X-Access-Token", "secret")])
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[bulkhead_testkit::requires(KernelVenv)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_restart_interrupt_and_kernel_death() {
    let h = Harness::new(&[]).await;
    let sub = h.home().join("sub dir");
    std::fs::create_dir_all(&sub).unwrap();
    let cwd = sub.to_string_lossy().into_owned();

    let started = Instant::now();
    let context = h.create(json!({"language": "python", "cwd": cwd})).await;
    eprintln!(
        "python context (kernel start + warm-up): {:?}",
        started.elapsed()
    );
    let id = context["id"].as_str().unwrap().to_owned();
    assert_eq!(context["language"], "python");
    assert_eq!(context["cwd"], cwd.as_str());
    assert_eq!(
        main_text(&h.in_context(&id, "import os\nos.getcwd()").await).as_deref(),
        Some(cwd.as_str())
    );
    let (status, list) = h.call("GET", "/contexts", None).await;
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert!(
        list.as_array().unwrap().iter().any(|c| c == &context),
        "{list}"
    );
    let (status, text) = h
        .call(
            "POST",
            "/contexts",
            Some(json!({"cwd": "/nonexistent/dir"})),
        )
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    // A kernel that cannot start: 500 with its exit status and stderr.
    let (status, text) = h
        .call("POST", "/contexts", Some(json!({"language": "broken"})))
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{text}");
    assert!(
        text.contains("exit status 3") && text.contains("no luck here"),
        "{text}"
    );

    // Restart clears state and keeps the cwd.
    no_error(&h.in_context(&id, "y = 5").await);
    let (status, body) = h
        .call("POST", &format!("/contexts/{id}/restart"), None)
        .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "null"));
    let lines = h.in_context(&id, "y").await;
    assert_eq!(of_type(&lines, "error")[0]["name"], "NameError");
    assert_eq!(
        main_text(
            &h.in_context(
                &id,
                "os.getcwd() if 'os' in dir() else __import__('os').getcwd()"
            )
            .await
        )
        .as_deref(),
        Some(cwd.as_str())
    );

    // Disconnecting mid-execution interrupts the kernel; state survives.
    no_error(&h.in_context(&id, "z = 7").await);
    let response = h
        .request(
            "POST",
            "/execute",
            Some(json!({"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\nz = 0", "context_id": id})),
            &[],
        )
        .await;
    let mut body = response.into_body();
    let mut buffer = String::new();
    loop {
        let batch = next_lines(&mut body, &mut buffer)
            .await
            .expect("stream open");
        if batch.iter().any(|(_, l)| l["text"] == "sleeping\n") {
            break;
        }
    }
    drop(body);
    let started = Instant::now();
    let lines = h.in_context(&id, "z").await;
    assert_eq!(main_text(&lines).as_deref(), Some("7"), "{lines:?}");
    assert!(started.elapsed() < Duration::from_secs(10));

    // An execution whose client left while it was queued never runs.
    no_error(&h.in_context(&id, "hits = 0").await);
    let running = h
        .request(
            "POST",
            "/execute",
            Some(json!({"code": "print('busy', flush=True)\ntime.sleep(1.5)", "context_id": id})),
            &[],
        )
        .await;
    // Only once the first execution holds the context is the second one really queued.
    let mut running = running.into_body();
    let mut buffer = String::new();
    let mut seen = Vec::new();
    loop {
        let batch = next_lines(&mut running, &mut buffer)
            .await
            .expect("stream open");
        let busy = batch.iter().any(|(_, l)| l["text"] == "busy\n");
        seen.extend(batch.into_iter().map(|(_, l)| l));
        if busy {
            break;
        }
    }
    let queued = h
        .request(
            "POST",
            "/execute",
            Some(json!({"code": "hits += 1", "context_id": id})),
            &[],
        )
        .await;
    drop(queued);
    while let Some(batch) = next_lines(&mut running, &mut buffer).await {
        seen.extend(batch.into_iter().map(|(_, l)| l));
    }
    no_error(&seen);
    assert_eq!(
        main_text(&h.in_context(&id, "hits").await).as_deref(),
        Some("0")
    );

    // A kernel that dies mid-execution: error line, end_of_execution, then a fresh kernel.
    let lines = h
        .in_context(&id, "print('dying', flush=True)\nimport os\nos._exit(1)")
        .await;
    let errors = of_type(&lines, "error");
    assert_eq!(errors.len(), 1, "{lines:?}");
    assert_eq!(errors[0]["name"], "ContextRestarting");
    assert!(
        errors[0]["value"]
            .as_str()
            .unwrap()
            .contains("exit status 1")
    );
    // Output the kernel sent before dying is not lost (a print right before `os._exit` may
    // never leave the kernel, so only the execution count is certain).
    assert_eq!(
        of_type(&lines, "number_of_executions").len(),
        1,
        "{lines:?}"
    );
    assert!(matches!(stdout(&lines).as_str(), "" | "dying\n"));
    let lines = h.in_context(&id, "1 + 1").await;
    assert_eq!(main_text(&lines).as_deref(), Some("2"), "{lines:?}");

    // Different contexts run concurrently.
    let other = h.create(json!({})).await;
    assert_eq!(other["language"], "python");
    let other_id = other["id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let (a, b) = tokio::join!(
        h.in_context(&id, "import time\ntime.sleep(1.5)\n'a'"),
        h.in_context(&other_id, "import time\ntime.sleep(1.5)\n'b'"),
    );
    assert_eq!(main_text(&a).as_deref(), Some("a"));
    assert_eq!(main_text(&b).as_deref(), Some("b"));
    let both = started.elapsed();
    assert!(
        both < Duration::from_millis(2800),
        "contexts ran serially: {both:?}"
    );

    // Delete kills the kernel; the id is gone.
    let pid: i32 = main_text(
        &h.in_context(
            &other_id,
            "os.getpid() if 'os' in dir() else __import__('os').getpid()",
        )
        .await,
    )
    .unwrap()
    .parse()
    .unwrap();
    let (status, body) = h
        .call("DELETE", &format!("/contexts/{other_id}"), None)
        .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "null"));
    let (status, _) = h
        .call(
            "POST",
            "/execute",
            Some(json!({"code": "1", "context_id": other_id})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        h.call("DELETE", &format!("/contexts/{other_id}"), None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.call("POST", &format!("/contexts/{other_id}/restart"), None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "kernel {pid} still alive after delete"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[bulkhead_testkit::requires(KernelVenv)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_and_sql_contexts() {
    let h = Harness::new(&[]).await;
    // bash: state persists across executions; env vars via export/unset.
    let lines = h
        .run(json!({"code": "export A=1\necho \"A=$A\"", "language": "bash"}))
        .await;
    no_error(&lines);
    assert_eq!(stdout(&lines), "A=1\n");
    let lines = h
        .run(json!({"code": "echo \"A=$A\"", "language": "sh"}))
        .await;
    assert_eq!(stdout(&lines), "A=1\n");
    let lines = h
        .run(json!({"code": "echo \"$B\"", "language": "bash", "env_vars": {"B": "it's $x"}}))
        .await;
    assert_eq!(stdout(&lines), "it's $x\n");
    let lines = h
        .run(json!({"code": "echo \"[${B-unset}]\"", "language": "bash"}))
        .await;
    assert_eq!(stdout(&lines), "[unset]\n");
    let lines = h.run(json!({"code": "false", "language": "bash"})).await;
    assert_eq!(of_type(&lines, "error").len(), 1, "{lines:?}");

    // SQL: one persistent DuckDB connection; code of any shape reaches it intact.
    let lines = h
        .run(json!({"code": "CREATE TABLE t AS SELECT 42 AS a;", "language": "sql"}))
        .await;
    no_error(&lines);
    let lines = h
        .run(json!({"code": "SELECT a, 'it''s \"q\"\\n%x' AS s FROM t -- done?", "language": "duckdb"}))
        .await;
    no_error(&lines);
    let results = of_type(&lines, "result");
    assert_eq!(results.len(), 1, "{lines:?}");
    assert_eq!(
        results[0]["data"],
        json!({"a": [42], "s": ["it's \"q\"\\n%x"]})
    );
    let lines = h
        .run(json!({"code": "SELECT * FROM missing", "language": "sql"}))
        .await;
    assert_eq!(of_type(&lines, "error").len(), 1, "{lines:?}");

    // The languages' default contexts are listed.
    let (_, list) = h.call("GET", "/contexts", None).await;
    let list: Vec<Value> = serde_json::from_str(&list).unwrap();
    let languages: Vec<&str> = list.iter().filter_map(|c| c["language"].as_str()).collect();
    assert_eq!(languages, ["bash", "sql"]);
}

/// Kernels started with `--HistoryManager.hist_file=:memory:` (only `lazypy`'s) by this test
/// process (the kernel's parent: pool kernels of real sandboxes elsewhere on the host use the
/// same flag), counted by a Python cell in the default context.
const LAZY_KERNELS: &str = "import os\ndef _lazy():\n    n = 0\n    me = str(os.getppid())\n    for p in os.listdir('/proc'):\n        try:\n            c = open(f'/proc/{p}/cmdline', 'rb').read()\n            ppid = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1]\n        except (OSError, IndexError):\n            continue\n        n += b'hist_file=:memory:' in c and b'ipykernel' in c and ppid == me\n    return n\n_lazy()";

#[bulkhead_testkit::requires(KernelVenv)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_default_contexts_warm_and_reseed_after_a_clone() {
    let h = Harness::new(&["python", "lazypy"]).await;
    // The host's warm-pool probe answers once the eager kernel is up (envd port: no port header).
    let warm = Request::post("/bulkhead/warm").body(Body::empty()).unwrap();
    let response = tokio::time::timeout(WAIT, h.router.clone().oneshot(warm))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    // Both default contexts are listed, but the lazy one's kernel has not started.
    let (_, list) = h.call("GET", "/contexts", None).await;
    let list: Vec<Value> = serde_json::from_str(&list).unwrap();
    // (Listed in creation order; the default contexts are made concurrently at start.)
    let mut languages: Vec<&str> = list.iter().filter_map(|c| c["language"].as_str()).collect();
    languages.sort_unstable();
    assert_eq!(languages, ["lazypy", "python"]);
    assert_eq!(main_text(&h.py(LAZY_KERNELS).await).as_deref(), Some("0"));
    let lines = h
        .run(json!({"code": "a = 21\na * 2", "language": "lazypy"}))
        .await;
    no_error(&lines);
    assert_eq!(main_text(&lines).as_deref(), Some("42"));
    assert_eq!(main_text(&h.py(LAZY_KERNELS).await).as_deref(), Some("1"));
    // In-memory history works.
    let lines = h
        .run(json!({"code": "[c for c in _ih if c][-2:]", "language": "lazypy"}))
        .await;
    assert!(main_text(&lines).unwrap().contains("a = 21"), "{lines:?}");

    // State drawn before a clone restore repeats unless re-seeded: seed, then "clone".
    let before = "import random, json\nrandom.seed(7)\nk = get_ipython().kernel\ns0 = k.session.session\nnone = None";
    no_error(&h.py(before).await);
    let cloned = Request::post("/bulkhead/cloned")
        .body(Body::empty())
        .unwrap();
    let response = tokio::time::timeout(WAIT, h.router.clone().oneshot(cloned))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let check = "json.dumps([random.random() != random.Random(7).random(), k.session.session != s0, k.session.bsession == k.session.session.encode(), 'none' in dir()])";
    let lines = h.py(check).await;
    no_error(&lines);
    assert_eq!(
        main_text(&lines).as_deref(),
        Some("[true, true, true, true]"),
        "re-seeded, new session id, user namespace untouched: {lines:?}"
    );
    // The re-seed cell left no names behind and the kernels still work.
    let lines = h
        .py("[n for n in ('_np', '_tf', '_k') if n in dir()]")
        .await;
    assert_eq!(main_text(&lines).as_deref(), Some("[]"));
    let lines = h.run(json!({"code": "a", "language": "lazypy"})).await;
    assert_eq!(main_text(&lines).as_deref(), Some("21"));
}

#[bulkhead_testkit::requires(KernelVenv)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_execute_latency() {
    let h = Harness::new(&["python"]).await;
    // Wait for the default context the agent starts at launch.
    let started = Instant::now();
    let context = loop {
        if let Some(c) = h.interpreter.list().first().cloned() {
            break c;
        }
        assert!(
            started.elapsed() < WAIT,
            "default python context did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("default python context ready after {:?}", started.elapsed());
    assert_eq!(context.language, "python");
    let mut times = Vec::new();
    for _ in 0..40 {
        let started = Instant::now();
        let lines = h.py("1+1").await;
        times.push(started.elapsed());
        assert_eq!(main_text(&lines).as_deref(), Some("2"));
    }
    times.sort();
    let p50 = times[times.len() / 2];
    let p90 = times[times.len() * 9 / 10];
    eprintln!(
        "warm /execute 1+1: p50 {p50:?}, p90 {p90:?}, max {:?}",
        times.last().unwrap()
    );
    assert!(
        p50 < Duration::from_millis(250),
        "warm execute too slow: p50 {p50:?}"
    );
}
