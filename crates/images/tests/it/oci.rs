//! OCI pulls against a real registry started here: the test builds an image itself (two
//! layers with a whiteout, an opaque dir, links and a device node; a config with user, env and
//! workdir), pushes it, pulls it through `ImageCache::pull_image` and checks the tree.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use bulkhead_images::oci::{OciError, RegistryConfig, RegistryCredentials};
use bulkhead_images::{ImageCache, LogProgress};
use bulkhead_testkit::requires;
use sha2::{Digest, Sha256};

use crate::registry::{self, Registry};

const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// One tar entry of a test layer.
enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a str, u32, u64),
    Sym(&'a str, &'a str),
    Hard(&'a str, &'a str),
    Dev(&'a str),
}

/// An uncompressed layer. Names go straight into the header so hostile ones (`../x`) can be
/// built too.
fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (path, data, owner): (&str, &[u8], u64) = match e {
            E::Dir(p, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                (p, b"", 0)
            }
            E::File(p, body, mode, owner) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                (p, body.as_bytes(), *owner)
            }
            E::Sym(p, t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_link_name_literal(t).unwrap();
                (p, b"", 0)
            }
            E::Hard(p, t) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_link_name_literal(t).unwrap();
                (p, b"", 0)
            }
            E::Dev(p) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_mode(0o666);
                h.set_device_major(1).unwrap();
                h.set_device_minor(1).unwrap();
                (p, b"", 0)
            }
        };
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_uid(owner);
        h.set_gid(owner);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(tar: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(tar).unwrap();
    e.finish().unwrap()
}

fn zstd(tar: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(tar, ruzstd::encoding::CompressionLevel::Fastest)
}

fn diff_id(tar: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(tar)))
}

fn config_json(diff_ids: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": bulkhead_arch(),
        "os": "linux",
        "config": {
            "User": "user",
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello world"],
            "WorkingDir": "/srv/app",
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": ["exec python3 main.py"],
            "ExposedPorts": {"8000/tcp": {}}
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids}
    }))
    .unwrap()
}

fn bulkhead_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    }
}

