//! The sandbox's filesystem as data: [`plan`] turns a [`StartSpec`] into an ordered list of
//! [`Step`]s and [`apply`] executes them through a [`MountSys`], so the construction and the
//! conditional logic are unit-tested with a recording fake and no privileges.
//!
//! Paths before [`Step::PivotRoot`] are host paths inside the new mount namespace (the new root
//! is `spec.merged`); paths after it are sandbox paths.

use std::io;
use std::path::{Path, PathBuf};

use crate::spec::StartSpec;

/// Where the agent binary and its socket directory appear inside the sandbox.
pub const AGENT_PATH: &str = "/run/bulkhead/agent";
pub const SOCK_DIR: &str = "/run/bulkhead/sock";
pub const SOCK_NAME: &str = "agent.sock";
/// The agent's stdout/stderr go here (inside the socket directory, so the host can show the
/// tail when an agent dies during start).
pub const AGENT_LOG: &str = "/run/bulkhead/sock/agent.log";

/// The system CA bundle path OpenSSL, curl, Python (`SSL_CERT_FILE`) and Node
/// (`NODE_EXTRA_CA_CERTS`) read on Debian-family templates.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Devices bind-mounted from the host into the sandbox's tmpfs `/dev`.
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// `/proc` files hidden behind `/dev/null` (kernel internals, host-wide information).
pub const MASKED_PROC_FILES: [&str; 7] = [
    "keys",
    "timer_list",
    "kcore",
    "sysrq-trigger",
    "sched_debug",
    "latency_stats",
    "timer_stats",
];
/// `/proc` directories hidden behind an empty read-only tmpfs (host hardware).
pub const MASKED_PROC_DIRS: [&str; 4] = ["acpi", "scsi", "asound", "firmware"];
/// `/proc` subtrees made read-only (kernel tunables).
pub const READONLY_PROC: [&str; 4] = ["sys", "bus", "fs", "irq"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Make every mount private so nothing we do propagates back to the host.
    PrivateRoot,
    Overlay {
        lower: PathBuf,
        upper: PathBuf,
        work: PathBuf,
        target: PathBuf,
        /// `volatile`: no syncs of the upper filesystem (see `StartSpec::volatile_upper`).
        volatile: bool,
    },
    Mkdir {
        path: PathBuf,
        mode: u32,
    },
    /// Create an empty file to bind a file onto.
    Touch {
        path: PathBuf,
    },
    Symlink {
        target: PathBuf,
        link: PathBuf,
    },
    Mount {
        fstype: String,
        target: PathBuf,
        flags: u64,
        data: String,
    },
    Bind {
        source: PathBuf,
        target: PathBuf,
    },
    ReadOnly {
        target: PathBuf,
        recursive: bool,
    },
    /// `pivot_root` into `new_root` and lazily detach the old root.
    PivotRoot {
        new_root: PathBuf,
    },
    /// Hide a file (if it exists) behind `/dev/null`.
    MaskFile {
        path: PathBuf,
    },
    /// Hide a directory (if it exists) behind an empty read-only tmpfs.
    MaskDir {
        path: PathBuf,
    },
    /// Make an existing subtree read-only (bind onto itself, then `MOUNT_ATTR_RDONLY`).
    ReadOnlyIfExists {
        path: PathBuf,
    },
    /// Bind a host file read-only over a file of the new root, creating it if missing. A
    /// symlink there is replaced first: before `pivot_root` an absolute link would resolve
    /// against the host's root and the bind would land outside the sandbox's view.
    BindFileReadOnly {
        source: PathBuf,
        target: PathBuf,
    },
    /// Attach volume number `index` of the spec (prepared by the launcher) at `target`, a
    /// sandbox path, creating its directories without following any symlink.
    AttachVolume {
        index: usize,
        target: PathBuf,
    },
}

const NOSUID: u64 = libc::MS_NOSUID;
const NODEV: u64 = libc::MS_NODEV;
const NOEXEC: u64 = libc::MS_NOEXEC;

