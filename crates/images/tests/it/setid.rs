//! Set-uid files that tenants bring (an OCI layer entry with mode 4755, a build step's
//! `chmod 4755` on a copy of `id`) keep their bits in the cache, for the sandbox's own `sudo`,
//! but no other host user can reach them: the cache root and every entry are owner-only.
//! Before, host user `nobody` running the planted `id` through its cache path got `euid=0`.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use bulkhead_images::oci::RegistryConfig;
use bulkhead_images::{ImageCache, LayerStore, LogProgress};
use bulkhead_testkit::requires;
use sha2::{Digest, Sha256};

use crate::registry::Registry;

/// A cache root as an operator has it: `<base>/images` under a world-traversable `<base>`
/// (like `/var/cache/bulkhead`), the cache directory itself made by the cache.
fn cache_under_public_dir() -> (tempfile::TempDir, PathBuf) {
    let base = tempfile::Builder::new()
        .prefix("bulkhead-setid-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = base.path().join("images");
    (base, root)
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Runs `path` as host user `nobody` (uid and gid 65534, no supplementary groups): what an
/// unprivileged local user could do with a planted file.
fn run_as_nobody(path: &Path) -> std::io::Result<std::process::Output> {
    Command::new(path).uid(65534).gid(65534).output()
}

/// The planted file is still set-uid root (the sandbox needs the bit) and `nobody` cannot
/// even reach it: the exec fails on the path, before the file's own mode matters.
fn assert_unreachable_set_uid_root(cache_root: &Path, planted: &Path) {
    let md = std::fs::symlink_metadata(planted).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o4755, "the set-uid bit is kept");
    assert_eq!(md.uid(), 0);
    match run_as_nobody(planted) {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
        Ok(out) => panic!(
            "host user nobody ran the tenant's set-uid file {}: {}",
            planted.display(),
            String::from_utf8_lossy(&out.stdout)
        ),
    }
    assert_eq!(mode(cache_root), 0o700, "cache root");
    let entry = planted
        .ancestors()
        .find(|a| a.parent() == Some(cache_root))
        .unwrap();
    assert_eq!(mode(entry), 0o700, "cache entry {}", entry.display());
}

/// One uncompressed layer: the directories, then `usr/local/bin/x` = `body`, 4755, root's.
fn set_uid_layer(body: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for d in ["usr/", "usr/local/", "usr/local/bin/"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_path(d).unwrap();
        h.set_mode(0o755);
        h.set_size(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append(&h, &b""[..]).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_path("usr/local/bin/x").unwrap();
    h.set_mode(0o4755);
    h.set_uid(0);
    h.set_gid(0);
    h.set_size(body.len() as u64);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    b.append(&h, body).unwrap();
    b.into_inner().unwrap()
}

#[requires(Root, "docker-registry (apt-get install docker-registry)")]
#[tokio::test(flavor = "multi_thread")]
async fn set_uid_files_of_pulled_images_are_out_of_reach_of_host_users() {
    let reg = Registry::start(false);
    let tar = set_uid_layer(&std::fs::read("/usr/bin/id").unwrap());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
    let arch = if std::env::consts::ARCH == "aarch64" {
        "arm64"
    } else {
        "amd64"
    };
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}
    }))
    .unwrap();
    reg.push(
        "bulkhead-test/setid:v1",
        vec![(
            gz.finish().unwrap(),
            "application/vnd.oci.image.layer.v1.tar+gzip",
        )],
        config,
    )
    .await;
    let mut cfg = RegistryConfig {
        insecure: vec![reg.host()],
        ..Default::default()
    };
    cfg.add_mirror(&format!("docker.io=http://{}", reg.host()))
        .unwrap();

    let (_base, root) = cache_under_public_dir();
    let img = ImageCache::new(&root)
        .pull_image("bulkhead-test/setid:v1", &cfg, None, &LogProgress::quiet())
        .await
        .expect("pull");
    assert_unreachable_set_uid_root(&root, &img.rootfs.join("usr/local/bin/x"));
}

#[requires(Root)]
#[tokio::test(flavor = "multi_thread")]
async fn set_uid_files_of_build_layers_are_out_of_reach_of_host_users() {
    let (base, root) = cache_under_public_dir();
    // The parent template's tree and a build step's exported changes (owners as inside the
    // sandbox: `chmod 4755` on a copy of `id` by the step's root).
    let parent = base.path().join("parent");
    std::fs::create_dir_all(parent.join("usr/bin")).unwrap();
    std::fs::write(parent.join("usr/bin/tool"), "#!/bin/sh\n").unwrap();
    let changes = base.path().join("changes");
    std::fs::create_dir_all(changes.join("usr/local/bin")).unwrap();
    let planted = changes.join("usr/local/bin/x");
    std::fs::copy("/usr/bin/id", &planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o4755)).unwrap();

    let key = hex::encode(Sha256::digest(b"setid layer"));
    let tree = LayerStore::new(&root)
        .commit(&key, &parent, &changes, "RUN chmod 4755 /usr/local/bin/x")
        .await
        .expect("commit");
    assert_unreachable_set_uid_root(&root, &tree.join("usr/local/bin/x"));
}

/// A cache written by an older version (0755 root and entries) is made owner-only before the
/// next build; ready entries are left as they are otherwise.
#[requires(Root)]
#[test]
fn older_caches_become_owner_only() {
    let (_base, root) = cache_under_public_dir();
    let entry = root.join("a".repeat(64));
    std::fs::create_dir_all(entry.join("rootfs/usr/bin")).unwrap();
    std::fs::write(entry.join("READY"), "{}").unwrap();
    for d in [&root, &entry, &entry.join("rootfs")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    ImageCache::new(&root).make_private().unwrap();
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&entry), 0o700);
    assert_eq!(
        mode(&entry.join("rootfs")),
        0o755,
        "the tree's own root is the sandbox's /"
    );
    assert!(entry.join("READY").is_file());
}
