//! The engine's network logic against the test double driver and a recording egress proxy:
//! late binding of links, defaults, validation, live updates, teardown, recovery, secrets and
//! the audit trail.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bulkhead_engine::network::{EgressControl, StoreAuditSink};
use bulkhead_engine::testing::{FakeDriver, FakeEngine, RecordingEgress, fake_engine};
use bulkhead_engine::{
    CreateRequest, Engine, EngineConfig, EngineError, NetworkRule, NetworkTransform, SandboxInfo,
    SandboxNetwork,
};
use bulkhead_store::Store;

struct Setup {
    _dir: tempfile::TempDir,
    store: Store,
    driver: Arc<FakeDriver>,
    egress: Arc<RecordingEgress>,
    engine: Arc<Engine>,
    owner: bulkhead_engine::Caller,
}

async fn setup(cfg: EngineConfig, with_egress: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let FakeEngine {
        store,
        driver,
        engine,
        owner,
    } = fake_engine(dir.path(), cfg, bulkhead_engine::testing::base_template()).await;
    let egress = Arc::new(RecordingEgress::default());
    if with_egress {
        engine.set_egress(egress.clone() as Arc<dyn EgressControl>, None);
    }
    Setup {
        _dir: dir,
        store,
        driver,
        egress,
        engine,
        owner,
    }
}

impl Setup {
    async fn create(&self, req: CreateRequest) -> SandboxInfo {
        self.engine.create(&self.owner, req).await.unwrap()
    }
}

fn cfg(pool: usize) -> EngineConfig {
    EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(pool),
        reap_interval: Duration::from_millis(20),
        ..Default::default()
    }
}

