//! A cluster's nodes and leases (run by `store_tests!` like `suite`): registration epochs,
//! heartbeats refused for a stale or dead incarnation, the fenced sweep, and leases taken,
//! renewed, expired and taken over, also by racing callers.

use std::sync::Arc;
use std::time::Duration;

use bulkhead_store::{
    LeaseEpoch, LostSandbox, NODE_HEALTH_LEASE, NODE_LOST, NodeStatus, NodeTransition,
    PersistenceRow, ReportedStatus, SandboxState, StaleReason, Store, StoreError,
};
use serde_json::json;

use crate::harness::Harness;
use crate::suite::sandbox;

const SUSPECT: Duration = Duration::from_secs(3);
const DEAD: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(10);

fn moved(id: &str, from: NodeStatus, to: NodeStatus, epoch: u64) -> NodeTransition {
    NodeTransition {
        id: id.into(),
        from,
        to,
        epoch,
    }
}

fn stale(err: StoreError) -> StaleReason {
    match err {
        StoreError::StaleEpoch { reason, .. } => reason,
        e => panic!("expected StaleEpoch, got {e:?}"),
    }
}

pub async fn nodes_register_and_heartbeat(h: &Harness) {
    let s = &h.store;
    assert_eq!(s.get_node("n1").await.unwrap(), None);
    let cap = json!({"cpus": 16, "memory_mib": 32768, "warm": {"base": 2}});
    let n1 = s
        .register_node("n1", "10.0.0.1:7001", &cap, 1_000)
        .await
        .unwrap();
    assert_eq!(
        (n1.epoch, n1.status, n1.registered_at, n1.heartbeat_at),
        (1, NodeStatus::Ready, 1_000, 1_000)
    );
    assert_eq!((n1.addr.as_str(), &n1.report), ("10.0.0.1:7001", &cap));
    assert_eq!(s.get_node("n1").await.unwrap(), Some(n1.clone()));

    // The node sets its own status and report.
    let busy = json!({"cpus": 16, "memory_mib": 32768, "warm": {}});
    s.heartbeat("n1", 1, ReportedStatus::Draining, &busy, 1_500)
        .await
        .unwrap();
    let got = s.get_node("n1").await.unwrap().unwrap();
    assert_eq!(
        (got.status, got.heartbeat_at, got.registered_at, &got.report),
        (NodeStatus::Draining, 1_500, 1_000, &busy)
    );

    // Coming back is a new incarnation: epoch + 1, ready, the new address and report.
    let again = s
        .register_node("n1", "10.0.0.9:7001", &cap, 2_000)
        .await
        .unwrap();
    assert_eq!(
        (
            again.epoch,
            again.status,
            again.registered_at,
            again.heartbeat_at
        ),
        (2, NodeStatus::Ready, 2_000, 2_000)
    );
    assert_eq!(again.addr, "10.0.0.9:7001");

    // The old incarnation's heartbeat is refused and changes nothing.
    let err = s
        .heartbeat("n1", 1, ReportedStatus::Draining, &busy, 2_500)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("must register again"), "{err}");
    assert_eq!(stale(err), StaleReason::Superseded { current: 2 });
    assert_eq!(s.get_node("n1").await.unwrap(), Some(again.clone()));
    // So is an epoch from the future, and an unknown node.
    assert_eq!(
        stale(
            s.heartbeat("n1", 3, ReportedStatus::Ready, &cap, 2_500)
                .await
                .unwrap_err()
        ),
        StaleReason::Superseded { current: 2 }
    );
    assert_eq!(
        stale(
            s.heartbeat("nope", 1, ReportedStatus::Ready, &cap, 2_500)
                .await
                .unwrap_err()
        ),
        StaleReason::Unknown
    );
    s.heartbeat("n1", 2, ReportedStatus::Ready, &cap, 2_600)
        .await
        .unwrap();

    s.register_node("n0", "10.0.0.2:7001", &json!({}), 3_000)
        .await
        .unwrap();
    let all = s.list_nodes().await.unwrap();
    assert_eq!(
        all.iter()
            .map(|n| (n.id.as_str(), n.epoch, n.heartbeat_at))
            .collect::<Vec<_>>(),
        [("n0", 1, 3_000), ("n1", 2, 2_600)]
    );
}

