//! The volume routes and Bulkhead's OpenAPI document, in-process over the engine with a test
//! double driver and plain-directory volume storage.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bulkhead_engine::driver::{ChangeKind, FileChange};
use bulkhead_engine::volume_storage::PlainDir;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::common;

async fn ctx() -> common::Ctx {
    common::ctx_with(
        |_, _| {},
        |engine, dir| engine.set_volume_storage(Arc::new(PlainDir::new(dir.join("volumes")))),
    )
    .await
}

async fn call(app: &axum::Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

async fn call_json(app: &axum::Router, req: Request<Body>) -> (StatusCode, Value) {
    let (s, b) = call(app, req).await;
    let v = if b.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into()))
    };
    (s, v)
}

fn req(
    method: &str,
    path: &str,
    key: Option<&str>,
    bearer: Option<&str>,
    body: Body,
) -> Request<Body> {
    let mut r = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    if let Some(t) = bearer {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    r.body(body).unwrap()
}

#[tokio::test]
async fn volume_rest_and_content_routes() {
    let c = ctx().await;
    let k = Some(c.key.as_str());
    let (s, v) = call_json(
        &c.app,
        req(
            "POST",
            "/volumes",
            k,
            None,
            Body::from(r#"{"name":"data"}"#),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["volumeID"].as_str().unwrap().to_string();
    let token = v["token"].as_str().unwrap().to_string();
    assert_eq!(v["name"], "data");

    let (s, v) = call_json(
        &c.app,
        req(
            "POST",
            "/volumes",
            k,
            None,
            Body::from(r#"{"name":"data"}"#),
        ),
    )
    .await;
    assert_eq!((s, v["code"].clone()), (StatusCode::CONFLICT, json!(409)));
    let (s, v) = call_json(
        &c.app,
        req("POST", "/volumes", k, None, Body::from(r#"{"name":"a b"}"#)),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("Invalid volume name")
    );
    let (s, v) = call_json(&c.app, req("GET", "/volumes", k, None, Body::empty())).await;
    assert_eq!(
        (s, v),
        (StatusCode::OK, json!([{"volumeID": id, "name": "data"}]))
    );
    let (s, v) = call_json(
        &c.app,
        req("GET", &format!("/volumes/{id}"), k, None, Body::empty()),
    )
    .await;
    assert_eq!(
        (s, v["token"].as_str()),
        (StatusCode::OK, Some(token.as_str()))
    );
    let (s, _) = call_json(&c.app, req("GET", "/volumes", None, None, Body::empty())).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // Content: token auth, upload bigger than the control plane's 2 MiB JSON limit.
    let t = Some(token.as_str());
    let big = vec![7u8; 3 << 20];
    let (s, v) = call_json(
        &c.app,
        req(
            "PUT",
            &format!("/volumecontent/{id}/file?path=/d/big.bin&force=true"),
            None,
            t,
            Body::from(big.clone()),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["size"], json!(3 << 20));
    let (s, b) = call(
        &c.app,
        req(
            "GET",
            &format!("/volumecontent/{id}/file?path=/d/big.bin"),
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b, big);
    let (s, v) = call_json(
        &c.app,
        req(
            "GET",
            &format!("/volumecontent/{id}/dir?path=/&depth=2"),
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["/d", "/d/big.bin"]
    );
    let (s, v) = call_json(
        &c.app,
        req(
            "POST",
            &format!("/volumecontent/{id}/dir?path=/e&mode=448"),
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!((s, v["mode"].clone()), (StatusCode::CREATED, json!(0o700)));
    let (s, v) = call_json(
        &c.app,
        req(
            "PATCH",
            &format!("/volumecontent/{id}/path?path=/e"),
            None,
            t,
            Body::from(r#"{"mode":493}"#),
        ),
    )
    .await;
    assert_eq!((s, v["mode"].clone()), (StatusCode::OK, json!(0o755)));
    let (s, v) = call_json(
        &c.app,
        req(
            "GET",
            &format!("/volumecontent/{id}/path?path=/nope"),
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!((s, v["code"].clone()), (StatusCode::NOT_FOUND, json!(404)));
    let (s, v) = call_json(
        &c.app,
        req(
            "GET",
            &format!("/volumecontent/{id}/path?path=/../etc"),
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // A symlink planted out of the volume (as a sandbox could) is not followed.
    let root = c.dir.path().join("volumes").join(&id).join("data");
    std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).unwrap();
    let (s, v) = call_json(
        &c.app,
        req(
            "GET",
            &format!("/volumecontent/{id}/file?path=/passwd"),
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("outside the volume")
    );
    let (s, _) = call_json(
        &c.app,
        req(
            "PUT",
            &format!("/volumecontent/{id}/file?path=/passwd"),
            None,
            t,
            Body::from("x"),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Wrong or missing token, unknown volume: 401 alike; the team's API key works.
    for (bearer, key) in [(Some("nope"), None), (None, None)] {
        let (s, _) = call_json(
            &c.app,
            req(
                "GET",
                &format!("/volumecontent/{id}/path?path=/d"),
                key,
                bearer,
                Body::empty(),
            ),
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let (s, _) = call_json(
        &c.app,
        req(
            "GET",
            "/volumecontent/unknown/path?path=/d",
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = call_json(
        &c.app,
        req(
            "GET",
            &format!("/volumecontent/{id}/path?path=/d"),
            k,
            None,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call_json(
        &c.app,
        req(
            "DELETE",
            &format!("/volumecontent/{id}/path?path=/d"),
            None,
            t,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    // A create that mounts it records it; delete is refused while that sandbox lives.
    let body =
        json!({"templateID": "base", "volumeMounts": [{"name": "data", "path": "/mnt/data"}]});
    let (s, sb) = call_json(
        &c.app,
        req(
            "POST",
            "/v2/sandboxes",
            k,
            None,
            Body::from(body.to_string()),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{sb}");
    for (path, name) in [("/proc/x", "data"), ("/mnt/x", "missing"), ("rel", "data")] {
        let body = json!({"templateID": "base", "volumeMounts": [{"name": name, "path": path}]});
        let (s, v) = call_json(
            &c.app,
            req(
                "POST",
                "/v2/sandboxes",
                k,
                None,
                Body::from(body.to_string()),
            ),
        )
        .await;
        assert!(
            s == StatusCode::BAD_REQUEST || s == StatusCode::NOT_FOUND,
            "{path}: {s} {v}"
        );
    }
    let (s, v) = call_json(
        &c.app,
        req("DELETE", &format!("/volumes/{id}"), k, None, Body::empty()),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let sid = sb["sandboxID"].as_str().unwrap();
    let (s, _) = call_json(
        &c.app,
        req(
            "DELETE",
            &format!("/sandboxes/{sid}"),
            k,
            None,
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call_json(
        &c.app,
        req("DELETE", &format!("/volumes/{id}"), k, None, Body::empty()),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(!c.dir.path().join("volumes").join(&id).exists());
    let (s, _) = call_json(
        &c.app,
        req("DELETE", &format!("/volumes/{id}"), k, None, Body::empty()),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// Does `v` have the shape of the object schema `name` (known keys, required keys, types)?
fn check_schema(doc: &Value, name: &str, v: &Value) {
    let schema = &doc["components"]["schemas"][name];
    let props = schema["properties"].as_object().unwrap();
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("{name}: not an object: {v}"));
    for r in schema["required"].as_array().unwrap() {
        assert!(
            obj.contains_key(r.as_str().unwrap()),
            "{name}: missing {r} in {v}"
        );
    }
    for (k, val) in obj {
        let p = props
            .get(k)
            .unwrap_or_else(|| panic!("{name}: {k} is not documented"));
        // A `$ref` (e.g. an enum) is checked against the schema it names.
        let p = match p["$ref"].as_str() {
            Some(r) => &doc["components"]["schemas"][r.rsplit('/').next().unwrap()],
            None => p,
        };
        // OpenAPI 3.1 spells a nullable type as `["string", "null"]`.
        let types: Vec<&str> = match &p["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            t => panic!("{name}.{k}: unexpected type {t}"),
        };
        let ok = types.iter().any(|t| match *t {
            "string" => val.is_string(),
            "integer" => val.is_u64() || val.is_i64(),
            "boolean" => val.is_boolean(),
            "null" => val.is_null(),
            t => panic!("{name}: unexpected type {t}"),
        });
        assert!(ok, "{name}.{k}: {val} is not a {}", p["type"]);
        if let Some(e) = p["enum"].as_array() {
            assert!(e.contains(val), "{name}.{k}: {val} not in {e:?}");
        }
    }
}

#[tokio::test]
async fn openapi_paths_are_routed_and_schemas_match() {
    // The generated document (checked in as docs/openapi.json; see tests/it/openapi.rs).
    let doc: Value =
        serde_json::from_str(&bulkhead_api::openapi_json()).expect("the document parses");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let c = ctx().await;
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.contains_key("/sandboxes/{id}/changes"));
    for (path, ops) in paths {
        let concrete: String = path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "x" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        for method in ops.as_object().unwrap().keys() {
            let (s, v) = call_json(
                &c.app,
                req(
                    &method.to_uppercase(),
                    &format!("{concrete}?path=/"),
                    Some(&c.key),
                    None,
                    Body::empty(),
                ),
            )
            .await;
            assert_ne!(
                s,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is not routed"
            );
            let msg = v["message"].as_str().unwrap_or("");
            assert!(
                !msg.starts_with("No route for"),
                "{method} {path} is not routed: {v}"
            );
        }
    }

    // The change list's schema is what the handler returns.
    for c in [
        FileChange {
            path: "/home/user/a.py".into(),
            kind: ChangeKind::Created,
            file_type: "file".into(),
            size: 12,
            mtime: Some(1_700_000_000),
        },
        FileChange {
            path: "/etc/issue".into(),
            kind: ChangeKind::Deleted,
            file_type: "file".into(),
            size: 0,
            mtime: None,
        },
    ] {
        let v = serde_json::to_value(bulkhead_api::Change::from(&c)).unwrap();
        check_schema(&doc, "FileChange", &v);
    }
    // And the volume entry's.
    let (_, v) = call_json(
        &c.app,
        req(
            "POST",
            "/volumes",
            Some(&c.key),
            None,
            Body::from(r#"{"name":"s"}"#),
        ),
    )
    .await;
    check_schema(&doc, "VolumeAndToken", &v);
    let (id, token) = (
        v["volumeID"].as_str().unwrap(),
        v["token"].as_str().unwrap(),
    );
    let (_, st) = call_json(
        &c.app,
        req(
            "PUT",
            &format!("/volumecontent/{id}/file?path=/f"),
            None,
            Some(token),
            Body::from("x"),
        ),
    )
    .await;
    check_schema(&doc, "VolumeEntryStat", &st);
    let (_, err) = call_json(
        &c.app,
        req(
            "GET",
            &format!("/volumecontent/{id}/path?path=/nope"),
            None,
            Some(token),
            Body::empty(),
        ),
    )
    .await;
    check_schema(&doc, "Error", &err);
}
