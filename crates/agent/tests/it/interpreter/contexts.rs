//! Contexts (restart, interrupt, a dying kernel), bash and SQL, lazy default contexts and warm latency.

use super::*;

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