pub async fn nodes_sweep_thresholds(h: &Harness) {
    let s = &h.store;
    let fence = s
        .acquire_lease(NODE_HEALTH_LEASE, "api-1", Duration::from_secs(3600), 0)
        .await
        .unwrap()
        .unwrap();
    let r = json!({});
    for id in ["a", "b", "c"] {
        s.register_node(id, "addr", &r, 10_000).await.unwrap();
    }
    s.heartbeat("c", 1, ReportedStatus::Draining, &r, 10_000)
        .await
        .unwrap();
    let sweep = |now: i64| s.sweep_nodes(now, SUSPECT, DEAD, fence);

    // Exactly at the threshold is not older than it.
    assert_eq!(sweep(12_000).await.unwrap().changes, []);
    assert_eq!(sweep(13_000).await.unwrap().changes, []);
    s.heartbeat("b", 1, ReportedStatus::Ready, &r, 12_500)
        .await
        .unwrap();
    assert_eq!(
        sweep(13_500).await.unwrap().changes,
        [
            moved("a", NodeStatus::Ready, NodeStatus::Suspect, 1),
            moved("c", NodeStatus::Draining, NodeStatus::Suspect, 1),
        ]
    );
    // Swept again, a suspect node stays suspect until the dead threshold.
    assert_eq!(sweep(14_000).await.unwrap().changes, []);

    // A suspect node that reports is what it reports again.
    s.heartbeat("a", 1, ReportedStatus::Ready, &r, 14_000)
        .await
        .unwrap();
    assert_eq!(
        s.get_node("a").await.unwrap().unwrap().status,
        NodeStatus::Ready
    );

    // Past the dead threshold: dead, with the epoch bumped.
    assert_eq!(
        sweep(15_500).await.unwrap().changes,
        [moved("c", NodeStatus::Suspect, NodeStatus::Dead, 2)]
    );
    let c = s.get_node("c").await.unwrap().unwrap();
    assert_eq!(
        (c.status, c.epoch, c.heartbeat_at),
        (NodeStatus::Dead, 2, 10_000)
    );

    // A dead node may not report itself back, with its old epoch or the bumped one.
    for epoch in [1, 2] {
        let err = s
            .heartbeat("c", epoch, ReportedStatus::Ready, &r, 16_000)
            .await
            .unwrap_err();
        assert_eq!(stale(err), StaleReason::Dead);
    }
    assert_eq!(s.get_node("c").await.unwrap().unwrap(), c);
    // Until it registers again.
    let back = s.register_node("c", "addr", &r, 16_000).await.unwrap();
    assert_eq!((back.epoch, back.status), (3, NodeStatus::Ready));
    s.heartbeat("c", 3, ReportedStatus::Ready, &r, 16_500)
        .await
        .unwrap();

    // A ready node whose heartbeat stopped long ago goes straight to dead; dead nodes are
    // not swept again.
    assert_eq!(
        sweep(19_600).await.unwrap().changes,
        [
            moved("a", NodeStatus::Ready, NodeStatus::Dead, 2),
            moved("b", NodeStatus::Ready, NodeStatus::Dead, 2),
            moved("c", NodeStatus::Ready, NodeStatus::Suspect, 3),
        ]
    );
    assert_eq!(
        sweep(40_000).await.unwrap().changes,
        [moved("c", NodeStatus::Suspect, NodeStatus::Dead, 4)]
    );
    assert_eq!(sweep(90_000).await.unwrap().changes, []);
    assert!(
        s.list_nodes()
            .await
            .unwrap()
            .iter()
            .all(|n| n.status == NodeStatus::Dead)
    );
}

