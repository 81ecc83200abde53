//! Teams against the test double driver (no root): sandboxes are team-scoped, team quotas and
//! the create rate refuse with the limit named, metering records usage and draws credits, and
//! a team out of credits is refused creates and has its running sandboxes paused.

use std::sync::Arc;
use std::time::Duration;

use bulkhead_engine::UsageFilter;
use bulkhead_engine::testing::{FakeEngine, fake_engine};
use bulkhead_engine::{
    Caller, CreateRequest, Engine, EngineConfig, EngineError, Limit, ListRequest, MeteringConfig,
    Prices, ResumeRequest, SandboxState, teams,
};
use bulkhead_store::Store;

struct Setup {
    _dir: tempfile::TempDir,
    store: Store,
    engine: Arc<Engine>,
    /// A key of the default team.
    a: Caller,
    /// A key of team `b`.
    b: Caller,
}

async fn setup(metering: MeteringConfig) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        checkpoint_dir: dir.path().join("checkpoints"),
        metering,
        ..Default::default()
    };
    let FakeEngine {
        store,
        engine,
        owner,
        ..
    } = fake_engine(dir.path(), cfg, bulkhead_engine::testing::base_template()).await;
    teams::create(&store, "b", None).await.unwrap();
    let (kb, _) = bulkhead_engine::keys::create_in(&store, "kb", "b")
        .await
        .unwrap();
    Setup {
        _dir: dir,
        store,
        engine,
        a: owner,
        b: kb.caller(),
    }
}

fn base(timeout: u64) -> CreateRequest {
    CreateRequest {
        template: "base".into(),
        timeout: Some(timeout),
        ..Default::default()
    }
}

fn quota_limit(e: &EngineError) -> Option<Limit> {
    match e {
        EngineError::Quota(q) => Some(q.limit),
        _ => None,
    }
}

