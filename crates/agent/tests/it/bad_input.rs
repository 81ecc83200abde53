//! Bad input gets a 4xx (E2B's error shape for REST, `invalid_argument` for Connect), never a
//! 5xx: overlong paths and names, NUL bytes, invalid UTF-8, malformed queries, too many headers.
//!
//! Requests are written as raw JSON so these tests do not depend on the message types.

use bytes::Bytes;
use http::{Request, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Agent, full};

/// A 5,000-character path, as a new user would try.
fn long_path() -> String {
    format!("/tmp/{}", "a".repeat(5000))
}

/// A path whose only problem is one component over 255 bytes.
fn long_name() -> String {
    format!("/tmp/{}", "n".repeat(300))
}

/// A path whose components are short but whose length is over PATH_MAX.
fn deep_path() -> String {
    format!("/tmp/{}", ["d"; 3000].join("/"))
}

fn enc(s: &str) -> String {
    urlencoding::encode(s).into_owned()
}

/// Checks E2B's REST error shape and returns the message.
fn rest_error(status: StatusCode, body: &Bytes, expected: StatusCode) -> String {
    assert_eq!(status, expected, "{}", String::from_utf8_lossy(body));
    let body: Value = serde_json::from_slice(body).expect("JSON error body");
    assert_eq!(body["code"], expected.as_u16());
    body["message"].as_str().expect("message").to_owned()
}

async fn get_file(agent: &Agent, query: &str) -> (StatusCode, Bytes) {
    let (status, _, body) = agent
        .call(
            Request::get(format!("/files?{query}"))
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await;
    (status, body)
}

async fn put_file(agent: &Agent, query: &str, data: &'static [u8]) -> (StatusCode, Bytes) {
    let (status, _, body) = agent
        .call(
            Request::post(format!("/files?{query}"))
                .header("content-type", "application/octet-stream")
                .body(full(data))
                .unwrap(),
        )
        .await;
    (status, body)
}

#[tokio::test]
async fn overlong_file_paths_are_bad_requests() {
    let agent = Agent::start(&[]).await;
    for (path, says) in [
        (long_path(), "too long"),
        (long_name(), "File name too long"),
        (deep_path(), "Path too long"),
    ] {
        let (status, body) = get_file(&agent, &format!("path={}", enc(&path))).await;
        let message = rest_error(status, &body, StatusCode::BAD_REQUEST);
        assert!(message.contains(says), "{message}");
        assert!(
            message.len() < 300,
            "the message does not echo the path: {message}"
        );

        let (status, body) = put_file(&agent, &format!("path={}", enc(&path)), b"x").await;
        let message = rest_error(status, &body, StatusCode::BAD_REQUEST);
        assert!(message.contains(says), "{message}");

        // The destination can also come from the multipart part's file name.
        let (content_type, multipart) =
            crate::files::multipart(&[("file", &path, b"x".as_slice())]);
        let (status, _, body) = agent
            .call(
                Request::post("/files")
                    .header("content-type", content_type)
                    .body(full(multipart))
                    .unwrap(),
            )
            .await;
        let message = rest_error(status, &body, StatusCode::BAD_REQUEST);
        assert!(message.contains(says), "{message}");
    }
    // A long input that resolves to a short path is fine.
    let dir = agent.path().display().to_string();
    let roundabout = format!("{dir}/{}/ok.txt", ["x/.."; 2000].join("/"));
    let (status, _) = put_file(&agent, &format!("path={}", enc(&roundabout)), b"ok").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        std::fs::read_to_string(agent.path().join("ok.txt")).unwrap(),
        "ok"
    );
}

#[tokio::test]
async fn nul_bytes_bad_utf8_and_malformed_queries_are_bad_requests() {
    let agent = Agent::start(&[]).await;
    let (status, body) = get_file(&agent, "path=%2Ftmp%2Fa%00b").await;
    let message = rest_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(message.contains("NUL"), "{message}");
    let (status, body) = put_file(&agent, "path=%2Ftmp%2Fa%00b", b"x").await;
    rest_error(status, &body, StatusCode::BAD_REQUEST);

    // A parameter sent twice.
    let (status, body) = get_file(&agent, "path=%2Fa&path=%2Fb").await;
    let message = rest_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(message.contains("query string"), "{message}");
    let (status, body) = put_file(&agent, "path=%2Fa&path=%2Fb", b"x").await;
    rest_error(status, &body, StatusCode::BAD_REQUEST);

    // A path that is not UTF-8 once decoded is refused rather than decoded lossily into the
    // name of another file.
    let (status, body) = get_file(&agent, "path=%2Ftmp%2F%FF%FE").await;
    let message = rest_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(message.contains("UTF-8"), "{message}");
    let (status, body) = put_file(&agent, "path=%2Ftmp%2F%FF%FE", b"x").await;
    rest_error(status, &body, StatusCode::BAD_REQUEST);
    assert!(!std::path::Path::new("/tmp/\u{FFFD}\u{FFFD}").exists());

    // An unknown or absurd user is the client's problem too.
    let (status, body) = get_file(&agent, &format!("path=%2F&username={}", "u".repeat(5000))).await;
    assert!(status.is_client_error(), "{status}");
    rest_error(status, &body, status);
    let (status, body) = get_file(&agent, "path=%2F&username=ro%00ot").await;
    assert!(status.is_client_error(), "{status}");
    rest_error(status, &body, status);
}

