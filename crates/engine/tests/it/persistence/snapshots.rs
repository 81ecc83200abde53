//! Snapshots, forks, cut streams and capacity.

use super::*;

#[tokio::test]
async fn snapshots_create_list_restore_delete() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.driver.write_file(pid, "/f", "v1");
    let snap = s
        .engine
        .create_snapshot(&s.owner, &sb.id, Some("my-snap"), true)
        .await
        .unwrap();
    assert_eq!(snap.snapshot_id, "my-snap:default");
    assert_eq!(snap.names, vec!["my-snap:default".to_string()]);
    // The parent ran on, untouched.
    assert_eq!(s.pid(&sb.id).await, pid);
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "running"
    );
    let anon = s
        .engine
        .create_snapshot(&s.owner, &sb.id, None, false)
        .await
        .unwrap();
    assert!(anon.names.is_empty());
    assert!(anon.snapshot_id.ends_with(":default"));

    let all = s
        .engine
        .list_snapshots(&s.owner, None, None, None, None)
        .await
        .unwrap();
    assert_eq!(all.items.len(), 2);
    let by_sb = s
        .engine
        .list_snapshots(&s.owner, Some(&sb.id), None, None, None)
        .await
        .unwrap();
    assert_eq!(by_sb.items.len(), 2);
    let none = s
        .engine
        .list_snapshots(&s.owner, Some("othersandbox"), None, None, None)
        .await
        .unwrap();
    assert!(none.items.is_empty());
    let by_name = s
        .engine
        .list_snapshots(&s.owner, None, Some("my-snap"), None, None)
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let p1 = s
        .engine
        .list_snapshots(&s.owner, None, None, Some(1), None)
        .await
        .unwrap();
    assert_eq!(p1.items.len(), 1);
    let p2 = s
        .engine
        .list_snapshots(&s.owner, None, None, Some(1), p1.next_token.as_deref())
        .await
        .unwrap();
    assert_eq!(p2.items.len(), 1);
    assert_ne!(p1.items[0].snapshot_id, p2.items[0].snapshot_id);
    assert!(p2.next_token.is_none());

    // Two independent sandboxes from the snapshot, each with its memory and files.
    let from = |t: &str| CreateRequest {
        template: t.into(),
        ..Default::default()
    };
    let c1 = s.create(from("my-snap")).await;
    let c2 = s.create(from("my-snap:default")).await;
    assert_ne!(c1.envd_access_token, sb.envd_access_token);
    let (p1, p2) = (s.pid(&c1.id).await, s.pid(&c2.id).await);
    assert_eq!(s.driver.memory(p1).unwrap().vars["x"], "42");
    assert_eq!(
        s.driver.memory(p1).unwrap().access_token,
        c1.envd_access_token
    );
    s.driver.write_file(p1, "/f", "changed");
    assert_eq!(s.driver.file(p2, "/f").as_deref(), Some("v1"));
    // The filesystem-only one boots fresh on the files.
    let c3 = s.create(from(&anon.snapshot_id)).await;
    let p3 = s.pid(&c3.id).await;
    assert!(s.driver.memory(p3).unwrap().vars.is_empty());
    assert_eq!(s.driver.memory(p3).unwrap().env["GREETING"], "hello");

    s.engine
        .delete_snapshot(&s.owner, "my-snap:default")
        .await
        .unwrap();
    assert!(matches!(
        s.engine.delete_snapshot(&s.owner, "my-snap").await,
        Err(EngineError::SnapshotNotFound(_))
    ));
    assert!(matches!(
        s.engine.create(&s.owner, from("my-snap")).await,
        Err(EngineError::TemplateNotFound(_))
    ));
    // A snapshot of a paused sandbox copies its checkpoint; it stays paused.
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    let ps = s
        .engine
        .create_snapshot(&s.owner, &sb.id, Some("from-paused"), true)
        .await
        .unwrap();
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "paused"
    );
    let c4 = s.create(from(&ps.snapshot_id)).await;
    assert_eq!(
        s.driver.memory(s.pid(&c4.id).await).unwrap().vars["x"],
        "42"
    );
    assert!(
        s.engine
            .connect(&s.owner, &sb.id, resume())
            .await
            .unwrap()
            .1
    );
}

#[tokio::test]
async fn fork_makes_independent_copies_and_leaves_the_parent() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    let forks = s.engine.fork(&s.owner, &sb.id, 2, Some(60)).await.unwrap();
    assert_eq!(forks.len(), 2);
    let forks: Vec<SandboxInfo> = forks.into_iter().map(Result::unwrap).collect();
    assert_ne!(forks[0].id, forks[1].id);
    assert_ne!(forks[0].id, sb.id);
    assert_ne!(forks[0].envd_access_token, forks[1].envd_access_token);
    assert_ne!(forks[0].envd_access_token, sb.envd_access_token);
    for f in &forks {
        let m = s.driver.memory(s.pid(&f.id).await).unwrap();
        assert_eq!(m.vars["x"], "42");
        assert_eq!(m.env["GREETING"], "hello");
        assert_eq!(m.access_token, f.envd_access_token);
    }
    assert_eq!(s.pid(&sb.id).await, pid);
    assert_eq!(
        s.driver.memory(pid).unwrap().access_token,
        sb.envd_access_token
    );
    assert_eq!(
        files_under_when_settled(&s.checkpoints()).await,
        0,
        "the fork's snapshot is deleted"
    );
    assert!(matches!(
        s.engine.fork(&s.owner, &sb.id, 21, None).await,
        Err(EngineError::BadRequest(_))
    ));
    // A fork that cannot start is reported on its own.
    *s.driver.fail_restore.lock().unwrap() = Some(boom);
    let failed = s.engine.fork(&s.owner, &sb.id, 1, None).await.unwrap();
    assert!(failed[0].is_err());
}

#[tokio::test]
async fn a_checkpoint_cuts_proxied_streams_and_a_snapshot_gives_the_link_back() {
    use tokio::io::AsyncReadExt;
    let s = setup().await;
    let egress = Arc::new(RecordingEgress::default());
    s.engine.set_egress(egress.clone(), None);
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            allow_internet_access: Some(true),
            ..Default::default()
        })
        .await;
    let mut open = s.engine.agent_stream(&sb.id).await.unwrap();
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 1];
        open.read(&mut buf).await
    });
    s.engine
        .create_snapshot(&s.owner, &sb.id, None, true)
        .await
        .unwrap();
    let cut = tokio::time::timeout(Duration::from_secs(2), reader)
        .await
        .expect("the open stream ended")
        .unwrap();
    assert!(cut.is_err());
    let calls = egress.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            format!("attach {}", sb.id),
            format!("detach {}", sb.id),
            format!("attach {}", sb.id)
        ]
    );
    // New streams work after the snapshot.
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());
}

#[tokio::test]
async fn paused_sandboxes_do_not_count_against_capacity() {
    let s = setup_with(|c| c.max_sandboxes = 1).await;
    let a = s.base().await;
    s.engine.pause(&s.owner, &a.id, true).await.unwrap();
    let b = s.base().await;
    // Resuming `a` now would exceed the limit: refused, and it stays paused.
    assert!(matches!(
        s.engine.connect(&s.owner, &a.id, resume()).await,
        Err(EngineError::Capacity)
    ));
    assert_eq!(s.engine.get(&s.owner, &a.id).await.unwrap().state, "paused");
    s.engine.kill(&s.owner, &b.id).await.unwrap();
    assert!(s.engine.connect(&s.owner, &a.id, resume()).await.unwrap().1);
}
