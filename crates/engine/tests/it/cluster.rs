//! Cluster membership over a real store (SQLite here; the store's own suite runs the same
//! statements on PostgreSQL): nodes heartbeat, replicas race for the health sweep, a silent
//! node goes suspect then dead, comes back under a new epoch, and placement only ever sees
//! ready nodes. Then (`router`) one engine over a `ClusterNode` of three fake nodes: spread,
//! draining, capacity refusals, resume where the checkpoint is, warm pools, unknown nodes.

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
    let Sweep::Swept { epoch, changes, .. } = a.round(T0).await.unwrap() else {
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

/// The store was out of reach (restarted, cut off): when the sweeper reaches it again every
/// heartbeat looks late, and no node is declared dead before it had a dead threshold to report.
#[tokio::test]
async fn after_a_store_outage_nodes_get_time_to_report_before_any_is_declared_dead() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let mut n1 = Heartbeat::new(store.clone(), "n1", "10.0.0.1:7001");
    let mut n2 = Heartbeat::new(store.clone(), "n2", "10.0.0.2:7001");
    n1.beat(&report(0), false, T0).await.unwrap();
    n2.beat(&report(0), false, T0).await.unwrap();
    let mut a = HealthSweeper::new(store.clone(), "api-a", HealthConfig::default());
    a.round(T0).await.unwrap();
    // 20 s with no round that reached the store (it was down); then rounds again. Both nodes'
    // heartbeats are 20 s old, but n1 reports within the quiet period and n2 does not.
    let back = T0 + 20_000;
    assert!(
        matches!(a.round(back).await.unwrap(), Sweep::Swept { ref changes, .. } if changes.is_empty())
    );
    assert_eq!(status_of(&store, "n1").await, NodeStatus::Ready);
    n1.beat(&report(0), false, back + 1_000).await.unwrap();
    for t in [2_000, 3_000, 4_000] {
        a.round(back + t).await.unwrap();
        n1.beat(&report(0), false, back + t).await.unwrap();
    }
    assert_eq!(
        status_of(&store, "n2").await,
        NodeStatus::Ready,
        "quiet for 5 s"
    );
    a.round(back + 5_000).await.unwrap();
    assert_eq!(status_of(&store, "n1").await, NodeStatus::Ready);
    assert_eq!(
        status_of(&store, "n2").await,
        NodeStatus::Dead,
        "silent past the quiet"
    );
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

// ---- One engine over a `ClusterNode` of three fake nodes. ----

mod router {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use bulkhead_engine::cluster::placement::{NodeStatus, PlacementConfig};
    use bulkhead_engine::cluster::{
        ClusterNode, Heartbeat, NodeReport, StaticDirectory, StaticMember, StoreDirectory,
    };
    use bulkhead_engine::driver::{
        AgentStream, DriverError, DriverHandle, SandboxSpec, StartError,
    };
    use bulkhead_engine::testing::{FakeDriver, FakeHost, base_template};
    use bulkhead_engine::{
        AgentPath, Caller, CreateRequest, Engine, EngineConfig, EngineError, LocalNode, Node,
        ResumeRequest,
    };
    use bulkhead_store::Store;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const IDS: [&str; 3] = ["n1", "n2", "n3"];

    /// A member's data path, counting the streams opened through it.
    struct CountingPath {
        node: Arc<LocalNode>,
        opened: AtomicUsize,
    }

    #[async_trait]
    impl AgentPath for CountingPath {
        async fn open(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
            self.opened.fetch_add(1, Ordering::SeqCst);
            self.node.open(h).await
        }
    }

    /// One machine: its own fake host (pids and start times repeat across machines, so a
    /// call sent to the wrong one would reach another sandbox or none).
    struct Machine {
        driver: Arc<FakeDriver>,
        local: Arc<LocalNode>,
        path: Arc<CountingPath>,
    }

    struct Cluster {
        _dir: tempfile::TempDir,
        store: Store,
        engine: Arc<Engine>,
        owner: Caller,
        directory: Arc<StaticDirectory>,
        router: Arc<ClusterNode>,
        machines: Vec<Machine>,
    }

    async fn cluster() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite_in(dir.path()).await.unwrap();
        bulkhead_engine::testing::unlock_secrets(&store).await;
        let mut machines = Vec::new();
        let mut members = Vec::new();
        for id in IDS {
            let driver = Arc::new(FakeDriver::on_host(&FakeHost::default()));
            let local = LocalNode::new(driver.clone());
            let path = Arc::new(CountingPath {
                node: local.clone(),
                opened: AtomicUsize::new(0),
            });
            let mut member = StaticMember::new(id, local.clone(), 8.0, 16 * 1024);
            member.agents = path.clone();
            members.push(member);
            machines.push(Machine {
                driver,
                local,
                path,
            });
        }
        let directory = Arc::new(StaticDirectory::new(members));
        let router = ClusterNode::new(directory.clone(), PlacementConfig::default()).await;
        let cfg = EngineConfig {
            pools: bulkhead_engine::PoolConfig::fixed(0),
            checkpoint_dir: dir.path().join("checkpoints"),
            ..Default::default()
        };
        let engine = Engine::with_node(store.clone(), router.clone(), router.clone(), cfg);
        engine.register_template(base_template()).await.unwrap();
        let owner = bulkhead_engine::testing::owner(&store).await;
        Cluster {
            _dir: dir,
            store,
            engine,
            owner,
            directory,
            router,
            machines,
        }
    }

    impl Cluster {
        async fn create(&self) -> Result<String, EngineError> {
            let req = CreateRequest {
                template: "base".into(),
                timeout: Some(600),
                ..Default::default()
            };
            Ok(self.engine.create(&self.owner, req).await?.id)
        }

        async fn handle(&self, id: &str) -> DriverHandle {
            let row = self.store.get_sandbox(id).await.unwrap().unwrap();
            serde_json::from_str(&row.driver_handle.expect("running")).unwrap()
        }

        fn machine(&self, h: &DriverHandle) -> &Machine {
            let id = h.node.as_deref().expect("the handle names its node");
            &self.machines[IDS.iter().position(|n| *n == id).expect("a member")]
        }

        /// Sandboxes per node, by their handles.
        async fn spread(&self, ids: &[String]) -> BTreeMap<String, usize> {
            let mut per = BTreeMap::new();
            for id in ids {
                *per.entry(self.handle(id).await.node.unwrap()).or_insert(0) += 1;
            }
            per
        }
    }

    fn refuse() -> DriverError {
        StartError::NoFreeSlot { max: 0 }.into()
    }

    /// `GET /health` over a stream to the sandbox's agent.
    async fn health(mut s: AgentStream) -> String {
        s.write_all(b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut chunk = [0u8; 256];
                let n = s.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the agent closed without answering");
                buf.extend_from_slice(&chunk[..n]);
            }
        })
        .await
        .expect("the agent answers");
        String::from_utf8_lossy(&buf)
            .lines()
            .next()
            .unwrap()
            .to_string()
    }

    #[tokio::test]
    async fn creates_spread_over_the_nodes_and_calls_reach_the_sandboxs_node() {
        let c = cluster().await;
        let mut ids = Vec::new();
        for _ in 0..30 {
            ids.push(c.create().await.unwrap());
        }
        let spread = c.spread(&ids).await;
        println!("30 creates over 3 equal nodes: {spread:?}");
        let (max, min) = (
            *spread.values().max().unwrap(),
            spread.values().min().copied().unwrap_or(0),
        );
        assert_eq!(spread.len(), 3, "every node gets some: {spread:?}");
        assert!(
            max as f64 / min as f64 <= 1.5,
            "max/min over 1.5: {spread:?}"
        );
        for (i, id) in IDS.iter().enumerate() {
            assert_eq!(
                c.machines[i].driver.started.load(Ordering::SeqCst) as usize,
                spread[*id],
                "{id} started what its handles say"
            );
        }
        for id in &ids {
            let h = c.handle(id).await;
            assert!(c.machine(&h).driver.alive.lock().unwrap().contains(&h.pid));
        }

        // Agent traffic and kills reach the sandbox's own node (pids repeat across nodes).
        for id in ids.iter().take(6) {
            let h = c.handle(id).await;
            let opened: Vec<usize> = c
                .machines
                .iter()
                .map(|m| m.path.opened.load(Ordering::SeqCst))
                .collect();
            let stream = c.engine.agent_stream(id).await.unwrap();
            assert_eq!(health(stream).await, "HTTP/1.1 204 No Content");
            for (i, m) in c.machines.iter().enumerate() {
                let want = opened[i] + usize::from(IDS[i] == h.node.as_deref().unwrap());
                assert_eq!(m.path.opened.load(Ordering::SeqCst), want, "{}", IDS[i]);
            }
            let stopped: Vec<i32> = c
                .machines
                .iter()
                .map(|m| m.driver.stopped.load(Ordering::SeqCst))
                .collect();
            c.engine.kill(&c.owner, id).await.unwrap();
            for (i, m) in c.machines.iter().enumerate() {
                let mine = IDS[i] == h.node.as_deref().unwrap();
                assert_eq!(
                    m.driver.stopped.load(Ordering::SeqCst),
                    stopped[i] + i32::from(mine)
                );
                if mine {
                    assert!(!m.driver.alive.lock().unwrap().contains(&h.pid));
                }
            }
        }
    }

    #[tokio::test]
    async fn a_draining_node_gets_no_new_sandboxes() {
        let c = cluster().await;
        assert!(c.directory.set_status("n2", NodeStatus::Draining));
        let mut ids = Vec::new();
        for _ in 0..12 {
            ids.push(c.create().await.unwrap());
        }
        let spread = c.spread(&ids).await;
        assert_eq!(spread.get("n2"), None, "{spread:?}");
        assert_eq!(c.machines[1].driver.started.load(Ordering::SeqCst), 0);
        assert_eq!(spread.values().sum::<usize>(), 12);
    }

    /// A node that stops answering while it starts a sandbox (partitioned, stopped) and is
    /// declared dead: the create moves on to another node instead of waiting for it.
    #[tokio::test]
    async fn a_start_in_flight_on_a_node_declared_dead_moves_on() {
        let c = cluster().await;
        for (i, m) in c.machines.iter().enumerate() {
            // n1 hangs; the others start at once.
            *m.driver.start_delay.lock().unwrap() = if i == 0 {
                Duration::from_secs(3600)
            } else {
                Duration::ZERO
            };
        }
        // Only n1 is ready, so placement picks it.
        for id in ["n2", "n3"] {
            c.directory.set_status(id, NodeStatus::Draining);
        }
        let engine = c.engine.clone();
        let owner = c.owner.clone();
        let create = tokio::spawn(async move {
            engine
                .create(
                    &owner,
                    CreateRequest {
                        template: "base".into(),
                        timeout: Some(600),
                        ..Default::default()
                    },
                )
                .await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!create.is_finished(), "n1 holds the start");
        // The sweep declares n1 dead and the others ready again; the router sees it.
        c.directory.set_status("n1", NodeStatus::Dead);
        for id in ["n2", "n3"] {
            c.directory.set_status(id, NodeStatus::Ready);
        }
        c.router.refresh().await;
        let info = tokio::time::timeout(Duration::from_secs(5), create)
            .await
            .expect("the create moved on")
            .unwrap()
            .expect("and succeeded elsewhere");
        let node = c.handle(&info.id).await.node.unwrap();
        assert_ne!(node, "n1");
        c.engine.kill(&c.owner, &info.id).await.unwrap();
    }

    #[tokio::test]
    async fn a_full_node_is_passed_over_and_a_full_cluster_answers_no_capacity() {
        let c = cluster().await;
        *c.machines[0].driver.fail_start.lock().unwrap() = Some(refuse);
        let mut ids = Vec::new();
        for _ in 0..9 {
            ids.push(
                c.create()
                    .await
                    .expect("a refusal moves on without an error"),
            );
        }
        let spread = c.spread(&ids).await;
        assert_eq!(spread.get("n1"), None, "{spread:?}");
        assert_eq!(spread.values().sum::<usize>(), 9);

        for m in &c.machines {
            *m.driver.fail_start.lock().unwrap() = Some(refuse);
        }
        match c.create().await {
            Err(EngineError::Driver {
                source: DriverError::NoCapacity { reason },
                ..
            }) => assert!(reason.contains("full"), "{reason}"),
            other => panic!("expected no capacity, got {other:?}"),
        }
        // Another failure than a refusal is the node's own error (E2B's create failure).
        *c.machines[2].driver.fail_start.lock().unwrap() = Some(|| DriverError::NotRunning);
        assert!(matches!(
            c.create().await,
            Err(EngineError::Driver {
                source: DriverError::NotRunning,
                ..
            })
        ));
    }

    #[tokio::test]
    async fn a_paused_sandbox_resumes_on_the_node_holding_its_checkpoint() {
        let c = cluster().await;
        let id = c.create().await.unwrap();
        let h = c.handle(&id).await;
        let home = h.node.clone().unwrap();
        c.machine(&h).driver.set_var(h.pid, "x", "42");
        c.engine.pause(&c.owner, &id, true).await.unwrap();
        assert_eq!(c.machine(&h).driver.checkpoints.load(Ordering::SeqCst), 1);

        // Its node becomes the busiest: fillers land there while the others drain.
        for other in IDS.iter().filter(|n| **n != home) {
            c.directory.set_status(other, NodeStatus::Draining);
        }
        for _ in 0..4 {
            let filler = c.create().await.unwrap();
            assert_eq!(c.handle(&filler).await.node.as_deref(), Some(home.as_str()));
        }
        for other in IDS {
            c.directory.set_status(other, NodeStatus::Ready);
        }

        c.engine
            .resume(&c.owner, &id, ResumeRequest::default())
            .await
            .unwrap();
        let back = c.handle(&id).await;
        assert_eq!(back.node.as_deref(), Some(home.as_str()));
        for (i, m) in c.machines.iter().enumerate() {
            let want = i32::from(IDS[i] == home);
            assert_eq!(m.driver.restores.load(Ordering::SeqCst), want, "{}", IDS[i]);
        }
        let memory = c.machine(&back).driver.memory(back.pid).unwrap();
        assert_eq!(memory.vars["x"], "42");

        // A holder that cannot take it: no other node is tried (its state is not there).
        c.engine.pause(&c.owner, &id, true).await.unwrap();
        c.directory.set_status(&home, NodeStatus::Draining);
        match c
            .engine
            .resume(&c.owner, &id, ResumeRequest::default())
            .await
        {
            Err(EngineError::RestoreFailed {
                source: DriverError::NoCapacity { reason },
                ..
            }) => assert!(reason.contains(&home), "{reason}"),
            other => panic!("expected no capacity, got {other:?}"),
        }
        c.directory.set_status(&home, NodeStatus::Ready);
        c.engine
            .resume(&c.owner, &id, ResumeRequest::default())
            .await
            .expect("still paused and resumable");
        assert_eq!(c.handle(&id).await.node.as_deref(), Some(home.as_str()));
    }

    #[tokio::test]
    async fn warm_stock_on_one_node_is_claimed_first() {
        let c = cluster().await;
        let spec = base_template().spec();
        let n3 = &c.machines[2];
        let mut pooled = Vec::new();
        for _ in 0..2 {
            let h = n3.local.start(&spec, true).await.unwrap();
            pooled.push(h.pid);
            n3.local.pool_put("base", h).await;
        }
        assert_eq!(c.engine.pool_len("base"), 2);
        for _ in 0..2 {
            let id = c.create().await.unwrap();
            let h = c.handle(&id).await;
            assert_eq!(h.node.as_deref(), Some("n3"));
            assert!(pooled.contains(&h.pid), "a claim, not a start");
        }
        assert_eq!(c.engine.pool_len("base"), 0);
        let started: i32 = c
            .machines
            .iter()
            .map(|m| m.driver.started.load(Ordering::SeqCst))
            .sum();
        assert_eq!(started, 2, "nothing started beyond the pool");
        // The pool is empty: the next create is placed and started.
        let id = c.create().await.unwrap();
        assert!(c.handle(&id).await.node.is_some());
    }

    /// Warm stock pulls creates (they claim it) but not new pool members: were it a bonus for
    /// them too, the node that has the pool would get every refill, and so every create.
    #[tokio::test]
    async fn pool_members_are_not_drawn_to_the_node_that_has_the_pool() {
        let c = cluster().await;
        let spec = base_template().spec();
        let h = c.machines[0].local.start(&spec, true).await.unwrap();
        c.machines[0].local.pool_put("base", h).await;
        let mut on = BTreeMap::<String, usize>::new();
        for _ in 0..30 {
            let h = c.router.start(&spec, true).await.unwrap();
            *on.entry(h.node.clone().unwrap()).or_default() += 1;
            c.router.stop(&h).await.unwrap();
        }
        assert!(on.len() == 3, "refills went to every node: {on:?}");
        assert!(on.get("n1").copied().unwrap_or(0) < 20, "{on:?}");
    }

    #[tokio::test]
    async fn a_handle_of_an_unknown_node_is_gone() {
        let c = cluster().await;
        let id = c.create().await.unwrap();
        let real = c.handle(&id).await;
        for node in [Some("n9".to_string()), None] {
            let mut h = real.clone();
            h.node = node;
            assert!(!c.router.owns(&h));
            assert!(!c.router.adopt(&h).await);
            assert!(!c.router.reachable(&h).await);
            assert!(matches!(
                c.router.usage(&h).await,
                Err(DriverError::NotRunning)
            ));
            assert!(matches!(
                c.router.thaw(&h).await,
                Err(DriverError::NotRunning)
            ));
            assert!(matches!(
                c.router.open(&h).await,
                Err(DriverError::NotRunning)
            ));
            tokio::time::timeout(Duration::from_secs(1), c.router.wait(&h))
                .await
                .expect("a sandbox of no node has ended");
            c.router.stop(&h).await.expect("stopping it is a no-op");
        }
        assert!(c.router.owns(&real), "the real one is untouched");
        assert!(c.router.reachable(&real).await);

        // A restarted engine whose cluster lost that node: the sandbox did not survive.
        let home = real.node.clone().unwrap();
        let rest: Vec<StaticMember> = IDS
            .iter()
            .zip(&c.machines)
            .filter(|(id, _)| **id != home)
            .map(|(id, m)| StaticMember::new(*id, m.local.clone(), 8.0, 16 * 1024))
            .collect();
        let router = ClusterNode::new(
            Arc::new(StaticDirectory::new(rest)),
            PlacementConfig::default(),
        )
        .await;
        let cfg = EngineConfig {
            pools: bulkhead_engine::PoolConfig::fixed(0),
            ..Default::default()
        };
        let engine = Engine::with_node(c.store.clone(), router.clone(), router, cfg);
        engine.recover().await.unwrap();
        let row = c.store.get_sandbox(&id).await.unwrap().unwrap();
        assert_eq!(row.end_reason.as_deref(), Some("lost on restart"));
    }

    /// A node stops answering: the sweep declares it dead and its sandboxes gone, the engine
    /// forgets them (not found from then on, not listed), the others run on; when the node
    /// comes back, its reconciler stops what it still ran of them and any leftover, keeps and
    /// adopts what the store still has on it, and a sandbox past its deadline is ended by the
    /// node alone.
    #[tokio::test]
    async fn a_dead_node_s_sandboxes_are_gone_and_stopped_when_it_returns() {
        use bulkhead_engine::ListRequest;
        use bulkhead_engine::cluster::{
            HealthConfig, HealthSweeper, ReconcileConfig, Reconciled, Reconciler, Sweep,
        };
        use bulkhead_store::{NODE_LOST, SandboxState};

        const T0: i64 = 1_800_000_000_000;
        let c = cluster().await;
        let r = serde_json::json!({});
        for id in IDS {
            c.store.register_node(id, "addr", &r, T0).await.unwrap();
        }
        let mut ids = Vec::new();
        for _ in 0..9 {
            ids.push(c.create().await.unwrap());
        }
        let mut on = BTreeMap::<String, Vec<String>>::new();
        for id in &ids {
            on.entry(c.handle(id).await.node.unwrap())
                .or_default()
                .push(id.clone());
        }
        let doomed = on.get("n1").cloned().unwrap_or_default();
        assert!(!doomed.is_empty(), "every node got some: {on:?}");
        let doomed_handles: Vec<DriverHandle> =
            futures::future::join_all(doomed.iter().map(|id| c.handle(id))).await;
        // A leftover of n1's previous life that the store does not know (a warm member, say).
        let spec = base_template().spec();
        let leftover = c.machines[0].local.start(&spec, false).await.unwrap();

        // n2 and n3 keep reporting; n1 is silent past the dead threshold.
        for id in ["n2", "n3"] {
            c.store
                .heartbeat(id, 1, bulkhead_store::ReportedStatus::Ready, &r, T0 + 5_500)
                .await
                .unwrap();
        }
        let mut sweeper = HealthSweeper::new(c.store.clone(), "api", HealthConfig::default());
        let Sweep::Swept { lost, .. } = sweeper.round(T0 + 6_000).await.unwrap() else {
            panic!("the only replica holds the lease");
        };
        let mut lost: Vec<String> = lost.into_iter().map(|l| l.id).collect();
        lost.sort();
        let mut want = doomed.clone();
        want.sort();
        assert_eq!(lost, want);
        assert_eq!(c.engine.forget_lost(&lost).await, lost.len());
        for id in &doomed {
            assert!(matches!(
                c.engine.get(&c.owner, id).await,
                Err(EngineError::SandboxNotFound(_))
            ));
            let row = c.store.get_sandbox(id).await.unwrap().unwrap();
            assert_eq!(row.end_reason.as_deref(), Some(NODE_LOST));
        }
        let listed = c
            .engine
            .list(&c.owner, &ListRequest::default())
            .await
            .unwrap();
        assert_eq!(listed.items.len(), ids.len() - doomed.len());
        assert!(listed.items.iter().all(|i| !doomed.contains(&i.id)));
        // n1 was only silent: its sandboxes still run there.
        for h in &doomed_handles {
            assert!(c.machines[0].local.reachable(h).await);
        }

        // n1 registers again: it stops what the cluster gave up on and the leftover, and keeps
        // (adopting) what the store has on it: nothing else here.
        c.store
            .register_node("n1", "addr", &r, T0 + 7_000)
            .await
            .unwrap();
        let mut n1 = Reconciler::new(
            c.store.clone(),
            "n1",
            c.machines[0].local.clone(),
            ReconcileConfig::default(),
        );
        let done = n1.round(T0 + 7_000, true).await;
        assert_eq!(
            (done.stopped_gone, done.expired, done.orphans, done.offline),
            (doomed.len(), 0, 1, false),
            "{done:?}"
        );
        for h in doomed_handles.iter().chain([&leftover]) {
            assert!(!c.machines[0].local.reachable(h).await);
        }
        // Done with them: the next round has nothing to do.
        assert_eq!(n1.round(T0 + 8_000, false).await, Reconciled::default());

        // n2's sandboxes: one is far past its deadline and no replica ended it (say none
        // reaches n2): n2 ends it itself, and only once the grace is over.
        let mine = on["n2"][0].clone();
        let row = c.store.get_sandbox(&mine).await.unwrap().unwrap();
        let h2 = c.handle(&mine).await;
        let mut n2 = Reconciler::new(
            c.store.clone(),
            "n2",
            c.machines[1].local.clone(),
            ReconcileConfig {
                deadline_grace: Duration::from_secs(30),
            },
        );
        assert_eq!(n2.round(row.end_at + 29_000, false).await.expired, 0);
        assert!(c.machines[1].local.reachable(&h2).await);
        let done = n2.round(row.end_at + 31_000, false).await;
        assert!(done.expired >= 1, "{done:?}");
        assert!(!c.machines[1].local.reachable(&h2).await);
        let row = c.store.get_sandbox(&mine).await.unwrap().unwrap();
        assert_eq!(
            (row.state, row.end_reason.as_deref()),
            (SandboxState::Dead, Some("timeout"))
        );
        for id in &ids {
            let _ = c.engine.kill(&c.owner, id).await;
        }
    }

    #[tokio::test]
    async fn the_store_directory_places_by_reports_and_makes_a_client_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite_in(dir.path()).await.unwrap();
        let now = super::T0;
        let roomy = NodeReport {
            cpus: 8.0,
            memory_mib: 16 * 1024,
            ..NodeReport::default()
        };
        let mut big = Heartbeat::new(store.clone(), "big", "10.0.0.1:7001");
        big.beat(&roomy, false, now).await.unwrap();
        // Reports no capacity: never placed on.
        Heartbeat::new(store.clone(), "none", "10.0.0.2:7001")
            .beat(&NodeReport::default(), false, now)
            .await
            .unwrap();
        let nodes: BTreeMap<&str, Arc<LocalNode>> = ["big", "none"]
            .into_iter()
            .map(|id| (id, LocalNode::new(Arc::new(FakeDriver::default()))))
            .collect();
        let made = Arc::new(std::sync::Mutex::new(Vec::<(String, u64)>::new()));
        let factory = {
            let made = made.clone();
            move |row: &bulkhead_store::NodeRow| {
                made.lock().unwrap().push((row.id.clone(), row.epoch));
                let node = nodes.get(row.id.as_str())?.clone();
                Some((node.clone() as Arc<dyn Node>, node as Arc<dyn AgentPath>))
            }
        };
        let directory = Arc::new(
            StoreDirectory::new(store.clone(), factory).with_refresh_every(Duration::ZERO),
        );
        let router = ClusterNode::new(directory, PlacementConfig::default()).await;
        assert_eq!(router.members().len(), 2);
        let spec = SandboxSpec {
            template_id: "base".into(),
            rootfs: "/nonexistent".into(),
            cpu_count: 1,
            memory_mb: 256,
            pids_max: 64,
            disk_mb: 0,
            volumes: Vec::new(),
        };
        for _ in 0..3 {
            let h = router.start(&spec, false).await.unwrap();
            assert_eq!(h.node.as_deref(), Some("big"));
        }
        assert_eq!(
            made.lock().unwrap().clone(),
            vec![("big".to_string(), 1), ("none".to_string(), 1)],
            "one client per node while its epoch holds"
        );
        // "none" comes back as a new incarnation: a new client, the other kept.
        Heartbeat::new(store.clone(), "none", "10.0.0.2:7001")
            .beat(&NodeReport::default(), false, now + 1000)
            .await
            .unwrap();
        router.refresh().await;
        assert_eq!(
            made.lock().unwrap().last().cloned(),
            Some(("none".into(), 2))
        );
        assert_eq!(made.lock().unwrap().len(), 3);
    }
}

