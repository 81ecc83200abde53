//! A sandbox on a template pulled from an OCI registry: the test makes an image of the
//! harness's tiny root filesystem plus a layer with a whiteout and a file owned by uid 1000,
//! pushes it to a real registry on 127.0.0.1, pulls it with `bulkhead_images`, and starts a
//! jail sandbox on the pulled tree (idmapped, like the built templates).

#[path = "../../../images/tests/it/registry.rs"]
mod registry;

use std::io::Write;

use crate::common::{Env, sh};
use bulkhead_driver::Driver;
use bulkhead_images::oci::RegistryConfig;
use bulkhead_images::{ImageCache, LogProgress};
use bulkhead_testkit::requires;
use sha2::{Digest, Sha256};

const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

fn gzip(tar: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(tar).unwrap();
    e.finish().unwrap()
}

fn diff_id(tar: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(tar)))
}

/// The upper layer: deletes the harness's marker, adds one of its own and a file of `user`.
fn upper_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, body, uid, mode) in [
        ("etc/.wh.template-marker", "", 0, 0o644),
        ("etc/image-marker", "from the image\n", 0, 0o644),
        ("home/user/mine", "owned by user\n", 1000, 0o600),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path(path).unwrap();
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_size(body.len() as u64);
        h.set_cksum();
        b.append(&h, body.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

#[requires(
    Root,
    "a host the jail driver supports",
    "docker-registry (apt-get install docker-registry)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_runs_on_a_pulled_image() {
    let env = Env::new();
    let reg = registry::Registry::start(false);

    // Layer 1: the harness's root filesystem as it is on disk (host root's files).
    let mut lower = tar::Builder::new(Vec::new());
    lower.follow_symlinks(false);
    lower.append_dir_all(".", &env.rootfs).unwrap();
    let lower = lower.into_inner().unwrap();
    let upper = upper_layer();
    let config = serde_json::json!({
        "architecture": if cfg!(target_arch = "aarch64") { "arm64" } else { "amd64" },
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "WorkingDir": "/home/user"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id(&lower), diff_id(&upper)]}
    });
    reg.push(
        "jail-test/tiny:1",
        vec![(gzip(&lower), GZIP), (gzip(&upper), GZIP)],
        serde_json::to_vec(&config).unwrap(),
    )
    .await;

    // The cache lives in the test's directory, which sandbox uids may traverse.
    let cache = ImageCache::new(env.path().join("images"));
    let mut cfg = RegistryConfig {
        insecure: vec![reg.host()],
        ..Default::default()
    };
    cfg.add_mirror(&format!("docker.io=http://{}", reg.host()))
        .unwrap();
    let image = cache
        .pull_image("jail-test/tiny:1", &cfg, None, &LogProgress::quiet())
        .await
        .expect("pull");
    drop(reg);
    assert_eq!(image.config.workdir.as_deref(), Some("/home/user"));

    let d = env.driver();
    let mut spec = env.spec(128, 64);
    spec.rootfs = image.rootfs.clone();
    let h = d
        .start(&spec)
        .await
        .expect("start a sandbox on the pulled tree");
    let (st, out) = sh(
        &d,
        &h,
        "cat /etc/image-marker; test -e /etc/template-marker && echo marker-present || echo \
         marker-gone; stat -c '%u %g %a' /home/user/mine; cat /home/user/mine; cat /etc/hostname",
    )
    .await;
    assert_eq!(st, "exit 0", "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "from the image",
            "marker-gone",
            "1000 1000 600",
            "owned by user",
            "sandbox"
        ],
        "{out}"
    );
    // The template stays read-only for sandboxes: writes go to the sandbox's own layer.
    let (st, _) = sh(&d, &h, "echo changed > /etc/image-marker").await;
    assert_eq!(st, "exit 0");
    assert_eq!(
        std::fs::read_to_string(image.rootfs.join("etc/image-marker")).unwrap(),
        "from the image\n"
    );
    d.stop(&h).await.unwrap();
    env.assert_clean();
}
