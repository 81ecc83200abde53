//! Tests of template builds: names and tags, per-team templates and uploads, resolution order.

use super::*;

#[test]
fn names_and_tags_are_checked_like_e2b() {
    assert!(validate_name("my-template_1.0").is_ok());
    assert!(validate_name("team/my-template").is_ok());
    assert!(validate_name("My-Template").is_err());
    assert!(validate_name("-x").is_err());
    assert!(validate_name("a b").is_err());
    assert!(validate_name("").is_err());
    assert!(validate_tag("v1.0").is_ok());
    assert!(validate_tag("Prod_2").is_ok());
    assert!(validate_tag("bad tag").is_err());
    assert!(validate_tag("a:b").is_err());
    assert_eq!(split_name("x:v1"), ("x", "v1"));
    assert_eq!(split_name("x"), ("x", "default"));
}

use crate::error::ChangesError;
use crate::sandbox::source::Source;
use crate::testing::{FakeEngine, base_template, fake_engine};
use bulkhead_store::SnapshotRow;

struct Two {
    dir: tempfile::TempDir,
    engine: Arc<Engine>,
    store: bulkhead_store::Store,
    a: Caller,
    b: Caller,
}

async fn two_teams() -> Two {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::EngineConfig {
        checkpoint_dir: dir.path().join("checkpoints"),
        template_dir: Some(dir.path().join("templates")),
        ..Default::default()
    };
    let FakeEngine { store, engine, .. } = fake_engine(dir.path(), cfg, base_template()).await;
    let team = |t: &str| Caller {
        key_id: format!("key-{t}"),
        team_id: t.to_owned(),
    };
    Two {
        dir,
        engine,
        store,
        a: team("default"),
        b: team("team_b"),
    }
}

