//! QEMU's jail, seen from the host through `/proc/<QEMU>/`, for every way a VM is launched
//! (cold boot, clone of the template snapshot, resume of a paused VM, fork of a snapshot): its
//! root holds exactly the files its command line names plus QEMU's own (no host secret, no
//! other sandbox's slot), it is pid 1 of its own pid namespace, and its cgroup is its slot's,
//! with the VM's limits. The VM works inside it.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{Env, run};
use bulkhead_driver::{CheckpointOptions, Driver, DriverHandle, RestoreOptions};
use bulkhead_microvm::jailer;

/// (mount point, read-only) of every mount in `pid`'s mount namespace.
fn mounts(pid: i32) -> Vec<(String, bool)> {
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .expect("QEMU's mountinfo")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let ro = f[5].split(',').any(|o| o == "ro");
            (f[4].to_owned(), ro)
        })
        .collect()
}

/// The directory of `pid`'s cgroup for `controller` (v1) or its unified cgroup (v2).
fn cgroup_dir(pid: i32, controller: &str) -> PathBuf {
    let own = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let mounts = bulkhead_host::cgroup::parse_mountinfo(
        &fs::read_to_string("/proc/self/mountinfo").unwrap(),
    );
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctl, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let rel = path.trim_start_matches('/');
        if ctl.split(',').any(|c| c == controller)
            && let Some(m) = mounts
                .iter()
                .find(|m| !m.v2 && m.options.iter().any(|o| o == controller))
        {
            return m.mount_point.join(rel);
        }
        if ctl.is_empty()
            && !mounts
                .iter()
                .any(|m| !m.v2 && m.options.iter().any(|o| o == controller))
            && let Some(m) = mounts.iter().find(|m| m.v2)
        {
            return m.mount_point.join(rel);
        }
    }
    panic!("no {controller} cgroup for {pid}: {own}");
}

fn read(p: &Path) -> String {
    fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_owned()
}

/// The files QEMU's command line names: `-kernel`, and every drive's `file=` outside its slot.
fn command_line_files(pid: i32, slot: &Path) -> Vec<PathBuf> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let mut files = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if a == "-kernel" {
            files.push(PathBuf::from(&args[i + 1]));
        }
        if let Some(f) = a.split(',').find_map(|o| o.strip_prefix("file=")) {
            files.push(PathBuf::from(f));
        }
    }
    files.retain(|f| !f.starts_with(slot));
    files
}

/// What `root` holds: its files, and the directories in `whole` (bind-mounted directories,
/// not descended into), as paths inside it.
fn listing(root: &Path, whole: &BTreeSet<PathBuf>) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![PathBuf::from("/")];
    while let Some(dir) = stack.pop() {
        let host = root.join(dir.strip_prefix("/").unwrap());
        for e in fs::read_dir(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display())) {
            let e = e.unwrap();
            let inside = dir.join(e.file_name());
            if whole.contains(&inside) || !e.file_type().unwrap().is_dir() {
                out.insert(inside);
            } else {
                stack.push(inside);
            }
        }
    }
    out
}

/// Asserts that `h`'s QEMU is jailed: its own pid namespace, a root of only its files, its
/// slot's cgroup with the VM's limits, no view of `others`' slots. `clone`: its RAM is an
/// inherited memfd, so its root has a `/proc` (of its own pid namespace only).
fn assert_jailed(env: &Env, h: &DriverHandle, memory_mb: u64, clone: bool, others: &[&Path]) {
    let pid = h.pid;
    let slot = env.cfg.state_dir.join("s").join(h.slot.to_string());
    let root = PathBuf::from(format!("/proc/{pid}/root"));

    // Its own pid namespace, as its init: two NSpid entries, the host's and 1.
    let status = read(&PathBuf::from(format!("/proc/{pid}/status")));
    let nspid: Vec<&str> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(nspid, vec![pid.to_string().as_str(), "1"], "QEMU's NSpid");
    let own_ns = fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    assert_ne!(own_ns, fs::read_link("/proc/self/ns/pid").unwrap());

    // Its root: exactly QEMU, its libraries and data, the images it boots, two devices, its
    // slot (and /proc for a clone).
    let files = jailer::QemuFiles::discover(&env.cfg.qemu).unwrap();
    let mut whole: BTreeSet<PathBuf> = files.dirs.iter().cloned().collect();
    whole.insert(slot.clone());
    whole.insert("/proc".into());
    let mut expect: BTreeSet<PathBuf> = whole.clone();
    if !clone {
        expect.remove(Path::new("/proc"));
    }
    expect.insert(files.binary.clone());
    expect.extend(files.libs.iter().cloned());
    expect.extend(command_line_files(pid, &slot));
    expect.extend(["/dev/null".into(), "/dev/urandom".into()]);
    assert_eq!(listing(&root, &whole), expect, "QEMU's root");
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap());
    for other in others {
        assert!(
            other.exists() && !inside(other).exists(),
            "QEMU of slot {} sees {}",
            h.slot,
            other.display()
        );
    }
    if clone {
        // Its procfs is of its own pid namespace: QEMU is its only process.
        let mut pids: Vec<String> = fs::read_dir(inside(Path::new("/proc")))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<u32>().is_ok())
            .collect();
        pids.sort();
        assert_eq!(pids, vec!["1"], "processes in QEMU's /proc");
    }
    let ms = mounts(pid);
    let writable: BTreeSet<&str> = ms
        .iter()
        .filter(|(_, ro)| !ro)
        .map(|(m, _)| m.as_str())
        .collect();
    assert_eq!(
        writable,
        BTreeSet::from(["/dev/null", slot.to_str().unwrap()]),
        "writable mounts in QEMU's root: {ms:?}"
    );
    assert!(ms.iter().any(|(m, ro)| m == "/" && *ro), "{ms:?}");

    // Its cgroup: its slot's, memory = guest RAM + overhead, pids, CPU quota of its one vCPU.
    let mem = cgroup_dir(pid, "memory");
    let name = mem.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        mem.parent().unwrap().ends_with(jailer::CGROUP_PARENT)
            && name.ends_with(&format!("-{}", h.slot)),
        "QEMU of slot {} is in {}",
        h.slot,
        mem.display()
    );
    let limit = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .map(|f| mem.join(f))
        .find(|p| p.exists())
        .expect("a memory limit file");
    assert_eq!(
        read(&limit),
        ((memory_mb + jailer::OVERHEAD_MB) << 20).to_string()
    );
    let pids = cgroup_dir(pid, "pids");
    assert_eq!(
        read(&pids.join("pids.max")),
        (jailer::PIDS_OVERHEAD + 1).to_string()
    );
    let cpu = cgroup_dir(pid, "cpu");
    let quota = if cpu.join("cpu.max").exists() {
        read(&cpu.join("cpu.max"))
    } else {
        read(&cpu.join("cpu.cfs_quota_us"))
    };
    assert!(quota.starts_with("100000"), "CPU quota {quota}");
}

