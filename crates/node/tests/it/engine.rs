//! An engine over the remote node (`Engine::with_node`) against one over its node in process
//! (`Engine::new`, a `LocalNode`): the same scenario gives the same observations.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bulkhead_engine::driver::DriverHandle;
use bulkhead_engine::testing::FakeDriver;
use bulkhead_engine::{
    Caller, CreateRequest, Engine, EngineConfig, EngineError, ListRequest, ResumeRequest,
};
use bulkhead_node::RemoteNode;
use bulkhead_store::Store;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::{Harness, template};

fn cfg(root: &Path) -> EngineConfig {
    EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        reap_interval: Duration::from_millis(20),
        checkpoint_dir: root.join("checkpoints"),
        ..Default::default()
    }
}

async fn store(root: &Path) -> (Store, Caller) {
    let store = Store::open_sqlite_in(root).await.unwrap();
    bulkhead_engine::testing::unlock_secrets(&store).await;
    let owner = bulkhead_engine::testing::owner(&store).await;
    (store, owner)
}

/// An engine over `remote`, its store and templates under `root`.
pub async fn remote_engine(root: &Path, remote: Arc<RemoteNode>) -> (Arc<Engine>, Caller, Store) {
    let (store, owner) = store(root).await;
    let engine = Engine::with_node(store.clone(), remote.clone(), remote, cfg(root));
    engine.register_template(template(root)).await.unwrap();
    (engine, owner, store)
}

/// An engine over `driver` in process, its store and templates under `root`.
pub async fn local_engine(root: &Path, driver: Arc<FakeDriver>) -> (Arc<Engine>, Caller, Store) {
    let (store, owner) = store(root).await;
    let engine = Engine::new(store.clone(), driver, cfg(root));
    engine.register_template(template(root)).await.unwrap();
    (engine, owner, store)
}

/// `GET path` over a fresh agent stream of sandbox `id`: the status.
async fn agent_get(engine: &Arc<Engine>, id: &str, path: &str) -> u16 {
    let stream = engine.agent_stream(id).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, "agent")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

async fn pid(store: &Store, id: &str) -> i32 {
    let row = store.get_sandbox(id).await.unwrap().unwrap();
    let h: DriverHandle = serde_json::from_str(row.driver_handle.as_deref().unwrap()).unwrap();
    h.pid
}