/// Builds `name` for `caller` as a finished build would record it (no driver run).
async fn build(t: &Two, caller: &Caller, name: &str) -> (String, String) {
    let created = t
        .engine
        .request_template_build(
            caller,
            BuildRequest {
                name: name.to_owned(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let record = t
        .engine
        .build_record(caller, &created.template_id, &created.build_id)
        .unwrap();
    let rootfs = t.dir.path().join(&created.build_id);
    t.engine
        .record_custom_build(
            &record,
            BuiltTemplate {
                rootfs,
                content_hash: created.build_id.clone(),
                runtime: Default::default(),
                created_at_ms: 0,
            },
        )
        .await
        .unwrap();
    record.finish(None);
    (created.template_id, created.build_id)
}

/// A complete snapshot of team `team` named `name`, taken on `base`.
async fn snapshot(t: &Two, team: &str, name: &str) {
    let dir = t.dir.path().join(format!("snap-{name}-{team}"));
    std::fs::create_dir_all(&dir).unwrap();
    crate::node::checkpoints::mark_complete(&crate::node::driver::CheckpointInfo {
        driver: "fake".into(),
        format: 1,
        dir: dir.clone(),
        size_bytes: 0,
        memory: false,
    })
    .unwrap();
    t.store
        .insert_snapshot(&SnapshotRow {
            id: crate::ids::sandbox_id(),
            name: Some(name.to_owned()),
            sandbox_id: crate::ids::sandbox_id(),
            template_id: "base".into(),
            checkpoint_dir: dir.display().to_string(),
            memory: false,
            env_vars: Default::default(),
            envd_access_token: None,
            created_at: 0,
            team_id: team.to_owned(),
        })
        .await
        .unwrap();
}

fn is_not_found(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::TemplateNotFound(_)
            | EngineError::TemplateBuild(TemplateBuildError::NotFound(_))
    )
}

#[tokio::test]
async fn a_template_is_its_teams_and_names_are_per_team() {
    let t = two_teams().await;
    let (a_id, a_build) = build(&t, &t.a, "my-tmpl").await;
    let e = &t.engine;
    assert_eq!(e.template_for(&t.a, "my-tmpl").unwrap().id, a_id);
    assert_eq!(e.template_for(&t.a, &a_id).unwrap().id, a_id);
    // Team B neither sees A's name nor A's id.
    assert!(e.template_for(&t.b, "my-tmpl").is_none());
    assert!(e.template_for(&t.b, &a_id).is_none());
    assert!(e.template_for(&t.b, &format!("{a_id}:default")).is_none());
    assert!(is_not_found(
        &e.template_by_alias(&t.b, "my-tmpl").unwrap_err()
    ));
    assert!(is_not_found(&e.template_tags(&t.b, &a_id).unwrap_err()));
    assert!(is_not_found(
        &e.template_build_status(&t.b, &a_id, &a_build, 0, 10)
            .unwrap_err()
    ));
    assert!(is_not_found(
        &e.template_file_present(&t.b, &a_id, &"ab".repeat(32))
            .unwrap_err()
    ));
    assert!(is_not_found(
        &e.assign_template_tags(&t.b, "my-tmpl", &["evil".into()])
            .await
            .unwrap_err()
    ));
    assert!(is_not_found(
        &e.remove_template_tags(&t.b, "my-tmpl", &["default".into()])
            .await
            .unwrap_err()
    ));
    assert!(is_not_found(
        &e.delete_template(&t.b, &a_id).await.unwrap_err()
    ));
    assert!(!e.is_custom_template(&t.b, "my-tmpl"));
    assert!(
        e.templates_for(&t.b).iter().all(|x| x.id != a_id),
        "B lists A's template"
    );

    // B's build of the same name is a template of its own; A's stays A's.
    let (b_id, _) = build(&t, &t.b, "my-tmpl").await;
    assert_ne!(a_id, b_id);
    assert_eq!(e.template_for(&t.a, "my-tmpl").unwrap().id, a_id);
    assert_eq!(e.template_for(&t.b, "my-tmpl").unwrap().id, b_id);
    assert_eq!(e.template_by_alias(&t.b, "my-tmpl").unwrap(), b_id);
    // A rebuild by A keeps A's id.
    assert_eq!(build(&t, &t.a, "my-tmpl").await.0, a_id);

    // Tags: B's tag on its own template is not A's.
    e.assign_template_tags(&t.b, "my-tmpl", &["v1".into()])
        .await
        .unwrap();
    assert!(e.template_for(&t.a, "my-tmpl:v1").is_none());
    assert_eq!(e.template_for(&t.b, "my-tmpl:v1").unwrap().id, b_id);

    // Deleting B's leaves A's.
    e.delete_template(&t.b, "my-tmpl").await.unwrap();
    assert!(e.template_for(&t.b, "my-tmpl").is_none());
    assert_eq!(e.template_for(&t.a, "my-tmpl").unwrap().id, a_id);
    assert!(e.templates_for(&t.a).iter().any(|x| x.id == a_id));
    // Built-ins are everyone's, and reserved.
    assert_eq!(e.template_for(&t.b, "base").unwrap().id, "base");
    assert!(matches!(
        e.request_template_build(
            &t.b,
            BuildRequest {
                name: "base".into(),
                ..Default::default()
            }
        )
        .await
        .unwrap_err(),
        EngineError::TemplateBuild(TemplateBuildError::Invalid(_))
    ));
    assert!(e.delete_template(&t.b, "base").await.is_err());
}

#[tokio::test]
async fn resolution_order_and_one_name_one_thing() {
    let t = two_teams().await;
    let e = &t.engine;
    snapshot(&t, "default", "asnap").await;
    // A template may not take a name of one of the team's snapshots...
    let err = e
        .request_template_build(
            &t.a,
            BuildRequest {
                name: "asnap".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Conflict(_)), "{err:?}");
    // ...but another team's snapshot names do not matter to B, nor B's template to A.
    let (b_id, _) = build(&t, &t.b, "asnap").await;
    match e.resolve_source(&t.a, "asnap").await.unwrap() {
        Source::Checkpoint(c) => assert_eq!(c.template.id, "base"),
        Source::Template(x) => panic!("A's create got template {}", x.id),
    }
    match e.resolve_source(&t.b, "asnap").await.unwrap() {
        Source::Template(x) => assert_eq!(x.id, b_id),
        Source::Checkpoint(_) => panic!("B's create restored A's snapshot"),
    }
    // The team's template comes before a built-in of the same id... which it cannot
    // take; built-ins come before snapshots (a snapshot cannot take their names).
    assert!(matches!(
        e.resolve_source(&t.a, "base").await.unwrap(),
        Source::Template(x) if x.id == "base"
    ));
    assert!(matches!(
        e.resolve_source(&t.b, "nothing").await,
        Err(EngineError::TemplateNotFound(_))
    ));
    // Snapshot names: not a built-in, not one of the team's templates or builds; another
    // team's template names are free.
    let (a_id, _) = build(&t, &t.a, "a-tmpl").await;
    for n in ["base", "a-tmpl", a_id.as_str()] {
        let err = e.check_snapshot_name(&t.a, n).unwrap_err();
        assert!(matches!(err, EngineError::Conflict(_)), "{n}: {err:?}");
    }
    e.check_snapshot_name(&t.b, "a-tmpl").unwrap();
    e.request_template_build(
        &t.a,
        BuildRequest {
            name: "pending".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(e.check_snapshot_name(&t.a, "pending").is_err());
    e.check_snapshot_name(&t.b, "pending").unwrap();
}

#[tokio::test]
async fn since_resolves_only_the_callers_snapshots() {
    let t = two_teams().await;
    snapshot(&t, "default", "asnap").await;
    assert!(t.engine.snapshot_dir(&t.a, "asnap").await.is_ok());
    let err = t.engine.snapshot_dir(&t.b, "asnap").await.unwrap_err();
    assert!(
        matches!(err, EngineError::Changes(ChangesError::SnapshotNotFound(_))),
        "{err:?}"
    );
}

fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, *data).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

#[tokio::test]
async fn uploads_are_kept_per_team() {
    let t = two_teams().await;
    let e = &t.engine;
    let (a_id, _) = build(&t, &t.a, "a-tmpl").await;
    let (b_id, _) = build(&t, &t.b, "b-tmpl").await;
    let hash = "cd".repeat(32);
    // B uploads under the hash A's SDK will ask for: it lands in B's files only.
    let token = e.issue_upload_token(&t.b, &hash);
    assert_eq!(
        e.take_upload_token(&hash, &token).as_deref(),
        Some("team_b")
    );
    assert_eq!(
        e.take_upload_token(&hash, &token),
        None,
        "a token is used once"
    );
    let body =
        |data: Vec<u8>| futures::stream::iter([Ok::<_, io::Error>(bytes::Bytes::from(data))]);
    // What is not a tar archive (plain or gzip) is refused and not kept.
    for junk in [
        b"poison".to_vec(),
        vec![0x1f, 0x8b, 8, 0, 1, 2, 3],
        tar_gz(&[]),
    ] {
        let err = e
            .store_template_file("team_b", &hash, body(junk))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::TemplateBuild(TemplateBuildError::Invalid(_))
            ),
            "{err:?}"
        );
        assert!(!e.template_file_present(&t.b, &b_id, &hash).unwrap());
    }
    e.store_template_file("team_b", &hash, body(tar_gz(&[("app.py", b"poison")])))
        .await
        .unwrap();
    assert!(e.template_file_present(&t.b, &b_id, &hash).unwrap());
    assert!(!e.template_file_present(&t.a, &a_id, &hash).unwrap());
    // A token is for the hash it was issued for.
    let token = e.issue_upload_token(&t.a, &hash);
    assert_eq!(e.take_upload_token(&"ef".repeat(32), &token), None);
    // Team ids never make paths of their own.
    assert!(e.upload_path("../x", &hash).is_err());
}
