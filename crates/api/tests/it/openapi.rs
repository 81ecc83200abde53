//! The OpenAPI document as a contract: the checked-in `docs/openapi.json` is what the code
//! generates; every documented path and method reaches a handler of the real router (not its
//! fallback); no route is registered outside the document; the document and its reference page
//! are served without a key; and every answer carries a sane request id.

use crate::common;

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn checked_in_document_is_current() {
    let generated = bulkhead_api::openapi_json();
    let path = repo_root().join("docs/openapi.json");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        generated == checked_in,
        "docs/openapi.json differs from the document the code generates (a route, handler \
         annotation or wire type changed). Regenerate it with\n    \
         cargo run -p bulkhead -- openapi > docs/openapi.json\nand review the diff."
    );
}

#[test]
fn operation_ids_are_unique_and_every_operation_is_tagged() {
    let doc: Value = serde_json::from_str(&bulkhead_api::openapi_json()).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default().to_string();
            assert!(
                seen.insert(id.clone()),
                "{method} {path}: duplicate operationId {id}"
            );
            assert!(
                op["tags"].as_array().is_some_and(|t| !t.is_empty()),
                "{method} {path}: no tag"
            );
            assert!(
                op["responses"]["default"].is_object(),
                "{method} {path}: no error response"
            );
        }
    }
}

/// A concrete request path for a documented one (`{id}` → `x`).
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => in_param = true,
            '}' => {
                in_param = false;
                out.push('x');
            }
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

/// Every documented operation reaches a handler: the router's fallback answers 404 with
/// "No route for …", and a path with the wrong method answers 405. Requests go without an API
/// key (a keyed route answers 401, which is the route answering) except where the handler
/// must run to tell.
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let ctx = common::ctx().await;
    let doc: Value = serde_json::from_str(&bulkhead_api::openapi_json()).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let uri = concrete(path);
            let req = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(&uri)
                .header("x-api-key", &ctx.key)
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .unwrap();
            let resp = ctx.app.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8_lossy(&body);
            assert_ne!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {uri}: 405"
            );
            assert!(
                !(status == StatusCode::NOT_FOUND && body.contains("No route for")),
                "{method} {uri}: fell through to the router's fallback: {body}"
            );
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} operations documented");
    // The probe itself can fail: an undocumented path does reach the fallback.
    let (status, body) = ctx.call("GET", "/no/such/route", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["message"].as_str().unwrap().contains("No route for"));
}

/// The converse: routes are only registered through `OpenApiRouter::routes(routes!(..))`
/// (which documents them). A plain `.route(`, `route_service(` or a second `nest_service(` in
/// the API crate fails here; `/mcp` (a nested service described by `docs::mcp_endpoint`) is
/// the one exception.
#[test]
fn no_route_is_registered_outside_the_document() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    let mut nested = 0;
    let mut files = vec![];
    let mut dirs = vec![src];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains(".route(") || code.contains("route_service(") {
                offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
            if code.contains("nest_service(") || code.contains(".nest(") {
                nested += 1;
                assert!(
                    code.contains("\"/mcp\""),
                    "{}:{}: only /mcp may be nested",
                    path.display(),
                    n + 1
                );
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "routes registered without a document entry (annotate the handler with \
         #[utoipa::path] and register it with .routes(routes!(handler))):\n{}",
        offenders.join("\n")
    );
    assert_eq!(nested, 1, "the /mcp service is nested exactly once");
    let doc: Value = serde_json::from_str(&bulkhead_api::openapi_json()).unwrap();
    for m in ["get", "post", "delete"] {
        assert!(
            doc["paths"]["/mcp"][m].is_object(),
            "/mcp {m} is documented"
        );
    }
}

#[tokio::test]
async fn document_and_reference_page_are_served_without_a_key() {
    let ctx = common::ctx().await;
    let get = |uri: &'static str| {
        let app = ctx.app.clone();
        async move {
            let resp = app
                .oneshot(Request::get(uri).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = resp.status();
            let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, ct, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let (status, ct, body) = get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(ct.starts_with("application/json"));
    assert_eq!(body, bulkhead_api::openapi_json());
    let (status, ct, page) = get("/docs/api").await;
    assert_eq!(status, StatusCode::OK);
    assert!(ct.starts_with("text/html"));
    for needle in [
        "/v2/sandboxes",
        "/sandboxes/{id}/connect",
        "/bulkhead/v1/usage",
        "id=\"schema-SandboxDetail\"",
        "<code>envdAccessToken</code>",
    ] {
        assert!(page.contains(needle), "reference page lacks {needle}");
    }
    // Nothing fetched from elsewhere: the page is self-contained.
    assert!(!page.contains("<script"), "no scripts");
    assert!(!page.contains("src=\"http"), "no remote assets");
}

async fn request_id_of(ctx: &common::Ctx, given: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::get("/sandboxes/nope").header("x-api-key", &ctx.key);
    if let Some(g) = given {
        req = req.header("x-request-id", g);
    }
    let resp = ctx
        .app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    (resp.status(), id)
}

#[tokio::test]
async fn every_answer_carries_a_sane_request_id() {
    let ctx = common::ctx().await;
    let (status, id) = request_id_of(&ctx, Some("trace-42.a:b_c")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(id, "trace-42.a:b_c", "a sane client id is kept");
    let (_, generated) = request_id_of(&ctx, None).await;
    assert_eq!(generated.len(), 16, "a generated id: {generated}");
    let (_, other) = request_id_of(&ctx, None).await;
    assert_ne!(generated, other);
    let long = "a".repeat(129);
    for bad in [long.as_str(), "has space", "a\"b", "x/y"] {
        let (_, id) = request_id_of(&ctx, Some(bad)).await;
        assert_ne!(id, bad, "an insane client id is replaced, not echoed");
        assert_eq!(id.len(), 16);
    }
}
