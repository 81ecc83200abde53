//! Real sandboxes, as root. Each test is gated with `#[requires(Root, ...)]`: reported as
//! ignored by plain `cargo test`, failed (naming what is missing) by `--include-ignored` on a
//! host the jail driver does not support.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::{Duration, Instant};

use crate::common::{Env, ask, chain, sh, stats};
use bulkhead_driver::{Driver, DriverError};
use bulkhead_testkit::requires;

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_is_isolated_and_hardened() {
    let env = Env::new();
    let d = env.driver();
    let h = d.start(&env.spec(256, 128)).await.expect("start");
    let base = env.cfg.uid_base + h.slot * 65536;

    assert_eq!(ask(&d, &h, "ping").await, "pong");

    // pid 1 is the agent; host processes are invisible.
    let (st, cmdline) = sh(&d, &h, "cat /proc/1/cmdline").await;
    assert_eq!(st, "exit 0");
    assert!(
        cmdline.starts_with("/run/bulkhead/agent\0--listen\0unix:/run/bulkhead/sock/agent.sock"),
        "{cmdline:?}"
    );
    let (_, pids) = sh(&d, &h, "for p in /proc/[0-9]*; do echo $p; done").await;
    assert!(pids.lines().count() <= 3, "unexpected processes: {pids}");
    assert!(pids.lines().any(|l| l == "/proc/1"));

    // Host files are invisible, template files visible.
    let host_path = env!("CARGO_MANIFEST_DIR");
    let (_, out) = sh(
        &d,
        &h,
        &format!("test -e {host_path} && echo visible || echo hidden"),
    )
    .await;
    assert_eq!(out.trim(), "hidden");
    let (_, out) = sh(&d, &h, "cat /etc/template-marker").await;
    assert_eq!(out.trim(), "from the template");
    let (_, out) = sh(&d, &h, "ls -A /sys").await;
    assert_eq!(out.trim(), "", "/sys must be empty");
    let (_, out) = sh(&d, &h, "ls /dev").await;
    let devs: Vec<&str> = out.split_whitespace().collect();
    for want in [
        "null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd",
    ] {
        assert!(devs.contains(&want), "/dev lacks {want}: {devs:?}");
    }
    assert!(
        !devs
            .iter()
            .any(|d| ["kvm", "vda", "vsock", "mem"].contains(d)),
        "{devs:?}"
    );

    // Network: only lo, and it is up.
    let (_, out) = sh(&d, &h, "cat /proc/net/dev").await;
    let ifaces: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(i, _)| i.trim())
        .collect();
    assert_eq!(ifaces, vec!["lo"], "{out}");
    assert_eq!(ask(&d, &h, "probe inet").await, "ok");

    // uid 0 inside is the slot's base uid outside.
    let (_, out) = sh(&d, &h, "id -u; cat /proc/self/uid_map /proc/self/gid_map").await;
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], vec!["0"]);
    assert_eq!(lines[1], vec!["0", &base.to_string(), "65536"]);
    assert_eq!(lines[2], vec!["0", &base.to_string(), "65536"]);
    let status = fs::read_to_string(format!("/proc/{}/status", h.pid)).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|u| u == base.to_string()),
        "{uid_line}"
    );

    // Capabilities, seccomp (as seen by a process the agent started); no `no_new_privs`, so
    // set-uid programs work up to the sandbox's own root (sudo, as on E2B).
    let (_, out) = sh(&d, &h, "cat /proc/self/status").await;
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("CapBnd:"), "00000000a80425fb");
    assert_eq!(field("CapEff:"), "00000000a80425fb");
    assert_eq!(field("CapAmb:"), "0000000000000000");
    assert_eq!(field("NoNewPrivs:"), "0");
    assert_eq!(field("Seccomp:"), "2");

    // /proc: hostname, read-only sysctls, masked entries.
    let (_, out) = sh(&d, &h, "cat /proc/sys/kernel/hostname").await;
    assert_eq!(out.trim(), "sandbox");
    let (st, out) = sh(&d, &h, "echo evil > /proc/sys/kernel/hostname").await;
    assert_ne!(st, "exit 0", "{out}");
    let (st, out) = sh(&d, &h, "cat /proc/keys /proc/timer_list").await;
    assert_eq!((st.as_str(), out.as_str()), ("exit 0", ""));

    // seccomp denials.
    for p in [
        "mount",
        "umount",
        "unshare_user",
        "unshare_ns",
        "unshare_net",
        "setns",
        "clone_newuser",
        "clone_newns",
        "clone_newpid",
        "clone_newnet",
        "vsock",
        "packet",
        "alg",
        "bpf",
        "io_uring",
        "keyctl",
        "perf_event_open",
        "userfaultfd",
        "open_tree",
        "fsopen",
        "pivot_root",
        "init_module",
        "kexec_load",
        "syslog",
    ] {
        assert_eq!(
            ask(&d, &h, &format!("probe {p}")).await,
            "errno 1",
            "probe {p}"
        );
    }
    assert_eq!(ask(&d, &h, "probe clone3").await, "errno 38");
    for p in ["inet6", "unix", "netlink"] {
        assert_eq!(ask(&d, &h, &format!("probe {p}")).await, "ok", "probe {p}");
    }
    // Foreign syscall entries kill the caller (SIGSYS).
    assert_eq!(ask(&d, &h, "probe x32").await, "signal 31");
    assert_eq!(ask(&d, &h, "probe i386").await, "signal 31");

    // Writable root through the idmapped lower: the writes land in upper, owned by the slot.
    let (st, out) = sh(
        &d,
        &h,
        "echo hi > /etc/hello && rm /etc/hostname && mkdir -p /usr/local/lib/x /home/user \
         && chown 1000:1000 /home/user && echo done",
    )
    .await;
    assert_eq!((st.as_str(), out.trim()), ("exit 0", "done"));
    let upper = env.cfg.state_dir.join(format!("s/{}/disk/upper", h.slot));
    let m = fs::metadata(upper.join("etc/hello")).unwrap();
    assert_eq!((m.uid(), m.gid()), (base, base));
    let wh = fs::symlink_metadata(upper.join("etc/hostname")).unwrap();
    assert!(
        wh.file_type().is_char_device() && wh.rdev() == 0,
        "whiteout expected"
    );
    assert_eq!(
        fs::metadata(upper.join("home/user")).unwrap().uid(),
        base + 1000
    );
    assert!(upper.join("usr/local/lib/x").is_dir());
    // The template itself is untouched.
    assert!(env.rootfs.join("etc/hostname").exists());
    assert!(!env.rootfs.join("etc/hello").exists());

    // New top-level entries are the sandbox's own (as on E2B); /proc, /dev and /sys are
    // read-only mounts, their devices still usable.
    let (st, out) = sh(
        &d,
        &h,
        "echo x > /newfile && mkdir -p /newtop/a && echo y > /newtop/a/f && cat /newtop/a/f \
         && echo x > /tmp/f && cat /tmp/f",
    )
    .await;
    assert_eq!((st.as_str(), out.as_str()), ("exit 0", "y\nx\n"));
    assert!(upper.join("newtop/a/f").is_file());
    for w in [
        "echo 500 > /proc/self/oom_score_adj",
        "echo x > /dev/probe",
        "mkdir /dev/probe-dir",
        "ln -s /etc /dev/probe-link",
        "echo x > /sys/probe",
        "echo renamed > /proc/self/comm",
    ] {
        let (st, out) = sh(&d, &h, &format!("{w} 2>&1")).await;
        assert_ne!(st, "exit 0", "{w}: {out}");
        assert!(
            out.contains("Read-only file system") || out.contains("ermission denied"),
            "{w}: {out}"
        );
    }
    let (st, out) = sh(
        &d,
        &h,
        "echo x > /dev/null && head -c 3 /dev/zero | wc -c && echo x > /dev/shm/f && cat /dev/shm/f",
    )
    .await;
    assert_eq!((st.as_str(), out.as_str()), ("exit 0", "3\nx\n"));

    // Limits as written on the host.
    let cg = h.data["cgroup"].as_str().unwrap().to_string();
    let dirs = env.cgroups().dirs(&cg);
    let read = |file: &str| {
        dirs.iter()
            .map(|d| d.join(file))
            .find(|p| p.exists())
            .map(|p| fs::read_to_string(p).unwrap().trim().to_string())
            .unwrap_or_else(|| panic!("no {file} in {dirs:?}"))
    };
    if d.cgroup_version() == bulkhead_jail::CgroupVersion::V1 {
        assert_eq!(read("memory.limit_in_bytes"), (256u64 << 20).to_string());
        if dirs
            .iter()
            .any(|d| d.join("memory.memsw.limit_in_bytes").exists())
        {
            assert_eq!(
                read("memory.memsw.limit_in_bytes"),
                (256u64 << 20).to_string()
            );
        }
        assert_eq!(read("cpu.cfs_quota_us"), "100000");
        let procs = read("cgroup.procs");
        assert!(procs.lines().any(|p| p == h.pid.to_string()), "{procs}");
    } else {
        assert_eq!(read("memory.max"), (256u64 << 20).to_string());
        assert_eq!(read("cpu.max"), "100000 100000");
    }
    assert_eq!(read("pids.max"), "128");

    // Usage from the cgroup and the upper dir.
    let u = d.usage(&h).await.unwrap();
    assert_eq!(u.mem_limit_bytes, 256 << 20);
    assert!(
        u.mem_used_bytes > 0 && u.pids_current >= 1 && u.cpu_usage_ns > 0,
        "{u:?}"
    );
    assert!(
        u.disk_used_bytes > 0 && u.disk_total_bytes > u.disk_used_bytes,
        "{u:?}"
    );

    // The socket directory is the sandbox's: a symlink planted there must not make the server
    // connect to a host socket.
    let host_sock = env.path().join("host.sock");
    let host_listener = std::os::unix::net::UnixListener::bind(&host_sock).unwrap();
    host_listener.set_nonblocking(true).unwrap();
    let (st, _) = sh(
        &d,
        &h,
        &format!(
            "rm /run/bulkhead/sock/agent.sock && ln -s {} /run/bulkhead/sock/agent.sock",
            host_sock.display()
        ),
    )
    .await;
    assert_eq!(st, "exit 0");
    assert!(matches!(d.connect(&h).await, Err(DriverError::Connect(_))));
    assert!(
        host_listener.accept().is_err(),
        "the server was redirected to a host socket"
    );

    d.stop(&h).await.unwrap();
    env.assert_clean();
    // Idempotent, and the dead handle is not running any more.
    d.stop(&h).await.unwrap();
    assert!(matches!(d.connect(&h).await, Err(DriverError::NotRunning)));
    d.prune_lowers().unwrap();
    assert!(env.mounts().is_empty());
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_kills_a_hog_and_spares_the_neighbour() {
    let env = Env::new();
    let d = env.driver();
    let small = d.start(&env.spec(64, 64)).await.expect("start small");
    let neighbour = d.start(&env.spec(128, 64)).await.expect("start neighbour");
    assert_ne!(small.slot, neighbour.slot);

    let (hog, ping) = tokio::join!(ask(&d, &small, "hog 512"), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        ask(&d, &neighbour, "ping").await
    });
    assert_eq!(hog, "signal 9", "the hog must be OOM-killed");
    assert_eq!(ping, "pong");
    // Only the hog died: the small sandbox's agent still answers.
    assert_eq!(ask(&d, &small, "ping").await, "pong");
    assert_eq!(ask(&d, &neighbour, "ping").await, "pong");

    d.stop(&small).await.unwrap();
    d.stop(&neighbour).await.unwrap();
    env.assert_clean();
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_limit_holds_for_bytes_and_files() {
    let env = Env::new();
    let d = env.driver();
    let mut spec = env.spec(256, 64);
    spec.disk_mb = 64;
    let h = d.start(&spec).await.expect("start");
    let image = env.path().join(format!("j/s/{}/disk.ext4", h.slot));

    // Bytes: 100 MiB into a 64 MiB disk fail inside the sandbox, not on the host.
    let (head, out) = sh(&d, &h, "dd if=/dev/zero of=/home/big bs=1M count=100").await;
    assert_eq!(head, "exit 1", "{out}");
    assert!(out.contains("No space left"), "{out}");
    let host = std::fs::metadata(&image).unwrap();
    assert_eq!(host.len(), 64 << 20, "the image is the disk's size");
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&host) * 512 <= 64 << 20,
        "the host holds no more than the disk"
    );
    let u = d.usage(&h).await.expect("usage");
    assert!(u.disk_total_bytes <= 64 << 20, "{u:?}");
    assert!(u.disk_used_bytes > 40 << 20, "{u:?}");

    // Files: 64 MiB at one inode per 16 KiB is 4,096 inodes.
    let (head, out) = sh(
        &d,
        &h,
        "rm /home/big; i=0; while [ $i -lt 6000 ]; do touch /home/f$i || break; i=$((i+1)); done; echo made=$i",
    )
    .await;
    assert_eq!(head, "exit 0", "{out}");
    let made: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("made="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!((3000..4096).contains(&made), "{out}");
    assert!(out.contains("No space left"), "{out}");

    // Freed space is usable again; the sandbox lives on.
    let (head, out) = sh(
        &d,
        &h,
        "rm -f /home/f*; dd if=/dev/zero of=/home/again bs=1M count=16 2>/dev/null && echo ok",
    )
    .await;
    assert_eq!((head.as_str(), out.trim()), ("exit 0", "ok"));
    d.stop(&h).await.unwrap();
    env.assert_clean();
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pids_limit_contains_a_fork_bomb() {
    let env = Env::new();
    let d = env.driver();
    let h = d.start(&env.spec(128, 32)).await.expect("start");
    let out = ask(&d, &h, "forkbomb 500").await;
    let nums: Vec<usize> = out
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (forked, failed) = (nums[0], nums[1]);
    assert!(forked < 32, "{out}");
    assert!(failed > 0, "{out}");
    assert_eq!(ask(&d, &h, "ping").await, "pong");
    d.stop(&h).await.unwrap();
    env.assert_clean();
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_failures_are_reported_and_cleaned_up() {
    let mut env = Env::new();
    env.cfg.agent_args = vec!["--fail".into()];
    let d = env.driver();
    let err = chain(&d.start(&env.spec(128, 64)).await.unwrap_err());
    assert!(err.contains("exited with status 3"), "{err}");
    assert!(err.contains("failing on purpose"), "{err}");
    env.assert_clean();

    let mut spec = env.spec(128, 64);
    spec.rootfs = env.path().join("missing");
    let err = chain(&d.start(&spec).await.unwrap_err());
    assert!(err.contains("not a directory"), "{err}");

    // A template without a usable lower fails inside the launcher with a named step.
    let broken = env.path().join("broken");
    fs::create_dir(&broken).unwrap();
    let mut spec = env.spec(128, 64);
    spec.rootfs = broken;
    let err = chain(&d.start(&spec).await.unwrap_err());
    assert!(
        err.contains("execve /run/bulkhead/agent") || err.contains("exited"),
        "{err}"
    );
    env.assert_clean();
    d.prune_lowers().unwrap();
}

/// A server that died in a pause after the disk image was moved into the checkpoint: the next
/// driver gives the image back when the checkpoint is incomplete, and stops the sandbox (it is
/// paused) when the checkpoint is complete.
#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopting_after_a_pause_died_midway_puts_the_disk_in_one_place() {
    let env = Env::new();
    let d1 = env.driver();
    let (a, b) = (
        d1.start(&env.spec(128, 64)).await.expect("start a"),
        d1.start(&env.spec(128, 64)).await.expect("start b"),
    );
    let (st, _) = sh(&d1, &a, "echo kept > /home/f").await;
    assert_eq!(st, "exit 0");
    drop(d1);
    let moved = |h: &bulkhead_driver::DriverHandle, name: &str| {
        let slot = env.path().join(format!("j/s/{}", h.slot));
        let ckpt = env.path().join(name);
        fs::create_dir_all(&ckpt).unwrap();
        let to = ckpt.join("disk.ext4");
        fs::write(
            slot.join("disk-moved-to"),
            to.as_os_str().as_encoded_bytes(),
        )
        .unwrap();
        fs::rename(slot.join("disk.ext4"), &to).unwrap();
        ckpt
    };
    // a: the checkpoint never got its manifest.
    let unfinished = moved(&a, "unfinished");
    // b: the checkpoint is complete (its manifest is in place).
    let complete = moved(&b, "complete");
    fs::write(complete.join("checkpoint.json"), "{}").unwrap();

    let d2 = env.driver();
    assert!(d2.adopt(&a).await, "an unfinished pause is undone");
    assert!(
        env.path()
            .join(format!("j/s/{}/disk.ext4", a.slot))
            .is_file(),
        "the disk is back in the slot"
    );
    assert!(!unfinished.join("disk.ext4").exists());
    let (_, out) = sh(&d2, &a, "cat /home/f").await;
    assert_eq!(out.trim(), "kept");
    assert!(
        !d2.adopt(&b).await,
        "a finished pause makes the sandbox paused"
    );
    assert!(
        complete.join("disk.ext4").is_file(),
        "the checkpoint keeps its disk"
    );
    assert!(matches!(d2.connect(&b).await, Err(DriverError::NotRunning)));
    d2.stop(&a).await.unwrap();
    env.assert_clean();
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_after_the_driver_is_recreated() {
    let env = Env::new();
    let h = {
        let d1 = env.driver();
        d1.start(&env.spec(128, 64)).await.expect("start")
    };
    // The sandbox outlives its driver.
    let d2 = env.driver();
    // Before adoption the slot is not handed out again.
    let other = d2.start(&env.spec(128, 64)).await.expect("start other");
    assert_ne!(other.slot, h.slot);

    let mut wrong = h.clone();
    wrong.pid_start_time += 1;
    assert!(!d2.adopt(&wrong).await);
    assert!(d2.adopt(&h).await);
    assert!(d2.adopt(&h).await, "adopting twice is harmless");
    assert_eq!(ask(&d2, &h, "ping").await, "pong");
    assert!(d2.usage(&h).await.unwrap().pids_current >= 1);

    // Reclaim keeps what it is told to keep and stops the rest.
    assert_eq!(
        d2.reclaim_orphans(std::slice::from_ref(&h)).await.unwrap(),
        1
    );
    assert!(matches!(
        d2.connect(&other).await,
        Err(DriverError::NotRunning)
    ));
    assert_eq!(ask(&d2, &h, "ping").await, "pong");

    d2.stop(&h).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), d2.wait(&h))
        .await
        .unwrap();
    assert!(!d2.adopt(&h).await, "a stopped sandbox cannot be adopted");
    env.assert_clean();
}