fn slot_of(env: &Env, h: &DriverHandle) -> PathBuf {
    env.cfg.state_dir.join("s").join(h.slot.to_string())
}

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_launch_path_runs_qemu_in_its_own_jail() {
    let env = Env::new();
    // A world-readable host file next to the VM's own files, like /etc/shadow would be to a
    // QEMU without a root of its own.
    let secret = env.cfg.state_dir.parent().unwrap().join("host-secret");
    fs::write(&secret, "host secret\n").unwrap();
    let d = env.driver();
    let spec = env.spec(256, 64);
    // Two clones of the template snapshot (whose template VM ran in the same jail: its RAM file
    // was written through the bind of the staging directory).
    let a = d.start(&spec).await.expect("start a clone");
    let b = d.start(&spec).await.expect("start another clone");
    assert!(a.data.get("snapshot").and_then(|s| s.as_str()).is_some());
    let (code, out, err) = run(&d, &a, "cat /etc/template-marker").await;
    assert_eq!((code, out.as_str()), (0, "from the template\n"), "{err}");
    let (sa, sb) = (slot_of(&env, &a), slot_of(&env, &b));
    assert_jailed(&env, &a, 256, true, &[&secret, &sb]);
    assert_jailed(&env, &b, 256, true, &[&secret, &sa]);
    let mem_a = cgroup_dir(a.pid, "memory");

    // Pause and resume a, then fork the resumed VM: both restores are jailed the same way.
    let paused = env.cfg.state_dir.join("paused");
    d.checkpoint(&a, &paused, CheckpointOptions::default())
        .await
        .expect("pause");
    assert!(
        !mem_a.exists(),
        "the paused VM's cgroup {} is left",
        mem_a.display()
    );
    let r = d
        .restore(&spec, &paused, RestoreOptions::default())
        .await
        .expect("resume");
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
    let (sr, sf) = (slot_of(&env, &r), slot_of(&env, &f));
    assert_jailed(&env, &r, 256, false, &[&secret, &sb, &sf, &paused]);
    assert_jailed(&env, &f, 256, false, &[&secret, &sb, &sr, &snap]);
    let (code, out, _) = run(&d, &f, "cat /etc/template-marker").await;
    assert_eq!((code, out.as_str()), (0, "from the template\n"));

    // A cold boot (no snapshots).
    let mut cold_cfg = env.cfg.clone();
    cold_cfg.snapshots = false;
    let cold = bulkhead_microvm::MicrovmDriver::new(cold_cfg).unwrap();
    let c = cold.start(&spec).await.expect("cold boot");
    assert!(c.data.get("snapshot").is_none_or(|s| s.is_null()));
    assert_jailed(&env, &c, 256, false, &[&secret, &sb, &sr, &sf]);

    let cgroups: Vec<PathBuf> = [&b, &r, &f, &c]
        .iter()
        .map(|h| cgroup_dir(h.pid, "memory"))
        .collect();
    for h in [&b, &r, &f] {
        d.stop(h).await.expect("stop");
        tokio::time::timeout(Duration::from_secs(10), d.wait(h))
            .await
            .expect("dead");
    }
    cold.stop(&c).await.expect("stop");
    for cg in cgroups {
        assert!(!cg.exists(), "the cgroup {} is left", cg.display());
    }
    env.assert_clean();
}
