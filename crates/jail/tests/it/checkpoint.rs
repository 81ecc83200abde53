//! Checkpoint and restore of real jail sandboxes with CRIU, beyond the conformance cases:
//! state kept over many pause/resume cycles without leaks, a full disk, files re-owned for
//! another slot, filesystem-only checkpoints. As root, with CRIU 4.2+ (`BULKHEAD_CRIU`).

use std::path::Path;
use std::process::Command;

use crate::common::{Env, chain, sh};
use bulkhead_driver::{CheckpointOptions, Driver, DriverHandle, RestoreOptions};
use bulkhead_jail::JailDriver;

/// Start a process whose environment (in its memory) holds `secret`, and files in `/home` and
/// `/tmp`; return the checksum the sandbox computes over both files.
async fn plant(d: &JailDriver, h: &DriverHandle, secret: &str) -> String {
    let (head, _) = sh(
        d,
        h,
        &format!(
            "head -c 200000 /dev/urandom > /home/data; head -c 5000 /dev/urandom > /tmp/t; \
             (SECRET={secret} exec sleep 100000 </dev/null >/dev/null 2>&1 & echo $! > /tmp/pid); \
             echo planted"
        ),
    )
    .await;
    assert_eq!(head, "exit 0", "plant");
    checksum(d, h).await
}

async fn checksum(d: &JailDriver, h: &DriverHandle) -> String {
    let (head, body) = sh(d, h, "cat /home/data /tmp/t | md5sum").await;
    assert_eq!(head, "exit 0", "{body}");
    body.trim().to_string()
}

/// The secret as the sleeping process's memory holds it.
async fn secret(d: &JailDriver, h: &DriverHandle) -> String {
    let (_, body) = sh(d, h, "cat /proc/$(cat /tmp/pid)/environ").await;
    body.split('\0')
        .find_map(|kv| kv.strip_prefix("SECRET="))
        .unwrap_or("")
        .to_string()
}

fn pause_opts() -> CheckpointOptions {
    CheckpointOptions {
        leave_running: false,
        filesystem_only: false,
    }
}

