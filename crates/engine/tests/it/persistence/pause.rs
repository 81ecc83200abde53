//! Pause, resume, connect, retention and recovery of paused sandboxes.

use super::*;

#[tokio::test]
async fn pause_and_connect_keep_memory_files_env_token_and_id() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.driver.write_file(pid, "/home/user/f.txt", "data");

    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert_eq!(s.state(&sb.id).await, SandboxState::Paused);
    let info = s.engine.get(&s.owner, &sb.id).await.unwrap();
    assert_eq!(info.state, "paused");
    assert_eq!(info.pause_memory, Some(true));
    assert!(
        !s.driver.alive.lock().unwrap().contains(&pid),
        "a paused sandbox has no process"
    );
    assert_eq!(
        files_under(&s.checkpoints()),
        2,
        "the image and its completion marker"
    );

    // Listed as paused; filters.
    let paused = s
        .engine
        .list(
            &s.owner,
            &ListRequest {
                states: vec![SandboxState::Paused.into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(paused.items.len(), 1);
    let running = s
        .engine
        .list(
            &s.owner,
            &ListRequest {
                states: vec![SandboxState::Running.into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(running.items.is_empty());

    let (c, resumed) = s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    assert!(resumed);
    assert_eq!(c.id, sb.id);
    assert_eq!(c.envd_access_token, sb.envd_access_token);
    assert_eq!(c.state, "running");
    let new = s.pid(&sb.id).await;
    assert_ne!(new, pid);
    let mem = s.driver.memory(new).unwrap();
    assert_eq!(mem.vars["x"], "42");
    assert_eq!(mem.env["GREETING"], "hello");
    assert_eq!(mem.access_token, sb.envd_access_token);
    assert_eq!(
        s.driver.file(new, "/home/user/f.txt").as_deref(),
        Some("data")
    );
    // The restored agent was not given its identity again (its env would be reset).
    let last_init = s.driver.inits.lock().unwrap().last().cloned().unwrap();
    assert!(last_init.get("envVars").is_none(), "{last_init}");
    // The checkpoint is deleted in the background once the resume is recorded.
    assert_eq!(
        files_under_when_settled(&s.checkpoints()).await,
        0,
        "the checkpoint is deleted after a resume"
    );
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());

    // A second pause gets a fresh directory.
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    let dirs = walk(&s.checkpoints());
    assert!(
        dirs.iter().all(|p| p.to_string_lossy().contains("/2/")),
        "{dirs:?}"
    );
}

#[tokio::test]
async fn refusals_as_e2b() {
    let s = setup().await;
    let sb = s.base().await;
    assert_eq!(
        refusal(
            s.engine
                .resume(&s.owner, &sb.id, resume())
                .await
                .unwrap_err()
        ),
        Refusal::AlreadyRunning
    );
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert_eq!(
        refusal(s.engine.pause(&s.owner, &sb.id, true).await.unwrap_err()),
        Refusal::AlreadyPaused
    );
    assert_eq!(
        refusal(
            s.engine
                .set_timeout(&s.owner, &sb.id, 60)
                .await
                .unwrap_err()
        ),
        Refusal::Paused
    );
    assert_eq!(
        refusal(s.engine.usage(&s.owner, &sb.id).await.unwrap_err()),
        Refusal::Paused
    );
    // Without auto-resume, traffic is told it is paused.
    assert_eq!(
        refusal(s.engine.agent_stream(&sb.id).await.err().unwrap()),
        Refusal::Paused
    );
    // The older resume resumes it.
    let info = s.engine.resume(&s.owner, &sb.id, resume()).await.unwrap();
    assert_eq!(info.state, "running");
    assert!(matches!(
        s.engine.pause(&s.owner, "nosuchsandbox", true).await,
        Err(EngineError::SandboxNotFound(_))
    ));
}

#[tokio::test]
async fn filesystem_only_pause_keeps_files_not_processes() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.driver.write_file(pid, "/f", "kept");
    s.engine.pause(&s.owner, &sb.id, false).await.unwrap();
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().pause_memory,
        Some(false)
    );
    s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    let new = s.pid(&sb.id).await;
    let mem = s.driver.memory(new).unwrap();
    assert!(mem.vars.is_empty(), "a fresh boot has no memory");
    assert_eq!(s.driver.file(new, "/f").as_deref(), Some("kept"));
    // It was given its identity again: env and token.
    assert_eq!(mem.env["GREETING"], "hello");
    assert_eq!(mem.access_token, sb.envd_access_token);
}

#[tokio::test]
async fn connect_without_memory_boots_a_full_checkpoint_afresh() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    let req = ResumeRequest {
        timeout: Some(30),
        memory: false,
    };
    s.engine.connect(&s.owner, &sb.id, req).await.unwrap();
    let mem = s.driver.memory(s.pid(&sb.id).await).unwrap();
    assert!(mem.vars.is_empty());
    assert_eq!(mem.env["GREETING"], "hello");
}

#[tokio::test]
async fn a_failed_pause_leaves_the_sandbox_running_with_its_link() {
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
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    *s.driver.fail_checkpoint.lock().unwrap() = Some(boom);
    let e = s.engine.pause(&s.owner, &sb.id, true).await.unwrap_err();
    assert!(matches!(e, EngineError::CheckpointFailed { .. }), "{e:?}");
    assert!(e.to_string().contains("keeps running"), "{e}");
    assert_eq!(s.state(&sb.id).await, SandboxState::Running);
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "running"
    );
    assert_eq!(s.pid(&sb.id).await, pid);
    assert_eq!(s.driver.memory(pid).unwrap().vars["x"], "42");
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());
    assert!(
        egress.attached.lock().unwrap().contains_key(&sb.id),
        "link given back"
    );
    assert_eq!(files_under_when_settled(&s.checkpoints()).await, 0);
    // It is still watched: a death ends it.
    s.driver.crash(pid);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(s.engine.get(&s.owner, &sb.id).await.is_err());
}