pub async fn nodes_sweep_is_fenced(h: &Harness) {
    let s = &h.store;
    s.register_node("n", "addr", &json!({}), 0).await.unwrap();

    // Nobody ever took the lease: no epoch is valid.
    let err = s
        .sweep_nodes(60_000, SUSPECT, DEAD, LeaseEpoch(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Fenced {
                epoch: LeaseEpoch(1),
                current: None,
                ..
            }
        ),
        "{err:?}"
    );

    let old = s
        .acquire_lease(NODE_HEALTH_LEASE, "api-1", TTL, 0)
        .await
        .unwrap()
        .unwrap();
    // api-1 stalls past its TTL; api-2 takes the lease over.
    let new = s
        .acquire_lease(NODE_HEALTH_LEASE, "api-2", TTL, 20_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new, LeaseEpoch(old.0 + 1));

    // api-1's sweep, however late, changes nothing.
    let err = s.sweep_nodes(60_000, SUSPECT, DEAD, old).await.unwrap_err();
    assert!(err.to_string().contains("lost it"), "{err}");
    match err {
        StoreError::Fenced {
            lease,
            epoch,
            current,
        } => assert_eq!(
            (lease.as_str(), epoch, current),
            (NODE_HEALTH_LEASE, old, Some(new))
        ),
        e => panic!("expected Fenced, got {e:?}"),
    }
    let n = s.get_node("n").await.unwrap().unwrap();
    assert_eq!((n.status, n.epoch), (NodeStatus::Ready, 1));

    // The new holder's does.
    assert_eq!(
        s.sweep_nodes(60_000, SUSPECT, DEAD, new)
            .await
            .unwrap()
            .changes,
        [moved("n", NodeStatus::Ready, NodeStatus::Dead, 2)]
    );
}

/// A sandbox row on `node` in `state` with a handle there.
async fn on_node(s: &Store, id: &str, node: &str, state: SandboxState, end_at: i64) {
    let mut row = sandbox(id, 0);
    row.state = state;
    row.end_at = end_at;
    row.node_id = Some(node.into());
    row.driver_handle = Some(format!("{{\"pid\":1,\"id\":\"{id}\"}}"));
    s.insert_sandbox(&row).await.unwrap();
}

pub async fn nodes_sweep_marks_what_a_dead_node_ran_lost(h: &Harness) {
    let s = &h.store;
    let fence = s
        .acquire_lease(NODE_HEALTH_LEASE, "api-1", Duration::from_secs(3600), 0)
        .await
        .unwrap()
        .unwrap();
    let r = json!({});
    s.register_node("a", "addr", &r, 10_000).await.unwrap();
    s.register_node("b", "addr", &r, 10_000).await.unwrap();
    on_node(s, "run-a", "a", SandboxState::Running, 99_000).await;
    on_node(s, "paused-a", "a", SandboxState::Paused, 99_000).await;
    on_node(s, "pausing-a", "a", SandboxState::Pausing, 99_000).await;
    on_node(s, "run-b", "b", SandboxState::Running, 99_000).await;
    s.heartbeat("b", 1, ReportedStatus::Ready, &r, 15_000)
        .await
        .unwrap();

    // Suspect loses nothing.
    let out = s.sweep_nodes(13_500, SUSPECT, DEAD, fence).await.unwrap();
    assert_eq!(out.lost, []);
    // Dead: what ran there is gone, ended now, its handle kept for the node to stop it.
    let out = s.sweep_nodes(15_500, SUSPECT, DEAD, fence).await.unwrap();
    assert_eq!(
        out.changes,
        [moved("a", NodeStatus::Suspect, NodeStatus::Dead, 2)]
    );
    assert_eq!(
        out.lost,
        [LostSandbox {
            id: "run-a".into(),
            node: "a".into()
        }]
    );
    let gone = s.get_sandbox("run-a").await.unwrap().unwrap();
    assert_eq!(
        (gone.state, gone.end_reason.as_deref(), gone.end_at),
        (SandboxState::Dead, Some(NODE_LOST), 15_500)
    );
    assert!(gone.driver_handle.is_some());
    // A paused one stays paused, one being paused is left to its operation, the other node's
    // runs on.
    for (id, state) in [
        ("paused-a", SandboxState::Paused),
        ("pausing-a", SandboxState::Pausing),
        ("run-b", SandboxState::Running),
    ] {
        assert_eq!(
            s.get_sandbox(id).await.unwrap().unwrap().state,
            state,
            "{id}"
        );
    }
    // A create that completes on the dead node afterwards is caught by the next round.
    on_node(s, "late-a", "a", SandboxState::Running, 99_000).await;
    let out = s.sweep_nodes(16_000, SUSPECT, DEAD, fence).await.unwrap();
    assert_eq!((out.changes.len(), out.lost.len()), (0, 1));
    assert_eq!(out.lost[0].id, "late-a");
    // Once the node registers again, its sandboxes are no longer swept.
    s.register_node("a", "addr", &r, 17_000).await.unwrap();
    on_node(s, "new-a", "a", SandboxState::Running, 99_000).await;
    let out = s.sweep_nodes(17_500, SUSPECT, DEAD, fence).await.unwrap();
    assert_eq!(out.lost, []);
}