#[bulkhead_testkit::requires(Root, Criu)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_pause_resume_cycles_keep_files_and_memory_and_leak_nothing() {
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 128);
    let mut h = d.start(&spec).await.expect("start");
    let sum = plant(&d, &h, "s3cr3t-42").await;
    let cycles = std::env::var("BULKHEAD_TEST_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    for i in 0..cycles {
        let dir = env.path().join(format!("ckpt-{i}"));
        d.checkpoint(&h, &dir, pause_opts())
            .await
            .unwrap_or_else(|e| panic!("pause {i}: {}", chain(&e)));
        d.stop(&h).await.expect("stop the paused sandbox's remains");
        h = d
            .restore(
                &spec,
                &dir,
                RestoreOptions {
                    consume: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("resume {i}: {}", chain(&e)));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(checksum(&d, &h).await, sum, "files after cycle {i}");
        assert_eq!(secret(&d, &h).await, "s3cr3t-42", "memory after cycle {i}");
    }
    d.stop(&h).await.expect("stop");
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Criu)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_pause_and_the_sandbox_runs_on() {
    let env = Env::new();
    let d = env.driver();
    let h = d.start(&env.spec(256, 128)).await.expect("start");
    let sum = plant(&d, &h, "still-here").await;
    // Memory to dump that does not fit: 8 MB in the sandbox's /dev/shm.
    sh(&d, &h, "head -c 8000000 /dev/urandom > /dev/shm/big").await;
    let small = env.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success());
    for opts in [
        pause_opts(),
        CheckpointOptions {
            leave_running: true,
            filesystem_only: false,
        },
    ] {
        let e = d
            .checkpoint(&h, &small.join("c"), opts)
            .await
            .expect_err("a checkpoint onto a 2 MB filesystem");
        let msg = chain(&e);
        assert!(msg.contains("full"), "{msg}");
        assert!(!small.join("c").exists(), "nothing half-written is left");
        assert_eq!(checksum(&d, &h).await, sum, "files after the failed pause");
        assert_eq!(
            secret(&d, &h).await,
            "still-here",
            "memory after the failed pause"
        );
    }
    let _ = Command::new("umount").arg(&small).status();
    d.stop(&h).await.expect("stop");
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Criu)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_in_other_slots_own_their_files_and_run_independently() {
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 128);
    let h = d.start(&spec).await.expect("start");
    let sum = plant(&d, &h, "parent").await;
    sh(
        &d,
        &h,
        "echo mine > /home/user-file; chown 1000:1000 /home/user-file",
    )
    .await;
    let snap = env.path().join("snap");
    d.checkpoint(
        &h,
        &snap,
        CheckpointOptions {
            leave_running: true,
            filesystem_only: false,
        },
    )
    .await
    .unwrap_or_else(|e| panic!("snapshot: {}", chain(&e)));
    let mut forks = Vec::new();
    for _ in 0..2 {
        let f = d
            .restore(&spec, &snap, RestoreOptions::default())
            .await
            .unwrap_or_else(|e| panic!("fork: {}", chain(&e)));
        assert_ne!(f.slot, h.slot);
        forks.push(f);
    }
    for f in &forks {
        assert_eq!(checksum(&d, f).await, sum);
        assert_eq!(secret(&d, f).await, "parent");
        let (_, owner) = sh(&d, f, "stat -c %u:%g /home/user-file").await;
        assert_eq!(owner.trim(), "1000:1000", "owner inside the fork");
        let upper = env
            .path()
            .join(format!("j/s/{}/disk/upper/home/user-file", f.slot));
        let host_uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&upper).unwrap());
        assert_eq!(
            host_uid,
            env.uid_range().start + f.slot * 65536 + 1000,
            "owner on the host: the fork's own uid range"
        );
    }
    // Independent: a change in one fork is seen nowhere else.
    sh(&d, &forks[0], "echo changed > /home/data").await;
    assert_eq!(checksum(&d, &forks[1]).await, sum);
    assert_eq!(checksum(&d, &h).await, sum);
    for f in forks.iter().chain([&h]) {
        d.stop(f).await.expect("stop");
    }
    std::fs::remove_dir_all(&snap).unwrap();
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Criu)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_only_checkpoint_keeps_files_but_not_processes() {
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 128);
    let h = d.start(&spec).await.expect("start");
    plant(&d, &h, "gone").await;
    let dir = env.path().join("fs-only");
    let info = d
        .checkpoint(
            &h,
            &dir,
            CheckpointOptions {
                leave_running: false,
                filesystem_only: true,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("checkpoint: {}", chain(&e)));
    assert!(!info.memory);
    assert!(!Path::new(&dir).join("images").exists());
    d.stop(&h).await.expect("stop");
    let r = d
        .restore(
            &spec,
            &dir,
            RestoreOptions {
                consume: true,
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("restore: {}", chain(&e)));
    let (_, body) = sh(&d, &r, "wc -c < /home/data; wc -c < /tmp/t").await;
    assert_eq!(
        body.lines().collect::<Vec<_>>(),
        ["200000", "5000"],
        "files kept, /tmp's too (it is on the disk, as on E2B)"
    );
    let (_, ps) = sh(&d, &r, "ls /proc | head -50").await;
    let pids: Vec<&str> = ps.lines().filter(|l| l.parse::<u32>().is_ok()).collect();
    assert!(
        pids.len() <= 4,
        "only the agent and this shell run: {pids:?}"
    );
    d.stop(&r).await.expect("stop");
    std::fs::remove_dir_all(&dir).unwrap();
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Criu)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_resume_leaves_the_checkpoint_restorable() {
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 128);
    let h = d.start(&spec).await.expect("start");
    let sum = plant(&d, &h, "kept").await;
    let dir = env.path().join("pause");
    d.checkpoint(&h, &dir, pause_opts()).await.expect("pause");
    d.stop(&h).await.expect("stop");
    // Break the image CRIU reads first, so the restore fails after the files were moved in.
    let pstree = dir.join("images/pstree.img");
    let good = std::fs::read(&pstree).unwrap();
    std::fs::write(&pstree, b"garbage").unwrap();
    let e = d
        .restore(
            &spec,
            &dir,
            RestoreOptions {
                consume: true,
                ..Default::default()
            },
        )
        .await
        .expect_err("a broken image");
    assert!(chain(&e).contains("CRIU restore failed"), "{}", chain(&e));
    assert!(dir.join("disk.ext4").is_file(), "the disk given back");
    std::fs::write(&pstree, good).unwrap();
    let r = d
        .restore(
            &spec,
            &dir,
            RestoreOptions {
                consume: true,
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("resume: {}", chain(&e)));
    assert_eq!(checksum(&d, &r).await, sum);
    assert_eq!(secret(&d, &r).await, "kept");
    d.stop(&r).await.expect("stop");
    std::fs::remove_dir_all(&dir).unwrap();
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Criu)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_checkpoint_can_be_restored_filesystem_only() {
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 128);
    let h = d.start(&spec).await.expect("start");
    plant(&d, &h, "forgotten").await;
    let dir = env.path().join("pause");
    d.checkpoint(&h, &dir, pause_opts()).await.expect("pause");
    d.stop(&h).await.expect("stop");
    let r = d
        .restore(
            &spec,
            &dir,
            RestoreOptions {
                consume: false,
                filesystem_only: true,
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("cold boot: {}", chain(&e)));
    let (_, body) = sh(&d, &r, "wc -c < /home/data; wc -c < /tmp/t").await;
    assert_eq!(
        body.lines().collect::<Vec<_>>(),
        ["200000", "5000"],
        "files kept, /tmp's too (on the disk, as on E2B)"
    );
    assert!(
        dir.join("images").is_dir(),
        "the memory image is left as it was"
    );
    d.stop(&r).await.expect("stop");
    std::fs::remove_dir_all(&dir).unwrap();
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Criu)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_agent_log_symlink_never_reaches_the_host() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 128);
    let h = d.start(&spec).await.expect("start");
    // A host file the sandbox cannot see, named by its host path in a planted symlink where
    // the server copies the agent's log from (checkpoint) and to (restore, then re-owned).
    let marker = env.path().join("host-secret");
    std::fs::write(&marker, "host only").unwrap();
    let (head, body) = sh(
        &d,
        &h,
        &format!("ln -sf {} /run/bulkhead/sock/agent.log", marker.display()),
    )
    .await;
    assert_eq!(head, "exit 0", "{body}");
    let snap = env.path().join("snap");
    d.checkpoint(
        &h,
        &snap,
        CheckpointOptions {
            leave_running: true,
            filesystem_only: false,
        },
    )
    .await
    .unwrap_or_else(|e| panic!("snapshot: {}", chain(&e)));
    assert!(
        !snap.join("agent.log").exists(),
        "the symlink's target was copied into the checkpoint"
    );
    // Plant the symlink in the checkpoint too, as if it had come from an older server.
    std::os::unix::fs::symlink(&marker, snap.join("agent.log")).unwrap();
    let fork = d
        .restore(&spec, &snap, RestoreOptions::default())
        .await
        .unwrap_or_else(|e| panic!("fork: {}", chain(&e)));
    let md = std::fs::metadata(&marker).unwrap();
    assert_eq!((md.uid(), md.gid()), (0, 0), "the host file was re-owned");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "host only");
    for x in [&fork, &h] {
        d.stop(x).await.expect("stop");
    }
    std::fs::remove_dir_all(&snap).unwrap();
    env.assert_clean();
}
