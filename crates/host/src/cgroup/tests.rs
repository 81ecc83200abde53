//! Path, limit, usage and layout-detection logic of both backends, against temporary
//! directories and sample mountinfo.

use super::*;

const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

const COMOUNTED: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";

const UNIFIED: &str = "27 22 0:24 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

fn limits() -> CgroupLimits {
    CgroupLimits::new(256, 128, 2)
}

#[test]
fn limits_follow_the_spec() {
    let l = limits();
    assert_eq!(l.memory_bytes, 256 << 20);
    assert_eq!(l.pids_max, 128);
    assert_eq!(l.cpu_quota_us, Some(200_000));
    assert_eq!(l.cpu_period_us, 100_000);
    let unlimited = CgroupLimits::new(0, 0, 0);
    assert_eq!(unlimited.cpu_quota_us, None);
    assert_eq!(unlimited.pids_max, 1);
}

#[test]
fn hybrid_layout_selects_v1_with_separate_hierarchies() {
    let be = detect_from(&parse_mountinfo(HYBRID), "bulkhead", |_| "hugetlb".into()).unwrap();
    assert_eq!(be.version(), CgroupVersion::V1);
    let dirs = be.dirs("3-ab");
    assert_eq!(dirs.len(), 5);
    assert!(dirs.contains(&PathBuf::from("/sys/fs/cgroup/memory/bulkhead/3-ab")));
    assert!(dirs.contains(&PathBuf::from("/sys/fs/cgroup/cpuacct/bulkhead/3-ab")));
    assert!(dirs.contains(&PathBuf::from("/sys/fs/cgroup/freezer/bulkhead/3-ab")));
}

#[test]
fn freezers_are_found_in_the_sandbox_cgroup() {
    let hybrid = detect_from(&parse_mountinfo(HYBRID), "bulkhead", |_| String::new()).unwrap();
    assert_eq!(
        hybrid.freezer("3-ab"),
        Some(Freezer::V1 {
            state: "/sys/fs/cgroup/freezer/bulkhead/3-ab/freezer.state".into()
        })
    );
    // No freezer hierarchy mounted: nothing to freeze with.
    let comounted = detect_from(&parse_mountinfo(COMOUNTED), "bh", |_| String::new()).unwrap();
    assert_eq!(comounted.freezer("x"), None);
    let unified = detect_from(&parse_mountinfo(UNIFIED), "bh", |_| {
        "cpu memory pids".into()
    })
    .unwrap();
    assert_eq!(
        unified.freezer("x"),
        Some(Freezer::V2 {
            freeze: "/sys/fs/cgroup/bh/x/cgroup.freeze".into(),
            events: "/sys/fs/cgroup/bh/x/cgroup.events".into(),
        })
    );
}

#[test]
fn comounted_controllers_share_a_directory() {
    let be = detect_from(&parse_mountinfo(COMOUNTED), "bh", |_| String::new()).unwrap();
    let dirs = be.dirs("x");
    assert_eq!(
        dirs,
        vec![
            PathBuf::from("/sys/fs/cgroup/memory/bh/x"),
            PathBuf::from("/sys/fs/cgroup/pids/bh/x"),
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/bh/x"),
        ]
    );
}

#[test]
fn unified_layout_selects_v2_only_with_controllers() {
    let mounts = parse_mountinfo(UNIFIED);
    let be = detect_from(&mounts, "bulkhead", |_| "cpuset cpu io memory pids".into()).unwrap();
    assert_eq!(be.version(), CgroupVersion::V2);
    assert_eq!(
        be.dirs("1-x"),
        vec![PathBuf::from("/sys/fs/cgroup/bulkhead/1-x")]
    );
    let err = detect_from(&mounts, "bulkhead", |_| "hugetlb".into())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no usable cgroup hierarchy"), "{err}");
}

#[test]
fn mountinfo_escapes_are_decoded() {
    let m = parse_mountinfo("1 2 0:1 / /a\\040b rw - cgroup2 cgroup2 rw\n");
    assert_eq!(m[0].mount_point, PathBuf::from("/a b"));
}

#[test]
fn v1_writes_limits_into_each_hierarchy() {
    let t = tempfile::tempdir().unwrap();
    let mut mounts = BTreeMap::new();
    for c in V1_CONTROLLERS {
        mounts.insert(c.to_string(), t.path().join(c));
    }
    let be = V1 {
        mounts,
        parent: "bulkhead".into(),
    };
    let procs = be.create("2-aa", &limits()).unwrap();
    assert_eq!(procs.len(), 5);
    let read = |p: &str| fs::read_to_string(t.path().join(p)).unwrap();
    assert_eq!(
        read("memory/bulkhead/2-aa/memory.limit_in_bytes"),
        "268435456"
    );
    assert!(
        !t.path()
            .join("memory/bulkhead/2-aa/memory.memsw.limit_in_bytes")
            .exists()
    );
    assert_eq!(read("pids/bulkhead/2-aa/pids.max"), "128");
    assert_eq!(read("cpu/bulkhead/2-aa/cpu.cfs_quota_us"), "200000");
    assert_eq!(read("cpu/bulkhead/2-aa/cpu.cfs_period_us"), "100000");
    assert_eq!(be.list().unwrap(), vec!["2-aa".to_string()]);

    fs::write(
        t.path().join("memory/bulkhead/2-aa/memory.usage_in_bytes"),
        "5000\n",
    )
    .unwrap();
    fs::write(
        t.path().join("memory/bulkhead/2-aa/memory.stat"),
        "cache 100\ntotal_cache 300\ntotal_inactive_file 1000\n",
    )
    .unwrap();
    fs::write(
        t.path().join("cpuacct/bulkhead/2-aa/cpuacct.usage"),
        "123456789\n",
    )
    .unwrap();
    fs::write(t.path().join("pids/bulkhead/2-aa/pids.current"), "7\n").unwrap();
    let u = be.usage("2-aa").unwrap();
    assert_eq!(
        u,
        CgroupUsage {
            cpu_usage_ns: 123_456_789,
            mem_used_bytes: 4000,
            mem_cache_bytes: 300,
            mem_limit_bytes: 268_435_456,
            pids_current: 7,
        }
    );
    // A second create with the same name must fail rather than share a cgroup.
    assert!(be.create("2-aa", &limits()).is_err());
}