/// Build the mount plan for one sandbox.
pub fn plan(spec: &StartSpec) -> Vec<Step> {
    let root = &spec.merged;
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let mut s = vec![
        Step::PrivateRoot,
        Step::Overlay {
            lower: spec.lower.clone(),
            upper: spec.upper.clone(),
            work: spec.work.clone(),
            target: root.clone(),
            volatile: spec.volatile_upper,
        },
        Step::Mkdir {
            path: at("proc"),
            mode: 0o555,
        },
        Step::Mount {
            fstype: "proc".into(),
            target: at("proc"),
            flags: NOSUID | NODEV | NOEXEC,
            data: String::new(),
        },
        Step::Mkdir {
            path: at("dev"),
            mode: 0o755,
        },
        Step::Mount {
            fstype: "tmpfs".into(),
            target: at("dev"),
            flags: NOSUID | NOEXEC,
            data: "mode=755,size=64k".into(),
        },
    ];
    for dev in DEVICES {
        let target = at(&format!("dev/{dev}"));
        s.push(Step::Touch {
            path: target.clone(),
        });
        s.push(Step::Bind {
            source: Path::new("/dev").join(dev),
            target,
        });
    }
    s.extend([
        Step::Mkdir {
            path: at("dev/pts"),
            mode: 0o755,
        },
        Step::Mount {
            fstype: "devpts".into(),
            target: at("dev/pts"),
            flags: NOSUID | NOEXEC,
            data: "newinstance,ptmxmode=0666,mode=0620,gid=5".into(),
        },
        Step::Symlink {
            target: "pts/ptmx".into(),
            link: at("dev/ptmx"),
        },
        Step::Symlink {
            target: "/proc/self/fd".into(),
            link: at("dev/fd"),
        },
        Step::Symlink {
            target: "/proc/self/fd/0".into(),
            link: at("dev/stdin"),
        },
        Step::Symlink {
            target: "/proc/self/fd/1".into(),
            link: at("dev/stdout"),
        },
        Step::Symlink {
            target: "/proc/self/fd/2".into(),
            link: at("dev/stderr"),
        },
        Step::Mkdir {
            path: at("dev/shm"),
            mode: 0o1777,
        },
        Step::Mount {
            fstype: "tmpfs".into(),
            target: at("dev/shm"),
            flags: NOSUID | NODEV,
            data: format!("mode=1777,size={}m", spec.shm_size_mb.max(1)),
        },
        // `/tmp` is on the sandbox's disk, as on E2B: it survives a filesystem-only pause,
        // counts against `diskSizeMB` (not memory), and a restore brings it back as written
        // (a tmpfs would be dumped into CRIU's images, mtimes cut to whole seconds).
        Step::Mkdir {
            path: at("tmp"),
            mode: 0o1777,
        },
        Step::Mkdir {
            path: at("run"),
            mode: 0o755,
        },
        Step::Mount {
            fstype: "tmpfs".into(),
            target: at("run"),
            flags: NOSUID | NODEV,
            data: "mode=755,size=64m".into(),
        },
        Step::Mkdir {
            path: at("run/bulkhead/sock"),
            mode: 0o755,
        },
        Step::Touch {
            path: at(AGENT_PATH),
        },
        Step::Bind {
            source: spec.agent_binary.clone(),
            target: at(AGENT_PATH),
        },
        Step::ReadOnly {
            target: at(AGENT_PATH),
            recursive: false,
        },
        Step::Bind {
            source: spec.sock_dir.clone(),
            target: at(SOCK_DIR),
        },
        // /sys is never mounted: an empty read-only tmpfs hides whatever the image holds.
        Step::Mkdir {
            path: at("sys"),
            mode: 0o555,
        },
        Step::Mount {
            fstype: "tmpfs".into(),
            target: at("sys"),
            flags: libc::MS_RDONLY | NOSUID | NODEV | NOEXEC,
            data: "mode=555,size=4k".into(),
        },
    ]);
    if let Some(bundle) = &spec.ca_bundle {
        s.push(Step::BindFileReadOnly {
            source: bundle.clone(),
            target: at(CA_BUNDLE),
        });
    }
    s.push(Step::PivotRoot {
        new_root: root.clone(),
    });
    for p in READONLY_PROC {
        s.push(Step::ReadOnlyIfExists {
            path: Path::new("/proc").join(p),
        });
    }
    for f in MASKED_PROC_FILES {
        s.push(Step::MaskFile {
            path: Path::new("/proc").join(f),
        });
    }
    for d in MASKED_PROC_DIRS {
        s.push(Step::MaskDir {
            path: Path::new("/proc").join(d),
        });
    }
    // `/proc` and `/dev` take no writes (as `/sys`): the sandbox's Landlock ruleset allows
    // everything beneath `/` so that new top-level directories work as on E2B, and these
    // mounts are what keeps procfs files and the device directory unwritable, to every process
    // and across a restore. Device nodes stay usable (a read-only mount refuses writes to
    // files, not I/O on devices); `/dev/pts` and `/dev/shm` are mounts of their own.
    for target in ["/proc", "/dev"] {
        s.push(Step::ReadOnly {
            target: PathBuf::from(target),
            recursive: false,
        });
    }
    // Last, inside the sandbox's own root: a symlink planted in the upper layer (a resumed
    // sandbox) can only point within the sandbox, and attaching refuses to follow any.
    for (index, v) in spec.volumes.iter().enumerate() {
        s.push(Step::AttachVolume {
            index,
            target: PathBuf::from(&v.target),
        });
    }
    s
}

