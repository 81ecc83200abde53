//! Image cache collection against the test double driver (no root): an entry nothing uses is
//! removed; entries a template, a sandbox's stored driver handle or a checkpoint manifest
//! names are kept, whatever their age.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bulkhead_engine::testing::{FakeEngine, base_template, fake_engine};
use bulkhead_engine::{CreateRequest, EngineConfig};

fn hash(c: char) -> String {
    std::iter::repeat_n(c, 64).collect()
}

/// A finished cache entry written two hours ago.
fn old_entry(root: &Path, hash: &str) -> PathBuf {
    let dir = root.join(hash);
    std::fs::create_dir_all(dir.join("rootfs/etc")).unwrap();
    std::fs::write(dir.join("rootfs/etc/hostname"), hash).unwrap();
    std::fs::write(dir.join("lock"), b"").unwrap();
    std::fs::write(dir.join("READY"), br#"{"size_bytes": 4096}"#).unwrap();
    let then = SystemTime::now() - Duration::from_secs(7200);
    for p in [dir.join("READY"), dir.clone()] {
        std::fs::File::open(&p).unwrap().set_modified(then).unwrap();
    }
    dir
}

#[tokio::test]
async fn unused_entries_go_and_used_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    let checkpoints = dir.path().join("checkpoints");
    let (a, b, c, d) = (hash('a'), hash('b'), hash('c'), hash('d'));
    let template_tree = old_entry(&images, &a);
    let unused = old_entry(&images, &b);
    let checkpointed = old_entry(&images, &c);
    let sandbox_tree = old_entry(&images, &d);

    // A paused sandbox's checkpoint manifest names the tree it was taken on.
    std::fs::create_dir_all(checkpoints.join("paused-1")).unwrap();
    std::fs::write(
        checkpoints.join("paused-1/checkpoint.json"),
        format!(r#"{{"rootfs": "{}/rootfs"}}"#, checkpointed.display()),
    )
    .unwrap();

    let cfg = EngineConfig {
        checkpoint_dir: checkpoints,
        image_cache: images.clone(),
        ..Default::default()
    };
    let template = bulkhead_engine::TemplateInfo {
        rootfs: template_tree.join("rootfs"),
        ..base_template()
    };
    let FakeEngine {
        store,
        engine,
        owner,
        ..
    } = fake_engine(dir.path(), cfg, template).await;

    // A sandbox whose stored handle names another tree (one it started on before its
    // template was rebuilt, say).
    let sbx = engine
        .create(
            &owner,
            CreateRequest {
                template: "base".into(),
                timeout: Some(300),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let handle = serde_json::json!({
        "driver": "jail", "pid": 1, "pid_start_time": 1, "slot": 0,
        "data": {"rootfs": sandbox_tree.join("rootfs")}
    });
    assert!(
        store
            .set_sandbox_driver_handle(&sbx.id, Some(&handle.to_string()), None)
            .await
            .unwrap()
    );

    let grace = Duration::from_secs(3600);
    let report = engine.collect_image_garbage(grace).await.unwrap();
    assert_eq!(report.removed, std::slice::from_ref(&b), "{report:?}");
    assert!(!unused.exists());
    for kept in [&template_tree, &checkpointed, &sandbox_tree] {
        assert!(kept.join("rootfs/etc/hostname").is_file(), "{kept:?}");
    }

    // Once the sandbox no longer names it, its tree goes too.
    store
        .set_sandbox_driver_handle(&sbx.id, None, None)
        .await
        .unwrap();
    let report = engine.collect_image_garbage(grace).await.unwrap();
    assert_eq!(report.removed, [d], "{report:?}");
    assert!(template_tree.exists() && checkpointed.exists());
    // A young entry is kept (a build may have just pulled it).
    let young = images.join(hash('e'));
    std::fs::create_dir_all(young.join("rootfs")).unwrap();
    let report = engine.collect_image_garbage(grace).await.unwrap();
    assert!(report.removed.is_empty() && young.exists(), "{report:?}");
}