/// A new engine over `s`'s store and (still running) sandboxes, as after a server restart,
/// with an egress recorder of its own; `recover` is the caller's.
async fn restarted(s: &Setup) -> (Arc<Engine>, Arc<RecordingEgress>) {
    let engine = Engine::new(s.store.clone(), s.driver.clone(), cfg(0));
    let egress = Arc::new(RecordingEgress::default());
    engine.set_egress(egress.clone() as Arc<dyn EgressControl>, None);
    engine
        .register_template(bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    (engine, egress)
}

fn net(allow: &[&str], deny: &[&str]) -> SandboxNetwork {
    SandboxNetwork {
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        deny_out: deny.iter().map(|s| s.to_string()).collect(),
        rules: BTreeMap::new(),
    }
}

fn links(s: &Setup) -> usize {
    s.driver.networks.lock().unwrap().len()
}

#[tokio::test]
async fn default_deny_gives_no_link_and_allow_out_does() {
    let s = setup(cfg(0), true).await;
    // Nothing asked: server default (deny) → no link at all.
    let a = s.create(CreateRequest::default()).await;
    assert!(!a.allow_internet_access);
    assert_eq!(a.network, None);
    assert_eq!(links(&s), 0);
    assert!(s.egress.attached.lock().unwrap().is_empty());

    // allowOut given → a link, with the policy the proxy needs.
    let b = s
        .create(CreateRequest {
            network: Some(net(&["pypi.org", "*.pythonhosted.org"], &["10.0.0.0/8"])),
            ..Default::default()
        })
        .await;
    assert_eq!(links(&s), 1);
    let p = s.egress.attached.lock().unwrap()[&b.id].clone();
    assert!(!p.allow_internet);
    assert_eq!(p.allow_out, ["pypi.org", "*.pythonhosted.org"]);
    assert_eq!(p.deny_out, ["10.0.0.0/8"]);
    // Stored and reported back.
    let got = s.engine.get(&me(), &b.id).await.unwrap();
    assert_eq!(
        got.network,
        Some(net(&["pypi.org", "*.pythonhosted.org"], &["10.0.0.0/8"]))
    );
    let row = s.store.get_sandbox(&b.id).await.unwrap().unwrap();
    assert!(!row.allow_internet);

    // allow_internet_access: true → link.
    let c = s
        .create(CreateRequest {
            allow_internet_access: Some(true),
            ..Default::default()
        })
        .await;
    assert!(c.allow_internet_access);
    assert!(s.egress.attached.lock().unwrap()[&c.id].allow_internet);
    assert_eq!(links(&s), 2);

    // Kill detaches; the engine's end of the link is closed.
    s.engine.kill(&me(), &b.id).await.unwrap();
    assert!(!s.egress.attached.lock().unwrap().contains_key(&b.id));
    assert!(
        s.egress
            .calls
            .lock()
            .unwrap()
            .contains(&format!("detach {}", b.id))
    );
}

#[tokio::test]
async fn operator_default_allow_applies_when_the_request_is_silent() {
    let s = setup(
        EngineConfig {
            network_default_allow: true,
            ..cfg(0)
        },
        true,
    )
    .await;
    let a = s.create(CreateRequest::default()).await;
    assert!(a.allow_internet_access);
    assert_eq!(links(&s), 1);
    // An explicit false wins over the default.
    let b = s
        .create(CreateRequest {
            allow_internet_access: Some(false),
            ..Default::default()
        })
        .await;
    assert!(!b.allow_internet_access);
    assert_eq!(links(&s), 1);
}

#[tokio::test]
async fn pooled_sandboxes_get_their_link_only_when_claimed() {
    let s = setup(cfg(2), true).await;
    s.engine.start_background();
    for _ in 0..200 {
        if s.engine.pool_len("base") == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.engine.pool_len("base"), 2);
    assert_eq!(links(&s), 0, "pool members must have no network");
    let a = s
        .create(CreateRequest {
            network: Some(net(&["example.com"], &[])),
            ..Default::default()
        })
        .await;
    assert_eq!(links(&s), 1);
    assert!(s.egress.attached.lock().unwrap().contains_key(&a.id));
    s.engine.shutdown().await;
}

#[tokio::test]
async fn invalid_configs_are_rejected_before_anything_starts() {
    let s = setup(cfg(0), true).await;
    for bad in [
        net(&["not a domain!"], &[]),
        net(&[], &["300.1.2.3/8"]),
        SandboxNetwork {
            rules: BTreeMap::from([(
                "api.example.com".to_string(),
                vec![NetworkRule {
                    transform: Some(NetworkTransform {
                        headers: BTreeMap::from([(
                            "Authorization".to_string(),
                            "Bearer ${e2b.secrets.unterminated".to_string(),
                        )]),
                    }),
                }],
            )]),
            ..net(&["api.example.com"], &[])
        },
    ] {
        let err = s
            .engine
            .create(
                &s.owner,
                CreateRequest {
                    network: Some(bad.clone()),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        match err {
            EngineError::BadRequest(m) => assert!(m.starts_with("Invalid network config"), "{m}"),
            e => panic!("{bad:?}: {e:?}"),
        }
    }
    assert_eq!(
        s.driver.started.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

#[tokio::test]
async fn network_access_needs_an_egress_proxy() {
    let s = setup(cfg(0), false).await;
    let err = s
        .engine
        .create(
            &s.owner,
            CreateRequest {
                allow_internet_access: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::BadRequest(m) if m.contains("no egress proxy")),
        "{err:?}"
    );
    // Deny-all still works without one.
    s.create(CreateRequest::default()).await;
}

#[tokio::test]
async fn updates_replace_the_policy_and_add_or_remove_the_link() {
    let s = setup(cfg(0), true).await;
    let a = s.create(CreateRequest::default()).await;
    assert_eq!(links(&s), 0);

    // deny → allowOut: a link appears.
    s.engine
        .update_network(&me(), &a.id, None, net(&["pypi.org"], &[]))
        .await
        .unwrap();
    assert_eq!(links(&s), 1);
    assert_eq!(
        s.egress.attached.lock().unwrap()[&a.id].allow_out,
        ["pypi.org"]
    );
    let got = s.engine.get(&me(), &a.id).await.unwrap();
    assert_eq!(got.network, Some(net(&["pypi.org"], &[])));

    // Still allowed: the same link gets the new policy.
    s.engine
        .update_network(&me(), &a.id, Some(true), net(&[], &["1.2.3.4"]))
        .await
        .unwrap();
    assert_eq!(links(&s), 1);
    let p = s.egress.attached.lock().unwrap()[&a.id].clone();
    assert!(p.allow_internet && p.allow_out.is_empty() && p.deny_out == ["1.2.3.4"]);
    assert!(
        s.engine
            .get(&me(), &a.id)
            .await
            .unwrap()
            .allow_internet_access
    );

    // Nothing allowed any more: the link goes; the stored config is cleared.
    s.engine
        .update_network(&me(), &a.id, None, SandboxNetwork::default())
        .await
        .unwrap();
    assert!(!s.egress.attached.lock().unwrap().contains_key(&a.id));
    let got = s.engine.get(&me(), &a.id).await.unwrap();
    assert!(!got.allow_internet_access);
    assert_eq!(got.network, None);
    let calls = s.egress.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            format!("attach {}", a.id),
            format!("set {}", a.id),
            format!("detach {}", a.id)
        ]
    );

    // Bad input and unknown sandboxes.
    assert!(matches!(
        s.engine
            .update_network(&me(), &a.id, None, net(&["bad domain"], &[]))
            .await,
        Err(EngineError::BadRequest(_))
    ));
    assert!(matches!(
        s.engine
            .update_network(
                &me(),
                "nosuchsandbox0000000",
                None,
                SandboxNetwork::default()
            )
            .await,
        Err(EngineError::SandboxNotFound(_))
    ));
    s.engine.kill(&me(), &a.id).await.unwrap();
    assert!(matches!(
        s.engine
            .update_network(&me(), &a.id, Some(true), SandboxNetwork::default())
            .await,
        Err(EngineError::SandboxNotFound(_))
    ));
}

#[tokio::test]
async fn ttl_expiry_detaches_the_link() {
    let s = setup(cfg(0), true).await;
    s.engine.start_background();
    let a = s
        .create(CreateRequest {
            timeout: Some(1),
            allow_internet_access: Some(true),
            ..Default::default()
        })
        .await;
    assert!(s.egress.attached.lock().unwrap().contains_key(&a.id));
    for _ in 0..300 {
        if !s.egress.attached.lock().unwrap().contains_key(&a.id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!s.egress.attached.lock().unwrap().contains_key(&a.id));
    s.engine.shutdown().await;
}

#[tokio::test]
async fn restart_reattaches_links_of_readopted_sandboxes() {
    let s = setup(cfg(0), true).await;
    let with = s
        .create(CreateRequest {
            network: Some(net(&["example.com"], &[])),
            ..Default::default()
        })
        .await;
    let without = s.create(CreateRequest::default()).await;
    s.engine.shutdown().await;

    // A new engine over the same store and (still running) sandboxes.
    let (engine2, egress2) = restarted(&s).await;
    assert_eq!(engine2.recover().await.unwrap(), 2);
    let attached = egress2.attached.lock().unwrap().clone();
    assert_eq!(attached.keys().collect::<Vec<_>>(), [&with.id]);
    assert_eq!(attached[&with.id].allow_out, ["example.com"]);
    assert!(!attached.contains_key(&without.id));
    // And the re-adopted sandbox's link is torn down with it.
    engine2.kill(&me(), &with.id).await.unwrap();
    assert!(egress2.attached.lock().unwrap().is_empty());
}

#[tokio::test]
async fn secrets_are_write_only_and_addressable_by_name() {
    let s = setup(cfg(0), true).await;
    let e = &s.engine;
    let a = e
        .create_secret(
            &me(),
            "openai-key",
            "sk-123",
            BTreeMap::from([("team".into(), "ml".into())]),
        )
        .await
        .unwrap();
    assert!(a.id.starts_with("sec_"));
    assert_eq!((a.name.as_str(), a.version), ("openai-key", 1));
    assert!(!format!("{a:?}").contains("sk-123"));
    assert!(matches!(
        e.create_secret(&me(), "openai-key", "x", BTreeMap::new())
            .await,
        Err(EngineError::Conflict(_))
    ));
    for (name, value) in [
        ("", "v"),
        ("a{b", "v"),
        ("ok", ""),
        ("ok", "a\r\nX-Evil: 1"),
    ] {
        assert!(
            matches!(
                e.create_secret(&me(), name, value, BTreeMap::new()).await,
                Err(EngineError::BadRequest(_))
            ),
            "{name:?} {value:?}"
        );
    }
    assert_eq!(e.get_secret(&me(), "openai-key").await.unwrap().id, a.id);
    let up = e.update_secret(&me(), &a.id, "sk-456", None).await.unwrap();
    assert_eq!(up.version, 2);
    assert_eq!(up.metadata["team"], "ml");
    // The proxy's view resolves the current value, by placeholder or name.
    let src = bulkhead_engine::network::StoreSecrets::new(s.store.clone());
    use bulkhead_egress::SecretSource;
    assert_eq!(
        src.resolve("default", "openai-key").await.as_deref(),
        Some("sk-456")
    );
    assert_eq!(
        src.resolve("default", "${e2b.secrets.openai-key}")
            .await
            .as_deref(),
        Some("sk-456")
    );
    assert_eq!(src.resolve("default", "nope").await, None);

    for i in 0..3 {
        e.create_secret(&me(), &format!("s{i}"), "v", BTreeMap::new())
            .await
            .unwrap();
    }
    let p1 = e.list_secrets(&me(), Some(3), None).await.unwrap();
    assert_eq!(p1.items.len(), 3);
    let p2 = e
        .list_secrets(&me(), Some(3), p1.next_token.as_deref())
        .await
        .unwrap();
    assert_eq!(p2.items.len(), 1);
    assert!(p2.next_token.is_none());
    e.delete_secret(&me(), "openai-key").await.unwrap();
    assert!(matches!(
        e.delete_secret(&me(), "openai-key").await,
        Err(EngineError::SecretNotFound(_))
    ));
    assert!(matches!(
        e.get_secret(&me(), "openai-key").await,
        Err(EngineError::SecretNotFound(_))
    ));
}

/// Issue 22 row 3: team B's rules naming team A's secret get nothing, B cannot read, change or
/// delete A's secret, both teams may use one name, and the scope survives a network update and
/// a restart.
#[tokio::test]
async fn secrets_and_rules_stay_within_their_team() {
    use bulkhead_egress::SecretSource;
    let s = setup(cfg(0), true).await;
    let e = &s.engine;
    let a = s.owner.clone();
    let team_b = bulkhead_engine::teams::create(&s.store, "team-b", None)
        .await
        .unwrap();
    let b = bulkhead_engine::keys::create_in(&s.store, "b", &team_b.id)
        .await
        .unwrap()
        .0
        .caller();
    assert_ne!(a.team_id, b.team_id);
    let a_secret = e
        .create_secret(&a, "a-secret", "A-VALUE", BTreeMap::new())
        .await
        .unwrap();
    e.create_secret(&a, "api-token", "A-TOKEN", BTreeMap::new())
        .await
        .unwrap();
    // The same name in another team is no conflict.
    e.create_secret(&b, "api-token", "B-TOKEN", BTreeMap::new())
        .await
        .unwrap();

    // B can neither see, overwrite nor delete A's secret: 404, by id or by name.
    for id in [a_secret.id.as_str(), "a-secret"] {
        assert!(matches!(
            e.get_secret(&b, id).await,
            Err(EngineError::SecretNotFound(_))
        ));
        assert!(matches!(
            e.update_secret(&b, id, "HIJACKED", None).await,
            Err(EngineError::SecretNotFound(_))
        ));
        assert!(matches!(
            e.delete_secret(&b, id).await,
            Err(EngineError::SecretNotFound(_))
        ));
    }
    // (Sorted: two secrets made in one millisecond are listed in id order.)
    let names = |page: bulkhead_engine::SecretPage| {
        let mut n = page.items.into_iter().map(|i| i.name).collect::<Vec<_>>();
        n.sort();
        n
    };
    assert_eq!(
        names(e.list_secrets(&b, None, None).await.unwrap()),
        ["api-token"]
    );
    assert_eq!(
        names(e.list_secrets(&a, None, None).await.unwrap()),
        ["a-secret", "api-token"]
    );

    // B's sandbox: its rules resolve in B's team only.
    let rules = |header: &str| SandboxNetwork {
        allow_out: vec!["api.example.com".into()],
        rules: BTreeMap::from([(
            "api.example.com".to_string(),
            vec![NetworkRule {
                transform: Some(NetworkTransform {
                    headers: BTreeMap::from([("X-Key".to_string(), header.to_string())]),
                }),
            }],
        )]),
        ..Default::default()
    };
    let sb = e
        .create(
            &b,
            CreateRequest {
                network: Some(rules("${e2b.secrets.a-secret}")),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let scope_of = |egress: &RecordingEgress, id: &str| {
        egress.attached.lock().unwrap()[id].secret_scope.clone()
    };
    assert_eq!(scope_of(&s.egress, &sb.id), Some(b.team_id.clone()));
    let src = bulkhead_engine::network::StoreSecrets::new(s.store.clone());
    assert_eq!(src.resolve(&b.team_id, "a-secret").await, None);
    assert_eq!(
        src.resolve(&b.team_id, "${e2b.secrets.api-token}")
            .await
            .as_deref(),
        Some("B-TOKEN")
    );
    assert_eq!(
        src.resolve(&a.team_id, "api-token").await.as_deref(),
        Some("A-TOKEN")
    );
    // A's value is untouched by B's attempts.
    assert_eq!(
        src.resolve(&a.team_id, "a-secret").await.as_deref(),
        Some("A-VALUE")
    );

    // A network update keeps B's scope.
    e.update_network(&b, &sb.id, None, rules("${e2b.secrets.api-token}"))
        .await
        .unwrap();
    assert_eq!(scope_of(&s.egress, &sb.id), Some(b.team_id.clone()));
    // A cannot update B's sandbox (and so cannot move its scope).
    assert!(matches!(
        e.update_network(&a, &sb.id, None, rules("x")).await,
        Err(EngineError::SandboxNotFound(_))
    ));

    // A restart re-adopts it with B's scope (from the sandbox's stored team).
    e.shutdown().await;
    let (engine2, egress2) = restarted(&s).await;
    assert_eq!(engine2.recover().await.unwrap(), 1);
    assert_eq!(scope_of(&egress2, &sb.id), Some(b.team_id.clone()));
    engine2.kill(&b, &sb.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_events_are_batched_into_the_store_and_readable_after_kill() {
    let s = setup(cfg(0), true).await;
    let sink = StoreAuditSink::spawn(s.store.clone());
    let engine = &s.engine;
    engine.set_egress(
        s.egress.clone() as Arc<dyn EgressControl>,
        Some(sink.clone()),
    );
    let a = engine
        .create(
            &s.owner,
            CreateRequest {
                allow_internet_access: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    use bulkhead_egress::AuditSink;
    for i in 0..1000u32 {
        sink.record(bulkhead_egress::AuditEvent {
            sandbox_id: a.id.clone(),
            at: chrono::Utc::now(),
            protocol: if i % 2 == 0 { "tls" } else { "dns" },
            host: Some(format!("h{i}.example.com")),
            ip: Some("203.0.113.10".parse().unwrap()),
            port: 443,
            allowed: i % 3 != 0,
            rule: "test".into(),
            bytes_out: u64::from(i),
            bytes_in: 2 * u64::from(i),
        });
    }
    // Reading flushes: every event recorded before the read is there.
    let ev = engine.network_events(&me(), &a.id, 10_000).await.unwrap();
    assert_eq!(ev.len(), 1000);
    assert_eq!(sink.dropped(), 0);
    assert_eq!(ev.iter().filter(|e| !e.allowed).count(), 334);
    assert_eq!(ev.iter().map(|e| e.bytes_in).sum::<i64>(), 999 * 1000);
    let newest = engine.network_events(&me(), &a.id, 10).await.unwrap();
    assert_eq!(newest.len(), 10);
    // The trail outlives the sandbox.
    engine.kill(&me(), &a.id).await.unwrap();
    assert_eq!(
        engine.network_events(&me(), &a.id, 5).await.unwrap().len(),
        5
    );
    assert!(matches!(
        engine
            .network_events(&me(), "nosuchsandbox0000000", 5)
            .await,
        Err(EngineError::SandboxNotFound(_))
    ));
}

#[tokio::test]
async fn default_sandbox_env_is_sent_and_overridable() {
    let s = setup(
        EngineConfig {
            sandbox_env: BTreeMap::from([
                (
                    "SSL_CERT_FILE".into(),
                    "/etc/ssl/certs/ca-certificates.crt".into(),
                ),
                (
                    "PIP_CERT".into(),
                    "/etc/ssl/certs/ca-certificates.crt".into(),
                ),
            ]),
            ..cfg(0)
        },
        true,
    )
    .await;
    s.create(CreateRequest {
        env_vars: BTreeMap::from([("PIP_CERT".into(), "/mine.pem".into())]),
        ..Default::default()
    })
    .await;
    let init = s.driver.inits.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        init["envVars"]["SSL_CERT_FILE"],
        "/etc/ssl/certs/ca-certificates.crt"
    );
    assert_eq!(init["envVars"]["PIP_CERT"], "/mine.pem");
}

/// The caller of engine verbs in these tests (the engine checks no ownership yet).
fn me() -> bulkhead_engine::Caller {
    bulkhead_engine::Caller {
        key_id: "test".into(),
        team_id: "default".into(),
    }
}