pub async fn node_sandboxes_expire_and_release(h: &Harness) {
    let s = &h.store;
    on_node(s, "due", "a", SandboxState::Running, 10_000).await;
    on_node(s, "later", "a", SandboxState::Running, 50_000).await;
    on_node(s, "pauses", "a", SandboxState::Running, 10_000).await;
    on_node(s, "lost", "a", SandboxState::Dead, 10_000).await;
    on_node(s, "elsewhere", "b", SandboxState::Running, 10_000).await;
    s.upsert_persistence(&PersistenceRow {
        sandbox_id: "pauses".into(),
        on_timeout: "pause".into(),
        auto_resume: false,
        pause_memory: true,
        timeout_ms: 1_000,
        checkpoint_dir: None,
        checkpoint_memory: false,
        generation: 0,
        paused_at: None,
        resume_on_traffic: false,
    })
    .await
    .unwrap();
    let mine = s.node_sandboxes("a").await.unwrap();
    let ids: Vec<&str> = mine.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids, ["due", "later", "lost", "pauses"]);
    assert!(mine[3].pauses_on_timeout && !mine[0].pauses_on_timeout);
    assert_eq!(mine[2].state, SandboxState::Dead);

    // The row decides: only a running sandbox of this node past the cut.
    assert!(!s.expire_on_node("due", "a", 10_000).await.unwrap());
    assert!(!s.expire_on_node("due", "b", 20_000).await.unwrap());
    assert!(!s.expire_on_node("lost", "a", 20_000).await.unwrap());
    assert!(s.expire_on_node("due", "a", 20_000).await.unwrap());
    let due = s.get_sandbox("due").await.unwrap().unwrap();
    assert_eq!(
        (due.state, due.end_reason.as_deref(), due.driver_handle),
        (SandboxState::Dead, Some("timeout"), None)
    );
    // Whoever ends it later keeps the node's reason.
    assert!(!s.end_sandbox("due", "exited").await.unwrap());
    assert_eq!(
        s.get_sandbox("due")
            .await
            .unwrap()
            .unwrap()
            .end_reason
            .as_deref(),
        Some("timeout")
    );
    assert!(s.end_sandbox("later", "killed").await.unwrap());
    s.set_sandbox_state("later", SandboxState::Running, None)
        .await
        .unwrap();
    // An API replica extended it meanwhile: not expired.
    s.set_sandbox_end_at("later", 90_000).await.unwrap();
    assert!(!s.expire_on_node("later", "a", 60_000).await.unwrap());

    // A dead one's handle goes once the node stopped it; a running one's stays.
    assert!(s.release_dead_handle("lost", "a").await.unwrap());
    assert!(!s.release_dead_handle("lost", "a").await.unwrap());
    assert!(!s.release_dead_handle("later", "a").await.unwrap());
    let ids: Vec<String> = s
        .node_sandboxes("a")
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(ids, ["later", "pauses"]);
}