/// The privileged operations a plan needs; the real implementation is in the launcher's child.
pub trait MountSys {
    fn exists(&self, path: &Path) -> bool;
    fn is_dir(&self, path: &Path) -> bool;
    fn mkdir_all(&mut self, path: &Path, mode: u32) -> io::Result<()>;
    fn touch(&mut self, path: &Path) -> io::Result<()>;
    fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()>;
    /// `mount(source, target, fstype, flags, data)`; `fstype` None with `MS_BIND`.
    fn mount(
        &mut self,
        source: &str,
        target: &Path,
        fstype: Option<&str>,
        flags: u64,
        data: &str,
    ) -> io::Result<()>;
    fn set_readonly(&mut self, target: &Path, recursive: bool) -> io::Result<()>;
    fn pivot_root(&mut self, new_root: &Path) -> io::Result<()>;
    /// Is `path` itself a symlink (not followed)?
    fn is_symlink(&self, path: &Path) -> bool;
    fn unlink(&mut self, path: &Path) -> io::Result<()>;
    /// Create `target`'s directories (never following a symlink) and attach the prepared
    /// volume mount number `index` there.
    fn attach_volume(&mut self, index: usize, target: &Path) -> io::Result<()>;
}

/// Which step failed and why; the launcher sends this to its parent verbatim.
#[derive(Debug)]
pub struct StepError {
    pub step: String,
    pub source: io::Error,
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.source)
    }
}

/// Run a plan. Optional steps (masks of entries this kernel lacks) are skipped silently.
pub fn apply(plan: &[Step], sys: &mut dyn MountSys) -> Result<(), StepError> {
    for step in plan {
        apply_one(step, sys).map_err(|source| StepError {
            step: describe(step),
            source,
        })?;
    }
    Ok(())
}

fn apply_one(step: &Step, sys: &mut dyn MountSys) -> io::Result<()> {
    match step {
        Step::PrivateRoot => sys.mount(
            "none",
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            "",
        ),
        Step::Overlay {
            lower,
            upper,
            work,
            target,
            volatile,
        } => {
            let mut data = format!(
                "lowerdir={},upperdir={},workdir={},userxattr",
                escape_overlay(lower),
                escape_overlay(upper),
                escape_overlay(work)
            );
            if *volatile {
                data.push_str(",volatile");
            }
            sys.mount("overlay", target, Some("overlay"), 0, &data)
        }
        Step::Mkdir { path, mode } => {
            if sys.is_dir(path) {
                Ok(())
            } else {
                sys.mkdir_all(path, *mode)
            }
        }
        Step::Touch { path } => {
            if sys.exists(path) {
                Ok(())
            } else {
                sys.touch(path)
            }
        }
        Step::Symlink { target, link } => sys.symlink(target, link),
        Step::Mount {
            fstype,
            target,
            flags,
            data,
        } => sys.mount(fstype, target, Some(fstype), *flags, data),
        Step::Bind { source, target } => {
            let src = source.to_string_lossy();
            sys.mount(&src, target, None, libc::MS_BIND, "")
        }
        Step::ReadOnly { target, recursive } => sys.set_readonly(target, *recursive),
        Step::PivotRoot { new_root } => sys.pivot_root(new_root),
        Step::MaskFile { path } => {
            if !sys.exists(path) || sys.is_dir(path) {
                return Ok(());
            }
            sys.mount("/dev/null", path, None, libc::MS_BIND, "")
        }
        Step::MaskDir { path } => {
            if !sys.is_dir(path) {
                return Ok(());
            }
            sys.mount(
                "tmpfs",
                path,
                Some("tmpfs"),
                libc::MS_RDONLY | NOSUID | NODEV | NOEXEC,
                "mode=555,size=4k",
            )
        }
        Step::BindFileReadOnly { source, target } => {
            if sys.is_symlink(target) {
                sys.unlink(target)?;
            }
            if !sys.exists(target) {
                sys.touch(target)?;
            }
            sys.mount(&source.to_string_lossy(), target, None, libc::MS_BIND, "")?;
            sys.set_readonly(target, false)
        }
        Step::ReadOnlyIfExists { path } => {
            if !sys.exists(path) {
                return Ok(());
            }
            let src = path.to_string_lossy().into_owned();
            sys.mount(&src, path, None, libc::MS_BIND | libc::MS_REC, "")?;
            sys.set_readonly(path, true)
        }
        Step::AttachVolume { index, target } => sys.attach_volume(*index, target),
    }
}

