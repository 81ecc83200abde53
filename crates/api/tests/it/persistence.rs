//! The persistence routes (pause, connect/resume, snapshots, fork, lifecycle on create) in
//! E2B's shapes and status codes, in-process over the engine with the fake driver.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common;

use common::Ctx;

async fn ctx() -> Ctx {
    common::ctx_with(
        |cfg, dir| cfg.checkpoint_dir = dir.join("checkpoints"),
        |_, _| {},
    )
    .await
}

trait Create {
    async fn create(&self, body: Value) -> String;
}

impl Create for Ctx {
    async fn create(&self, body: Value) -> String {
        let (s, v) = self.call("POST", "/v2/sandboxes", Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["sandboxID"].as_str().unwrap().to_string()
    }
}

#[tokio::test]
async fn pause_connect_resume_status_codes() {
    let c = ctx().await;
    let id = c.create(json!({"templateID": "base"})).await;
    // Resuming a running sandbox: 409 (E2B).
    let (s, _) = c
        .call("POST", &format!("/sandboxes/{id}/resume"), Some(json!({})))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = c
        .call("POST", &format!("/sandboxes/{id}/pause"), Some(json!({})))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    // Pausing twice: 409 in E2B's shape.
    let (s, v) = c
        .call("POST", &format!("/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(v["code"], 409);
    let (s, v) = c.call("GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "paused");
    assert_eq!(v["pauseMode"], "full");
    let (s, v) = c.call("GET", "/v2/sandboxes?state=paused", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v.as_array().unwrap().len(), 1);
    // The proxy answers a paused sandbox as not running.
    let req = Request::get("/health")
        .header("e2b-sandbox-id", &id)
        .header("e2b-sandbox-port", "49983")
        .body(Body::empty())
        .unwrap();
    let resp = c.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("The sandbox was not found"));

    // Connect resumes: 201; again: 200 (extends).
    let (s, v) = c
        .call(
            "POST",
            &format!("/v2/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["sandboxID"], id.as_str());
    let (s, _) = c
        .call(
            "POST",
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // The older resume of a paused sandbox: 201.
    c.call(
        "POST",
        &format!("/sandboxes/{id}/pause"),
        Some(json!({"memory": false})),
    )
    .await;
    let (_, v) = c.call("GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(v["pauseMode"], "filesystem");
    let (s, _) = c
        .call("POST", &format!("/sandboxes/{id}/resume"), Some(json!({})))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = c.call("POST", "/sandboxes/nosuchsandbox/pause", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn lifecycle_on_create_shows_in_info() {
    let c = ctx().await;
    let id = c
        .create(json!({"templateID": "base", "autoPause": true, "autoResume": {"enabled": true}}))
        .await;
    let (_, v) = c.call("GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(
        v["lifecycle"],
        json!({"onTimeout": "pause", "autoResume": true})
    );
    let id = c
        .create(json!({"templateID": "base", "lifecycle": {"on_timeout": "pause"}}))
        .await;
    let (_, v) = c.call("GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(v["lifecycle"]["onTimeout"], "pause");
    let (s, _) = c
        .call(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "autoResume": {"enabled": true}})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "auto-resume without auto-pause");
}

#[tokio::test]
async fn snapshots_and_fork_shapes() {
    let c = ctx().await;
    let id = c.create(json!({"templateID": "base"})).await;
    let (s, v) = c
        .call(
            "POST",
            &format!("/sandboxes/{id}/snapshots"),
            Some(json!({"name": "snap-a"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        v,
        json!({"snapshotID": "snap-a:default", "names": ["snap-a:default"]})
    );
    let (s, v) = c
        .call("POST", &format!("/sandboxes/{id}/snapshots"), None)
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(v["names"], json!([]));
    let (s, v) = c
        .call("GET", &format!("/snapshots?sandboxID={id}&limit=1"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v.as_array().unwrap().len(), 1);
    let (_, v) = c.call("GET", "/snapshots?name=snap-a", None).await;
    assert_eq!(v.as_array().unwrap().len(), 1);

    let from = c.create(json!({"templateID": "snap-a:default"})).await;
    assert_ne!(from, id);

    let (s, v) = c
        .call(
            "POST",
            &format!("/sandboxes/{id}/fork"),
            Some(json!({"count": 2, "timeout": 30})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let forks = v.as_array().unwrap();
    assert_eq!(forks.len(), 2);
    assert!(forks.iter().all(|f| f["sandbox"]["sandboxID"].is_string()));
    let (s, _) = c
        .call(
            "POST",
            &format!("/sandboxes/{id}/fork"),
            Some(json!({"count": 21})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let (s, _) = c.call("DELETE", "/templates/snap-a%3Adefault", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = c.call("DELETE", "/templates/snap-a", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, _) = c.call("DELETE", "/templates/base", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}