#[tokio::test]
async fn sandboxes_are_visible_only_to_their_team() {
    let s = setup(MeteringConfig::default()).await;
    assert_eq!(s.a.team_id, "default");
    assert_ne!(s.b.team_id, "default");
    let sa = s.engine.create(&s.a, base(60)).await.unwrap();
    let sb = s.engine.create(&s.b, base(60)).await.unwrap();
    // A second key of team b sees b's sandbox: sandboxes are the team's, not the key's.
    let (kb2, _) = bulkhead_engine::keys::create_in(&s.store, "kb2", "b")
        .await
        .unwrap();
    let b2 = kb2.caller();

    let ids = |page: bulkhead_engine::ListPage| -> Vec<String> {
        page.items.into_iter().map(|i| i.id).collect()
    };
    let req = ListRequest::default();
    assert_eq!(
        ids(s.engine.list(&s.a, &req).await.unwrap()),
        vec![sa.id.clone()]
    );
    assert_eq!(
        ids(s.engine.list(&s.b, &req).await.unwrap()),
        vec![sb.id.clone()]
    );
    assert_eq!(
        ids(s.engine.list(&b2, &req).await.unwrap()),
        vec![sb.id.clone()]
    );
    assert_eq!(s.engine.list(&s.a, &req).await.unwrap().total_running, 1);

    // Another team's sandbox does not exist for you: get, kill, timeout, pause, metrics 404.
    for (who, other) in [(&s.a, &sb.id), (&s.b, &sa.id)] {
        let e = s.engine.get(who, other).await.unwrap_err();
        assert!(matches!(e, EngineError::SandboxNotFound(_)), "{e:?}");
        let e = s.engine.kill(who, other).await.unwrap_err();
        assert!(matches!(e, EngineError::SandboxNotFound(_)), "{e:?}");
        let e = s.engine.set_timeout(who, other, 30).await.unwrap_err();
        assert!(matches!(e, EngineError::SandboxNotFound(_)), "{e:?}");
        let e = s.engine.pause(who, other, true).await.unwrap_err();
        assert!(matches!(e, EngineError::SandboxNotFound(_)), "{e:?}");
        let e = s.engine.usage(who, other).await.unwrap_err();
        assert!(matches!(e, EngineError::SandboxNotFound(_)), "{e:?}");
    }
    assert!(
        s.engine.is_live(&sa.id) && s.engine.is_live(&sb.id),
        "nothing was killed"
    );
    // Snapshots are the team's: not listed, used, replaced or deleted by another team.
    let snap = s
        .engine
        .create_snapshot(&s.a, &sa.id, Some("snap-a"), true)
        .await
        .unwrap();
    assert!(
        s.engine
            .list_snapshots(&s.b, None, None, None, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(
        s.engine
            .list_snapshots(&s.a, None, None, None, None)
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let e = s
        .engine
        .create(
            &s.b,
            CreateRequest {
                template: "snap-a".into(),
                ..base(60)
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::TemplateNotFound(_)), "{e:?}");
    let e = s
        .engine
        .create_snapshot(&s.b, &sb.id, Some("snap-a"), true)
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::Conflict(_)), "{e:?}");
    let e = s.engine.delete_snapshot(&s.b, "snap-a").await.unwrap_err();
    assert!(matches!(e, EngineError::SnapshotNotFound(_)), "{e:?}");
    s.engine
        .delete_snapshot(&s.a, &snap.snapshot_id)
        .await
        .unwrap();
    s.engine.get(&b2, &sb.id).await.unwrap();
    s.engine.kill(&b2, &sb.id).await.unwrap();
    s.engine.kill(&s.a, &sa.id).await.unwrap();
}

#[tokio::test]
async fn quotas_refuse_with_the_limit_named() {
    let s = setup(MeteringConfig::default()).await;
    // The base template has 2 vCPUs and 512 MiB.
    let set = |u: teams::QuotaUpdate| {
        let store = s.store.clone();
        async move { teams::set_quotas(&store, "b", &u).await.unwrap() }
    };
    set(teams::QuotaUpdate {
        max_vcpus: Some(Some(1)),
        ..Default::default()
    })
    .await;
    let e = s.engine.create(&s.b, base(60)).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::MaxVcpus), "{e:?}");
    assert!(
        e.to_string()
            .contains("bulkhead teams set-quota b --max-vcpus 2"),
        "{e}"
    );
    // Other teams are not limited by it.
    let sa = s.engine.create(&s.a, base(60)).await.unwrap();

    set(teams::QuotaUpdate {
        max_vcpus: Some(None),
        max_memory_mb: Some(Some(256)),
        ..Default::default()
    })
    .await;
    let e = s.engine.create(&s.b, base(60)).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::MaxMemory), "{e:?}");

    set(teams::QuotaUpdate {
        max_memory_mb: Some(None),
        max_timeout_secs: Some(Some(120)),
        max_sandboxes: Some(Some(1)),
        ..Default::default()
    })
    .await;
    let e = s.engine.create(&s.b, base(121)).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::MaxTimeout), "{e:?}");
    let sb = s.engine.create(&s.b, base(120)).await.unwrap();
    let e = s.engine.set_timeout(&s.b, &sb.id, 500).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::MaxTimeout), "{e:?}");
    let e = s.engine.create(&s.b, base(60)).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::MaxSandboxes), "{e:?}");
    assert!(e.to_string().contains("its limit is 1"), "{e}");
    // A paused sandbox does not count; resuming it does.
    s.engine.pause(&s.b, &sb.id, true).await.unwrap();
    let sb2 = s.engine.create(&s.b, base(60)).await.unwrap();
    let resume = ResumeRequest {
        timeout: Some(60),
        ..Default::default()
    };
    let e = s.engine.connect(&s.b, &sb.id, resume).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::MaxSandboxes), "{e:?}");
    for (c, id) in [(&s.b, &sb2.id), (&s.b, &sb.id), (&s.a, &sa.id)] {
        s.engine.kill(c, id).await.unwrap();
    }
}

#[tokio::test]
async fn concurrent_creates_cannot_overshoot_the_sandbox_limit() {
    let s = setup(MeteringConfig::default()).await;
    teams::set_quotas(
        &s.store,
        "b",
        &teams::QuotaUpdate {
            max_sandboxes: Some(Some(2)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let e = s.engine.clone();
            let b = s.b.clone();
            tokio::spawn(async move { e.create(&b, base(60)).await })
        })
        .collect();
    let mut ok = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(i) => ok.push(i.id),
            Err(e) => assert_eq!(quota_limit(&e), Some(Limit::MaxSandboxes), "{e:?}"),
        }
    }
    assert_eq!(ok.len(), 2, "{ok:?}");
    for id in ok {
        s.engine.kill(&s.b, &id).await.unwrap();
    }
}