/// Create, agent traffic, pause with memory, connect (resume), kill: what a client and the
/// driver see at each step.
async fn scenario(
    engine: &Arc<Engine>,
    owner: &Caller,
    store: &Store,
    driver: &FakeDriver,
) -> Vec<String> {
    let mut seen = Vec::new();
    let env = BTreeMap::from([("GREETING".to_string(), "hello".to_string())]);
    let sb = engine
        .create(
            owner,
            CreateRequest {
                template: "base".into(),
                env_vars: env,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    seen.push(format!(
        "created {} {} token={}",
        sb.template_id,
        sb.state,
        sb.envd_access_token.is_some()
    ));
    let first = pid(store, &sb.id).await;
    let init = driver.inits.lock().unwrap().last().cloned().unwrap();
    seen.push(format!("init env {}", init["envVars"]["GREETING"]));

    seen.push(format!(
        "GET /health {}",
        agent_get(engine, &sb.id, "/health").await
    ));
    seen.push(format!(
        "GET /nope {}",
        agent_get(engine, &sb.id, "/nope").await
    ));

    driver.set_var(first, "x", "42");
    driver.write_file(first, "/home/user/f.txt", "data");
    engine.pause(owner, &sb.id, true).await.unwrap();
    let paused = engine.get(owner, &sb.id).await.unwrap();
    seen.push(format!(
        "paused {} memory={:?}",
        paused.state, paused.pause_memory
    ));

    let (info, resumed) = engine
        .connect(owner, &sb.id, ResumeRequest::default())
        .await
        .unwrap();
    let second = pid(store, &sb.id).await;
    let memory = driver.memory(second).unwrap();
    seen.push(format!(
        "connected {} resumed={resumed} same token={} new pid={} x={} env={} file={:?}",
        info.state,
        info.envd_access_token == sb.envd_access_token,
        second != first,
        memory.vars["x"],
        memory.env["GREETING"],
        driver.file(second, "/home/user/f.txt"),
    ));
    seen.push(format!(
        "GET /health {}",
        agent_get(engine, &sb.id, "/health").await
    ));

    let usage = engine.usage(owner, &sb.id).await;
    seen.push(format!("usage ok={}", usage.is_ok()));

    engine.kill(owner, &sb.id).await.unwrap();
    let gone = engine.get(owner, &sb.id).await.unwrap_err();
    seen.push(format!(
        "killed: get says not found={}",
        matches!(gone, EngineError::SandboxNotFound(_))
    ));
    let running = engine
        .list(owner, &ListRequest::default())
        .await
        .unwrap()
        .items
        .len();
    seen.push(format!("listed {running}"));
    seen.push(format!(
        "driver started={} stopped>0={} checkpoints={} restores={}",
        driver.started.load(Ordering::SeqCst),
        driver.stopped.load(Ordering::SeqCst) > 0,
        driver.checkpoints.load(Ordering::SeqCst),
        driver.restores.load(Ordering::SeqCst),
    ));
    seen
}

#[tokio::test]
async fn an_engine_over_the_remote_node_sees_what_one_in_process_sees() {
    let h = Harness::start().await;
    let (engine, owner, store) = remote_engine(h.dir.path(), h.remote.clone()).await;
    let over_the_wire = scenario(&engine, &owner, &store, &h.driver).await;

    let dir = tempfile::tempdir().unwrap();
    let driver = Arc::new(FakeDriver::default());
    let (engine, owner, store) = local_engine(dir.path(), driver.clone()).await;
    let in_process = scenario(&engine, &owner, &store, &driver).await;

    assert_eq!(over_the_wire, in_process);
    // And what was seen is the scenario's, not two equal failures.
    assert!(
        in_process[0].starts_with("created base running"),
        "{in_process:?}"
    );
    assert!(
        in_process.contains(&"GET /health 204".to_string()),
        "{in_process:?}"
    );
    assert!(
        in_process
            .iter()
            .any(|s| s.contains("resumed=true same token=true new pid=true x=42 env=hello")),
        "{in_process:?}"
    );
}

#[tokio::test]
async fn the_getters_answer_from_the_nodes_info() {
    use bulkhead_engine::Node;
    let h = Harness::start().await;
    assert_eq!(h.remote.driver_name(), h.local.driver_name());
    assert_eq!(h.remote.capabilities(), h.local.capabilities());
    assert_eq!(h.remote.has_egress(), h.local.has_egress());
    assert_eq!(h.remote.checkpoint_key(), h.local.checkpoint_key());
    let ours = DriverHandle::new("fake", 1, 2, 3, serde_json::Value::Null);
    let theirs = DriverHandle::new("jail", 1, 2, 3, serde_json::Value::Null);
    assert!(h.remote.owns(&ours));
    assert!(!h.remote.owns(&theirs));
    assert_eq!(h.remote.info().node_id, "node-1");
}

#[tokio::test]
async fn pool_stock_counts_this_clients_calls_and_refresh_reads_the_node() {
    use bulkhead_engine::Node;
    let h = Harness::start().await;
    let spec = bulkhead_engine::driver::SandboxSpec {
        template_id: "base".into(),
        rootfs: h.dir.path().join("templates/base/rootfs"),
        cpu_count: 1,
        memory_mb: 128,
        pids_max: 16,
        disk_mb: 0,
        volumes: Vec::new(),
    };
    let a = h.remote.start(&spec, true).await.unwrap();
    let b = h.remote.start(&spec, true).await.unwrap();
    h.remote.pool_put("base", a.clone()).await;
    h.remote.pool_put("base", b.clone()).await;
    assert_eq!(
        h.remote.pool_stock(),
        BTreeMap::from([("base".to_string(), 2)])
    );
    assert_eq!(h.local.pool_stock(), h.remote.pool_stock());
    assert_eq!(h.remote.pool_take("base").await, Some(a));
    assert_eq!(h.remote.pool_stock()["base"], 1);

    // Another caller of the node: invisible until a refresh.
    h.local.pool_put("other", b.clone()).await;
    assert!(!h.remote.pool_stock().contains_key("other"));
    h.remote.refresh().await.unwrap();
    assert_eq!(h.remote.pool_stock(), h.local.pool_stock());

    assert_eq!(h.remote.pool_members().await.len(), 2);
    assert_eq!(h.remote.pool_take_surplus("base", 5).await, vec![b.clone()]);
    assert_eq!(h.remote.pool_drain(None).await, vec![b]);
    assert!(h.remote.pool_stock().is_empty());
    assert!(h.local.pool_stock().is_empty());
}
