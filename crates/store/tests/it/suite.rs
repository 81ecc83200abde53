use std::collections::BTreeMap;

use bulkhead_store::{
    ApiKeyRow, SandboxFilter, SandboxRow, SandboxState, Store, StoreError, TemplateRow,
};

use crate::harness::Harness;
pub use crate::suite_idempotency::{
    idempotency_claim_complete_and_mismatch, idempotency_keys_expire,
    idempotency_race_has_one_winner, idempotency_release_and_abandoned_claims,
};
pub use crate::suite_nodes::{
    leases_acquire_renew_expire, leases_race_has_one_winner, node_sandboxes_expire_and_release,
    nodes_drain_through_the_store, nodes_race_register, nodes_register_and_heartbeat,
    nodes_sweep_is_fenced, nodes_sweep_marks_what_a_dead_node_ran_lost, nodes_sweep_thresholds,
};
pub use crate::suite_records::{
    egress_events, persistence_roundtrip, sandbox_for_tests, sandbox_network_updates,
    snapshots_crud_and_pagination, volumes_crud,
};
pub use crate::suite_replicas::{
    replicas_register_and_heartbeat, replicas_take_over_only_from_silent_owners,
    replicas_takeover_race_has_one_winner,
};
pub use crate::suite_secrets::{
    secrets_crud, secrets_per_team, secrets_sealed_at_rest, secrets_wrong_key,
};
pub use crate::suite_teams::{teams_credits_and_quotas, usage_records_and_sums};

pub(crate) fn key(id: &str, prefix: &str, created_at: i64) -> ApiKeyRow {
    ApiKeyRow {
        id: id.to_owned(),
        name: format!("key {id}"),
        hash: format!("{id:0>64}"),
        prefix: prefix.to_owned(),
        created_at,
        revoked_at: None,
        team_id: "default".to_owned(),
        last_used_at: None,
    }
}

pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub(crate) fn sandbox(id: &str, started_at: i64) -> SandboxRow {
    SandboxRow {
        id: id.to_owned(),
        template_id: "base".to_owned(),
        alias: None,
        state: SandboxState::Running,
        owner_key_id: "k1".to_owned(),
        team_id: "default".to_owned(),
        metadata: BTreeMap::new(),
        env_vars: BTreeMap::new(),
        envd_access_token: None,
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 1024,
        started_at,
        end_at: started_at + 300_000,
        driver_handle: None,
        end_reason: None,
        allow_internet: false,
        network: None,
        node_id: None,
        owner_replica: None,
    }
}

fn template(id: &str, alias: Option<&str>, created_at: i64) -> TemplateRow {
    TemplateRow {
        id: id.to_owned(),
        alias: alias.map(str::to_owned),
        content_hash: format!("hash-{id}"),
        status: "building".to_owned(),
        rootfs_path: format!("/var/cache/bulkhead/images/{id}/rootfs"),
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 2048,
        created_at,
        updated_at: created_at,
        team_id: None,
    }
}

