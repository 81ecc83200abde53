//! The v2 freezer against a real cgroup, as root. The conformance suite freezes sandboxes
//! through whatever layout the host has (v1 on a hybrid host, v2 in production); this covers
//! the v2 files on a hybrid host too, in its unified hierarchy.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use bulkhead_jail::cgroup::parse_mountinfo;
use bulkhead_jail::freezer::Freezer;

/// Clock ticks of CPU time a process has used (utime + stime of /proc/PID/stat).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line; `after` starts at field 3.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[bulkhead_testkit::requires(Root, "a cgroup2 mount (the unified hierarchy)")]
#[test]
fn v2_freezer_stops_and_resumes_a_busy_process() {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let Some(root) = parse_mountinfo(&info)
        .into_iter()
        .find(|m| m.v2)
        .map(|m| m.mount_point)
    else {
        bulkhead_testkit::require_host(
            "a cgroup2 mount (the unified hierarchy)",
            &["no cgroup2 filesystem is mounted"],
            "mount cgroup2 (e.g. at /sys/fs/cgroup/unified on a hybrid host)",
        );
        unreachable!("require_host fails the test when a problem is listed");
    };
    let dir: PathBuf = root.join(format!("bulkhead-freezer-test-{}", std::process::id()));
    fs::create_dir(&dir).unwrap();
    let mut busy = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = busy.id();
    fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
    let f = Freezer::V2 {
        freeze: dir.join("cgroup.freeze"),
        events: dir.join("cgroup.events"),
    };
    let result = std::panic::catch_unwind(|| {
        std::thread::sleep(Duration::from_millis(100));
        f.set(true, Duration::from_secs(5)).expect("freeze");
        assert_eq!(f.state().unwrap(), Some(true));
        let before = cpu_ticks(pid);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cpu_ticks(pid), before, "a frozen process used CPU");
        f.set(false, Duration::from_secs(5)).expect("thaw");
        assert_eq!(f.state().unwrap(), Some(false));
        std::thread::sleep(Duration::from_millis(300));
        assert!(cpu_ticks(pid) > before, "a thawed process did not run");
    });
    let _ = f.request(false);
    let _ = busy.kill();
    let _ = busy.wait();
    let _ = fs::remove_dir(&dir);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
