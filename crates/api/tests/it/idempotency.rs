//! `Idempotency-Key` on the create routes: the header reaches the engine (one sandbox per key
//! and body, the same answer every time, on both create routes) and its refusals come back in
//! E2B's error shape with what to do.

use crate::common;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use bulkhead_store::SandboxFilter;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// `POST path` with `body` and these `Idempotency-Key` values (none, one, or several).
async fn create(
    ctx: &common::Ctx,
    path: &str,
    keys: &[HeaderValue],
    body: Value,
) -> (StatusCode, Value) {
    let mut req = Request::post(path)
        .header("x-api-key", &ctx.key)
        .header("content-type", "application/json");
    for k in keys {
        req = req.header("idempotency-key", k.clone());
    }
    let resp = ctx
        .app
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn sandboxes(ctx: &common::Ctx) -> i64 {
    ctx.store
        .count_sandboxes(&SandboxFilter::default())
        .await
        .unwrap()
}

fn key(k: &'static str) -> HeaderValue {
    HeaderValue::from_static(k)
}

#[tokio::test]
async fn a_repeated_create_with_a_key_answers_with_the_same_sandbox() {
    let ctx = common::ctx().await;
    let body = json!({"templateID": "base", "timeout": 60, "metadata": {"job": "1"}});
    let (status, first) = create(&ctx, "/sandboxes", &[key("job-1")], body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert!(first["envdAccessToken"].is_string(), "{first}");
    // Again on both routes (v2 only forces `secure`, which the SDKs' v1 default is anyway),
    // with the body's fields in another order.
    let reordered = json!({"metadata": {"job": "1"}, "timeout": 60, "templateID": "base"});
    for path in ["/sandboxes", "/v2/sandboxes"] {
        let (status, again) = create(&ctx, path, &[key("job-1")], reordered.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{path}: {again}");
        assert_eq!(again, first, "{path}");
    }
    assert_eq!(sandboxes(&ctx).await, 1);

    // The same key with another body: E2B's error shape, a 422 that says what to do.
    let (status, err) = create(
        &ctx,
        "/sandboxes",
        &[key("job-1")],
        json!({"templateID": "base", "timeout": 61, "metadata": {"job": "1"}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert_eq!(err["code"], 422);
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("'job-1' was used with a different request")
            && message.contains("new key"),
        "{message}"
    );

    // Without a key every create is a new sandbox.
    for _ in 0..2 {
        let (status, _) = create(&ctx, "/sandboxes", &[], body.clone()).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    assert_eq!(sandboxes(&ctx).await, 3);

    // After a kill the key does not hand the sandbox out again.
    let id = first["sandboxID"].as_str().unwrap();
    let (status, _) = ctx.call("DELETE", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, err) = create(&ctx, "/sandboxes", &[key("job-1")], body).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["code"], 409);
    assert!(
        err["message"].as_str().unwrap().contains(id),
        "names the sandbox: {err}"
    );
}

#[tokio::test]
async fn an_invalid_key_is_a_400_that_says_what_is_allowed() {
    let ctx = common::ctx().await;
    let body = json!({"templateID": "base"});
    let long = HeaderValue::from_str(&"k".repeat(256)).unwrap();
    let cases = [
        vec![key("has space")],
        vec![long],
        vec![HeaderValue::from_bytes(b"caf\xe9").unwrap()],
        vec![HeaderValue::from_static("")],
        vec![key("one"), key("two")],
    ];
    for keys in cases {
        let (status, err) = create(&ctx, "/sandboxes", &keys, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{keys:?}: {err}");
        assert_eq!(err["code"], 400);
        let message = err["message"].as_str().unwrap();
        assert!(
            message.starts_with("Invalid Idempotency-Key header"),
            "{message}"
        );
        if keys.len() == 1 {
            assert!(
                message.contains("1 to 255 visible ASCII characters"),
                "{message}"
            );
        }
    }
    assert_eq!(sandboxes(&ctx).await, 0);
}