#[tokio::test]
async fn a_local_node_tallies_what_its_sandboxes_were_promised() {
    use std::sync::Arc;

    use bulkhead_engine::driver::SandboxSpec;
    use bulkhead_engine::testing::{FakeDriver, base_template};
    use bulkhead_engine::{Allocation, LocalNode, Node};

    let node = LocalNode::new(Arc::new(FakeDriver::default()));
    let t = base_template();
    let spec = SandboxSpec {
        template_id: t.id.clone(),
        rootfs: t.rootfs.clone(),
        cpu_count: 2,
        memory_mb: 512,
        pids_max: t.pids_max,
        disk_mb: 0,
        volumes: Vec::new(),
    };
    let a = node.start(&spec, false).await.unwrap();
    let warm = node.start(&spec, true).await.unwrap();
    assert_eq!(
        node.allocated(),
        Allocation {
            sandboxes: 1,
            cpus: 2.0,
            memory_mib: 512,
            warm: 1
        }
    );
    node.claimed(&warm).await.unwrap();
    assert_eq!((node.allocated().sandboxes, node.allocated().warm), (2, 0));
    assert_eq!(node.allocated().cpus, 4.0);
    node.stop(&a).await.unwrap();
    node.stop(&warm).await.unwrap();
    assert_eq!(node.allocated(), Allocation::default());
}
