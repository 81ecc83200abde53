use super::*;

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn files() -> QemuFiles {
    QemuFiles {
        binary: "/usr/bin/qemu-system-x86_64".into(),
        libs: vec![
            "/lib/x86_64-linux-gnu/libz.so.1".into(),
            "/lib64/ld-linux-x86-64.so.2".into(),
        ],
        dirs: vec!["/usr/share/qemu".into()],
    }
}

fn spec(accel: Accel) -> VmSpec {
    crate::qemu::sample_spec(accel)
}

fn binds(steps: &[Step]) -> Vec<(String, bool, bool, bool)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Bind {
                target,
                writable,
                exec,
                dev,
                ..
            } => Some((
                target.to_string_lossy().into_owned(),
                *writable,
                *exec,
                *dev,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn ldd_output_is_parsed_into_paths() {
    let out = "\tlinux-vdso.so.1 (0x00007ffc)\n\
               \tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f)\n\
               \tlibmissing.so => not found\n\
               \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
    assert_eq!(
        parse_ldd(out),
        vec![
            PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
            PathBuf::from("/lib64/ld-linux-x86-64.so.2")
        ]
    );
}

#[test]
fn the_root_holds_only_qemus_files_read_only_and_its_slot_writable() {
    let steps = plan(
        Path::new("/st/root"),
        &files(),
        &spec(Accel::Tcg),
        Path::new("/st/s/3"),
    )
    .unwrap();
    assert_eq!(steps[0], Step::MakePrivate);
    assert_eq!(
        steps[1],
        Step::Tmpfs {
            target: c("/st/root")
        }
    );
    let b = binds(&steps);
    let expect = |t: &str, w: bool, x: bool, d: bool| (t.to_owned(), w, x, d);
    assert_eq!(
        b,
        vec![
            expect("/st/root/usr/bin/qemu-system-x86_64", false, true, false),
            expect(
                "/st/root/lib/x86_64-linux-gnu/libz.so.1",
                false,
                true,
                false
            ),
            expect("/st/root/lib64/ld-linux-x86-64.so.2", false, true, false),
            expect("/st/root/usr/share/qemu", false, true, false),
            expect("/st/root/k/bzImage", false, false, false),
            expect("/st/root/c/boot.ext4", false, false, false),
            expect("/st/root/c/root.erofs", false, false, false),
            expect("/st/root/dev/null", true, false, true),
            expect("/st/root/dev/urandom", false, false, true),
            expect("/st/root/st/s/3", true, false, false),
        ]
    );
    // Directories before what is mounted in them, each once; files get an empty file to
    // bind onto.
    let pos = |want: &Step| steps.iter().position(|s| s == want).unwrap();
    assert!(
        pos(&Step::Mkdir {
            path: c("/st/root/usr")
        }) < pos(&Step::Mkdir {
            path: c("/st/root/usr/bin")
        })
    );
    assert_eq!(
        steps
            .iter()
            .filter(|s| **s
                == Step::Mkdir {
                    path: c("/st/root/usr")
                })
            .count(),
        1
    );
    assert!(steps.contains(&Step::Touch {
        path: c("/st/root/usr/bin/qemu-system-x86_64")
    }));
    assert!(steps.contains(&Step::Mkdir {
        path: c("/st/root/st/s/3")
    }));
    // Nothing is mounted after the pivot but the root's own read-only remount.
    let n = steps.len();
    assert_eq!(
        &steps[n - 2..],
        &[
            Step::PivotRoot {
                new_root: c("/st/root")
            },
            Step::RootReadOnly
        ]
    );
}

#[test]
fn kvm_adds_dev_kvm_and_tcg_does_not() {
    let has_kvm = |a| {
        let steps = plan(Path::new("/r"), &files(), &spec(a), Path::new("/s/3")).unwrap();
        binds(&steps)
            .iter()
            .any(|(t, w, _, d)| t == "/r/dev/kvm" && *w && *d)
    };
    assert!(has_kvm(Accel::Kvm));
    assert!(!has_kvm(Accel::Tcg));
}

#[test]
fn a_template_vm_gets_its_snapshot_staging_dir_writable_and_no_proc() {
    let mut s = spec(Accel::Tcg);
    s.memory_file = Some(crate::qemu::MemoryFile {
        path: Some("/c/microvm/snap-k.1-0.tmp/ram".into()),
        shared: true,
    });
    let steps = plan(Path::new("/r"), &files(), &s, Path::new("/s/3")).unwrap();
    assert!(
        binds(&steps).contains(&("/r/c/microvm/snap-k.1-0.tmp".to_owned(), true, false, false)),
        "{steps:?}"
    );
    assert!(!steps.iter().any(|s| matches!(s, Step::Proc { .. })));
}

#[test]
fn a_clone_gets_a_proc_for_its_inherited_ram_fd_and_no_other_writable_dir() {
    let mut s = spec(Accel::Tcg);
    s.memory_file = Some(crate::qemu::MemoryFile {
        path: Some("/proc/self/fd/7".into()),
        shared: false,
    });
    let steps = plan(Path::new("/r"), &files(), &s, Path::new("/s/3")).unwrap();
    let pos = |want: &Step| steps.iter().position(|s| s == want).unwrap();
    let proc = pos(&Step::Proc {
        target: c("/r/proc"),
    });
    assert!(pos(&Step::Mkdir { path: c("/r/proc") }) < proc);
    assert!(proc < pos(&Step::PivotRoot { new_root: c("/r") }));
    let writable: Vec<String> = binds(&steps)
        .into_iter()
        .filter(|b| b.1)
        .map(|b| b.0)
        .collect();
    assert_eq!(writable, vec!["/r/dev/null", "/r/s/3"]);
    // A checkpoint restore (anonymous RAM under the backend id) needs neither.
    s.memory_file = Some(crate::qemu::MemoryFile {
        path: None,
        shared: false,
    });
    let steps = plan(Path::new("/r"), &files(), &s, Path::new("/s/3")).unwrap();
    assert!(!steps.iter().any(|s| matches!(s, Step::Proc { .. })));
}

#[test]
fn a_file_listed_twice_is_mounted_once() {
    let mut f = files();
    f.libs.push("/lib/x86_64-linux-gnu/libz.so.1".into());
    let steps = plan(Path::new("/r"), &f, &spec(Accel::Tcg), Path::new("/s/3")).unwrap();
    let b = binds(&steps);
    assert_eq!(
        b.iter()
            .filter(|(t, ..)| t == "/r/lib/x86_64-linux-gnu/libz.so.1")
            .count(),
        1
    );
}

#[test]
fn limits_cover_the_guest_ram_plus_qemus_overhead() {
    let l = limits(512, 2);
    assert_eq!(l.memory_bytes, (512 + OVERHEAD_MB) << 20);
    assert_eq!(l.pids_max, PIDS_OVERHEAD + 2);
    assert_eq!(l.cpu_quota_us, Some(2 * CPU_PERIOD_US));
}

/// Records the calls; `fork` answers with `parent` (the intermediate) or the child.
#[derive(Default)]
struct Fake {
    calls: Vec<String>,
    parent: bool,
    fail_mount: Option<usize>,
    mounts: usize,
}

impl JailSys for Fake {
    fn setsid(&mut self) -> io::Result<()> {
        self.calls.push("setsid".into());
        Ok(())
    }
    fn join_cgroup(&mut self, procs: &CStr) -> io::Result<()> {
        self.calls.push(format!("join {}", procs.to_string_lossy()));
        Ok(())
    }
    fn unshare(&mut self, flags: libc::c_int) -> io::Result<()> {
        let mut names = Vec::new();
        for (f, n) in [
            (libc::CLONE_NEWNS, "ns"),
            (libc::CLONE_NEWPID, "pid"),
            (libc::CLONE_NEWUSER, "user"),
            (libc::CLONE_NEWNET, "net"),
            (libc::CLONE_NEWIPC, "ipc"),
            (libc::CLONE_NEWUTS, "uts"),
        ] {
            if flags & f != 0 {
                names.push(n);
            }
        }
        self.calls.push(format!("unshare {}", names.join(",")));
        Ok(())
    }
    fn fork(&mut self) -> io::Result<Forked> {
        self.calls.push("fork".into());
        Ok(if self.parent {
            Forked::Parent { child: 4242 }
        } else {
            Forked::Child
        })
    }
    fn report_and_exit(&mut self, fd: RawFd, child: libc::pid_t) {
        self.calls.push(format!("report {child} on {fd}"));
    }
    fn mount(&mut self, step: &Step) -> io::Result<()> {
        self.mounts += 1;
        if self.fail_mount == Some(self.mounts) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        self.calls.push(format!("mount {step:?}"));
        Ok(())
    }
    fn set_ids(&mut self, uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()> {
        self.calls.push(format!("ids {uid} {gid} {groups:?}"));
        Ok(())
    }
    fn no_new_privs(&mut self) -> io::Result<()> {
        self.calls.push("nnp".into());
        Ok(())
    }
}

fn jail() -> Jail {
    Jail {
        steps: vec![Step::MakePrivate, Step::PivotRoot { new_root: c("/r") }],
        cgroup_procs: vec![c("/cg/memory/x/cgroup.procs"), c("/cg/pids/x/cgroup.procs")],
        uid: 1000,
        gid: 1000,
        groups: vec![],
        pid_fd: 9,
    }
}

#[test]
fn qemu_joins_its_cgroup_before_the_fork_and_drops_ids_after_the_pivot() {
    let mut f = Fake::default();
    enter(&jail(), &mut f).unwrap();
    assert_eq!(
        f.calls,
        vec![
            "setsid",
            "join /cg/memory/x/cgroup.procs",
            "join /cg/pids/x/cgroup.procs",
            "unshare ns,pid",
            "fork",
            "mount MakePrivate",
            "mount PivotRoot { new_root: \"/r\" }",
            "ids 1000 1000 []",
            "unshare user,net,ipc,uts",
            "nnp",
        ]
    );
}

#[test]
fn the_intermediate_reports_qemus_pid_and_does_nothing_else() {
    let mut f = Fake {
        parent: true,
        ..Fake::default()
    };
    enter(&jail(), &mut f).unwrap();
    assert_eq!(f.calls.last().unwrap(), "report 4242 on 9");
    assert!(
        !f.calls
            .iter()
            .any(|c| c.starts_with("mount") || c.starts_with("ids"))
    );
}

#[test]
fn a_failed_mount_stops_before_qemu_runs() {
    let mut f = Fake {
        fail_mount: Some(2),
        ..Fake::default()
    };
    let e = enter(&jail(), &mut f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    assert!(!f.calls.iter().any(|c| c.starts_with("ids") || c == "nnp"));
}

#[test]
fn a_bare_program_name_is_resolved_through_path() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("qemu-test");
    fs::write(&bin, "").unwrap();
    let link = dir.path().join("qemu-link");
    std::os::unix::fs::symlink(&bin, &link).unwrap();
    let canon = fs::canonicalize(&bin).unwrap();
    assert_eq!(
        resolve_program(Path::new("qemu-link"), dir.path().as_os_str()),
        Some(canon.clone())
    );
    assert_eq!(resolve_program(&link, OsStr::new("")), Some(canon));
    assert_eq!(
        resolve_program(Path::new("nope"), dir.path().as_os_str()),
        None
    );
}