#[tokio::test]
async fn too_many_headers_are_refused_with_a_4xx() {
    // hyper answers `431` itself (over 100 headers, or a head over its buffer); the agent's
    // routes never see such a request.
    let agent = Agent::start(&[]).await;
    let mut request = Request::get("/files?path=%2Fetc%2Fhostname");
    for i in 0..150 {
        request = request.header(format!("x-h{i}"), "v");
    }
    let (status, _, _) = agent.call(request.body(full(Bytes::new())).unwrap()).await;
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
}

async fn connect_code(agent: &Agent, method: &str, body: Value) -> (StatusCode, String, String) {
    let (status, body) = agent.unary_raw(method, &body, &[]).await;
    (
        status,
        body["code"].as_str().unwrap_or_default().to_owned(),
        body["message"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn connect_calls_answer_invalid_argument_for_bad_paths() {
    let agent = Agent::start(&[]).await;
    let fs = |m: &str| format!("/filesystem.Filesystem/{m}");
    let missing = agent.path().join("missing").display().to_string();
    for path in [
        long_path(),
        long_name(),
        deep_path(),
        "/tmp/a\0b".to_owned(),
    ] {
        for (method, body) in [
            ("Stat", json!({ "path": path })),
            ("MakeDir", json!({ "path": path })),
            ("ListDir", json!({ "path": path, "depth": 1 })),
            ("Remove", json!({ "path": path })),
            ("Move", json!({ "source": path, "destination": missing })),
            ("Move", json!({ "source": missing, "destination": path })),
            ("CreateWatcher", json!({ "path": path })),
        ] {
            let (status, code, message) = connect_code(&agent, &fs(method), body).await;
            assert_eq!(
                (status, code.as_str()),
                (StatusCode::BAD_REQUEST, "invalid_argument"),
                "{method}: {message}"
            );
            assert!(message.len() < 300, "{method} echoes the path: {message}");
        }
        let (_, end) = agent
            .stream::<_, Value>(&fs("WatchDir"), &json!({ "path": path }), &[])
            .await
            .finish()
            .await;
        assert_eq!(
            end.error.expect("an error").code,
            bulkhead_envd::connect::Code::InvalidArgument
        );

        // A process's working directory.
        let (_, end) = agent
            .stream::<_, Value>(
                "/process.Process/Start",
                &json!({ "process": { "cmd": "/bin/true", "cwd": path } }),
                &[],
            )
            .await
            .finish()
            .await;
        assert_eq!(
            end.error.expect("an error").code,
            bulkhead_envd::connect::Code::InvalidArgument
        );
    }

    // The program itself: an overlong name and a NUL byte.
    for cmd in [
        format!("/bin/{}", "c".repeat(5000)),
        "/bin/tr\0ue".to_owned(),
    ] {
        let (_, end) = agent
            .stream::<_, Value>(
                "/process.Process/Start",
                &json!({ "process": { "cmd": cmd } }),
                &[],
            )
            .await
            .finish()
            .await;
        let error = end.error.expect("an error");
        assert_eq!(
            error.code,
            bulkhead_envd::connect::Code::InvalidArgument,
            "{error:?}"
        );
    }
}

/// A 200 KB body, as a new user's runaway request would send.
fn big_body() -> Vec<u8> {
    serde_json::to_vec(&json!({ "path": "/tmp", "junk": "j".repeat(200 * 1024) })).unwrap()
}

#[tokio::test]
async fn an_oversized_connect_body_is_413_not_a_reset() {
    let agent = Agent::start(&[]).await;
    for method in [
        "/filesystem.Filesystem/ListDir",
        "/filesystem.Filesystem/Stat",
        "/process.Process/List",
        "/process.Process/SendSignal",
    ] {
        let (status, _, body) = agent
            .call(
                Request::post(method)
                    .header("content-type", "application/json")
                    .body(full(big_body()))
                    .unwrap(),
            )
            .await;
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{method}: {}",
            String::from_utf8_lossy(&body)
        );
        let error: Value = serde_json::from_slice(&body).expect("Connect error body");
        assert_eq!(error["code"], "resource_exhausted", "{method}");
        assert!(
            error["message"].as_str().unwrap().contains("too large"),
            "{error}"
        );
    }
    // The agent is still serving on the same footing.
    let (status, _, _) = agent.get("/health").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn early_answers_read_the_body_first() {
    let agent = Agent::start(&[]).await;
    // A wrong content type on a streaming method that takes large bodies: 415, not a reset.
    let (status, _, body) = agent
        .call(
            Request::post("/process.Process/Start")
                .header("content-type", "application/json")
                .body(full(big_body()))
                .unwrap(),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "{}",
        String::from_utf8_lossy(&body)
    );
    // A refused token: 401 in the Connect shape, after the body was read.
    let (status, _, _) = agent
        .call(
            Request::post("/init")
                .header("content-type", "application/json")
                .body(full(
                    serde_json::to_vec(&json!({"accessToken": "t0ken"})).unwrap(),
                ))
                .unwrap(),
        )
        .await;
    assert!(status.is_success(), "{status}");
    let (status, _, body) = agent
        .call(
            Request::post("/filesystem.Filesystem/ListDir")
                .header("content-type", "application/json")
                .body(full(big_body()))
                .unwrap(),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let error: Value = serde_json::from_slice(&body).expect("Connect error body");
    assert_eq!(error["code"], "unauthenticated");
}
