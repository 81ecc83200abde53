//! Two API replicas (two engines, as two `bulkhead api` processes) over one store and one set
//! of fake nodes: the replica that creates a sandbox drives it, the other routes requests for
//! it there, and once the owner's heartbeat stops, takes it over and drives it itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bulkhead_engine::cluster::placement::PlacementConfig;
use bulkhead_engine::cluster::replicas::DEAD_AFTER;
use bulkhead_engine::cluster::{
    Beat, ClusterNode, Membership, Route, StaticDirectory, StaticMember,
};
use bulkhead_engine::driver::DriverHandle;
use bulkhead_engine::testing::{FakeDriver, FakeHost, base_template};
use bulkhead_engine::{Caller, CreateRequest, Engine, EngineConfig, ListRequest, LocalNode};
use bulkhead_store::Store;

struct Replicas {
    _dir: tempfile::TempDir,
    store: Store,
    a: Arc<Engine>,
    b: Arc<Engine>,
    owner: Caller,
    drivers: Vec<Arc<FakeDriver>>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// An engine for replica `id` over its own router to the shared nodes.
async fn replica(
    store: &Store,
    dir: &std::path::Path,
    id: &str,
    directory: Arc<StaticDirectory>,
) -> Arc<Engine> {
    let router = ClusterNode::new(directory, PlacementConfig::default()).await;
    let cfg = EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        checkpoint_dir: dir.join(id).join("checkpoints"),
        replica: Some(id.to_owned()),
        ..Default::default()
    };
    let engine = Engine::with_node(store.clone(), router.clone(), router, cfg);
    engine.register_template(base_template()).await.unwrap();
    engine
}

async fn replicas() -> Replicas {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    bulkhead_engine::testing::unlock_secrets(&store).await;
    let mut drivers = Vec::new();
    let mut members = Vec::new();
    // Named apart: the two fake nodes share this test's disk, where each must recognise only its
    // own checkpoints, as nodes on their own disks do.
    for (id, name) in [("n1", "fake-n1"), ("n2", "fake-n2")] {
        let driver = Arc::new(FakeDriver::named(&FakeHost::default(), name));
        members.push(StaticMember::new(
            id,
            LocalNode::new(driver.clone()),
            8.0,
            16 * 1024,
        ));
        drivers.push(driver);
    }
    let directory = Arc::new(StaticDirectory::new(members));
    let a = replica(&store, dir.path(), "a", directory.clone()).await;
    let b = replica(&store, dir.path(), "b", directory).await;
    let owner = bulkhead_engine::testing::owner(&store).await;
    Replicas {
        _dir: dir,
        store,
        a,
        b,
        owner,
        drivers,
    }
}

impl Replicas {
    async fn create_on_a(&self) -> String {
        let req = CreateRequest {
            template: "base".into(),
            timeout: Some(600),
            ..Default::default()
        };
        self.a.create(&self.owner, req).await.unwrap().id
    }

    async fn handle(&self, id: &str) -> DriverHandle {
        let row = self.store.get_sandbox(id).await.unwrap().unwrap();
        serde_json::from_str(&row.driver_handle.expect("running")).unwrap()
    }

    fn runs(&self, h: &DriverHandle) -> bool {
        let i = if h.node.as_deref() == Some("n1") {
            0
        } else {
            1
        };
        self.drivers[i].alive.lock().unwrap().contains(&h.pid)
    }
}

#[tokio::test]
async fn the_creator_drives_a_sandbox_and_the_other_replica_routes_to_it() {
    let r = replicas().await;
    let mut ma = Membership::new(r.store.clone(), "a", "http://10.0.0.1:3000");
    let mut mb = Membership::new(r.store.clone(), "b", "http://10.0.0.2:3000");
    ma.beat(now_ms()).await.unwrap();
    mb.beat(now_ms()).await.unwrap();
    let id = r.create_on_a().await;
    let row = r.store.get_sandbox(&id).await.unwrap().unwrap();
    assert_eq!(row.owner_replica.as_deref(), Some("a"));

    assert!(r.a.is_live(&id) && !r.b.is_live(&id));
    assert_eq!(r.a.locate(&id).await.unwrap(), Route::Here);
    // B forwards it to A (an `{id}-{client}` form names the same sandbox).
    let to_a = Route::Owner {
        replica: "a".into(),
        addr: "http://10.0.0.1:3000".into(),
    };
    assert_eq!(r.b.locate(&id).await.unwrap(), to_a);
    assert_eq!(r.b.locate(&format!("{id}-n1")).await.unwrap(), to_a);
    // Unknown sandboxes are answered where asked (a 404 there).
    assert_eq!(r.b.locate("nosuchsandbox").await.unwrap(), Route::Here);
    // B's listing (from the store) shows A's sandbox as running, with its node.
    let page = r.b.list(&r.owner, &ListRequest::default()).await.unwrap();
    let listed: Vec<_> = page
        .items
        .iter()
        .map(|s| (s.id.as_str(), s.node.as_deref()))
        .collect();
    let node = r.handle(&id).await.node;
    assert_eq!(listed, [(id.as_str(), node.as_deref())]);
    assert_eq!(page.total_running, 1);
    // B's own rounds leave it alone while A heartbeats.
    assert_eq!(r.b.take_over(None).await.unwrap(), 0);
    assert_eq!(r.b.release_taken().await.unwrap(), 0);
    assert_eq!(r.a.release_taken().await.unwrap(), 0);
    assert!(r.a.is_live(&id));
    // What B forwards, A does: the kill is A's.
    r.a.kill(&r.owner, &id).await.unwrap();
    assert_eq!(r.b.locate(&id).await.unwrap(), Route::Here);
}

