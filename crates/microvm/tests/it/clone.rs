//! Create = clone of the template snapshot: clones run commands and keep files apart, draw
//! different randomness and get the host's clock, leave the snapshot's RAM untouched, and a
//! broken snapshot falls back to a cold boot and is taken again.

use std::fs;
use std::time::Duration;

use crate::common::{Env, run};
use bulkhead_driver::{Driver, DriverHandle};
use bulkhead_microvm::snapshot;
use sha2::{Digest, Sha256};

/// The snapshot key a handle's VM was cloned from; None for a cold boot.
fn cloned_from(h: &DriverHandle) -> Option<String> {
    h.data
        .get("snapshot")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
}

fn sha(path: &std::path::Path) -> String {
    let bytes = fs::read(path).expect("read");
    format!("{:x}", Sha256::digest(bytes))
}

/// The clone's RAM as its QEMU maps it: `mem-path=/proc/self/fd/N` on its command line.
fn clone_ram(pid: i32) -> std::path::PathBuf {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let text = String::from_utf8_lossy(&cmdline);
    let at = text.find("mem-path=/proc/self/fd/").expect("a RAM memfd") + 23;
    let n: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    format!("/proc/{pid}/fd/{n}").into()
}

/// (Rss, Pss, Rss of the snapshot RAM mapping) of a QEMU, in KiB.
fn memory(pid: i32) -> (u64, u64, u64) {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut rss, mut pss, mut snap, mut in_snap) = (0, 0, 0, false);
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let (Some(name), Some(value)) = (f.next(), f.next()) else {
            continue;
        };
        if !name.ends_with(':') {
            // A mapping's header line: address range, perms, offset, dev, inode, path.
            in_snap = line.contains("bulkhead-snapshot-ram");
            continue;
        }
        let kb: u64 = value.parse().unwrap_or(0);
        match name {
            "Rss:" => {
                rss += kb;
                if in_snap {
                    snap += kb;
                }
            }
            "Pss:" => pss += kb,
            _ => {}
        }
    }
    (rss, pss, snap)
}