fn scratch_cache() -> (tempfile::TempDir, ImageCache) {
    let dir = tempfile::Builder::new()
        .prefix("bulkhead-oci-cache-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let cache = ImageCache::new(dir.path());
    (dir, cache)
}

/// The operator's view: Docker Hub names go to the local registry (as to a mirror).
fn mirror_to(reg: &Registry) -> RegistryConfig {
    let mut c = RegistryConfig {
        insecure: vec![reg.host()],
        ..Default::default()
    };
    c.add_mirror(&format!("docker.io=http://{}", reg.host()))
        .unwrap();
    c
}

#[requires(Root, "docker-registry (apt-get install docker-registry)")]
#[tokio::test(flavor = "multi_thread")]
async fn pulls_a_pushed_image_with_whiteouts_links_and_config() {
    let reg = Registry::start(false);
    let lower = layer(&[
        E::Dir("etc/", 0o755),
        E::File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644, 0),
        E::File("etc/group", "root:x:0:\n", 0o644, 0),
        E::File("etc/shadow", "root:*:19000:0:99999:7:::\n", 0o640, 0),
        E::Dir("usr/lib/", 0o755),
        E::Sym("lib", "usr/lib"),
        E::File("data/keep.txt", "kept\n", 0o640, 0),
        E::File("data/gone.txt", "deleted by the upper layer\n", 0o644, 0),
        E::Hard("data/hard.txt", "data/keep.txt"),
        E::Sym("data/link", "keep.txt"),
        E::File("opaque/old.txt", "old", 0o644, 0),
        E::File("opaque/sub/older.txt", "old", 0o644, 0),
        E::File("usr/bin/tool", "#!/bin/sh\n", 0o4755, 0),
        E::File("home/app/owned", "x", 0o600, 1234),
        E::Dev("dev/mem"),
    ]);
    let upper = layer(&[
        E::File("data/.wh.gone.txt", "", 0o644, 0),
        E::File("opaque/.wh..wh..opq", "", 0o644, 0),
        E::File("opaque/new.txt", "new", 0o644, 0),
        E::File("lib/through-symlink.so", "so", 0o644, 0),
        E::File("srv/app/main.py", "print('hi')\n", 0o755, 0),
    ]);
    let ids = [diff_id(&lower), diff_id(&upper)];
    reg.push(
        "bulkhead-test/sample:v1",
        vec![(gzip(&lower), GZIP), (zstd(&upper), ZSTD)],
        config_json(&ids),
    )
    .await;

    let (_dir, cache) = scratch_cache();
    let cfg = mirror_to(&reg);
    let img = cache
        .pull_image("bulkhead-test/sample:v1", &cfg, None, &LogProgress::quiet())
        .await
        .expect("pull");
    let root = &img.rootfs;
    assert_eq!(img.reference, "docker.io/bulkhead-test/sample:v1");
    assert!(!img.cached);
    assert!(img.downloaded_bytes > 0);
    assert_eq!(img.skipped_entries, 1, "the device node is not created");
    assert!(!root.join("dev/mem").exists());

    // Layer contents, whiteouts and the opaque dir.
    assert_eq!(
        std::fs::read_to_string(root.join("data/keep.txt")).unwrap(),
        "kept\n"
    );
    assert!(!root.join("data/gone.txt").exists());
    assert!(!root.join("data/.wh.gone.txt").exists());
    assert!(!root.join("opaque/old.txt").exists());
    assert!(!root.join("opaque/sub").exists());
    assert_eq!(
        std::fs::read_to_string(root.join("opaque/new.txt")).unwrap(),
        "new"
    );
    assert!(!root.join("opaque/.wh..wh..opq").exists());
    // Links: the hard link shares the inode; the symlink is kept as a symlink; a path through
    // the `lib -> usr/lib` symlink lands in usr/lib.
    let md = |p: &str| std::fs::symlink_metadata(root.join(p)).unwrap();
    assert_eq!(md("data/hard.txt").ino(), md("data/keep.txt").ino());
    assert_eq!(
        std::fs::read_link(root.join("data/link")).unwrap().to_str(),
        Some("keep.txt")
    );
    assert!(root.join("usr/lib/through-symlink.so").is_file());
    assert!(md("lib").file_type().is_symlink());
    // Modes (set-uid kept) and owners as in the layers.
    assert_eq!(md("data/keep.txt").mode() & 0o7777, 0o640);
    assert_eq!(md("usr/bin/tool").mode() & 0o7777, 0o4755);
    assert_eq!(md("srv/app/main.py").mode() & 0o7777, 0o755);
    assert_eq!(
        (md("home/app/owned").uid(), md("home/app/owned").gid()),
        (1234, 1234)
    );
    assert_eq!(md("data/keep.txt").mtime(), 1_700_000_000);

    // Ready for sandboxes: E2B's user, neutral host files, mount points.
    assert_eq!(img.sandbox_user.as_deref(), Some("user"));
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd.contains("user:x:1000:1000::/home/user:/bin/bash"),
        "{passwd}"
    );
    assert_eq!(md("home/user").uid(), 1000);
    assert_eq!(
        std::fs::read_to_string(root.join("etc/hostname")).unwrap(),
        "sandbox\n"
    );
    assert_eq!(md("tmp").mode() & 0o7777, 0o1777);
    assert!(root.join("proc").is_dir() && root.join("dev").is_dir());

    // The config, for the template builder.
    let c = &img.config;
    assert_eq!(c.user.as_deref(), Some("user"));
    assert_eq!(c.env_var("GREETING"), Some("hello world"));
    assert_eq!(c.workdir.as_deref(), Some("/srv/app"));
    assert_eq!(
        c.start_command().unwrap(),
        ["/bin/sh", "-c", "exec python3 main.py"].map(String::from)
    );
    assert_eq!(c.exposed_ports, ["8000/tcp"]);
    assert_eq!(c.diff_ids, ids);

    // Pulling again (by tag, then by digest) reuses the entry.
    let again = cache
        .pull_image(
            "docker.io/bulkhead-test/sample:v1",
            &cfg,
            None,
            &LogProgress::quiet(),
        )
        .await
        .unwrap();
    assert!(again.cached);
    assert_eq!(
        (again.hash.as_str(), &again.rootfs),
        (img.hash.as_str(), &img.rootfs)
    );
    let listed = cache.list().unwrap();
    assert_eq!(listed.len(), 1);
    let info = listed[0].info.as_ref().unwrap();
    assert_eq!(
        (info.tool.as_str(), info.recipe.id.as_str()),
        ("oci", img.reference.as_str())
    );

    // With the registry gone, a digest reference is still served from the cache, and a tag
    // fails at once with what to configure.
    let by_digest = format!("bulkhead-test/sample@{}", img.manifest_digest);
    drop(reg);
    let hit = cache
        .pull_image(&by_digest, &cfg, None, &LogProgress::quiet())
        .await
        .unwrap();
    assert_eq!(hit.hash, img.hash);
    let e = cache
        .pull_image("bulkhead-test/sample:v1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::Unreachable { .. }), "{e}");
}