#[requires(Root, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_stop_loop_leaves_nothing_behind() {
    let rounds: usize = std::env::var("BULKHEAD_JAIL_LOOP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let env = Env::new();
    let d = env.driver();
    let spec = env.spec(128, 64);
    let (mut starts, mut stops) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let t = Instant::now();
        let h = d
            .start(&spec)
            .await
            .unwrap_or_else(|e| panic!("start #{i}: {e}"));
        starts.push(t.elapsed());
        let t = Instant::now();
        d.stop(&h)
            .await
            .unwrap_or_else(|e| panic!("stop #{i}: {e}"));
        stops.push(t.elapsed());
        if i % 50 == 0 {
            env.assert_clean();
        }
    }
    env.assert_clean();
    // One reusable idmapped lower, nothing else mounted.
    assert_eq!(env.mounts().len(), 1, "{:?}", env.mounts());
    let _ = writeln!(
        std::io::stderr(),
        "jail {} (cgroup {})",
        stats("start (until the agent accepts)", starts),
        d.cgroup_version()
    );
    let _ = writeln!(
        std::io::stderr(),
        "jail {}",
        stats("stop (kill, reap, rmdir cgroups, rm slot)", stops)
    );
    d.prune_lowers().unwrap();
    assert!(env.mounts().is_empty());
}

