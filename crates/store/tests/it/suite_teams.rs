//! The store's teams, credits, quotas and metered usage (run by `store_tests!` like `suite`).

use bulkhead_store::{
    DEFAULT_TEAM, SandboxFilter, StoreError, TeamQuotas, TeamRow, UsageFilter, UsageRow,
};

use crate::harness::Harness;
use crate::suite::{key, sandbox};

fn usage_row(sandbox: &str, team: &str, start_ms: i64, end_ms: i64, cost: i64) -> UsageRow {
    UsageRow {
        sandbox_id: sandbox.into(),
        team_id: team.into(),
        key_id: format!("key-{team}"),
        start_ms,
        end_ms,
        state: "running".into(),
        vcpu_ms: 2 * (end_ms - start_ms),
        memory_mib_ms: 512 * (end_ms - start_ms),
        storage_mib_ms: 0,
        cost_micro: cost,
    }
}

pub async fn teams_credits_and_quotas(h: &Harness) {
    let s = &h.store;
    // The migration made the default team; keys and sandboxes land in it by default.
    let default = s.get_team(DEFAULT_TEAM).await.unwrap().unwrap();
    assert_eq!(
        (default.name.as_str(), default.credits_micro),
        ("default", None)
    );
    let t = TeamRow {
        id: "team_x".into(),
        name: "acme".into(),
        created_at: 5,
        credits_micro: None,
        quotas: TeamQuotas::default(),
    };
    s.insert_team(&t).await.unwrap();
    let dup = TeamRow {
        id: "team_y".into(),
        ..t.clone()
    };
    assert!(matches!(
        s.insert_team(&dup).await.unwrap_err(),
        StoreError::Conflict { .. }
    ));
    assert_eq!(s.get_team("acme").await.unwrap(), Some(t.clone()));
    assert_eq!(s.get_team("team_x").await.unwrap(), Some(t.clone()));
    assert_eq!(s.get_team("nope").await.unwrap(), None);
    assert_eq!(
        s.list_teams()
            .await
            .unwrap()
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>(),
        ["default", "team_x"]
    );

    // Credits: relative updates, a team without a balance starts at 0.
    assert_eq!(
        s.add_team_credits("team_x", 5_000).await.unwrap(),
        Some(5_000)
    );
    assert_eq!(
        s.add_team_credits("team_x", -7_000).await.unwrap(),
        Some(-2_000)
    );
    assert_eq!(s.add_team_credits("missing", 1).await.unwrap(), None);
    assert!(s.clear_team_credits("team_x").await.unwrap());
    assert_eq!(
        s.get_team("team_x").await.unwrap().unwrap().credits_micro,
        None
    );

    let q = TeamQuotas {
        max_sandboxes: Some(3),
        max_vcpus: Some(4),
        max_memory_mb: None,
        max_timeout_secs: Some(600),
        create_rate_milli: Some(500),
        create_burst: Some(2),
    };
    assert!(s.set_team_quotas("team_x", &q).await.unwrap());
    assert!(!s.set_team_quotas("missing", &q).await.unwrap());
    assert_eq!(s.get_team("acme").await.unwrap().unwrap().quotas, q);

    // Keys carry their team and last use.
    let mut k = key("kx", "e2b_xxxx", 1);
    k.team_id = "team_x".into();
    s.insert_api_key(&k).await.unwrap();
    s.touch_api_key("kx", 1234).await.unwrap();
    let got = s
        .find_active_api_key_by_hash(&k.hash)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (got.team_id.as_str(), got.last_used_at),
        ("team_x", Some(1234))
    );

    // Sandboxes filter by team.
    let mut sb = sandbox("sx", 10);
    sb.team_id = "team_x".into();
    s.insert_sandbox(&sb).await.unwrap();
    s.insert_sandbox(&sandbox("sd", 11)).await.unwrap();
    let only_x = SandboxFilter {
        team_id: Some("team_x".into()),
        ..Default::default()
    };
    let rows = s.list_sandboxes(&only_x, None, false, None).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].id.as_str(), rows[0].team_id.as_str()),
        ("sx", "team_x")
    );
    assert_eq!(s.count_sandboxes(&only_x).await.unwrap(), 1);
    assert_eq!(
        s.get_sandbox("sd").await.unwrap().unwrap().team_id,
        DEFAULT_TEAM
    );
}

