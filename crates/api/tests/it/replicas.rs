//! Two API replicas (two engines and routers over one store and one fake driver): a request to
//! replica B for a sandbox replica A drives is forwarded to A over HTTP and A's answer comes
//! back; a request already forwarded once is answered where it lands.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bulkhead_engine::cluster::Membership;
use bulkhead_engine::testing::FakeDriver;
use bulkhead_engine::{Engine, EngineConfig};
use bulkhead_store::Store;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

fn engine(store: &Store, driver: &Arc<FakeDriver>, id: &str) -> Arc<Engine> {
    let cfg = EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        replica: Some(id.to_owned()),
        ..Default::default()
    };
    Engine::new(store.clone(), driver.clone(), cfg)
}

async fn call(
    app: &axum::Router,
    key: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("x-api-key", key);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_replica_forwards_requests_for_another_replicas_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    bulkhead_engine::testing::unlock_secrets(&store).await;
    let (_, key) = bulkhead_engine::keys::create(&store, "t").await.unwrap();
    let driver = Arc::new(FakeDriver::default());
    let (a, b) = (engine(&store, &driver, "a"), engine(&store, &driver, "b"));
    for e in [&a, &b] {
        e.register_template(bulkhead_engine::testing::base_template())
            .await
            .unwrap();
    }
    // A serves on a real port, as replicas reach each other.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a_url = format!("http://{}", listener.local_addr().unwrap());
    let app_a = bulkhead_api::router(a.clone());
    tokio::spawn(async move { axum::serve(listener, app_a).await });
    let app_b = bulkhead_api::router(b.clone());
    let now = chrono::Utc::now().timestamp_millis();
    Membership::new(store.clone(), "a", &a_url)
        .beat(now)
        .await
        .unwrap();
    Membership::new(store.clone(), "b", "http://127.0.0.1:1")
        .beat(now)
        .await
        .unwrap();

    let (status, created) = call(
        &bulkhead_api::router(a.clone()),
        &key,
        "POST",
        "/sandboxes",
        &[],
        Some(json!({"templateID": "base", "timeout": 60})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    assert!(a.is_live(&id) && !b.is_live(&id));

    // REST through B: A's answer.
    let (status, got) = call(&app_b, &key, "GET", &format!("/sandboxes/{id}"), &[], None).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["sandboxID"], id.as_str());
    // A request already forwarded once is answered where it lands: B does not drive it.
    let (status, _) = call(
        &app_b,
        &key,
        "GET",
        &format!("/sandboxes/{id}"),
        &[("x-bulkhead-forwarded", "1")],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A body travels too: B sets A's TTL.
    let (status, body) = call(
        &app_b,
        &key,
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        &[],
        Some(json!({"timeout": 600})),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, got) = call(
        &bulkhead_api::router(a.clone()),
        &key,
        "GET",
        &format!("/sandboxes/{id}"),
        &[],
        None,
    )
    .await;
    let end = chrono::DateTime::parse_from_rfc3339(got["endAt"].as_str().unwrap()).unwrap();
    assert!(end.timestamp_millis() > now + 500_000, "{got}");
    // The kill through B is A's.
    let (status, body) = call(
        &app_b,
        &key,
        "DELETE",
        &format!("/sandboxes/{id}"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert!(!a.is_live(&id));
    let (status, _) = call(&app_b, &key, "GET", &format!("/sandboxes/{id}"), &[], None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