#[tokio::test]
async fn a_silent_replicas_sandboxes_are_taken_over_once_and_driven_by_the_taker() {
    let r = replicas().await;
    let mut ma = Membership::new(r.store.clone(), "a", "http://10.0.0.1:3000");
    let mut mb = Membership::new(r.store.clone(), "b", "http://10.0.0.2:3000");
    // A's last heartbeat is almost DEAD_AFTER old: it goes silent in a moment.
    let head_start = DEAD_AFTER - Duration::from_millis(1_500);
    ma.beat(now_ms() - head_start.as_millis() as i64)
        .await
        .unwrap();
    mb.beat(now_ms()).await.unwrap();
    let asked = r.create_on_a().await;
    let rest = r.create_on_a().await;
    let (h_asked, h_rest) = (r.handle(&asked).await, r.handle(&rest).await);
    assert!(matches!(
        r.b.locate(&asked).await.unwrap(),
        Route::Owner { .. }
    ));

    // A stops heartbeating: the first request B gets for one of its sandboxes takes it over.
    let silent = Instant::now();
    let taken = loop {
        mb.beat(now_ms()).await.unwrap();
        if r.b.locate(&asked).await.unwrap() == Route::Here {
            break silent.elapsed();
        }
        assert!(
            silent.elapsed() < Duration::from_secs(5),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        taken <= Duration::from_millis(2_000),
        "taken after {taken:?}"
    );
    assert!(r.b.is_live(&asked), "B drives the sandbox it took");
    assert!(
        !r.b.is_live(&rest),
        "only the sandbox asked for was taken on demand"
    );
    assert_eq!(
        r.store
            .get_sandbox(&asked)
            .await
            .unwrap()
            .unwrap()
            .owner_replica
            .as_deref(),
        Some("b")
    );
    // B's background round takes the rest; nothing is taken twice.
    assert_eq!(r.b.take_over(None).await.unwrap(), 1);
    assert_eq!(r.b.take_over(None).await.unwrap(), 0);
    assert!(r.b.is_live(&rest));
    // The node-side sandboxes never stopped, and B answers for them.
    assert!(r.runs(&h_asked) && r.runs(&h_rest));
    let info = r.b.get(&r.owner, &asked).await.unwrap();
    assert_eq!(info.id, asked);

    // A comes back: its heartbeat is refused, it registers again, and gives both up without
    // touching their nodes.
    assert!(matches!(
        ma.beat(now_ms()).await.unwrap(),
        Beat::Registered {
            epoch: 2,
            previous: Some(1)
        }
    ));
    assert_eq!(r.a.release_taken().await.unwrap(), 2);
    assert!(!r.a.is_live(&asked) && !r.a.is_live(&rest));
    assert!(r.runs(&h_asked) && r.runs(&h_rest));
    assert_eq!(
        r.a.locate(&asked).await.unwrap(),
        Route::Owner {
            replica: "b".into(),
            addr: "http://10.0.0.2:3000".into()
        }
    );

    // B, the owner now, kills them: their processes on the nodes stop.
    r.b.kill(&r.owner, &asked).await.unwrap();
    r.b.kill(&r.owner, &rest).await.unwrap();
    assert!(!r.runs(&h_asked) && !r.runs(&h_rest));
    let page = r.a.list(&r.owner, &ListRequest::default()).await.unwrap();
    assert!(page.items.is_empty(), "{:?}", page.items);
}

#[tokio::test]
async fn a_paused_sandbox_taken_over_resumes_with_its_memory_through_the_taker() {
    let r = replicas().await;
    let mut ma = Membership::new(r.store.clone(), "a", "http://10.0.0.1:3000");
    let mut mb = Membership::new(r.store.clone(), "b", "http://10.0.0.2:3000");
    // A's heartbeat is already older than DEAD_AFTER once the sandbox is paused.
    ma.beat(now_ms() - DEAD_AFTER.as_millis() as i64 + 300)
        .await
        .unwrap();
    mb.beat(now_ms()).await.unwrap();
    let id = r.create_on_a().await;
    let h = r.handle(&id).await;
    let i = usize::from(h.node.as_deref() != Some("n1"));
    r.drivers[i].set_var(h.pid, "x", "42");
    r.a.pause(&r.owner, &id, true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    mb.beat(now_ms()).await.unwrap();
    assert_eq!(r.b.take_over(None).await.unwrap(), 1);
    assert!(r.b.is_live(&id));
    assert_eq!(r.b.get(&r.owner, &id).await.unwrap().state, "paused");
    let info =
        r.b.resume(&r.owner, &id, bulkhead_engine::ResumeRequest::default())
            .await
            .unwrap();
    assert_eq!(info.id, id);
    let back = r.handle(&id).await;
    assert_eq!(
        back.node, h.node,
        "resumed on the node holding its checkpoint"
    );
    assert_eq!(r.drivers[i].memory(back.pid).unwrap().vars["x"], "42");
    r.b.kill(&r.owner, &id).await.unwrap();
    assert!(!r.runs(&back));
}
