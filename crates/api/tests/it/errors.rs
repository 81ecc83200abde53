//! Server errors in E2B's shape: provoke driver failures with the fake driver's failure switches
//! and check the status, the E2B error code, that the message names the operation and carries a
//! request id, and that neither a host path nor the internal cause chain leaks into the body.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bulkhead_engine::driver::DriverError;
use bulkhead_engine::testing::FakeDriver;
use bulkhead_engine::{Engine, EngineConfig};
use bulkhead_store::Store;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// A host path a real driver error could carry; it must never reach a client.
const SECRET_PATH: &str = "/var/lib/bulkhead/slots/7/rootfs";

fn io_failure(what: &str) -> DriverError {
    DriverError::io(
        format!("{what} {SECRET_PATH}"),
        std::io::Error::other(format!(
            "cgroup read failed at {SECRET_PATH}/memory.current"
        )),
    )
}

struct Ctx {
    _dir: tempfile::TempDir,
    app: axum::Router,
    key: String,
    driver: Arc<FakeDriver>,
}

async fn ctx() -> Ctx {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let (_, key) = bulkhead_engine::keys::create(&store, "t").await.unwrap();
    let driver = Arc::new(FakeDriver::default());
    let engine = Engine::new(
        store,
        driver.clone(),
        EngineConfig {
            pools: bulkhead_engine::PoolConfig::fixed(0),
            ..Default::default()
        },
    );
    engine
        .register_template(bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    Ctx {
        _dir: dir,
        app: bulkhead_api::router(engine),
        key,
        driver,
    }
}

async fn call(
    c: &Ctx,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("x-api-key", &c.key)
        .header("content-type", "application/json")
        .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
        .unwrap();
    let resp = c.app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

/// The body is E2B's error shape, names the operation, and leaks nothing.
fn assert_server_error(
    status: StatusCode,
    headers: &axum::http::HeaderMap,
    body: &str,
    code: &str,
    operation: &str,
) {
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["code"], 500, "{body}");
    assert_eq!(v["error_code"], code, "{body}");
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains(operation), "names the operation: {msg}");
    let rid = headers["x-request-id"].to_str().unwrap();
    assert!(msg.contains(rid), "carries the request id: {msg}");
    for leak in [
        SECRET_PATH,
        "cgroup read failed",
        "Driver I/O error",
        "memory.current",
    ] {
        assert!(!body.contains(leak), "{leak:?} leaked: {body}");
    }
}

#[tokio::test]
async fn driver_failures_name_the_operation_and_leak_nothing() {
    let c = ctx().await;
    *c.driver.fail_start.lock().unwrap() = Some(|| io_failure("mounting"));
    let (status, headers, body) = call(
        &c,
        "POST",
        "/sandboxes",
        Some(serde_json::json!({"templateID": "base"})),
    )
    .await;
    assert_server_error(status, &headers, &body, "sandbox_create_failed", "create");
    *c.driver.fail_start.lock().unwrap() = None;

    let (status, _, body) = call(
        &c,
        "POST",
        "/sandboxes",
        Some(serde_json::json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["sandboxID"]
        .as_str()
        .unwrap()
        .to_string();

    // A metrics failure is not a failed create.
    *c.driver.fail_usage.lock().unwrap() = Some(|| io_failure("reading"));
    let (status, headers, body) = call(&c, "GET", &format!("/sandboxes/{id}/metrics"), None).await;
    assert_server_error(status, &headers, &body, "internal_server_error", "metrics");
    *c.driver.fail_usage.lock().unwrap() = None;
    let (status, _, _) = call(&c, "GET", &format!("/sandboxes/{id}/metrics"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn bad_input_is_a_client_error() {
    let c = ctx().await;
    let long = "a".repeat(5000);
    for (method, path, body) in [
        ("GET", format!("/sandboxes/{long}"), None),
        ("DELETE", format!("/sandboxes/{long}"), None),
        ("GET", format!("/sandboxes/{long}/metrics"), None),
        (
            "POST",
            "/sandboxes".to_string(),
            Some(serde_json::json!({"templateID": long})),
        ),
        (
            "POST",
            "/sandboxes".to_string(),
            Some(serde_json::json!({"templateID": "base", "timeout": -1})),
        ),
        (
            "POST",
            "/sandboxes".to_string(),
            Some(serde_json::json!({"templateID": "base", "envVars": {"A=B": "1"}})),
        ),
        ("GET", "/v2/sandboxes?nextToken=!!!".to_string(), None),
    ] {
        let (status, _, text) = call(&c, method, &path, body).await;
        assert!(
            status.is_client_error(),
            "{method} {}: {status} {text}",
            &path[..path.len().min(40)]
        );
    }
}

/// A template build whose files cannot be stored (the server's template directory is broken)
/// is a 500 that names the step and holds no host path or cause chain.
#[tokio::test]
async fn template_build_failures_name_the_step_and_leak_no_path() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let (_, key) = bulkhead_engine::keys::create(&store, "t").await.unwrap();
    let templates = dir.path().join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    // Where uploads go is a file, so storing one fails with ENOTDIR.
    std::fs::write(templates.join("files"), b"not a directory").unwrap();
    let engine = Engine::new(
        store,
        Arc::new(FakeDriver::default()),
        EngineConfig {
            pools: bulkhead_engine::PoolConfig::fixed(0),
            template_dir: Some(templates.clone()),
            ..Default::default()
        },
    );
    engine
        .register_template(bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    let c = Ctx {
        _dir: dir,
        app: bulkhead_api::router(engine),
        key,
        driver: Arc::new(FakeDriver::default()),
    };
    let (status, _, body) = call(
        &c,
        "POST",
        "/v3/templates",
        Some(serde_json::json!({"name": "leaky"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["templateID"]
        .as_str()
        .unwrap()
        .to_string();
    let hash = "ab".repeat(32);
    let (status, _, body) = call(&c, "GET", &format!("/templates/{id}/files/{hash}"), None).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let url = serde_json::from_str::<serde_json::Value>(&body).unwrap()["url"]
        .as_str()
        .unwrap()
        .to_string();
    let path = &url[url.find("/bulkhead/").expect("an upload path")..];
    let (status, headers, body) = call(&c, "PUT", path, None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], 500, "{body}");
    assert_eq!(v["error_code"], "internal_server_error", "{body}");
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains("template build"), "names the build: {msg}");
    assert!(msg.contains("build files"), "names the step: {msg}");
    let rid = headers["x-request-id"].to_str().unwrap();
    assert!(msg.contains(rid), "carries the request id: {msg}");
    let host_dir = templates.display().to_string();
    for leak in [host_dir.as_str(), "/files", "Not a directory", "os error"] {
        assert!(!body.contains(leak), "{leak:?} leaked: {body}");
    }
}