/// Shared_Clean + Shared_Dirty of the snapshot mapping: the pages clones share.
fn shared_snapshot_kb(pid: i32) -> u64 {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut in_snap = false;
    let mut shared = 0;
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let (Some(name), Some(value)) = (f.next(), f.next()) else {
            continue;
        };
        if !name.ends_with(':') {
            in_snap = line.contains("bulkhead-snapshot-ram");
            continue;
        }
        if in_snap && name.starts_with("Shared_") {
            shared += value.parse::<u64>().unwrap_or(0);
        }
    }
    shared
}

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_run_commands_keep_files_apart_and_leave_the_snapshot_untouched() {
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 256);
    let a = d
        .start(&spec)
        .await
        .expect("first start (takes the snapshot)");
    let key = cloned_from(&a).expect("the first start is a clone of the new snapshot");
    let snap = env.cfg.snapshot_dir.join(format!("snap-{key}"));
    let ram_before = sha(&snap.join(snapshot::RAM));
    let disk_before = sha(&snap.join(snapshot::DISK));
    let b = d.start(&spec).await.expect("second start");
    assert_eq!(cloned_from(&b).as_deref(), Some(key.as_str()));

    // Commands and files, each clone on its own disk.
    let (code, out, err) = run(&d, &a, "echo one > /tmp/mine; mkdir /home/a; cat /tmp/mine").await;
    assert_eq!((code, out.as_str()), (0, "one\n"), "stderr: {err}");
    let (code, out, _) = run(&d, &b, "cat /tmp/mine 2>&1; ls /home").await;
    assert_eq!(code, 0);
    assert!(out.contains("No such file"), "b sees a's file: {out}");
    assert!(
        !out.lines().any(|l| l == "a"),
        "b sees a's directory: {out}"
    );

    // Both dirty their RAM (a tmpfs file lives in guest memory); the shared RAM stays as saved.
    for h in [&a, &b] {
        let (code, _, err) = run(&d, h, "head -c 30000000 /dev/urandom > /dev/shm/fill").await;
        assert_eq!(code, 0, "{err}");
    }
    let (rss, pss, snap_rss) = memory(a.pid);
    let shared = shared_snapshot_kb(a.pid);
    eprintln!(
        "clone QEMU after 30 MB written: RSS {} MiB, PSS {} MiB, snapshot mapping RSS {} MiB of which shared {} MiB; RSS minus shared snapshot pages {} MiB (TCG)",
        rss / 1024,
        pss / 1024,
        snap_rss / 1024,
        shared / 1024,
        (rss - shared) / 1024
    );
    assert_eq!(
        sha(&clone_ram(a.pid)),
        ram_before,
        "the RAM file as a clone maps it changed"
    );
    d.stop(&a).await.expect("stop");
    d.stop(&b).await.expect("stop");
    assert_eq!(sha(&snap.join(snapshot::RAM)), ram_before);
    assert_eq!(sha(&snap.join(snapshot::DISK)), disk_before);
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel, "a Debian mirror or a cached `base`")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_draw_different_randomness_and_get_the_hosts_clock() {
    let env = Env::new();
    let base = crate::common::base_tree().await;
    let d = env.driver();
    let spec = env.spec_for(&base, 256, 256);
    let a = d.start(&spec).await.expect("first clone");
    // Long enough that a clone left on the snapshot's clock would be visibly behind.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let b = d.start(&spec).await.expect("second clone");
    assert!(cloned_from(&a).is_some() && cloned_from(&a) == cloned_from(&b));
    let probe = "cat /proc/sys/kernel/random/uuid; \
                 python3 -c 'import os; print(os.urandom(16).hex())'; date +%s";
    let (ca, oa, ea) = run(&d, &a, probe).await;
    let (cb, ob, eb) = run(&d, &b, probe).await;
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert_eq!((ca, cb), (0, 0), "{ea} {eb}");
    eprintln!("clone a: {oa:?}\nclone b: {ob:?}\nhost clock: {host_now}");
    let (la, lb): (Vec<&str>, Vec<&str>) = (oa.lines().collect(), ob.lines().collect());
    assert_eq!((la.len(), lb.len()), (3, 3), "{oa} / {ob}");
    assert_ne!(la[0], lb[0], "the clones drew the same kernel uuid");
    assert_ne!(la[1], lb[1], "the clones drew the same os.urandom bytes");
    let guest_now: i64 = lb[2].parse().unwrap();
    assert!(
        (host_now - guest_now).abs() <= 3,
        "the second clone's clock is {guest_now}, the host's {host_now}"
    );
    d.stop(&a).await.expect("stop");
    d.stop(&b).await.expect("stop");
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_snapshot_falls_back_to_a_cold_boot_and_is_taken_again() {
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 256);
    let a = d.start(&spec).await.expect("first start");
    let key = cloned_from(&a).expect("a clone");
    d.stop(&a).await.expect("stop");
    // Same size (the snapshot still looks complete), garbage content: the restore fails.
    let state = env
        .cfg
        .snapshot_dir
        .join(format!("snap-{key}"))
        .join(snapshot::STATE);
    let len = fs::metadata(&state).unwrap().len() as usize;
    fs::write(&state, vec![0x5a; len]).unwrap();
    let b = d
        .start(&spec)
        .await
        .expect("the start falls back to a cold boot");
    assert_eq!(cloned_from(&b), None, "cold boot");
    let (code, out, _) = run(&d, &b, "echo cold").await;
    assert_eq!((code, out.as_str()), (0, "cold\n"));
    d.stop(&b).await.expect("stop");
    // The broken snapshot was deleted; the next start takes it again and clones.
    let c = d.start(&spec).await.expect("third start");
    assert_eq!(cloned_from(&c).as_deref(), Some(key.as_str()));
    assert!(
        cloned_from(&c).is_some()
            && env
                .cfg
                .snapshot_dir
                .join(format!("snap-{key}"))
                .join(snapshot::STATE)
                .metadata()
                .unwrap()
                .len()
                > 0
    );
    let (code, out, _) = run(&d, &c, "echo warm").await;
    assert_eq!((code, out.as_str()), (0, "warm\n"));
    d.stop(&c).await.expect("stop");
    env.assert_clean();
}

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_clone_resumes_with_its_disk_and_memory_and_forks_apart() {
    use bulkhead_driver::{CheckpointOptions, RestoreOptions};
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(256, 256);
    let a = d.start(&spec).await.expect("start");
    assert!(cloned_from(&a).is_some());
    let (code, _, err) = run(&d, &a, "echo disk > /tmp/d; echo memory > /dev/shm/m").await;
    assert_eq!(code, 0, "{err}");

    // Pause: the VM ends; resume: its disk and RAM (a tmpfs file) are back.
    let paused = env.cfg.state_dir.join("paused");
    let info = d
        .checkpoint(&a, &paused, CheckpointOptions::default())
        .await
        .expect("pause");
    assert!(info.memory && info.size_bytes > 0);
    assert_eq!(d.checkpoint_info(&paused), Some(info));
    let r = d
        .restore(&spec, &paused, RestoreOptions::default())
        .await
        .expect("resume");
    let (code, out, err) = run(&d, &r, "cat /tmp/d /dev/shm/m").await;
    assert_eq!((code, out.as_str()), (0, "disk\nmemory\n"), "{err}");

    // Snapshot the resumed VM while it runs, fork it: the fork has its state, then each goes
    // its own way.
    let snap = env.cfg.state_dir.join("forkable");
    d.checkpoint(
        &r,
        &snap,
        CheckpointOptions {
            leave_running: true,
            ..Default::default()
        },
    )
    .await
    .expect("snapshot");
    let f = d
        .restore(&spec, &snap, RestoreOptions::default())
        .await
        .expect("fork");
    let (code, out, _) = run(&d, &f, "cat /dev/shm/m; echo fork > /tmp/only-fork").await;
    assert_eq!((code, out.as_str()), (0, "memory\n"));
    let (code, out, _) = run(&d, &r, "cat /tmp/only-fork 2>&1; cat /tmp/d").await;
    assert_eq!(code, 0);
    assert!(
        out.contains("No such file") && out.ends_with("disk\n"),
        "{out}"
    );
    let (_, ur, _) = run(&d, &r, "cat /proc/sys/kernel/random/uuid").await;
    let (_, uf, _) = run(&d, &f, "cat /proc/sys/kernel/random/uuid").await;
    assert_ne!(ur, uf);
    for h in [&a, &r, &f] {
        d.stop(h).await.expect("stop");
    }
    env.assert_clean();
}
