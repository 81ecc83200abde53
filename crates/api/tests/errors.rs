//! Server errors in E2B's shape: provoke driver failures with a test driver that fails on demand
//! and check the status, the E2B error code, that the message names the operation and carries a
//! request id, and that neither a host path nor the internal cause chain leaks into the body.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use bulkhead_engine::driver::{
    AgentStream, Driver, DriverError, DriverHandle, ResourceUsage, SandboxSpec,
};
use bulkhead_engine::testing::FakeDriver;
use bulkhead_engine::{Engine, EngineConfig};
use bulkhead_store::Store;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// A host path a real driver error could carry; it must never reach a client.
const SECRET_PATH: &str = "/var/lib/bulkhead/slots/7/rootfs";

/// The fake driver, failing `start` and `usage` on demand with errors that name a host path.
#[derive(Default)]
struct Flaky {
    inner: FakeDriver,
    fail_start: AtomicBool,
    fail_usage: AtomicBool,
}

fn io_failure(what: &str) -> DriverError {
    DriverError::io(
        format!("{what} {SECRET_PATH}"),
        std::io::Error::other(format!(
            "cgroup read failed at {SECRET_PATH}/memory.current"
        )),
    )
}

#[async_trait]
impl Driver for Flaky {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        if self.fail_start.load(Ordering::SeqCst) {
            return Err(io_failure("mounting"));
        }
        self.inner.start(spec).await
    }
    async fn stop(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.inner.stop(h).await
    }
    async fn wait(&self, h: &DriverHandle) {
        self.inner.wait(h).await
    }
    async fn adopt(&self, h: &DriverHandle) -> bool {
        self.inner.adopt(h).await
    }
    async fn connect(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
        self.inner.connect(h).await
    }
    async fn usage(&self, h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        if self.fail_usage.load(Ordering::SeqCst) {
            return Err(io_failure("reading"));
        }
        self.inner.usage(h).await
    }
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        self.inner.reclaim_orphans(keep).await
    }
}

struct Ctx {
    _dir: tempfile::TempDir,
    app: axum::Router,
    key: String,
    driver: Arc<Flaky>,
}

async fn ctx() -> Ctx {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let (_, key) = bulkhead_engine::keys::create(&store, "t").await.unwrap();
    let driver = Arc::new(Flaky::default());
    let engine = Engine::new(
        store,
        driver.clone(),
        EngineConfig {
            pool_size: 0,
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
    c.driver.fail_start.store(true, Ordering::SeqCst);
    let (status, headers, body) = call(
        &c,
        "POST",
        "/sandboxes",
        Some(serde_json::json!({"templateID": "base"})),
    )
    .await;
    assert_server_error(status, &headers, &body, "sandbox_create_failed", "create");
    c.driver.fail_start.store(false, Ordering::SeqCst);

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
    c.driver.fail_usage.store(true, Ordering::SeqCst);
    let (status, headers, body) = call(&c, "GET", &format!("/sandboxes/{id}/metrics"), None).await;
    assert_server_error(status, &headers, &body, "internal_server_error", "metrics");
    c.driver.fail_usage.store(false, Ordering::SeqCst);
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
