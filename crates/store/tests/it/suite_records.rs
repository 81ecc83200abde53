//! The store's network settings, egress audit events, persistence rows, snapshots and volumes
//! (run by `store_tests!` like `suite`).

use std::collections::BTreeMap;

use bulkhead_store::{
    EgressEventRow, SandboxRow, SandboxState, SandboxVolumeRow, StoreError, VolumeRow,
};

use crate::harness::Harness;
use crate::suite::sandbox;

pub fn sandbox_for_tests(id: &str) -> SandboxRow {
    sandbox(id, 0)
}

pub async fn sandbox_network_updates(h: &Harness) {
    let s = &h.store;
    s.insert_sandbox(&sandbox("sb1", 100)).await.unwrap();
    let got = s.get_sandbox("sb1").await.unwrap().unwrap();
    assert!(!got.allow_internet);
    assert_eq!(got.network, None);

    let net = r#"{"allowOut":["*.example.com"],"denyOut":["10.0.0.0/8"]}"#;
    assert!(s.set_sandbox_network("sb1", true, Some(net)).await.unwrap());
    let got = s.get_sandbox("sb1").await.unwrap().unwrap();
    assert!(got.allow_internet);
    assert_eq!(got.network.as_deref(), Some(net));

    // PUT semantics: the whole config is replaced, None clears it.
    assert!(s.set_sandbox_network("sb1", false, None).await.unwrap());
    let got = s.get_sandbox("sb1").await.unwrap().unwrap();
    assert!(!got.allow_internet);
    assert_eq!(got.network, None);
    assert!(!s.set_sandbox_network("nope", true, None).await.unwrap());
}

fn event(sandbox: &str, at: i64, host: &str, allowed: bool) -> EgressEventRow {
    EgressEventRow {
        sandbox_id: sandbox.to_owned(),
        at,
        protocol: "tls".to_owned(),
        host: Some(host.to_owned()),
        ip: Some("203.0.113.10".to_owned()),
        port: 443,
        allowed,
        rule: if allowed {
            "allowOut:pypi.org"
        } else {
            "default-deny"
        }
        .to_owned(),
        bytes_out: 517,
        bytes_in: 1 << 33,
    }
}

pub async fn egress_events(h: &Harness) {
    let s = &h.store;
    s.insert_egress_events(&[]).await.unwrap();
    let batch: Vec<EgressEventRow> = (0..10)
        .map(|i| {
            event(
                if i % 2 == 0 { "sb1" } else { "sb2" },
                100 + i,
                "pypi.org",
                i % 3 == 0,
            )
        })
        .collect();
    s.insert_egress_events(&batch).await.unwrap();
    let mut no_host = event("sb1", 200, "x", false);
    no_host.host = None;
    no_host.ip = None;
    no_host.protocol = "dns".to_owned();
    s.insert_egress_events(std::slice::from_ref(&no_host))
        .await
        .unwrap();

    let all = s.list_egress_events("sb1", 100).await.unwrap();
    assert_eq!(all.len(), 6);
    assert_eq!(
        all.iter().map(|e| e.at).collect::<Vec<_>>(),
        [100, 102, 104, 106, 108, 200]
    );
    assert_eq!(all[0], batch[0]);
    assert_eq!(all[5], no_host);
    // The newest `limit`, oldest first.
    let newest = s.list_egress_events("sb1", 2).await.unwrap();
    assert_eq!(newest.iter().map(|e| e.at).collect::<Vec<_>>(), [108, 200]);
    assert!(s.list_egress_events("nope", 10).await.unwrap().is_empty());

    assert_eq!(s.delete_egress_events_before(105).await.unwrap(), 5);
    assert_eq!(s.list_egress_events("sb1", 100).await.unwrap().len(), 3);
}

pub async fn persistence_roundtrip(h: &Harness) {
    use bulkhead_store::PersistenceRow;
    let s = &h.store;
    assert_eq!(s.get_persistence("p1").await.unwrap(), None);
    let mut p = PersistenceRow {
        sandbox_id: "p1".into(),
        on_timeout: "pause".into(),
        auto_resume: true,
        pause_memory: false,
        timeout_ms: 300_000,
        checkpoint_dir: None,
        checkpoint_memory: false,
        generation: 0,
        paused_at: None,
        resume_on_traffic: false,
    };
    s.upsert_persistence(&p).await.unwrap();
    assert_eq!(s.get_persistence("p1").await.unwrap(), Some(p.clone()));
    p.checkpoint_dir = Some("/data/checkpoints/sandboxes/p1/1".into());
    p.checkpoint_memory = true;
    p.resume_on_traffic = true;
    p.generation = 1;
    p.paused_at = Some(1234);
    s.upsert_persistence(&p).await.unwrap();
    assert_eq!(s.get_persistence("p1").await.unwrap(), Some(p));
    s.delete_persistence("p1").await.unwrap();
    assert_eq!(s.get_persistence("p1").await.unwrap(), None);
}

