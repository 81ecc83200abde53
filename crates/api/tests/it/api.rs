//! The E2B REST surface and the routing proxy, driven in-process (tower `oneshot`) over the
//! engine with a test double driver.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::common;

use common::ctx;

async fn call(
    app: &axum::Router,
    req: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (status, headers, v)
}

fn post(path: &str, key: &str, body: serde_json::Value) -> Request<Body> {
    Request::post(path)
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn get(path: &str, key: &str) -> Request<Body> {
    Request::get(path)
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn health_needs_no_key_and_everything_else_does() {
    let c = ctx().await;
    let (s, _, _) = call(&c.app, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, v) = call(
        &c.app,
        get(
            "/v2/sandboxes",
            "e2b_0000000000000000000000000000000000000000",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(v["code"], 401);
    assert!(v["message"].as_str().unwrap().contains("API key"));
}

#[tokio::test]
async fn create_both_generations_and_lifecycle() {
    let c = ctx().await;
    // v2 (latest SDKs): minimal JS body.
    let (s, _, v) = call(
        &c.app,
        post(
            "/v2/sandboxes",
            &c.key,
            serde_json::json!({"templateID": "base"}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    for f in [
        "sandboxID",
        "templateID",
        "clientID",
        "envdVersion",
        "envdAccessToken",
    ] {
        assert!(v.get(f).is_some(), "missing {f} in {v}");
    }
    let id = v["sandboxID"].as_str().unwrap().to_string();
    // v1 (older SDKs).
    let (s, _, v1) = call(
        &c.app,
        post("/sandboxes", &c.key, serde_json::json!({"templateID": "base", "timeout": 15, "secure": true, "metadata": {"k": "v"}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let id1 = v1["sandboxID"].as_str().unwrap().to_string();

    let (s, _, d) = call(&c.app, get(&format!("/sandboxes/{id1}"), &c.key)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(d["metadata"]["k"], "v");
    assert_eq!(d["state"], "running");
    assert_eq!(d["memoryMB"], 512);
    for f in [
        "startedAt",
        "endAt",
        "cpuCount",
        "diskSizeMB",
        "clientID",
        "envdVersion",
    ] {
        assert!(d.get(f).is_some(), "missing {f}");
    }

    let (s, h, l) = call(
        &c.app,
        get("/v2/sandboxes?metadata=k%3Dv&state=running", &c.key),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(l.as_array().unwrap().len(), 1);
    assert_eq!(h["x-total-running"], "2");
    let (_, h, l) = call(&c.app, get("/v2/sandboxes?limit=1", &c.key)).await;
    assert_eq!(l.as_array().unwrap().len(), 1);
    assert!(h.contains_key("x-next-token"));

    let (s, _, _) = call(
        &c.app,
        post(
            &format!("/sandboxes/{id}/timeout"),
            &c.key,
            serde_json::json!({"timeout": 60}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, v) = call(
        &c.app,
        post(
            &format!("/v2/sandboxes/{id}/connect"),
            &c.key,
            serde_json::json!({"timeout": 600}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["sandboxID"], id.as_str());
    let (s, _, m) = call(&c.app, get(&format!("/sandboxes/{id}/metrics"), &c.key)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(m[0]["timestamp"].is_string() && m[0]["memUsed"].is_number());

    let del = || {
        Request::delete(format!("/sandboxes/{id}"))
            .header("x-api-key", &c.key)
            .body(Body::empty())
            .unwrap()
    };
    let (s, _, _) = call(&c.app, del()).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, v) = call(&c.app, del()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], 404);
    let (s, _, _) = call(&c.app, get(&format!("/sandboxes/{id}"), &c.key)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bad_input_gets_e2b_errors() {
    let c = ctx().await;
    let bad = Request::post("/v2/sandboxes")
        .header("x-api-key", &c.key)
        .body(Body::from("{not json"))
        .unwrap();
    let (s, _, v) = call(&c.app, bad).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["code"], 400);
    let (s, _, _) = call(
        &c.app,
        post(
            "/v2/sandboxes",
            &c.key,
            serde_json::json!({"templateID": "nope"}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, v) = call(
        &c.app,
        post(
            "/v2/sandboxes",
            &c.key,
            serde_json::json!({"templateID": "base", "timeout": 999999999}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("Timeout cannot be greater")
    );
    let (s, _, _) = call(&c.app, get("/v2/sandboxes?limit=1000", &c.key)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _, _) = call(&c.app, get("/sandboxes/..%2F..%2Fetc", &c.key)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn proxy_routes_and_refuses() {
    let c = ctx().await;
    let sb = |id: &str, port: &str, path: &str| {
        Request::get(path)
            .header("e2b-sandbox-id", id)
            .header("e2b-sandbox-port", port)
            .body(Body::empty())
            .unwrap()
    };
    let (s, _, v) = call(&c.app, sb("doesnotexist", "49983", "/health")).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert_eq!(v["message"], "The sandbox was not found");
    let only_id = Request::get("/health")
        .header("e2b-sandbox-id", "x")
        .body(Body::empty())
        .unwrap();
    let (s, _, v) = call(&c.app, only_id).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["message"].as_str().unwrap().contains("Missing header"));

    let (_, _, v) = call(
        &c.app,
        post(
            "/v2/sandboxes",
            &c.key,
            serde_json::json!({"templateID": "base"}),
        ),
    )
    .await;
    let id = v["sandboxID"].as_str().unwrap();
    // The host-only /init route is never reachable from clients.
    let init = Request::post("/init")
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49983")
        .body(Body::from("{}"))
        .unwrap();
    let (s, _, _) = call(&c.app, init).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Host-based routing reaches the (fake) agent, which answers 404 for unknown paths.
    let by_host = Request::get("/nothing")
        .header("host", format!("49983-{id}.localhost:3000"))
        .body(Body::empty())
        .unwrap();
    let resp = c.app.clone().oneshot(by_host).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // Unknown signature on a bare /files URL.
    let (s, _, _) = call(
        &c.app,
        Request::get("/files?path=/x&signature=v1_abc")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}
