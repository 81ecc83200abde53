//! The Python kernel: outputs, state, errors and env.

use super::*;

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
