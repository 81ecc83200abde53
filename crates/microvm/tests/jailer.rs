//! QEMU's jail, seen from the host through `/proc/<QEMU>/`: its root holds only its own files
//! (a world-readable host secret is not there), it is pid 1 of its own pid namespace, and its
//! cgroup carries the VM's limits. The VM still works inside it.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bulkhead_driver::Driver;
use bulkhead_microvm::jailer;
use common::{Env, run};

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
    let mounts = bulkhead_jail::cgroup::parse_mountinfo(
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

#[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_sees_only_its_files_is_pid_1_and_is_limited_by_its_cgroup() {
    let env = Env::new();
    // A world-readable host file next to the VM's own files, like /etc/shadow would be to a
    // QEMU without a root of its own.
    let secret = env.cfg.state_dir.parent().unwrap().join("host-secret");
    fs::write(&secret, "host secret\n").unwrap();
    let d = env.driver();
    let h = d.start(&env.spec(256, 64)).await.expect("start a VM");
    let pid = h.pid;

    // The VM works in its jail.
    let (code, out, err) = run(&d, &h, "cat /etc/template-marker").await;
    assert_eq!((code, out.as_str()), (0, "from the template\n"), "{err}");

    // Its root: no host files, only what QEMU needs, all read-only but its slot.
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap());
    assert!(
        secret.exists() && !inside(&secret).exists(),
        "QEMU can read {}",
        secret.display()
    );
    for host_file in ["/etc/passwd", "/etc/hostname", "/root", "/home", "/proc/1"] {
        assert!(
            !inside(Path::new(host_file)).exists(),
            "{host_file} is visible to QEMU"
        );
    }
    assert!(inside(&env.cfg.kernel).is_file(), "the kernel is missing");
    let slot = env.cfg.state_dir.join("s/0");
    assert!(
        inside(&slot.join("agent.sock")).exists(),
        "QEMU's slot is missing"
    );
    let ms = mounts(pid);
    let writable: Vec<&str> = ms
        .iter()
        .filter(|(_, ro)| !ro)
        .map(|(m, _)| m.as_str())
        .collect();
    assert_eq!(
        writable,
        vec!["/dev/null", slot.to_str().unwrap()],
        "writable mounts in QEMU's root: {ms:?}"
    );
    assert!(ms.iter().any(|(m, ro)| m == "/" && *ro), "{ms:?}");

    // Its own pid namespace, as its init.
    let status = read(&PathBuf::from(format!("/proc/{pid}/status")));
    let nspid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap();
    assert_eq!(
        nspid.split_whitespace().collect::<Vec<_>>(),
        vec![pid.to_string().as_str(), "1"],
        "QEMU's NSpid"
    );

    // Its cgroup: memory = guest RAM + overhead, pids, CPU quota of its one vCPU.
    let mem = cgroup_dir(pid, "memory");
    assert!(
        mem.to_string_lossy().contains(jailer::CGROUP_PARENT),
        "{}",
        mem.display()
    );
    let limit = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .map(|f| mem.join(f))
        .find(|p| p.exists())
        .expect("a memory limit file");
    assert_eq!(
        read(&limit),
        ((256 + jailer::OVERHEAD_MB) << 20).to_string()
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

    d.stop(&h).await.expect("stop");
    tokio::time::timeout(Duration::from_secs(10), d.wait(&h))
        .await
        .expect("dead");
    assert!(!mem.exists(), "the cgroup {} is left", mem.display());
    env.assert_clean();
}
