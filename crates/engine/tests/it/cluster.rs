//! Cluster membership over a real store (SQLite here; the store's own suite runs the same
//! statements on PostgreSQL): nodes heartbeat, replicas race for the health sweep, a silent
//! node goes suspect then dead, comes back under a new epoch, and placement only ever sees
//! ready nodes.

use std::collections::BTreeMap;

use bulkhead_engine::cluster::placement::{PlacementConfig, Placer, Request};
use bulkhead_engine::cluster::report::loads;
use bulkhead_engine::cluster::{Beat, HealthConfig, HealthSweeper, Heartbeat, NodeReport, Sweep};
use bulkhead_store::{NodeStatus, Store};
use rand::SeedableRng;
use rand::rngs::StdRng;

const T0: i64 = 1_800_000_000_000;

fn report(warm: u32) -> NodeReport {
    NodeReport {
        version: "test".into(),
        driver: "fake".into(),
        cpus: 8.0,
        memory_mib: 16 * 1024,
        warm: BTreeMap::from([("base".to_string(), warm)]),
        checkpoint_key: Some("k".into()),
        ..NodeReport::default()
    }
}

async fn status_of(store: &Store, id: &str) -> NodeStatus {
    store
        .get_node(id)
        .await
        .unwrap()
        .expect("registered")
        .status
}

#[tokio::test]
async fn a_silent_node_goes_suspect_then_dead_and_comes_back_under_a_new_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let mut n1 = Heartbeat::new(store.clone(), "n1", "10.0.0.1:7001");
    let mut n2 = Heartbeat::new(store.clone(), "n2", "10.0.0.2:7001");
    assert_eq!(
        n1.beat(&report(0), false, T0).await.unwrap(),
        Beat::Registered {
            epoch: 1,
            previous: None
        }
    );
    n2.beat(&report(2), false, T0).await.unwrap();
    let mut a = HealthSweeper::new(store.clone(), "api-a", HealthConfig::default());
    let mut b = HealthSweeper::new(store.clone(), "api-b", HealthConfig::default());
    let Sweep::Swept { epoch, changes } = a.round(T0).await.unwrap() else {
        panic!("the first replica takes the lease");
    };
    assert!(changes.is_empty());
    assert_eq!(b.round(T0).await.unwrap(), Sweep::NotHolder);

    // n1 keeps reporting; n2 goes quiet.
    for s in 1..=6 {
        let now = T0 + s * 1000;
        assert_eq!(
            n1.beat(&report(0), false, now).await.unwrap(),
            Beat::Reported { epoch: 1 }
        );
        let swept = a.round(now + 500).await.unwrap();
        assert!(matches!(swept, Sweep::Swept { epoch: e, .. } if e == epoch));
        assert_eq!(b.round(now + 500).await.unwrap(), Sweep::NotHolder);
        let expect = match s {
            1 | 2 => NodeStatus::Ready,
            3 | 4 => NodeStatus::Suspect,
            _ => NodeStatus::Dead,
        };
        assert_eq!(status_of(&store, "n2").await, expect, "at {s}.5 s");
        assert_eq!(status_of(&store, "n1").await, NodeStatus::Ready);
        // Placement never offers a node that is not ready, though n2 has the template warm.
        let nodes = loads(&store.list_nodes().await.unwrap());
        let req = Request {
            template: "base".into(),
            cpus: 1.0,
            memory_mib: 512,
            checkpoint_key: None,
            preferred: None,
        };
        let cfg = PlacementConfig::default();
        let mut rng = StdRng::seed_from_u64(s as u64);
        let chosen = Placer::new(&cfg, &nodes, &req).next(&mut rng).unwrap();
        let want = if expect == NodeStatus::Ready {
            "n2"
        } else {
            "n1"
        };
        assert_eq!(chosen.id, want, "at {s}.5 s (n2 is warm while ready)");
    }

    // n2 returns: its old epoch is refused, so it registers again as a new incarnation.
    let back = n2.beat(&report(2), false, T0 + 8000).await.unwrap();
    assert_eq!(
        back,
        Beat::Registered {
            epoch: 3,
            previous: Some(1)
        },
        "registration 1, death bumped it to 2, the return to 3"
    );
    assert_eq!(status_of(&store, "n2").await, NodeStatus::Ready);

    // A draining node reports itself so and stays out of placement.
    n1.beat(&report(0), true, T0 + 8000).await.unwrap();
    assert_eq!(status_of(&store, "n1").await, NodeStatus::Draining);
}

#[tokio::test]
async fn the_sweep_moves_to_another_replica_when_its_holder_stops() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let cfg = HealthConfig::default();
    let ttl = cfg.lease_ttl.as_millis() as i64;
    let mut a = HealthSweeper::new(store.clone(), "api-a", cfg.clone());
    let mut b = HealthSweeper::new(store.clone(), "api-b", cfg);
    let Sweep::Swept { epoch: first, .. } = a.round(T0).await.unwrap() else {
        panic!("a takes the lease");
    };
    // a stops renewing (paused, partitioned); b waits out the TTL, then takes over.
    assert_eq!(b.round(T0 + ttl - 1).await.unwrap(), Sweep::NotHolder);
    let Sweep::Swept { epoch: second, .. } = b.round(T0 + ttl).await.unwrap() else {
        panic!("b takes the expired lease");
    };
    assert!(
        second > first,
        "a new holder gets a new epoch (the fencing token)"
    );
    // a wakes up: its renewal fails and it does not sweep.
    assert_eq!(a.round(T0 + ttl + 1).await.unwrap(), Sweep::NotHolder);
    // b gives the lease up at shutdown; a takes it at once.
    b.release(T0 + ttl + 2).await.unwrap();
    assert!(matches!(
        a.round(T0 + ttl + 3).await.unwrap(),
        Sweep::Swept { epoch, .. } if epoch > second
    ));
}

#[tokio::test]
async fn a_node_reports_what_its_sandboxes_were_promised_and_its_warm_pools() {
    use bulkhead_engine::testing::{FakeEngine, fake_engine};
    use bulkhead_engine::{CreateRequest, EngineConfig};

    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        checkpoint_dir: dir.path().join("checkpoints"),
        ..Default::default()
    };
    let FakeEngine { engine, owner, .. } =
        fake_engine(dir.path(), cfg, bulkhead_engine::testing::base_template()).await;
    let idle = engine.node_report();
    assert_eq!(idle.driver, "fake");
    assert_eq!((idle.sandboxes, idle.cpu_allocated), (0, 0.0));
    assert!(idle.cpus >= 1.0 && idle.memory_mib > 0, "{idle:?}");
    assert!(idle.cached.contains("base"));

    let mut ids = Vec::new();
    for _ in 0..2 {
        let info = engine
            .create(
                &owner,
                CreateRequest {
                    template: "base".into(),
                    timeout: Some(60),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        ids.push(info.id);
    }
    let busy = engine.node_report();
    assert_eq!(busy.sandboxes, 2);
    let t = bulkhead_engine::testing::base_template();
    assert_eq!(busy.cpu_allocated, 2.0 * t.cpu_count as f64);
    assert_eq!(busy.memory_allocated_mib, 2 * t.memory_mb);
    assert_eq!(
        busy.warm.get("base").copied().unwrap_or(0) as usize,
        engine.pool_len("base")
    );
    // What it reports round-trips through the row's JSON, as a replica reads it back.
    assert_eq!(NodeReport::from_json(&busy.to_json()), busy);
    for id in ids {
        engine.kill(&owner, &id).await.unwrap();
    }
    assert_eq!(engine.node_report().sandboxes, 0);
}