fn ids(rows: &[SandboxRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

pub async fn open_is_idempotent(h: &Harness) {
    let expected = if h.url.starts_with("sqlite") {
        "sqlite"
    } else {
        "postgres"
    };
    assert_eq!(h.store.backend(), expected);
    h.store
        .insert_api_key(&key("k1", "e2b_aaaa", 1))
        .await
        .unwrap();
    // Reopening runs the migrator again over an up-to-date schema and sees the same data.
    let again = Store::open(&h.url).await.unwrap();
    assert_eq!(again.backend(), expected);
    assert_eq!(again.count_active_api_keys().await.unwrap(), 1);
    again.close().await;
}

pub async fn api_keys_roundtrip(h: &Harness) {
    let s = &h.store;
    assert_eq!(s.count_active_api_keys().await.unwrap(), 0);
    assert!(s.list_api_keys().await.unwrap().is_empty());

    let k2 = key("k2", "e2b_bbbb", 20);
    let k1 = key("k1", "e2b_aaaa", 10);
    s.insert_api_key(&k2).await.unwrap();
    s.insert_api_key(&k1).await.unwrap();
    assert_eq!(
        s.list_api_keys().await.unwrap(),
        vec![k1.clone(), k2.clone()]
    );
    assert_eq!(s.count_active_api_keys().await.unwrap(), 2);
    assert_eq!(
        s.find_active_api_key_by_hash(&k1.hash).await.unwrap(),
        Some(k1.clone())
    );
    assert_eq!(s.find_active_api_key_by_hash("nope").await.unwrap(), None);

    // Same hash under another id is a conflict, not a second key for the same secret.
    let mut dup = key("k3", "e2b_cccc", 30);
    dup.hash = k1.hash.clone();
    let err = s.insert_api_key(&dup).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");

    assert!(s.revoke_api_key("k1").await.unwrap());
    assert!(!s.revoke_api_key("k1").await.unwrap(), "already revoked");
    assert!(!s.revoke_api_key("missing").await.unwrap());
    assert_eq!(s.find_active_api_key_by_hash(&k1.hash).await.unwrap(), None);
    assert_eq!(s.count_active_api_keys().await.unwrap(), 1);
    let listed = s.list_api_keys().await.unwrap();
    assert!(listed[0].revoked_at.is_some_and(|t| t > 0));
    assert_eq!(listed[1].revoked_at, None);
}

pub async fn api_key_revoke_by_prefix(h: &Harness) {
    let s = &h.store;
    s.insert_api_key(&key("k1", "e2b_aaaa", 1)).await.unwrap();
    s.insert_api_key(&key("k2", "e2b_bbbb", 2)).await.unwrap();
    s.insert_api_key(&key("k3", "e2b_bbbb", 3)).await.unwrap();

    assert!(s.revoke_api_key("e2b_aaaa").await.unwrap());
    assert_eq!(s.count_active_api_keys().await.unwrap(), 2);

    let err = s.revoke_api_key("e2b_bbbb").await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Ambiguous { count: 2, .. }),
        "{err:?}"
    );
    assert_eq!(
        s.count_active_api_keys().await.unwrap(),
        2,
        "nothing revoked"
    );
    // Once one of the two is revoked by id, the prefix is unambiguous again.
    assert!(s.revoke_api_key("k2").await.unwrap());
    assert!(s.revoke_api_key("e2b_bbbb").await.unwrap());
    assert_eq!(s.count_active_api_keys().await.unwrap(), 0);
}

