//! Volumes in real sandboxes, as root: two sandboxes in different slots share one volume at
//! the same time, files keep canonical ids on the host, and nothing planted in a volume or in
//! the template leads out of a sandbox.

use std::fs;
use std::os::unix::fs::MetadataExt;

use crate::common::{Env, chain, sh};
use bulkhead_driver::{Driver, VolumeMount};
use bulkhead_testkit::requires;

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sandboxes_share_a_volume_without_reaching_the_host() {
    let env = Env::new();
    let d = env.driver();
    let vol = env.path().join("vol");
    fs::create_dir(&vol).unwrap();
    let host_secret = env.path().join("host-secret");
    fs::write(&host_secret, "host only\n").unwrap();

    let mut spec = env.spec(256, 128);
    spec.volumes = vec![VolumeMount {
        name: "shared".into(),
        host_dir: vol.clone(),
        path: "/mnt/shared".into(),
    }];
    let a = d.start(&spec).await.expect("start a");
    let b = d.start(&spec).await.expect("start b");
    assert_ne!(a.slot, b.slot);

    // Root inside writes; the other sandbox (another uid range) reads; the host stores the
    // file with canonical ids (0 = the sandbox's root, 1000 = its user), not slot uids.
    let (st, _) = sh(&d, &a, "echo from-a > /mnt/shared/a && mkdir /mnt/shared/dir && echo u > /mnt/shared/dir/u && chown -R 1000:1000 /mnt/shared/dir").await;
    assert_eq!(st, "exit 0");
    let (st, out) = sh(&d, &b, "cat /mnt/shared/a; stat -c '%u:%g' /mnt/shared/a /mnt/shared/dir/u; echo from-b > /mnt/shared/b").await;
    assert_eq!(st, "exit 0", "{out}");
    assert_eq!(out, "from-a\n0:0\n1000:1000\n");
    let (_, out) = sh(&d, &a, "cat /mnt/shared/b").await;
    assert_eq!(out, "from-b\n");
    let m = fs::metadata(vol.join("a")).unwrap();
    assert_eq!((m.uid(), m.gid()), (0, 0));
    let m = fs::metadata(vol.join("dir/u")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 1000));

    // The mount is nosuid,nodev inside.
    let (_, info) = sh(&d, &a, "cat /proc/self/mountinfo").await;
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/mnt/shared"))
        .unwrap_or_else(|| panic!("no /mnt/shared in {info}"));
    let opts = line.split(' ').nth(5).unwrap();
    assert!(opts.contains("nosuid") && opts.contains("nodev"), "{line}");

    // Symlinks planted by one sandbox resolve inside the sandbox that follows them.
    let host_secret_s = host_secret.display().to_string();
    let (st, _) = sh(
        &d,
        &a,
        &format!(
            "ln -s / /mnt/shared/root && ln -s {host_secret_s} /mnt/shared/secret && ln -s ../../.. /mnt/shared/up"
        ),
    )
    .await;
    assert_eq!(st, "exit 0");
    let (_, out) = sh(
        &d,
        &b,
        &format!(
            "cat /mnt/shared/root/etc/template-marker; cat /mnt/shared/secret 2>&1; cat /mnt/shared/up{host_secret_s} 2>&1; ls /mnt/shared/up/"
        ),
    )
    .await;
    assert!(out.starts_with("from the template\n"), "{out}");
    assert!(!out.contains("host only"), "{out}");
    // `..` from the volume's root is the sandbox's /mnt, not the host's parent directory
    // (which holds `rootfs`, `vol`, `j`, `host-secret`).
    let listing: Vec<&str> = out.lines().skip(3).collect();
    assert!(
        listing.contains(&"etc") && listing.contains(&"mnt"),
        "{out}"
    );
    for host_entry in ["rootfs", "vol", "j", "host-secret"] {
        assert!(!listing.contains(&host_entry), "{out}");
    }

    d.stop(&a).await.unwrap();
    d.stop(&b).await.unwrap();
    // The data outlives the sandboxes.
    assert_eq!(fs::read_to_string(vol.join("b")).unwrap(), "from-b\n");
    env.assert_clean();
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_path_through_a_symlink_is_refused() {
    let env = Env::new();
    let d = env.driver();
    let vol = env.path().join("vol");
    fs::create_dir(&vol).unwrap();
    let host_dir = env.path().join("hostdir");
    fs::create_dir(&host_dir).unwrap();
    // A template (or a resumed upper layer) with a symlink to a host path where the volume
    // should go: followed before pivot_root it would mount over the host's directory.
    std::os::unix::fs::symlink(&host_dir, env.rootfs.join("trap")).unwrap();
    let mut spec = env.spec(256, 128);
    spec.volumes = vec![VolumeMount {
        name: "v".into(),
        host_dir: vol.clone(),
        path: "/trap/data".into(),
    }];
    let err = d
        .start(&spec)
        .await
        .expect_err("the symlinked path must be refused");
    let msg = chain(&err);
    assert!(msg.contains("attach volume"), "{msg}");
    assert!(
        fs::read_dir(&host_dir).unwrap().next().is_none(),
        "host dir touched"
    );
    env.assert_clean();
}