pub async fn nodes_drain_through_the_store(h: &Harness) {
    let s = &h.store;
    let r = json!({});
    assert!(!s.set_node_drain("n", true).await.unwrap(), "no such node");
    s.register_node("n", "addr", &r, 0).await.unwrap();
    assert!(
        !s.heartbeat("n", 1, ReportedStatus::Ready, &r, 1_000)
            .await
            .unwrap()
    );
    assert!(s.set_node_drain("n", true).await.unwrap());
    // The node learns it from its next heartbeat and is draining whatever it reports.
    assert!(
        s.heartbeat("n", 1, ReportedStatus::Ready, &r, 2_000)
            .await
            .unwrap()
    );
    let n = s.get_node("n").await.unwrap().unwrap();
    assert_eq!((n.status, n.drain), (NodeStatus::Draining, true));
    // Cancelled: it reports ready again.
    assert!(s.set_node_drain("n", false).await.unwrap());
    assert!(
        !s.heartbeat("n", 1, ReportedStatus::Ready, &r, 3_000)
            .await
            .unwrap()
    );
    assert_eq!(
        s.get_node("n").await.unwrap().unwrap().status,
        NodeStatus::Ready
    );
    // A node draining on its own (SIGTERM) reports it; a registration ends an operator's drain.
    assert!(
        !s.heartbeat("n", 1, ReportedStatus::Draining, &r, 4_000)
            .await
            .unwrap()
    );
    assert_eq!(
        s.get_node("n").await.unwrap().unwrap().status,
        NodeStatus::Draining
    );
    s.set_node_drain("n", true).await.unwrap();
    let again = s.register_node("n", "addr", &r, 5_000).await.unwrap();
    assert_eq!(
        (again.status, again.drain, again.epoch),
        (NodeStatus::Ready, false, 2)
    );
}

pub async fn leases_acquire_renew_expire(h: &Harness) {
    let s = &h.store;
    assert_eq!(s.current_lease("gc").await.unwrap(), None);

    let e1 = s.acquire_lease("gc", "r1", TTL, 1_000).await.unwrap();
    assert_eq!(e1, Some(LeaseEpoch(1)));
    let l = s.current_lease("gc").await.unwrap().unwrap();
    assert_eq!(
        (l.holder.as_str(), l.epoch, l.expires_at),
        ("r1", LeaseEpoch(1), 11_000)
    );
    assert!(l.is_held_at(10_999) && !l.is_held_at(11_000));

    // Held: another holder is refused, the holder itself keeps its epoch.
    assert_eq!(s.acquire_lease("gc", "r2", TTL, 5_000).await.unwrap(), None);
    assert_eq!(
        s.acquire_lease("gc", "r1", TTL, 5_000).await.unwrap(),
        Some(LeaseEpoch(1))
    );
    s.renew_lease("gc", "r1", LeaseEpoch(1), TTL, 8_000)
        .await
        .unwrap();
    assert_eq!(
        s.current_lease("gc").await.unwrap().unwrap().expires_at,
        18_000
    );
    // Renewing what one does not hold fails.
    let err = s
        .renew_lease("gc", "r2", LeaseEpoch(1), TTL, 8_000)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");

    // Expired (at its expiry instant): taken over, with the next epoch.
    assert_eq!(
        s.acquire_lease("gc", "r2", TTL, 17_999).await.unwrap(),
        None
    );
    assert_eq!(
        s.acquire_lease("gc", "r2", TTL, 18_000).await.unwrap(),
        Some(LeaseEpoch(2))
    );
    // The old holder can neither renew nor release it.
    let err = s
        .renew_lease("gc", "r1", LeaseEpoch(1), TTL, 18_500)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("acquire it again"), "{err}");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert!(
        !s.release_lease("gc", "r1", LeaseEpoch(1), 18_500)
            .await
            .unwrap()
    );
    // Nor can it take it back while it is held.
    assert_eq!(
        s.acquire_lease("gc", "r1", TTL, 18_500).await.unwrap(),
        None
    );

    // Released: free at once; the releaser taking it back before anyone else keeps the epoch.
    assert!(
        s.release_lease("gc", "r2", LeaseEpoch(2), 19_000)
            .await
            .unwrap()
    );
    assert!(
        !s.release_lease("gc", "r2", LeaseEpoch(2), 19_000)
            .await
            .unwrap()
    );
    let l = s.current_lease("gc").await.unwrap().unwrap();
    assert!(!l.is_held_at(19_000));
    assert_eq!((l.holder.as_str(), l.epoch), ("r2", LeaseEpoch(2)));
    assert_eq!(
        s.acquire_lease("gc", "r2", TTL, 19_000).await.unwrap(),
        Some(LeaseEpoch(2))
    );
    assert!(
        s.release_lease("gc", "r2", LeaseEpoch(2), 19_500)
            .await
            .unwrap()
    );
    assert_eq!(
        s.acquire_lease("gc", "r3", TTL, 19_500).await.unwrap(),
        Some(LeaseEpoch(3))
    );

    // An expired lease cannot be renewed even if nobody took it; acquiring takes it back.
    let err = s
        .renew_lease("gc", "r3", LeaseEpoch(3), TTL, 29_500)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert_eq!(
        s.acquire_lease("gc", "r3", TTL, 29_500).await.unwrap(),
        Some(LeaseEpoch(3))
    );

    // Leases are independent of each other.
    assert_eq!(
        s.acquire_lease(NODE_HEALTH_LEASE, "r1", TTL, 29_500)
            .await
            .unwrap(),
        Some(LeaseEpoch(1))
    );
    assert_eq!(s.current_lease("gc").await.unwrap().unwrap().holder, "r3");
}