#[tokio::test]
async fn pause_detaches_the_link_and_resume_gives_it_back() {
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
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert!(!egress.attached.lock().unwrap().contains_key(&sb.id));
    s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    let attached = egress.attached.lock().unwrap().get(&sb.id).cloned();
    assert!(attached.expect("re-attached").allow_internet);
}

#[tokio::test]
async fn a_failed_restore_leaves_it_paused_and_resumable() {
    let s = setup().await;
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    *s.driver.fail_restore.lock().unwrap() = Some(boom);
    let e = s
        .engine
        .connect(&s.owner, &sb.id, resume())
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::RestoreFailed { .. }), "{e:?}");
    assert_eq!(s.state(&sb.id).await, SandboxState::Paused);
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "paused"
    );
    *s.driver.fail_restore.lock().unwrap() = None;
    assert!(
        s.engine
            .connect(&s.owner, &sb.id, resume())
            .await
            .unwrap()
            .1
    );
}

#[tokio::test]
async fn concurrent_resumes_coalesce_into_one_restore() {
    let s = setup().await;
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    *s.driver.restore_delay.lock().unwrap() = Duration::from_millis(200);
    // Traffic arriving once the resume is in flight (a resume first checks the caller's team,
    // so it is not in flight the moment it is called).
    let traffic = async {
        while s.driver.restores_started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        s.engine.agent_stream(&sb.id).await
    };
    let (a, b, c) = tokio::join!(
        s.engine.connect(&s.owner, &sb.id, resume()),
        s.engine.connect(&s.owner, &sb.id, resume()),
        traffic,
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.1 ^ b.1, "exactly one of them resumed it");
    // Traffic without auto-resume waits for the resume in flight, then reaches the agent.
    assert!(c.is_ok(), "{:?}", c.as_ref().err());
    assert_eq!(s.driver.restores.load(Ordering::SeqCst), 1);
}