pub async fn snapshots_crud_and_pagination(h: &Harness) {
    use bulkhead_store::{SnapshotFilter, SnapshotRow, StoreError};
    let s = &h.store;
    let snap = |id: &str, name: Option<&str>, sandbox: &str, at: i64| SnapshotRow {
        id: id.into(),
        name: name.map(Into::into),
        sandbox_id: sandbox.into(),
        template_id: "base".into(),
        checkpoint_dir: format!("/c/{id}"),
        memory: true,
        env_vars: BTreeMap::from([("K".to_string(), "v".to_string())]),
        envd_access_token: Some("tok".into()),
        created_at: at,
        team_id: "default".into(),
    };
    s.insert_snapshot(&snap("s1", Some("one"), "a", 10))
        .await
        .unwrap();
    s.insert_snapshot(&snap("s2", None, "a", 20)).await.unwrap();
    s.insert_snapshot(&snap("s3", None, "b", 30)).await.unwrap();
    assert!(matches!(
        s.insert_snapshot(&snap("s4", Some("one"), "b", 40)).await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(s.get_snapshot("one").await.unwrap().unwrap().id, "s1");
    assert_eq!(
        s.get_snapshot("s2").await.unwrap().unwrap().env_vars["K"],
        "v"
    );
    assert_eq!(s.get_snapshot("nope").await.unwrap(), None);

    let all = s
        .list_snapshots(&SnapshotFilter::default(), 10, None)
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["s3", "s2", "s1"]
    );
    let of_a = SnapshotFilter {
        sandbox_id: Some("a".into()),
        name: None,
        team_id: None,
    };
    let p1 = s.list_snapshots(&of_a, 1, None).await.unwrap();
    assert_eq!(p1[0].id, "s2");
    let p2 = s
        .list_snapshots(&of_a, 1, Some((p1[0].created_at, p1[0].id.clone())))
        .await
        .unwrap();
    assert_eq!(p2[0].id, "s1");
    let named = SnapshotFilter {
        sandbox_id: None,
        name: Some("one".into()),
        team_id: None,
    };
    assert_eq!(s.list_snapshots(&named, 10, None).await.unwrap().len(), 1);
    let other_team = SnapshotFilter {
        team_id: Some("team_other".into()),
        ..named.clone()
    };
    assert!(
        s.list_snapshots(&other_team, 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.delete_snapshot("s1").await.unwrap());
    assert!(!s.delete_snapshot("s1").await.unwrap());
}

fn volume(id: &str, team: &str, name: &str, created_at: i64) -> VolumeRow {
    VolumeRow {
        id: id.into(),
        team: team.into(),
        name: name.into(),
        owner_key_id: "key1".into(),
        token: format!("tok-{id}"),
        max_bytes: 1 << 20,
        created_at,
    }
}

pub async fn volumes_crud(h: &Harness) {
    let s = &h.store;
    let a = volume("vol_a", "", "data", 10);
    s.insert_volume(&a).await.unwrap();
    s.insert_volume(&volume("vol_b", "", "cache", 20))
        .await
        .unwrap();
    // Another team may use the same name; the same team may not.
    s.insert_volume(&volume("vol_c", "t2", "data", 30))
        .await
        .unwrap();
    let err = s
        .insert_volume(&volume("vol_d", "", "data", 40))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
    assert!(!format!("{a:?}").contains("tok-vol_a"));

    assert_eq!(s.get_volume("", "vol_a").await.unwrap(), Some(a.clone()));
    assert_eq!(s.get_volume("t2", "vol_a").await.unwrap(), None);
    assert_eq!(
        s.get_volume_by_name("", "data").await.unwrap(),
        Some(a.clone())
    );
    let names: Vec<String> = s
        .list_volumes("")
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["data", "cache"]);
    assert_eq!(s.all_volumes().await.unwrap().len(), 3);

    // Mount records: a volume is in use while a sandbox that is not dead mounts it.
    let sb = sandbox_for_tests("sbv");
    s.insert_sandbox(&sb).await.unwrap();
    let m = SandboxVolumeRow {
        sandbox_id: "sbv".into(),
        volume_id: "vol_a".into(),
        path: "/mnt/data".into(),
    };
    s.insert_sandbox_volumes(std::slice::from_ref(&m))
        .await
        .unwrap();
    assert_eq!(s.sandbox_volumes("sbv").await.unwrap(), vec![m.clone()]);
    assert_eq!(s.volume_users("vol_a").await.unwrap(), ["sbv"]);
    assert!(s.volume_users("vol_b").await.unwrap().is_empty());
    s.set_sandbox_state("sbv", SandboxState::Dead, Some("killed"))
        .await
        .unwrap();
    assert!(s.volume_users("vol_a").await.unwrap().is_empty());
    // Deleting dead sandboxes deletes their mount records.
    s.insert_sandbox_volumes(&[SandboxVolumeRow {
        sandbox_id: "gone".into(),
        volume_id: "vol_b".into(),
        path: "/x".into(),
    }])
    .await
    .unwrap();
    s.delete_dead_sandboxes_before(0).await.unwrap();
    assert!(s.sandbox_volumes("gone").await.unwrap().is_empty());
    assert_eq!(s.sandbox_volumes("sbv").await.unwrap().len(), 1);

    assert!(s.delete_volume("vol_a").await.unwrap());
    assert!(!s.delete_volume("vol_a").await.unwrap());
    assert!(s.sandbox_volumes("sbv").await.unwrap().is_empty());
    assert_eq!(s.get_volume("", "vol_a").await.unwrap(), None);
}