pub async fn sandbox_roundtrip(h: &Harness) {
    let s = &h.store;
    let mut sb = sandbox("sb1", 1_700_000_000_000);
    sb.alias = Some("my-alias".to_owned());
    sb.metadata = map(&[
        ("user", "alice"),
        ("quote", "a \"b\" \\ c"),
        ("ünï", "çødé ✓"),
    ]);
    sb.env_vars = map(&[("PATH", "/usr/bin"), ("EMPTY", "")]);
    sb.envd_access_token = Some("tok".to_owned());
    sb.driver_handle = Some(r#"{"pid":42}"#.to_owned());
    sb.allow_internet = true;
    sb.network = Some(r#"{"allowOut":["pypi.org"]}"#.to_owned());
    s.insert_sandbox(&sb).await.unwrap();
    assert_eq!(s.get_sandbox("sb1").await.unwrap(), Some(sb.clone()));
    assert_eq!(s.get_sandbox("nope").await.unwrap(), None);

    let plain = sandbox("sb2", 5);
    s.insert_sandbox(&plain).await.unwrap();
    assert_eq!(s.get_sandbox("sb2").await.unwrap(), Some(plain));

    let err = s.insert_sandbox(&sb).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
}

pub async fn sandbox_updates(h: &Harness) {
    let s = &h.store;
    s.insert_sandbox(&sandbox("sb1", 100)).await.unwrap();

    assert!(s.set_sandbox_end_at("sb1", 999).await.unwrap());
    assert!(!s.set_sandbox_end_at("nope", 999).await.unwrap());

    assert!(
        s.set_sandbox_driver_handle("sb1", Some("{\"pid\":7}"), Some("n1"))
            .await
            .unwrap()
    );
    assert!(
        s.set_sandbox_state("sb1", SandboxState::Paused, Some("paused by user"))
            .await
            .unwrap()
    );
    let got = s.get_sandbox("sb1").await.unwrap().unwrap();
    assert_eq!(got.end_at, 999);
    assert_eq!(got.state, SandboxState::Paused);
    assert_eq!(got.end_reason.as_deref(), Some("paused by user"));
    assert_eq!(got.driver_handle.as_deref(), Some("{\"pid\":7}"));
    assert_eq!(got.node_id.as_deref(), Some("n1"));

    // Resume clears the reason; the handle can be cleared independently.
    assert!(
        s.set_sandbox_state("sb1", SandboxState::Running, None)
            .await
            .unwrap()
    );
    assert!(
        s.set_sandbox_driver_handle("sb1", None, None)
            .await
            .unwrap()
    );
    let got = s.get_sandbox("sb1").await.unwrap().unwrap();
    assert_eq!(got.state, SandboxState::Running);
    assert_eq!(got.end_reason, None);
    assert_eq!(got.driver_handle, None);
    // The node stays with a paused sandbox's checkpoint.
    assert_eq!(got.node_id.as_deref(), Some("n1"));

    assert!(
        !s.set_sandbox_state("nope", SandboxState::Dead, Some("killed"))
            .await
            .unwrap()
    );
    assert!(
        !s.set_sandbox_driver_handle("nope", None, None)
            .await
            .unwrap()
    );
}

pub async fn sandbox_filters_and_counts(h: &Harness) {
    let s = &h.store;
    let mut a = sandbox("a", 10);
    a.metadata = map(&[("team", "x"), ("env", "prod")]);
    let mut b = sandbox("b", 20);
    b.metadata = map(&[("team", "x"), ("env", "dev")]);
    b.state = SandboxState::Paused;
    let mut c = sandbox("c", 30);
    c.template_id = "code-interpreter-v1".to_owned();
    c.owner_key_id = "k2".to_owned();
    c.state = SandboxState::Dead;
    for sb in [&a, &b, &c] {
        s.insert_sandbox(sb).await.unwrap();
    }

    let all = SandboxFilter::default();
    assert_eq!(s.count_sandboxes(&all).await.unwrap(), 3);
    assert_eq!(
        ids(&s.list_sandboxes(&all, None, false, None).await.unwrap()),
        ["a", "b", "c"]
    );
    assert_eq!(
        ids(&s.list_sandboxes(&all, None, true, None).await.unwrap()),
        ["c", "b", "a"]
    );
    assert_eq!(
        ids(&s.list_sandboxes(&all, Some(2), true, None).await.unwrap()),
        ["c", "b"]
    );
    assert!(
        s.list_sandboxes(&all, Some(0), false, None)
            .await
            .unwrap()
            .is_empty()
    );

    let live = SandboxFilter {
        states: vec![SandboxState::Running, SandboxState::Paused],
        ..Default::default()
    };
    assert_eq!(
        ids(&s.list_sandboxes(&live, None, false, None).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(s.count_sandboxes(&live).await.unwrap(), 2);

    let by_template = SandboxFilter {
        template_id: Some("code-interpreter-v1".to_owned()),
        ..Default::default()
    };
    assert_eq!(
        ids(&s
            .list_sandboxes(&by_template, None, false, None)
            .await
            .unwrap()),
        ["c"]
    );

    let by_owner = SandboxFilter {
        owner_key_id: Some("k1".to_owned()),
        ..Default::default()
    };
    assert_eq!(s.count_sandboxes(&by_owner).await.unwrap(), 2);

    // The bound is inclusive (E2B's `started_after`).
    let at_a = SandboxFilter {
        started_after: Some(10),
        ..Default::default()
    };
    assert_eq!(
        ids(&s.list_sandboxes(&at_a, None, false, None).await.unwrap()),
        ["a", "b", "c"]
    );
    let recent = SandboxFilter {
        started_after: Some(11),
        ..Default::default()
    };
    assert_eq!(
        ids(&s.list_sandboxes(&recent, None, false, None).await.unwrap()),
        ["b", "c"]
    );

    let team_x = SandboxFilter {
        metadata: map(&[("team", "x")]),
        ..Default::default()
    };
    assert_eq!(
        ids(&s.list_sandboxes(&team_x, None, false, None).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(s.count_sandboxes(&team_x).await.unwrap(), 2);

    // Every pair must match.
    let team_x_prod = SandboxFilter {
        metadata: map(&[("team", "x"), ("env", "prod")]),
        ..Default::default()
    };
    assert_eq!(
        ids(&s
            .list_sandboxes(&team_x_prod, None, false, None)
            .await
            .unwrap()),
        ["a"]
    );
    assert_eq!(s.count_sandboxes(&team_x_prod).await.unwrap(), 1);

    let combined = SandboxFilter {
        states: vec![SandboxState::Paused],
        metadata: map(&[("team", "x")]),
        owner_key_id: Some("k1".to_owned()),
        template_id: Some("base".to_owned()),
        started_after: Some(0),
        team_id: Some("default".to_owned()),
        owner_replica: None,
    };
    assert_eq!(
        ids(&s
            .list_sandboxes(&combined, None, false, None)
            .await
            .unwrap()),
        ["b"]
    );
    assert_eq!(s.count_sandboxes(&combined).await.unwrap(), 1);

    let none = SandboxFilter {
        metadata: map(&[("team", "y")]),
        ..Default::default()
    };
    assert!(
        s.list_sandboxes(&none, Some(5), false, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(s.count_sandboxes(&none).await.unwrap(), 0);
}

/// Walks all pages of `page` rows and returns the ids in order.
async fn walk(s: &Store, filter: &SandboxFilter, page: i64, desc: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let rows = s
            .list_sandboxes(filter, Some(page), desc, after.clone())
            .await
            .unwrap();
        assert!(rows.len() as i64 <= page);
        out.extend(rows.iter().map(|r| r.id.clone()));
        match rows.last() {
            Some(last) if rows.len() as i64 == page => {
                after = Some((last.started_at, last.id.clone()));
            }
            _ => return out,
        }
    }
}

pub async fn sandbox_keyset_pagination(h: &Harness) {
    let s = &h.store;
    // Several sandboxes share a start time, so the id tie-break is exercised.
    let mut expected = Vec::new();
    for i in 0..25 {
        let id = format!("sb{:02}", (i * 7) % 25);
        s.insert_sandbox(&sandbox(&id, 1000 + (i / 3) as i64))
            .await
            .unwrap();
        expected.push((1000 + (i / 3) as i64, id));
    }
    expected.sort();
    let asc: Vec<String> = expected.iter().map(|(_, id)| id.clone()).collect();
    let mut desc = asc.clone();
    desc.reverse();

    let all = SandboxFilter::default();
    for page in [1, 4, 7, 25, 100] {
        assert_eq!(walk(s, &all, page, false).await, asc, "asc page {page}");
        assert_eq!(walk(s, &all, page, true).await, desc, "desc page {page}");
    }
}

pub async fn sandbox_pagination_with_metadata_filter(h: &Harness) {
    let s = &h.store;
    // 450 rows, every third one tagged: more than one internal scan batch.
    let mut tagged = Vec::new();
    for i in 0..450 {
        let mut sb = sandbox(&format!("sb{i:03}"), i);
        if i % 3 == 0 {
            sb.metadata = map(&[("tag", "yes"), ("n", &i.to_string())]);
            tagged.push(sb.id.clone());
        } else {
            sb.metadata = map(&[("tag", "no")]);
        }
        s.insert_sandbox(&sb).await.unwrap();
    }
    let filter = SandboxFilter {
        metadata: map(&[("tag", "yes")]),
        ..Default::default()
    };
    assert_eq!(s.count_sandboxes(&filter).await.unwrap(), 150);
    let everything = s.list_sandboxes(&filter, None, false, None).await.unwrap();
    assert_eq!(
        ids(&everything),
        tagged.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(walk(s, &filter, 40, false).await, tagged);
    let mut rev = tagged.clone();
    rev.reverse();
    assert_eq!(walk(s, &filter, 33, true).await, rev);
}

pub async fn delete_dead_sandboxes(h: &Harness) {
    let s = &h.store;
    let mut old_dead = sandbox("old-dead", 0);
    old_dead.state = SandboxState::Dead;
    old_dead.end_at = 100;
    let mut new_dead = sandbox("new-dead", 0);
    new_dead.state = SandboxState::Dead;
    new_dead.end_at = 500;
    let mut old_running = sandbox("old-running", 0);
    old_running.end_at = 100;
    for sb in [&old_dead, &new_dead, &old_running] {
        s.insert_sandbox(sb).await.unwrap();
    }
    assert_eq!(s.delete_dead_sandboxes_before(200).await.unwrap(), 1);
    assert_eq!(s.get_sandbox("old-dead").await.unwrap(), None);
    assert!(s.get_sandbox("new-dead").await.unwrap().is_some());
    assert!(s.get_sandbox("old-running").await.unwrap().is_some());
    assert_eq!(s.delete_dead_sandboxes_before(200).await.unwrap(), 0);
    assert_eq!(s.delete_dead_sandboxes_before(1000).await.unwrap(), 1);
}

pub async fn templates_upsert_and_lookup(h: &Harness) {
    let s = &h.store;
    assert!(s.list_templates().await.unwrap().is_empty());
    let base = template("base", None, 10);
    let ci = template("tpl-ci", Some("code-interpreter-v1"), 20);
    s.upsert_template(&ci).await.unwrap();
    s.upsert_template(&base).await.unwrap();
    assert_eq!(
        s.list_templates().await.unwrap(),
        vec![base.clone(), ci.clone()]
    );
    assert_eq!(s.get_template("base").await.unwrap(), Some(base.clone()));
    assert_eq!(
        s.get_template("code-interpreter-v1").await.unwrap(),
        Some(ci.clone())
    );
    assert_eq!(s.get_template("tpl-ci").await.unwrap(), Some(ci.clone()));
    assert_eq!(s.get_template("nope").await.unwrap(), None);

    // Update: new status and hash; created_at from the first insert survives.
    let mut ready = ci.clone();
    ready.status = "ready".to_owned();
    ready.content_hash = "newhash".to_owned();
    ready.created_at = 999;
    ready.updated_at = 30;
    s.upsert_template(&ready).await.unwrap();
    let got = s.get_template("tpl-ci").await.unwrap().unwrap();
    assert_eq!(got.status, "ready");
    assert_eq!(got.content_hash, "newhash");
    assert_eq!(got.created_at, 20);
    assert_eq!(got.updated_at, 30);
    assert_eq!(s.list_templates().await.unwrap().len(), 2);

    // An id beats another template's alias of the same text.
    let shadow = template("other", Some("base"), 40);
    s.upsert_template(&shadow).await.unwrap();
    assert_eq!(s.get_template("base").await.unwrap().unwrap().id, "base");

    // A team's aliases are unique within the team, and only there.
    let team = |id: &str, t: &str, at| TemplateRow {
        team_id: Some(t.to_owned()),
        ..template(id, Some("my-tmpl"), at)
    };
    s.upsert_template(&team("a-1", "team-a", 50)).await.unwrap();
    let err = s
        .upsert_template(&team("a-2", "team-a", 51))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
    s.upsert_template(&team("b-1", "team-b", 52)).await.unwrap();
    assert_eq!(
        s.get_template("b-1")
            .await
            .unwrap()
            .unwrap()
            .team_id
            .as_deref(),
        Some("team-b")
    );
    // A team's alias is not a server-wide name.
    assert_eq!(s.get_template("my-tmpl").await.unwrap(), None);
}

pub async fn concurrent_writes(h: &Harness) {
    // Many writers at once: SQLite must wait (busy timeout, WAL) instead of failing "locked".
    let mut tasks = Vec::new();
    for t in 0..8 {
        let s = h.store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let id = format!("t{t}-{i}");
                s.insert_sandbox(&sandbox(&id, i)).await.unwrap();
                assert!(s.set_sandbox_end_at(&id, 1).await.unwrap());
                s.get_sandbox(&id).await.unwrap().unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        h.store
            .count_sandboxes(&SandboxFilter::default())
            .await
            .unwrap(),
        200
    );
}