/// E2B: `pause()` then at once `Sandbox.connect()` (from another client): the connect waits
/// for the pause and resumes the sandbox, instead of answering that it is busy.
#[tokio::test]
async fn a_connect_during_a_pause_waits_for_it_then_resumes() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "kept");
    *s.driver.checkpoint_delay.lock().unwrap() = Duration::from_millis(300);
    let connect = async {
        // Once the pause is in flight.
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.engine.connect(&s.owner, &sb.id, resume()).await
    };
    let (paused, connected) = tokio::join!(s.engine.pause(&s.owner, &sb.id, true), connect);
    paused.unwrap();
    let (info, resumed) = connected.expect("the connect waited for the pause");
    assert!(resumed, "it resumed the paused sandbox (E2B: 201)");
    assert_eq!(info.state, "running");
    assert_eq!(s.driver.restores.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn on_timeout_pause_pauses_at_the_ttl_and_connect_resumes() {
    let s = setup().await;
    s.engine.start_background();
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            timeout: Some(1),
            lifecycle: LifecyclePolicy {
                on_timeout: OnTimeout::Pause,
                ..Default::default()
            },
            ..Default::default()
        })
        .await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "1");
    let mut paused = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        if s.state(&sb.id).await == SandboxState::Paused {
            paused = true;
            break;
        }
    }
    assert!(paused, "paused at the end of its TTL");
    let info = s.engine.get(&s.owner, &sb.id).await.unwrap();
    assert_eq!(info.lifecycle.on_timeout, OnTimeout::Pause);
    let (_, resumed) = s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    assert!(resumed);
    assert_eq!(s.driver.memory(s.pid(&sb.id).await).unwrap().vars["x"], "1");
    s.engine.shutdown().await;
}

#[tokio::test]
async fn auto_resume_on_traffic() {
    let s = setup().await;
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            timeout: Some(120),
            lifecycle: LifecyclePolicy {
                on_timeout: OnTimeout::Pause,
                auto_resume: true,
                pause_memory: true,
            },
            ..Default::default()
        })
        .await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());
    assert_eq!(s.state(&sb.id).await, SandboxState::Running);
    let info = s.engine.get(&s.owner, &sb.id).await.unwrap();
    // The TTL restarts from the resume with the sandbox's own timeout.
    let ttl = (info.end_at - chrono::Utc::now()).num_seconds();
    assert!((100..=120).contains(&ttl), "{ttl}");

    // A filesystem-only pause is never resumed by traffic.
    s.engine.pause(&s.owner, &sb.id, false).await.unwrap();
    assert_eq!(
        refusal(s.engine.agent_stream(&sb.id).await.err().unwrap()),
        Refusal::Paused
    );
}

#[tokio::test]
async fn paused_retention_deletes_checkpoint_and_record() {
    let s = setup_with(|c| c.paused_retention = Duration::from_millis(50)).await;
    s.engine.start_background();
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        s.engine.get(&s.owner, &sb.id).await,
        Err(EngineError::SandboxNotFound(_))
    ));
    assert_eq!(s.state(&sb.id).await, SandboxState::Dead);
    assert_eq!(files_under_when_settled(&s.checkpoints()).await, 0);
    s.engine.shutdown().await;
}

#[tokio::test]
async fn killing_a_paused_sandbox_deletes_its_checkpoint() {
    let s = setup().await;
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert!(files_under(&s.checkpoints()) > 0);
    s.engine.kill(&s.owner, &sb.id).await.unwrap();
    assert_eq!(files_under_when_settled(&s.checkpoints()).await, 0);
    assert!(matches!(
        s.engine.connect(&s.owner, &sb.id, resume()).await,
        Err(EngineError::SandboxNotFound(_))
    ));
}

/// A checkpoint a resume's cleanup left behind (the server stopped first) goes when the
/// sandbox, running again, is killed.
#[tokio::test]
async fn killing_a_resumed_sandbox_deletes_what_its_pauses_left() {
    let s = setup().await;
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    let leftover = s.checkpoints().join("sandboxes").join(&sb.id).join("1");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("pages.img"), b"x").unwrap();
    s.engine.kill(&s.owner, &sb.id).await.unwrap();
    assert_eq!(files_under_when_settled(&s.checkpoints()).await, 0);
}

