//! API replicas and sandbox ownership (run by `store_tests!` like `suite`): registration
//! epochs, heartbeats refused when late or stale, and the guarded take-over of a silent
//! replica's sandboxes, also by racing takers.

use std::time::Duration;

use bulkhead_store::{SandboxRow, SandboxState, Store, StoreError};

use crate::harness::Harness;
use crate::suite::sandbox;
use crate::suite_nodes::race;

const DEAD: Duration = Duration::from_secs(5);

fn owned(id: &str, owner: &str) -> SandboxRow {
    SandboxRow {
        owner_replica: Some(owner.to_owned()),
        ..sandbox(id, 100)
    }
}

fn ids(rows: &[SandboxRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

fn refused(r: bulkhead_store::Result<()>) -> bool {
    matches!(r, Err(StoreError::ReplicaStale { .. }))
}

pub async fn replicas_register_and_heartbeat(h: &Harness) {
    let s = &h.store;
    assert_eq!(s.get_replica("a").await.unwrap(), None);
    let a = s
        .register_replica("a", "http://10.0.0.1:3000", 1_000)
        .await
        .unwrap();
    assert_eq!((a.epoch, a.heartbeat_at), (1, 1_000));
    assert!(a.is_live_at(6_000, DEAD) && !a.is_live_at(6_001, DEAD));
    s.heartbeat_replica("a", 1, 2_000, DEAD).await.unwrap();
    assert_eq!(
        s.get_replica("a").await.unwrap().unwrap().heartbeat_at,
        2_000
    );

    // Silent longer than DEAD: its sandboxes may be gone; the beat is refused, nothing written.
    assert!(refused(s.heartbeat_replica("a", 1, 7_001, DEAD).await));
    assert_eq!(
        s.get_replica("a").await.unwrap().unwrap().heartbeat_at,
        2_000
    );
    // A new incarnation: epoch 2, a new address; the old epoch is refused from then on.
    let again = s
        .register_replica("a", "http://10.0.0.9:3000", 8_000)
        .await
        .unwrap();
    assert_eq!(
        (again.epoch, again.addr.as_str(), again.heartbeat_at),
        (2, "http://10.0.0.9:3000", 8_000)
    );
    assert!(refused(s.heartbeat_replica("a", 1, 8_500, DEAD).await));
    assert!(refused(s.heartbeat_replica("nobody", 1, 8_500, DEAD).await));
    s.heartbeat_replica("a", 2, 8_500, DEAD).await.unwrap();

    s.register_replica("b", "http://10.0.0.2:3000", 8_600)
        .await
        .unwrap();
    let all = s.list_replicas().await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    // Retiring (a clean stop) makes it silent at once; an older epoch cannot retire it.
    s.retire_replica("b", 7).await.unwrap();
    assert!(
        s.get_replica("b")
            .await
            .unwrap()
            .unwrap()
            .is_live_at(8_700, DEAD)
    );
    s.retire_replica("b", 1).await.unwrap();
    assert!(
        !s.get_replica("b")
            .await
            .unwrap()
            .unwrap()
            .is_live_at(8_700, DEAD)
    );
}

pub async fn replicas_take_over_only_from_silent_owners(h: &Harness) {
    let s = &h.store;
    s.register_replica("a", "http://a", 1_000).await.unwrap();
    s.register_replica("b", "http://b", 1_000).await.unwrap();
    for (id, owner) in [("sa1", "a"), ("sa2", "a"), ("sb1", "b"), ("sg1", "ghost")] {
        s.insert_sandbox(&owned(id, owner)).await.unwrap();
    }
    let mut ended = owned("sa3", "a");
    ended.state = SandboxState::Dead;
    s.insert_sandbox(&ended).await.unwrap();
    // serve's sandboxes (no owner) are never taken.
    s.insert_sandbox(&sandbox("plain", 100)).await.unwrap();

    // Everyone live: only the never-registered owner's sandbox is up for taking.
    let got = s.take_over_sandboxes("b", 5_000, DEAD, None).await.unwrap();
    assert_eq!(ids(&got), ["sg1"]);
    assert_eq!(got[0].owner_replica.as_deref(), Some("b"));
    assert!(
        s.take_over_sandboxes("b", 5_000, DEAD, None)
            .await
            .unwrap()
            .is_empty()
    );

    // b heartbeats, a goes silent: b takes a's live sandboxes, not the ended one.
    s.heartbeat_replica("b", 1, 5_500, DEAD).await.unwrap();
    s.heartbeat_replica("b", 1, 6_500, DEAD).await.unwrap();
    assert!(
        s.take_over_sandboxes("b", 6_000, DEAD, Some("sa1"))
            .await
            .unwrap()
            .is_empty(),
        "a is still live at 6 000"
    );
    let one = s
        .take_over_sandboxes("b", 6_500, DEAD, Some("sa1"))
        .await
        .unwrap();
    assert_eq!(ids(&one), ["sa1"]);
    let rest = s.take_over_sandboxes("b", 6_500, DEAD, None).await.unwrap();
    assert_eq!(ids(&rest), ["sa2"]);
    for (id, owner) in [
        ("sa1", Some("b")),
        ("sa2", Some("b")),
        ("sa3", Some("a")),
        ("sb1", Some("b")),
        ("plain", None),
    ] {
        let row = s.get_sandbox(id).await.unwrap().unwrap();
        assert_eq!(row.owner_replica.as_deref(), owner, "{id}");
    }
    let owners = s
        .sandbox_owners(&["sa3".into(), "nothing".into(), "sa1".into()])
        .await
        .unwrap();
    assert_eq!(
        owners
            .iter()
            .map(|o| (o.id.as_str(), o.owner_replica.as_deref(), o.state))
            .collect::<Vec<_>>(),
        [
            ("sa1", Some("b"), SandboxState::Running),
            ("sa3", Some("a"), SandboxState::Dead)
        ]
    );
    // Sandboxes of a cluster from before replicas (on a node, no owner) go to the first
    // replica that claims them; serve's (no node) and ended ones stay as they are.
    let mut old = sandbox("old", 100);
    old.node_id = Some("n1".into());
    s.insert_sandbox(&old).await.unwrap();
    assert_eq!(s.claim_unowned_sandboxes("b").await.unwrap(), 1);
    assert_eq!(s.claim_unowned_sandboxes("a").await.unwrap(), 0);
    let row = s.get_sandbox("old").await.unwrap().unwrap();
    assert_eq!(row.owner_replica.as_deref(), Some("b"));
    assert_eq!(
        s.get_sandbox("plain").await.unwrap().unwrap().owner_replica,
        None
    );
    // A replica never takes from itself, even when it is silent.
    assert!(
        s.take_over_sandboxes("b", 60_000, DEAD, None)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn replicas_takeover_race_has_one_winner(h: &Harness) {
    let s = &h.store;
    s.register_replica("dead", "http://dead", 1_000)
        .await
        .unwrap();
    let n_sandboxes = 20;
    for i in 0..n_sandboxes {
        s.insert_sandbox(&owned(&format!("s{i:02}"), "dead"))
            .await
            .unwrap();
    }
    let takers = 8;
    for i in 0..takers {
        s.register_replica(&format!("t{i}"), "http://t", 10_000)
            .await
            .unwrap();
    }
    // Half the takers go after one sandbox, half after all of them, at once.
    let got = race(h, 4, takers / 4, |s: Store, i| async move {
        let me = format!("t{i}");
        let only = (i % 2 == 0).then_some("s07");
        let rows = s
            .take_over_sandboxes(&me, 10_000, DEAD, only)
            .await
            .unwrap();
        rows.into_iter()
            .map(|r| (r.id, me.clone()))
            .collect::<Vec<_>>()
    })
    .await;
    let mut taken: Vec<(String, String)> = got.into_iter().flatten().collect();
    taken.sort();
    let mut names: Vec<&str> = taken.iter().map(|(id, _)| id.as_str()).collect();
    names.dedup();
    assert_eq!(names.len(), taken.len(), "a sandbox taken twice: {taken:?}");
    assert_eq!(taken.len(), n_sandboxes, "{taken:?}");
    // The store agrees with what each taker was told.
    for (id, taker) in &taken {
        let row = s.get_sandbox(id).await.unwrap().unwrap();
        assert_eq!(row.owner_replica.as_deref(), Some(taker.as_str()), "{id}");
    }
}