#[requires(Root, "docker-registry (apt-get install docker-registry)")]
#[tokio::test(flavor = "multi_thread")]
async fn hostile_and_corrupt_images_are_refused_and_leave_nothing() {
    let reg = Registry::start(false);
    let (_dir, cache) = scratch_cache();
    let cfg = mirror_to(&reg);
    let victim = tempfile::Builder::new()
        .prefix("bulkhead-oci-victim-")
        .tempdir_in("/var/tmp")
        .unwrap();

    // Path traversal in a layer.
    let evil = layer(&[
        E::File("ok.txt", "fine", 0o644, 0),
        E::File(
            "../../../../../../../../var/tmp/pwned-by-image",
            "x",
            0o644,
            0,
        ),
    ]);
    reg.push(
        "evil/traversal:1",
        vec![(gzip(&evil), GZIP)],
        config_json(&[diff_id(&evil)]),
    )
    .await;
    let e = cache
        .pull_image("evil/traversal:1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::Escape { .. }), "{e}");
    assert!(!std::path::Path::new("/var/tmp/pwned-by-image").exists());

    // A symlink to a host directory, then a file through it: lands inside the tree.
    let target = victim.path().display().to_string();
    let sneaky = layer(&[
        E::Sym("escape", &target),
        E::File("escape/planted", "x", 0o644, 0),
    ]);
    reg.push(
        "evil/symlink:1",
        vec![(gzip(&sneaky), GZIP)],
        config_json(&[diff_id(&sneaky)]),
    )
    .await;
    let img = cache
        .pull_image("evil/symlink:1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap();
    assert!(!victim.path().join("planted").exists());
    assert!(
        img.rootfs
            .join(target.trim_start_matches('/'))
            .join("planted")
            .is_file()
    );

    // A layer whose content does not match the config's diff_id.
    let honest = layer(&[E::File("a", "a", 0o644, 0)]);
    let other = layer(&[E::File("a", "b", 0o644, 0)]);
    reg.push(
        "evil/diffid:1",
        vec![(gzip(&honest), GZIP)],
        config_json(&[diff_id(&other)]),
    )
    .await;
    let e = cache
        .pull_image("evil/diffid:1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::DiffId { .. }), "{e}");

    // Too big for the operator's limit.
    let mut small = cfg.clone();
    small.limits.max_download_bytes = 10;
    let e = cache
        .pull_image("evil/diffid:1", &small, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::TooLarge { .. }), "{e}");

    // A small blob that inflates far past the limit after the tar's end (a "zip bomb").
    let mut bomb = layer(&[E::File("tiny", "x", 0o644, 0)]);
    bomb.resize(bomb.len() + (8 << 20), 0);
    reg.push(
        "evil/bomb:1",
        vec![(gzip(&bomb), GZIP)],
        config_json(&[diff_id(&bomb)]),
    )
    .await;
    let mut tight = cfg.clone();
    tight.limits.max_unpacked_bytes = 1 << 20;
    tight.limits.max_entries = 16;
    let e = cache
        .pull_image("evil/bomb:1", &tight, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::TooLarge { .. }), "{e}");

    // Only the good image is in the cache, and no refused pull left a tree behind.
    let listed = cache.list().unwrap();
    assert_eq!(listed.iter().filter(|c| c.ready).count(), 1, "{listed:?}");
    for c in &listed {
        let entry = c.rootfs.parent().unwrap();
        assert!(!entry.join("rootfs.tmp").exists(), "{c:?}");
        assert!(!entry.join("blobs.tmp").exists(), "{c:?}");
    }
}

#[requires(Root, "docker-registry (apt-get install docker-registry)")]
#[tokio::test(flavor = "multi_thread")]
async fn registry_auth_and_allow_list() {
    let reg = Registry::start(true);
    let base = layer(&[E::File("hello", "world", 0o644, 0)]);
    reg.push(
        "private/app:1",
        vec![(gzip(&base), GZIP)],
        config_json(&[diff_id(&base)]),
    )
    .await;
    let (_dir, cache) = scratch_cache();
    let mut cfg = mirror_to(&reg);

    let e = cache
        .pull_image("private/app:1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::Auth { .. }), "{e}");

    // Credentials from the request, then from the operator's configuration.
    let creds = RegistryCredentials {
        username: registry::USER.into(),
        password: registry::PASSWORD.into(),
    };
    let img = cache
        .pull_image("private/app:1", &cfg, Some(&creds), &LogProgress::quiet())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(img.rootfs.join("hello")).unwrap(),
        "world"
    );
    cfg.credentials.insert(reg.host(), creds);
    assert!(
        cache
            .pull_image("private/app:1", &cfg, None, &LogProgress::quiet())
            .await
            .unwrap()
            .cached
    );

    cfg.allowed = vec!["ghcr.io".into()];
    let e = cache
        .pull_image("private/app:1", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::NotAllowed { .. }), "{e}");
}

/// No root needed: the pull fails before anything is written.
#[tokio::test]
async fn unreachable_registry_fails_fast_with_what_to_configure() {
    let (_dir, cache) = scratch_cache();
    let mut cfg = RegistryConfig::default();
    // Nothing listens there: connection refused at once.
    let port = registry::free_port();
    cfg.insecure = vec![format!("127.0.0.1:{port}")];
    cfg.add_mirror(&format!("docker.io=http://127.0.0.1:{port}"))
        .unwrap();
    cfg.connect_timeout = Duration::from_secs(5);
    let started = Instant::now();
    let e = cache
        .pull_image("python:3.12", &cfg, None, &LogProgress::quiet())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, OciError::Unreachable { .. }), "{msg}");
    assert!(msg.contains("docker.io/library/python:3.12"), "{msg}");
    assert!(msg.contains("--registry-mirror"), "{msg}");
    // Bounded by the connect timeout, not by retries.
    assert!(
        started.elapsed() < cfg.connect_timeout,
        "{:?}",
        started.elapsed()
    );
    assert!(cache.list().unwrap().is_empty());
}