/// Overlay options are comma-separated and `:` separates lower layers: escape both.
fn escape_overlay(p: &Path) -> String {
    let s = p.to_string_lossy();
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, ',' | ':' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn describe(step: &Step) -> String {
    match step {
        Step::PrivateRoot => "make / rprivate".into(),
        Step::Overlay { target, .. } => format!("mount overlay on {}", target.display()),
        Step::Mkdir { path, .. } => format!("mkdir {}", path.display()),
        Step::Touch { path } => format!("create {}", path.display()),
        Step::Symlink { link, .. } => format!("symlink {}", link.display()),
        Step::Mount { fstype, target, .. } => format!("mount {fstype} on {}", target.display()),
        Step::Bind { source, target } => {
            format!("bind {} on {}", source.display(), target.display())
        }
        Step::ReadOnly { target, .. } => format!("make {} read-only", target.display()),
        Step::PivotRoot { new_root } => format!("pivot_root into {}", new_root.display()),
        Step::MaskFile { path } | Step::MaskDir { path } => format!("mask {}", path.display()),
        Step::ReadOnlyIfExists { path } => format!("make {} read-only", path.display()),
        Step::BindFileReadOnly { source, target } => {
            format!(
                "bind {} read-only on {}",
                source.display(),
                target.display()
            )
        }
        Step::AttachVolume { index, target } => {
            format!("attach volume {index} at {}", target.display())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn spec() -> StartSpec {
        StartSpec {
            uid_base: 1_000_000,
            id_count: 65536,
            lower: "/j/l/0-abc".into(),
            upper: "/j/s/0/upper".into(),
            work: "/j/s/0/work".into(),
            merged: "/j/s/0/merged".into(),
            sock_dir: "/j/s/0/sock".into(),
            agent_binary: "/opt/agent".into(),
            argv: vec![AGENT_PATH.into()],
            env: vec![],
            hostname: "sandbox".into(),
            cgroup_procs: vec![],
            shm_size_mb: 32,
            volatile_upper: true,
            nproc_limit: None,
            ca_bundle: None,
            volumes: Vec::new(),
        }
    }

    /// Records calls; pretends a fixed set of paths exist.
    #[derive(Default)]
    struct Recorder {
        existing: BTreeSet<PathBuf>,
        dirs: BTreeSet<PathBuf>,
        links: BTreeSet<PathBuf>,
        calls: Vec<String>,
        fail_on: Option<String>,
    }

    impl Recorder {
        fn log(&mut self, call: String) -> io::Result<()> {
            let fail = self
                .fail_on
                .as_ref()
                .is_some_and(|f| call.contains(f.as_str()));
            self.calls.push(call);
            if fail {
                Err(io::Error::from_raw_os_error(libc::EPERM))
            } else {
                Ok(())
            }
        }
    }

    impl MountSys for Recorder {
        fn exists(&self, path: &Path) -> bool {
            self.existing.contains(path) || self.dirs.contains(path)
        }
        fn is_dir(&self, path: &Path) -> bool {
            self.dirs.contains(path)
        }
        fn mkdir_all(&mut self, path: &Path, mode: u32) -> io::Result<()> {
            self.dirs.insert(path.to_owned());
            self.log(format!("mkdir {} {mode:o}", path.display()))
        }
        fn touch(&mut self, path: &Path) -> io::Result<()> {
            self.existing.insert(path.to_owned());
            self.log(format!("touch {}", path.display()))
        }
        fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()> {
            self.log(format!(
                "symlink {} -> {}",
                link.display(),
                target.display()
            ))
        }
        fn mount(
            &mut self,
            source: &str,
            target: &Path,
            fstype: Option<&str>,
            flags: u64,
            data: &str,
        ) -> io::Result<()> {
            self.log(format!(
                "mount {source} {} {} {flags:#x} {data}",
                target.display(),
                fstype.unwrap_or("-")
            ))
        }
        fn set_readonly(&mut self, target: &Path, recursive: bool) -> io::Result<()> {
            self.log(format!("ro {} {recursive}", target.display()))
        }
        fn pivot_root(&mut self, new_root: &Path) -> io::Result<()> {
            self.log(format!("pivot {}", new_root.display()))
        }
        fn is_symlink(&self, path: &Path) -> bool {
            self.links.contains(path)
        }
        fn unlink(&mut self, path: &Path) -> io::Result<()> {
            self.links.remove(path);
            self.log(format!("unlink {}", path.display()))
        }
        fn attach_volume(&mut self, index: usize, target: &Path) -> io::Result<()> {
            self.log(format!("volume {index} {}", target.display()))
        }
    }

    #[test]
    fn volumes_attach_last_at_sandbox_paths() {
        let mut s = spec();
        s.volumes = vec![
            crate::spec::VolumeBind {
                source: "/v/a/mnt".into(),
                target: "/mnt/a".into(),
            },
            crate::spec::VolumeBind {
                source: "/v/b/mnt".into(),
                target: "/home/user/b".into(),
            },
        ];
        let mut r = Recorder::default();
        apply(&plan(&s), &mut r).unwrap();
        let c = &r.calls;
        let pivot = position(c, "pivot /j/s/0/merged");
        let a = position(c, "volume 0 /mnt/a");
        let b = position(c, "volume 1 /home/user/b");
        // After pivot_root and after every /proc mask: the targets are sandbox paths.
        assert!(pivot < a && a < b && b == c.len() - 1, "{c:#?}");
        assert!(
            !c.iter().any(|x| x.contains("/v/a/mnt")),
            "host path used in the plan"
        );
        assert!(
            plan(&spec())
                .iter()
                .all(|s| !matches!(s, Step::AttachVolume { .. }))
        );
    }

    fn position(calls: &[String], needle: &str) -> usize {
        calls
            .iter()
            .position(|c| c.contains(needle))
            .unwrap_or_else(|| panic!("no call containing {needle:?} in {calls:#?}"))
    }

    #[test]
    fn plan_orders_overlay_devices_and_pivot() {
        let mut r = Recorder::default();
        // Pretend the kernel has /proc/keys and /proc/acpi but not the others.
        r.existing.insert("/proc/keys".into());
        r.dirs.insert("/proc/acpi".into());
        r.dirs.insert("/proc/sys".into());
        apply(&plan(&spec()), &mut r).unwrap();
        let c = &r.calls;

        assert!(c[0].starts_with("mount none / - 0x44000"), "{}", c[0]); // MS_REC|MS_PRIVATE
        let overlay = position(c, "mount overlay /j/s/0/merged overlay");
        assert!(c[overlay].ends_with(
            "lowerdir=/j/l/0-abc,upperdir=/j/s/0/upper,workdir=/j/s/0/work,userxattr,volatile"
        ));
        let proc_ = position(c, "mount proc /j/s/0/merged/proc proc");
        let dev = position(c, "mount tmpfs /j/s/0/merged/dev tmpfs");
        let null = position(c, "mount /dev/null /j/s/0/merged/dev/null");
        let pivot = position(c, "pivot /j/s/0/merged");
        assert!(overlay < proc_ && proc_ < dev && dev < null && null < pivot);
        for d in DEVICES {
            position(c, &format!("mount /dev/{d} /j/s/0/merged/dev/{d} - 0x1000"));
        }
        assert!(c[position(c, "devpts")].contains("newinstance,ptmxmode=0666"));
        position(c, "symlink /j/s/0/merged/dev/ptmx -> pts/ptmx");
        position(c, "symlink /j/s/0/merged/dev/fd -> /proc/self/fd");
        assert!(
            !c.iter().any(|l| l.contains("merged/tmp tmpfs")),
            "/tmp is on the disk"
        );
        assert!(c[position(c, "merged/dev/shm tmpfs")].ends_with("size=32m"));
        let agent_bind = position(c, "mount /opt/agent /j/s/0/merged/run/bulkhead/agent");
        let agent_ro = position(c, "ro /j/s/0/merged/run/bulkhead/agent false");
        assert!(position(c, "merged/run tmpfs") < agent_bind && agent_bind < agent_ro);
        position(c, "mount /j/s/0/sock /j/s/0/merged/run/bulkhead/sock");
        assert!(c[position(c, "merged/sys tmpfs")].contains(" 0xf ")); // MS_RDONLY|NOSUID|NODEV|NOEXEC

        // After the pivot: /proc masks only for entries that exist.
        let keys = position(c, "mount /dev/null /proc/keys");
        assert!(keys > pivot);
        assert!(!c.iter().any(|x| x.contains("/proc/timer_list")));
        assert!(position(c, "mount tmpfs /proc/acpi tmpfs") > pivot);
        assert!(!c.iter().any(|x| x.contains("/proc/scsi")));
        let sys_bind = position(c, "mount /proc/sys /proc/sys - 0x5000"); // MS_BIND|MS_REC
        assert!(position(c, "ro /proc/sys true") > sys_bind);
        // /proc and /dev themselves read-only, after every mount beneath them.
        let proc_ro = position(c, "ro /proc false");
        let dev_ro = position(c, "ro /dev false");
        assert!(proc_ro > keys && proc_ro > sys_bind && dev_ro > null && dev_ro > pivot);
        assert!(
            c[proc_ro..].iter().all(|x| !x.starts_with("mount")),
            "{c:#?}"
        );
    }

    #[test]
    fn ca_bundle_is_bound_read_only_before_the_pivot() {
        let mut r = Recorder::default();
        apply(&plan(&spec()), &mut r).unwrap();
        assert!(!r.calls.iter().any(|c| c.contains("ca-certificates")));

        let mut with = spec();
        with.ca_bundle = Some("/j/ca/base.pem".into());
        let target = "/j/s/0/merged/etc/ssl/certs/ca-certificates.crt";
        // A symlink in the template is replaced, a missing file created.
        let mut r = Recorder::default();
        r.links.insert(target.into());
        apply(&plan(&with), &mut r).unwrap();
        let c = &r.calls;
        let unlink = position(c, &format!("unlink {target}"));
        let touch = position(c, &format!("touch {target}"));
        let bind = position(c, &format!("mount /j/ca/base.pem {target} - 0x1000"));
        let ro = position(c, &format!("ro {target} false"));
        let pivot = position(c, "pivot /j/s/0/merged");
        assert!(
            unlink < touch && touch < bind && bind < ro && ro < pivot,
            "{c:#?}"
        );

        // An existing regular file is bound over as it is.
        let mut r = Recorder::default();
        r.existing.insert(target.into());
        apply(&plan(&with), &mut r).unwrap();
        assert!(
            !r.calls
                .iter()
                .any(|c| c.starts_with("unlink") || c.starts_with("touch /j/s/0/merged/etc"))
        );
        position(&r.calls, &format!("ro {target} false"));
    }

    #[test]
    fn existing_dirs_are_not_recreated() {
        let mut r = Recorder::default();
        r.dirs.insert("/j/s/0/merged/proc".into());
        apply(&plan(&spec()), &mut r).unwrap();
        assert!(
            !r.calls
                .iter()
                .any(|c| c.starts_with("mkdir /j/s/0/merged/proc "))
        );
        assert!(
            r.calls
                .iter()
                .any(|c| c.starts_with("mkdir /j/s/0/merged/tmp 1777"))
        );
    }

    #[test]
    fn failures_name_the_step() {
        let mut r = Recorder {
            fail_on: Some("overlay".into()),
            ..Default::default()
        };
        let err = apply(&plan(&spec()), &mut r).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("mount overlay on /j/s/0/merged: "), "{msg}");
        assert!(msg.contains("os error 1"), "{msg}");
    }

    #[test]
    fn overlay_paths_are_escaped() {
        assert_eq!(escape_overlay(Path::new("/a,b:c\\d")), "/a\\,b\\:c\\\\d");
    }
}