pub async fn usage_records_and_sums(h: &Harness) {
    let s = &h.store;
    let t = TeamRow {
        id: "team_u".into(),
        name: "u".into(),
        created_at: 1,
        credits_micro: Some(1_000),
        quotas: TeamQuotas::default(),
    };
    s.insert_team(&t).await.unwrap();
    // One transaction: rows recorded, the team with a balance drawn, the one without not.
    let balances = s
        .record_usage(&[
            usage_row("s1", "team_u", 0, 15_000, 300),
            usage_row("s2", "team_u", 0, 15_000, 300),
            usage_row("s3", DEFAULT_TEAM, 0, 15_000, 300),
        ])
        .await
        .unwrap();
    assert_eq!(balances.get("team_u"), Some(&400));
    assert_eq!(balances.get(DEFAULT_TEAM), None, "no balance, not drawn");
    let mut paused = usage_row("s1", "team_u", 15_000, 25_000, 0);
    paused.state = "paused".into();
    paused.vcpu_ms = 0;
    paused.memory_mib_ms = 0;
    paused.storage_mib_ms = 100 * 10_000;
    let balances = s.record_usage(&[paused]).await.unwrap();
    assert_eq!(balances.get("team_u"), Some(&400));
    // The same interval twice is refused, and nothing of that batch is kept or drawn.
    let err = s
        .record_usage(&[
            usage_row("s2", "team_u", 15_000, 30_000, 100),
            usage_row("s1", "team_u", 0, 15_000, 300),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
    assert_eq!(
        s.get_team("team_u").await.unwrap().unwrap().credits_micro,
        Some(400)
    );
    assert_eq!(
        s.metered_until(&["s1".into(), "s2".into(), "nope".into()])
            .await
            .unwrap(),
        [("s1".to_string(), 25_000), ("s2".to_string(), 15_000)]
            .into_iter()
            .collect()
    );

    let team = UsageFilter {
        team_id: Some("team_u".into()),
        ..Default::default()
    };
    let sums = s.sum_usage(&team).await.unwrap();
    assert_eq!(sums.len(), 2, "{sums:?}");
    let s1 = sums.iter().find(|u| u.sandbox_id == "s1").unwrap();
    assert_eq!(
        (s1.start_ms, s1.end_ms, s1.running_ms, s1.paused_ms),
        (0, 25_000, 15_000, 10_000)
    );
    assert_eq!((s1.vcpu_ms, s1.memory_mib_ms), (30_000, 512 * 15_000));
    assert_eq!((s1.storage_mib_ms, s1.cost_micro), (1_000_000, 300));
    assert_eq!(s1.key_id, "key-team_u");
    // Time range: intervals overlapping [20 s, ∞) are only the paused one.
    let late = s
        .sum_usage(&UsageFilter {
            from_ms: Some(20_000),
            ..team.clone()
        })
        .await
        .unwrap();
    assert_eq!(late.len(), 1);
    assert_eq!((late[0].running_ms, late[0].paused_ms), (0, 10_000));
    // By sandbox, by key, and nothing before the first record.
    let one = UsageFilter {
        sandbox_id: Some("s2".into()),
        ..Default::default()
    };
    assert_eq!(s.sum_usage(&one).await.unwrap().len(), 1);
    let by_key = UsageFilter {
        key_id: Some("key-default".into()),
        ..Default::default()
    };
    assert_eq!(s.sum_usage(&by_key).await.unwrap()[0].sandbox_id, "s3");
    let before = UsageFilter {
        to_ms: Some(0),
        ..Default::default()
    };
    assert!(s.sum_usage(&before).await.unwrap().is_empty());
}