#[tokio::test]
async fn a_paused_sandbox_survives_a_restart() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    s.engine.shutdown().await;

    let (driver, engine) = s.restart().await;
    assert_eq!(engine.get(&s.owner, &sb.id).await.unwrap().state, "paused");
    let (info, resumed) = engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    assert!(resumed);
    assert_eq!(info.envd_access_token, sb.envd_access_token);
    assert_eq!(driver.memory(s.pid(&sb.id).await).unwrap().vars["x"], "42");
}

#[tokio::test]
async fn recovery_after_a_death_mid_pause_or_mid_resume() {
    let s = setup().await;
    // (1) `pausing`, checkpoint complete, process gone: paused.
    let a = s.base().await;
    s.engine.pause(&s.owner, &a.id, true).await.unwrap();
    s.store
        .set_sandbox_state(&a.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    // (2) `pausing`, no completion marker, process still alive: running, leftover deleted.
    let b = s.base().await;
    let b_pid = s.pid(&b.id).await;
    let mut p = s.store.get_persistence(&b.id).await.unwrap().unwrap();
    let partial = s.checkpoints().join("sandboxes").join(&b.id).join("1");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("pages"), b"half").unwrap();
    p.checkpoint_dir = Some(partial.display().to_string());
    s.store.upsert_persistence(&p).await.unwrap();
    s.store
        .set_sandbox_state(&b.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    // (3) `pausing`, no marker, process gone: nothing to resume from, so it has ended.
    let c = s.base().await;
    let c_pid = s.pid(&c.id).await;
    let mut p = s.store.get_persistence(&c.id).await.unwrap().unwrap();
    p.checkpoint_dir = Some(partial.with_file_name("9").display().to_string());
    s.store.upsert_persistence(&p).await.unwrap();
    s.store
        .set_sandbox_state(&c.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    // (4) `resuming` with the checkpoint still complete and no new process: paused.
    let d = s.base().await;
    s.engine.pause(&s.owner, &d.id, true).await.unwrap();
    s.store
        .set_sandbox_state(&d.id, SandboxState::Resuming, None)
        .await
        .unwrap();
    // (5) `pausing`, the driver finished (its own record is there) but the server died before
    // writing the engine's marker: paused, and the marker is written now.
    let e = s.base().await;
    s.engine.pause(&s.owner, &e.id, true).await.unwrap();
    let e_dir = std::path::PathBuf::from(
        s.store
            .get_persistence(&e.id)
            .await
            .unwrap()
            .unwrap()
            .checkpoint_dir
            .unwrap(),
    );
    let marker = std::fs::read_dir(&e_dir)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .find(|p| p.file_name().unwrap() != bulkhead_driver::fake::CHECKPOINT_FILE)
        .expect("the engine's marker");
    std::fs::remove_file(&marker).unwrap();
    s.store
        .set_sandbox_state(&e.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    s.engine.shutdown().await;
    s.driver.crash(c_pid);

    let (_driver, engine) = s.restart().await;
    assert_eq!(s.state(&e.id).await, SandboxState::Paused);
    assert!(marker.exists(), "recovery completed the marker");
    assert!(engine.connect(&s.owner, &e.id, resume()).await.unwrap().1);
    assert_eq!(s.state(&a.id).await, SandboxState::Paused);
    assert_eq!(engine.get(&s.owner, &a.id).await.unwrap().state, "paused");
    assert_eq!(s.state(&b.id).await, SandboxState::Running);
    assert_eq!(s.pid(&b.id).await, b_pid);
    // The interrupted checkpoint is gone: adopting gave the sandbox back whatever the pause
    // had moved into it.
    assert!(!partial.exists());
    assert!(engine.agent_stream(&b.id).await.is_ok());
    assert_eq!(s.state(&c.id).await, SandboxState::Dead);
    assert_eq!(s.state(&d.id).await, SandboxState::Paused);
    engine.kill(&s.owner, &b.id).await.unwrap();
    assert!(engine.connect(&s.owner, &d.id, resume()).await.unwrap().1);
    assert!(engine.connect(&s.owner, &a.id, resume()).await.unwrap().1);
    // Only running sandboxes count as running (a, d and e resumed; b was killed above).
    let page = engine
        .list(&s.owner, &ListRequest::default())
        .await
        .unwrap();
    assert_eq!(page.total_running, 3);
}