/// `per_store` tasks on each of `stores` stores (replicas, each with its own pool) run `f` at
/// once; returns each task's result.
pub(crate) async fn race<T, F, Fut>(h: &Harness, stores: usize, per_store: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Store, usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let mut handles = Vec::new();
    for _ in 0..stores {
        handles.push(Store::open(&h.url).await.expect("reopen the store"));
    }
    let n = stores * per_store;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let s = handles[i % stores].clone();
        let barrier = barrier.clone();
        let work = f(s.clone(), i);
        tasks.push(tokio::spawn(async move {
            // Connect before the start line, so the race is between queries.
            s.current_lease("warm-up").await.unwrap();
            barrier.wait().await;
            work.await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    for s in handles {
        s.close().await;
    }
    out
}

pub async fn leases_race_has_one_winner(h: &Harness) {
    for round in 0..3_i64 {
        // Every round starts after the last round's lease expired.
        let now = 1_000 + round * 100_000;
        let got = race(h, 4, 4, move |s, i| async move {
            let holder = format!("r{round}-{i}");
            let epoch = s.acquire_lease("race", &holder, TTL, now).await.unwrap();
            (holder, epoch)
        })
        .await;
        let winners: Vec<_> = got.iter().filter(|(_, e)| e.is_some()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {got:?}");
        let (holder, epoch) = winners[0];
        assert_eq!(*epoch, Some(LeaseEpoch(round as u64 + 1)));
        let l = h.store.current_lease("race").await.unwrap().unwrap();
        assert_eq!((&l.holder, Some(l.epoch)), (holder, *epoch));
    }
}

pub async fn nodes_race_register(h: &Harness) {
    let n = 16;
    let got = race(h, 4, n / 4, |s, i| async move {
        let row = s
            .register_node(
                "racer",
                &format!("10.0.0.{i}:7001"),
                &json!({"i": i}),
                5_000,
            )
            .await
            .unwrap();
        row.epoch
    })
    .await;
    let mut epochs = got.clone();
    epochs.sort_unstable();
    assert_eq!(epochs, (1..=n as u64).collect::<Vec<_>>(), "{got:?}");
    let last = h.store.get_node("racer").await.unwrap().unwrap();
    assert_eq!(last.epoch, n as u64);
    // The row is the last registration's, whole.
    let i = last.report["i"].as_u64().unwrap();
    assert_eq!(last.addr, format!("10.0.0.{i}:7001"));
}