#[test]
fn v1_requires_core_controllers() {
    let be = V1 {
        mounts: BTreeMap::new(),
        parent: "p".into(),
    };
    let e = be.create("x", &limits()).unwrap_err();
    assert!(e.to_string().contains("memory is not mounted"), "{e}");
}

#[test]
fn v2_enables_controllers_down_the_path_and_writes_limits() {
    let t = tempfile::tempdir().unwrap();
    let be = V2 {
        root: t.path().to_owned(),
        parent: "bulkhead/sandboxes".into(),
    };
    fs::write(t.path().join("cgroup.subtree_control"), "cpu memory pids").unwrap();
    let procs = be.create("1-x", &limits()).unwrap();
    assert_eq!(
        procs,
        vec![t.path().join("bulkhead/sandboxes/1-x/cgroup.procs")]
    );
    let read = |p: &str| fs::read_to_string(t.path().join(p)).unwrap();
    // Already enabled at the root: left alone; missing below: written (the fake file keeps
    // only the last write, the kernel accumulates).
    assert_eq!(read("cgroup.subtree_control"), "cpu memory pids");
    assert_eq!(read("bulkhead/cgroup.subtree_control"), "+cpu");
    assert_eq!(read("bulkhead/sandboxes/cgroup.subtree_control"), "+cpu");
    assert_eq!(read("bulkhead/sandboxes/1-x/memory.max"), "268435456");
    assert_eq!(read("bulkhead/sandboxes/1-x/pids.max"), "128");
    assert_eq!(read("bulkhead/sandboxes/1-x/cpu.max"), "200000 100000");

    let d = t.path().join("bulkhead/sandboxes/1-x");
    fs::write(d.join("memory.current"), "9000\n").unwrap();
    fs::write(
        d.join("memory.stat"),
        "anon 5000\nfile 4000\ninactive_file 3000\n",
    )
    .unwrap();
    fs::write(d.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\n").unwrap();
    fs::write(d.join("pids.current"), "3\n").unwrap();
    let u = be.usage("1-x").unwrap();
    assert_eq!(u.cpu_usage_ns, 1_500_000);
    assert_eq!(u.mem_used_bytes, 6000);
    assert_eq!(u.mem_cache_bytes, 4000);
    assert_eq!(u.mem_limit_bytes, 268_435_456);
    assert_eq!(u.pids_current, 3);
    fs::write(d.join("memory.max"), "max\n").unwrap();
    assert_eq!(be.usage("1-x").unwrap().mem_limit_bytes, u64::MAX);
}

#[test]
fn stat_fields_match_whole_keys() {
    let s = "total_cache 5\ncache 7\n";
    assert_eq!(stat_field(s, "cache"), Some(7));
    assert_eq!(stat_field(s, "total_cache"), Some(5));
    assert_eq!(stat_field(s, "rss"), None);
}

#[test]
fn warm_sandboxes_get_the_smallest_cpu_weight_until_claimed() {
    let t = tempfile::tempdir().unwrap();
    let mut mounts = BTreeMap::new();
    for c in V1_CONTROLLERS {
        mounts.insert(c.to_string(), t.path().join(c));
    }
    let v1 = V1 {
        mounts,
        parent: "bulkhead".into(),
    };
    v1.create("0-a", &limits()).unwrap();
    let shares = t.path().join("cpu/bulkhead/0-a/cpu.shares");
    v1.set_background("0-a", true).unwrap();
    assert_eq!(fs::read_to_string(&shares).unwrap(), "2");
    v1.set_background("0-a", false).unwrap();
    assert_eq!(fs::read_to_string(&shares).unwrap(), "1024");

    let v2 = V2 {
        root: t.path().join("unified"),
        parent: "bulkhead".into(),
    };
    v2.create("0-b", &limits()).unwrap();
    let weight = t.path().join("unified/bulkhead/0-b/cpu.weight");
    v2.set_background("0-b", true).unwrap();
    assert_eq!(fs::read_to_string(&weight).unwrap(), "1");
    v2.set_background("0-b", false).unwrap();
    assert_eq!(fs::read_to_string(&weight).unwrap(), "100");
}
