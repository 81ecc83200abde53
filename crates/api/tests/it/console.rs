//! The web console's server side over the fake driver: login, the session cookie, the replay
//! of allowlisted routes with the session's key, CSRF refusals, revocation ending a session,
//! and the team-scoped key routes it reads. (The page itself is tested in a real browser by
//! tests/sdk/console.)

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// One request with optional cookie and extra headers; status, headers, JSON body.
async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut req = Request::builder().method(method).uri(path);
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
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, headers, v)
}

async fn login(app: &axum::Router, key: &str) -> String {
    let (status, headers, body) = send(
        app,
        "POST",
        "/console/api/login",
        &[("x-bulkhead-console", "1")],
        Some(json!({ "apiKey": key })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let set = headers["set-cookie"].to_str().unwrap();
    assert!(!set.contains(key));
    set.split(';').next().unwrap().to_owned()
}

#[tokio::test]
async fn a_session_replays_listed_routes_with_its_key_until_the_key_is_revoked() {
    let c = common::ctx().await;
    let (status, sbx) = c
        .call(
            "POST",
            "/v2/sandboxes",
            Some(json!({ "templateID": "base" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{sbx}");
    let id = sbx["sandboxID"].as_str().unwrap().to_owned();

    let cookie = login(&c.app, &c.key).await;
    let h = [("cookie", cookie.as_str())];
    let (status, _, list) = send(&c.app, "GET", "/console/api/v2/sandboxes", &h, None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list[0]["sandboxID"], id.as_str());
    // The sandbox's access token never reaches the page.
    let (status, _, one) = send(
        &c.app,
        "GET",
        &format!("/console/api/sandboxes/{id}"),
        &h,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["sandboxID"], id.as_str());
    assert!(one.get("envdAccessToken").is_none(), "{one}");
    let (_, direct) = c.call("GET", &format!("/sandboxes/{id}"), None).await;
    assert!(direct.get("envdAccessToken").is_some(), "{direct}");

    // Not listed: 404, whatever the session may do otherwise.
    for (m, p) in [
        ("POST", "/console/api/v2/sandboxes"),
        ("GET", "/console/api/secrets"),
    ] {
        let hs = [("cookie", cookie.as_str()), ("x-bulkhead-console", "1")];
        let (status, _, body) =
            send(&c.app, m, p, &hs, Some(json!({ "templateID": "base" }))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{m} {p}: {body}");
    }
    // State changes need the console's header; other sites are refused outright.
    let kill = format!("/console/api/sandboxes/{id}");
    let (status, _, _) = send(&c.app, "DELETE", &kill, &h, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let cross = [
        ("cookie", cookie.as_str()),
        ("sec-fetch-site", "cross-site"),
    ];
    let (status, _, _) = send(&c.app, "GET", "/console/api/v2/sandboxes", &cross, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let hs = [("cookie", cookie.as_str()), ("x-bulkhead-console", "1")];
    let (status, _, body) = send(&c.app, "DELETE", &kill, &hs, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // Revoking the key (here from the console itself) ends the session at its next request.
    let (_, _, keys) = send(&c.app, "GET", "/console/api/bulkhead/v1/keys", &h, None).await;
    let mine = keys[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(keys[0]["current"], true);
    let (status, _, _) = send(
        &c.app,
        "DELETE",
        &format!("/console/api/bulkhead/v1/keys/{mine}"),
        &hs,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, headers, body) = send(&c.app, "GET", "/console/api/v2/sandboxes", &h, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["message"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
    assert!(
        headers["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
}

#[tokio::test]
async fn login_refuses_wrong_keys_and_foreign_pages() {
    let c = common::ctx().await;
    let (status, _, body) = send(
        &c.app,
        "POST",
        "/console/api/login",
        &[("x-bulkhead-console", "1")],
        Some(json!({ "apiKey": format!("e2b_{}", "0".repeat(40)) })),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], 401);
    let key = json!({ "apiKey": c.key });
    let (status, _, _) = send(&c.app, "POST", "/console/api/login", &[], Some(key.clone())).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no console header");
    let foreign = [
        ("x-bulkhead-console", "1"),
        ("origin", "http://evil.test"),
        ("host", "bulkhead.test"),
    ];
    let (status, _, _) = send(&c.app, "POST", "/console/api/login", &foreign, Some(key)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "foreign origin");
    let (status, _, _) = send(&c.app, "GET", "/console/api/v2/sandboxes", &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, headers, _) = send(&c.app, "GET", "/console/", &[], None).await;
    assert_eq!(status, StatusCode::OK);
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
}

#[tokio::test]
async fn keys_are_listed_and_revoked_within_the_team_only() {
    let c = common::ctx().await;
    bulkhead_engine::teams::create(&c.store, "other", None)
        .await
        .unwrap();
    let (_, other_key) = bulkhead_engine::keys::create_in(&c.store, "theirs", "other")
        .await
        .unwrap();
    let (status, keys) = c.call("GET", "/bulkhead/v1/keys", None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = keys
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["t"]);
    assert!(keys[0]["prefix"].as_str().unwrap().starts_with("e2b_"));
    assert!(!keys.to_string().contains(&c.key));

    let theirs = bulkhead_engine::keys::list(&c.store)
        .await
        .unwrap()
        .into_iter()
        .find(|k| k.name == "theirs")
        .unwrap();
    let (status, body) = c
        .call("DELETE", &format!("/bulkhead/v1/keys/{}", theirs.id), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        c.app
            .clone()
            .oneshot(
                Request::get("/bulkhead/v1/keys")
                    .header("x-api-key", &other_key)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
            .status()
            .is_success(),
        "their key still works"
    );
}