#[requires(Root, Tun, "a host the jail driver supports")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_link_dns_config_and_trust_bundle() {
    let mut env = Env::new();
    // The template's own bundle is an absolute symlink: it must be read inside the template.
    let certs = env.rootfs.join("etc/ssl/certs");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::create_dir_all(env.rootfs.join("usr/share/ca")).unwrap();
    std::fs::write(
        env.rootfs.join("usr/share/ca/bundle.pem"),
        "TEMPLATE-ROOTS\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "/usr/share/ca/bundle.pem",
        certs.join("ca-certificates.crt"),
    )
    .unwrap();
    env.cfg.sandbox_ca_pem = Some("DEPLOYMENT-CA\n".into());
    env.cfg.nameserver = Some(std::net::Ipv4Addr::new(10, 200, 0, 1));
    let d = env.driver();
    let h = d.start(&env.spec(128, 64)).await.expect("start");

    let (_, out) = sh(&d, &h, "cat /etc/resolv.conf").await;
    assert!(out.starts_with("nameserver 10.200.0.1\n"), "{out}");
    // Editable inside (E2B users write their own resolvers), unlike the trust bundle.
    let (st, _) = sh(&d, &h, "echo '# mine' >> /etc/resolv.conf").await;
    assert_eq!(st, "exit 0");
    let (_, out) = sh(&d, &h, "cat /etc/ssl/certs/ca-certificates.crt").await;
    assert_eq!(out, "TEMPLATE-ROOTS\nDEPLOYMENT-CA\n");
    let (st, _) = sh(&d, &h, "echo x >> /etc/ssl/certs/ca-certificates.crt").await;
    assert_ne!(st, "exit 0", "the trust bundle must not be writable");

    // No link until asked; then eth0 exists only inside the sandbox.
    let (_, out) = sh(&d, &h, "cat /proc/net/dev").await;
    assert!(!out.contains("eth0"), "{out}");
    let tun = d.open_network(&h).await.expect("open_network");
    let (_, out) = sh(&d, &h, "cat /proc/net/dev").await;
    assert!(out.contains("eth0"), "{out}");
    let (_, route) = sh(&d, &h, "cat /proc/net/route").await;
    assert!(
        route.lines().any(|l| l.starts_with("eth0\t00000000")),
        "no default route: {route}"
    );
    // Closing the host's end removes the device.
    drop(tun);
    let (_, out) = sh(&d, &h, "cat /proc/net/dev").await;
    assert!(!out.contains("eth0"), "{out}");

    d.stop(&h).await.unwrap();
    assert!(matches!(
        d.open_network(&h).await,
        Err(DriverError::NotRunning)
    ));
    env.assert_clean();
}