#[tokio::test]
async fn creates_are_rate_limited_per_team() {
    let s = setup(MeteringConfig::default()).await;
    // One create per 10 s, burst 2: two pass, the third is refused.
    teams::set_quotas(
        &s.store,
        "b",
        &teams::QuotaUpdate {
            create_rate_milli: Some(Some(100)),
            create_burst: Some(Some(2)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let x = s.engine.create(&s.b, base(60)).await.unwrap();
    let y = s.engine.create(&s.b, base(60)).await.unwrap();
    let e = s.engine.create(&s.b, base(60)).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::CreateRate), "{e:?}");
    assert!(e.to_string().contains("--creates-per-second"), "{e}");
    // Team a has no rate limit.
    let z = s.engine.create(&s.a, base(60)).await.unwrap();
    for (c, id) in [(&s.b, &x.id), (&s.b, &y.id), (&s.a, &z.id)] {
        s.engine.kill(c, id).await.unwrap();
    }
}

#[tokio::test]
async fn metering_records_usage_and_credits_run_out() {
    let s = setup(MeteringConfig {
        interval: Duration::from_secs(3600),
        // 1 credit per vCPU-hour; memory free.
        prices: Prices {
            vcpu_hour: 1.0,
            gib_hour: 0.0,
            paused_gib_hour: 0.0,
        },
        grace: Duration::ZERO,
        ..Default::default()
    })
    .await;
    // 0.002 credits: 2 vCPUs use it in 3.6 s.
    teams::credit(&s.store, "b", 2_000).await.unwrap();
    let sb = s.engine.create(&s.b, base(600)).await.unwrap();
    let sa = s.engine.create(&s.a, base(600)).await.unwrap();
    let t0 = sb.started_at.timestamp_millis();

    // 1 s in (a fake instant): recorded, 0.000556 drawn, still positive.
    s.engine.meter(t0 + 1_000).await.unwrap();
    let r = s
        .engine
        .usage_report(&s.b, UsageFilter::default())
        .await
        .unwrap();
    assert_eq!(r.sandboxes.len(), 1, "{r:?}");
    assert_eq!(r.sandboxes[0].sandbox_id, sb.id);
    assert!((r.totals.vcpu_seconds - 2.0).abs() < 1e-9, "{r:?}");
    assert!((r.totals.memory_gib_seconds - 0.5).abs() < 1e-9, "{r:?}");
    let balance = r.credits.unwrap();
    assert!((balance - (0.002 - 2.0 / 3600.0)).abs() < 2e-6, "{balance}");
    assert!(s.engine.is_live(&sb.id));

    // 10 s in: the balance is below zero; with no grace the sandbox is paused.
    s.engine.meter(t0 + 10_000).await.unwrap();
    let team = teams::get(&s.store, "b").await.unwrap();
    assert!(team.credits_micro.unwrap() < 0, "{team:?}");
    let info = s.engine.get(&s.b, &sb.id).await.unwrap();
    assert_eq!(info.state, "paused", "{info:?}");
    // Team a has no balance: untouched.
    assert_eq!(s.engine.get(&s.a, &sa.id).await.unwrap().state, "running");

    // Creates and resumes are refused with the credits limit until a top-up.
    let e = s.engine.create(&s.b, base(60)).await.unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::Credits), "{e:?}");
    assert!(e.to_string().contains("bulkhead teams credit b +N"), "{e}");
    let e = s
        .engine
        .connect(&s.b, &sb.id, ResumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(quota_limit(&e), Some(Limit::Credits), "{e:?}");
    teams::credit(&s.store, "b", 1_000_000).await.unwrap();
    let (info, resumed) = s
        .engine
        .connect(&s.b, &sb.id, ResumeRequest::default())
        .await
        .unwrap();
    assert!(resumed && info.state == "running", "{info:?}");

    // Usage per key and per sandbox; the range excludes what is outside it.
    let by_key = s
        .engine
        .usage_report(
            &s.b,
            UsageFilter {
                key_id: Some(s.b.key_id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(by_key.totals.vcpu_seconds >= 20.0, "{by_key:?}");
    assert!(by_key.totals.cost > 0.0);
    let later = s
        .engine
        .usage_report(
            &s.b,
            UsageFilter {
                from_ms: Some(t0 + 10_000_000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(later.sandboxes.is_empty(), "{later:?}");
    // Team a's report shows only team a's sandbox, whatever it asks for.
    let ra = s
        .engine
        .usage_report(
            &s.a,
            UsageFilter {
                sandbox_id: Some(sb.id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(ra.sandboxes.is_empty(), "{ra:?}");

    s.engine.kill(&s.b, &sb.id).await.unwrap();
    s.engine.kill(&s.a, &sa.id).await.unwrap();
    // The kill recorded its last interval: nothing of it is left unmetered.
    let all = bulkhead_engine::metering::report(&s.store, &UsageFilter::default())
        .await
        .unwrap();
    assert_eq!(all.sandboxes.len(), 2, "{all:?}");
    assert!(all.sandboxes.iter().any(|u| u.sandbox_id == sa.id));
    assert_eq!(
        s.engine
            .get(&s.a, &sa.id)
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string(),
        EngineError::SandboxNotFound(sa.id.clone()).to_string()
    );
    let _ = SandboxState::Dead;
}
