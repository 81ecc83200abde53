//! What the API test modules share: the router over an engine with the fake driver and a
//! fresh SQLite store, and one JSON request helper.

#![allow(dead_code)] // Not every helper is used by every module.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bulkhead_engine::testing::FakeDriver;
use bulkhead_engine::{Engine, EngineConfig};
use bulkhead_store::Store;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub struct Ctx {
    pub dir: tempfile::TempDir,
    pub app: axum::Router,
    pub key: String,
    pub store: Store,
}

/// The router over a fresh engine (no warm pool, `base` registered); `configure` adjusts the
/// engine's configuration (given the test's directory) and `setup` the engine before use.
pub async fn ctx_with(
    configure: impl FnOnce(&mut EngineConfig, &Path),
    setup: impl FnOnce(&Arc<Engine>, &Path),
) -> Ctx {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    bulkhead_engine::testing::unlock_secrets(&store).await;
    let (_, key) = bulkhead_engine::keys::create(&store, "t").await.unwrap();
    let mut cfg = EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        ..Default::default()
    };
    configure(&mut cfg, dir.path());
    let engine = Engine::new(store.clone(), Arc::new(FakeDriver::default()), cfg);
    setup(&engine, dir.path());
    engine
        .register_template(bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    Ctx {
        dir,
        app: bulkhead_api::router(engine),
        key,
        store,
    }
}

pub async fn ctx() -> Ctx {
    ctx_with(|_, _| {}, |_, _| {}).await
}

impl Ctx {
    /// One request with the API key (and a JSON body); the answer as JSON (Null when empty).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("x-api-key", &self.key);
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Body::from(b.to_string())
            }
            None => Body::empty(),
        };
        let resp = self
            .app
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (status, v)
    }
}
