//! Network, secrets and audit endpoints in E2B's shapes, in-process over the engine with the
//! test double driver and a recording egress proxy.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bulkhead_engine::network::EgressControl;
use bulkhead_engine::testing::RecordingEgress;
use bulkhead_store::EgressEventRow;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common;

/// The shared context plus the recording egress proxy the engine was given.
struct Ctx {
    c: common::Ctx,
    egress: Arc<RecordingEgress>,
}

impl std::ops::Deref for Ctx {
    type Target = common::Ctx;
    fn deref(&self) -> &common::Ctx {
        &self.c
    }
}

async fn ctx() -> Ctx {
    let egress = Arc::new(RecordingEgress::default());
    let e = egress.clone();
    let c = common::ctx_with(
        |_, _| {},
        move |engine, _| engine.set_egress(e as Arc<dyn EgressControl>, None),
    )
    .await;
    Ctx { c, egress }
}

async fn call(c: &Ctx, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    c.c.call(method, path, body).await
}

#[tokio::test]
async fn create_detail_and_put_network() {
    let c = ctx().await;
    // What the Python SDK sends for network={"allow_out": [...], "rules": {...}}.
    let (st, v) = call(
        &c,
        "POST",
        "/v2/sandboxes",
        Some(json!({
            "templateID": "base", "metadata": {}, "envVars": {},
            "network": {
                "allowOut": ["api.example.com", "*.pythonhosted.org"],
                "denyOut": ["0.0.0.0/0"],
                "allowPublicTraffic": true, "dnsServers": ["1.1.1.1"],
                "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.k}"}}}]}
            }
        })),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let id = v["sandboxID"].as_str().unwrap().to_string();
    let attached = c.egress.attached.lock().unwrap()[&id].clone();
    assert_eq!(
        attached.rules["api.example.com"][0].headers["Authorization"],
        "Bearer ${e2b.secrets.k}"
    );

    let (st, d) = call(&c, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(d["allowInternetAccess"], false);
    assert_eq!(
        d["network"]["allowOut"],
        json!(["api.example.com", "*.pythonhosted.org"])
    );
    assert_eq!(d["network"]["denyOut"], json!(["0.0.0.0/0"]));
    assert_eq!(
        d["network"]["rules"]["api.example.com"][0]["transform"]["headers"]["Authorization"],
        "Bearer ${e2b.secrets.k}"
    );

    // SandboxNetworkUpdateConfig: snake_case allow_internet_access, the rest camelCase.
    let (st, _) = call(
        &c,
        "PUT",
        &format!("/sandboxes/{id}/network"),
        Some(json!({"allow_internet_access": true, "denyOut": ["10.0.0.0/8"]})),
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let p = c.egress.attached.lock().unwrap()[&id].clone();
    assert!(p.allow_internet && p.allow_out.is_empty() && p.rules.is_empty());
    let (_, d) = call(&c, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(d["allowInternetAccess"], true);
    assert_eq!(d["network"]["allowOut"], json!([]));

    for (body, want) in [
        (
            json!({"allowOut": ["not a domain"]}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"egressProxy": {"address": "p:1080"}}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"allowOut": "pypi.org"}), StatusCode::BAD_REQUEST),
    ] {
        let (st, v) = call(&c, "PUT", &format!("/sandboxes/{id}/network"), Some(body)).await;
        assert_eq!(st, want, "{v}");
        assert_eq!(v["code"], 400);
        assert!(v["message"].as_str().unwrap().len() > 10, "{v}");
    }
    let (st, v) = call(
        &c,
        "PUT",
        "/sandboxes/nosuchsandbox0000000/network",
        Some(json!({})),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    // An empty body is an empty config: deny everything.
    let (st, _) = call(&c, "PUT", &format!("/sandboxes/{id}/network"), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert!(c.egress.attached.lock().unwrap().is_empty());

    // Bad network on create: 400 before anything starts.
    let (st, v) = call(
        &c,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "network": {"denyOut": ["999.0.0.0/8"]}})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test]
async fn secrets_crud_in_e2b_shapes_without_values() {
    let c = ctx().await;
    let (st, s) = call(
        &c,
        "POST",
        "/secrets",
        Some(json!({"name": "openai", "value": "sk-very-secret", "metadata": {"team": "ml"}})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{s}");
    let id = s["secretID"].as_str().unwrap().to_string();
    assert_eq!(s["name"], "openai");
    assert_eq!(s["currentVersion"], 1);
    assert_eq!(s["metadata"]["team"], "ml");
    assert!(s["createdAt"].as_str().unwrap().ends_with('Z'));
    assert!(!s.to_string().contains("sk-very-secret"));

    let (st, v) = call(
        &c,
        "POST",
        "/secrets",
        Some(json!({"name": "openai", "value": "x"})),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    let (st, _) = call(
        &c,
        "POST",
        "/secrets",
        Some(json!({"name": "a}b", "value": "x"})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    for path in [format!("/secrets/{id}"), "/secrets/openai".to_string()] {
        let (st, v) = call(&c, "GET", &path, None).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(v["secretID"], id.as_str());
        assert!(!v.to_string().contains("sk-very-secret"));
    }
    let (st, v) = call(
        &c,
        "POST",
        "/secrets/openai",
        Some(json!({"value": "sk-2"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["currentVersion"], 2);
    assert_eq!(
        c.store
            .secret_value("default", "openai")
            .await
            .unwrap()
            .as_deref(),
        Some("sk-2")
    );
    let (st, _) = call(&c, "POST", "/secrets/nope", Some(json!({"value": "x"}))).await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    for i in 0..3 {
        call(
            &c,
            "POST",
            "/secrets",
            Some(json!({"name": format!("s{i}"), "value": "v"})),
        )
        .await;
    }
    let resp = c
        .app
        .clone()
        .oneshot(
            Request::get("/secrets?limit=2")
                .header("x-api-key", &c.key)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let token = resp.headers()["x-next-token"].to_str().unwrap().to_string();
    let page: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(page.as_array().unwrap().len(), 2);
    let (_, rest) = call(
        &c,
        "GET",
        &format!("/secrets?limit=2&nextToken={token}"),
        None,
    )
    .await;
    assert_eq!(rest.as_array().unwrap().len(), 2);

    let (st, _) = call(&c, "DELETE", &format!("/secrets/{id}"), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, v) = call(&c, "DELETE", &format!("/secrets/{id}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], 404);
    // Without a key: 401 like every control-plane route.
    let resp = c
        .app
        .clone()
        .oneshot(Request::get("/secrets").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn audit_events_endpoint() {
    let c = ctx().await;
    let (_, v) = call(
        &c,
        "POST",
        "/v2/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    let id = v["sandboxID"].as_str().unwrap().to_string();
    let ev = |at: i64, allowed: bool| EgressEventRow {
        sandbox_id: id.clone(),
        at,
        protocol: "tls".into(),
        host: Some("pypi.org".into()),
        ip: Some("151.101.0.223".into()),
        port: 443,
        allowed,
        rule: if allowed {
            "allowOut:pypi.org"
        } else {
            "default-deny"
        }
        .into(),
        bytes_out: 100,
        bytes_in: 2000,
    };
    c.store
        .insert_egress_events(&[ev(1_700_000_000_000, true), ev(1_700_000_000_500, false)])
        .await
        .unwrap();
    let (st, v) = call(&c, "GET", &format!("/sandboxes/{id}/network/events"), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v[0],
        json!({"sandboxID": id, "timestamp": "2023-11-14T22:13:20.000Z", "protocol": "tls",
               "host": "pypi.org", "ip": "151.101.0.223", "port": 443, "allowed": true,
               "rule": "allowOut:pypi.org", "bytesOut": 100, "bytesIn": 2000})
    );
    assert_eq!(v[1]["allowed"], false);
    let (_, v) = call(
        &c,
        "GET",
        &format!("/sandboxes/{id}/network/events?limit=1"),
        None,
    )
    .await;
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["allowed"], false);
    let (st, _) = call(
        &c,
        "GET",
        &format!("/sandboxes/{id}/network/events?limit=x"),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, _) = call(
        &c,
        "GET",
        "/sandboxes/nosuchsandbox0000000/network/events",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}
