//! The jailed VMM, after Firecracker's jailer: what confines each QEMU beyond its uid.
//!
//! QEMU is started in three steps, all in the forked child before `exec`:
//! 1. as root: its own session, its cgroup (memory = guest RAM + QEMU's overhead, pids, CPU),
//!    new mount and pid namespaces, then a `fork` so that QEMU is pid 1 of its pid namespace
//!    (the intermediate reports QEMU's host pid through a pipe and exits at once);
//! 2. still root, in the new mount namespace: a read-only tmpfs root holding, bind-mounted
//!    read-only, only what QEMU opens (its binary, the libraries `ldd` lists, its data and
//!    module directories, the kernel and disk images, `/dev/null`, `/dev/urandom`, `/dev/kvm`
//!    under KVM) and its slot directory read-write, at the same paths as on the host (so the
//!    command line is unchanged), then `pivot_root` into it, the host's root detached;
//! 3. the slot's uid and gid, then new user, network, IPC and UTS namespaces, `no_new_privs`.
//!
//! The mount namespace is owned by the host's user namespace, so QEMU, which only has
//! capabilities in its own user namespace, cannot unmount or remount anything in it.
//! The sequence is [`enter`] over a [`JailSys`], so its order is tested with a recording fake;
//! [`LiveSys`] makes the system calls and allocates nothing (it runs between `fork` and `exec`).

use std::ffi::{CStr, CString, OsStr};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use bulkhead_host::cgroup::{self, CPU_PERIOD_US, CgroupBackend, CgroupLimits};

use crate::qemu::{Accel, VmSpec};

/// Parent cgroup of every VM's cgroup (`<parent>/<state id>-<slot>`).
pub const CGROUP_PARENT: &str = "bulkhead-microvm";
/// QEMU's own memory on top of the guest's RAM: device emulation, its heap, I/O buffers, and
/// under TCG the translated-code cache (capped by `tb-size` on the command line).
pub const OVERHEAD_MB: u64 = 160;
/// QEMU's threads besides the vCPUs: main loop, RCU, the block layer's worker pool (up to 64).
pub const PIDS_OVERHEAD: u64 = 96;

#[derive(Debug, thiserror::Error)]
pub enum JailerError {
    #[error("cannot find what QEMU loads ({0}): install qemu-system-x86 and make sure `ldd` works")]
    Discover(String),
    #[error(
        "the cgroup of the VM: {0} (the microvm driver needs the memory, pids and cpu controllers)"
    )]
    Cgroup(String),
    #[error("the path {0:?} contains a NUL byte")]
    Path(PathBuf),
}

/// The host files QEMU needs, found once per driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuFiles {
    /// The resolved binary (no symlink).
    pub binary: PathBuf,
    /// Shared libraries and the dynamic loader, at the paths the loader opens them by.
    pub libs: Vec<PathBuf>,
    /// Data (firmware such as `qboot.rom`) and module (`accel-tcg-x86_64.so`) directories.
    pub dirs: Vec<PathBuf>,
}

/// Absolute library paths in `ldd` output (`name => /path (addr)` and `/path (addr)` lines).
pub fn parse_ldd(out: &str) -> Vec<PathBuf> {
    out.lines()
        .filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once("=>") {
                Some((_, r)) => r.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            p.starts_with('/').then(|| PathBuf::from(p))
        })
        .collect()
}

fn ldd(file: &Path) -> Result<Vec<PathBuf>, JailerError> {
    let out = Command::new("ldd")
        .arg(file)
        .output()
        .map_err(|e| JailerError::Discover(format!("run ldd {}: {e}", file.display())))?;
    if !out.status.success() {
        return Err(JailerError::Discover(format!(
            "ldd {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

/// `program` as an absolute, symlink-free path (a bare name is looked up in `path`).
pub fn resolve_program(program: &Path, path: &OsStr) -> Option<PathBuf> {
    let found = if program.components().count() > 1 || program.is_absolute() {
        Some(program.to_path_buf())
    } else {
        std::env::split_paths(path)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    };
    fs::canonicalize(found?).ok()
}

impl QemuFiles {
    /// QEMU's binary, its libraries, its data directory and the accelerator modules with
    /// their libraries (Debian builds TCG as a module). Display and audio modules are not
    /// loaded by our command line, and their libraries are left out.
    pub fn discover(qemu: &Path) -> Result<QemuFiles, JailerError> {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        let binary = resolve_program(qemu, &path).ok_or_else(|| {
            JailerError::Discover(format!("{} is not an executable file", qemu.display()))
        })?;
        let mut libs = ldd(&binary)?;
        let mut dirs = Vec::new();
        // Where Debian's (and upstream's default) build looks for firmware and modules.
        let prefix = binary
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/usr"));
        let data = prefix.join("share/qemu");
        if data.is_dir() {
            dirs.push(data);
        }
        for modules in [
            prefix.join("lib/x86_64-linux-gnu/qemu"),
            prefix.join("lib/qemu"),
        ] {
            let Ok(rd) = fs::read_dir(&modules) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name();
                if name.as_bytes().starts_with(b"accel-") {
                    libs.extend(ldd(&e.path())?);
                }
            }
            dirs.push(modules);
        }
        libs.sort();
        libs.dedup();
        Ok(QemuFiles { binary, libs, dirs })
    }
}

/// One step of building QEMU's root. Paths before [`Step::PivotRoot`] are host paths in the
/// new mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing mounted from here on propagates to the host.
    MakePrivate,
    /// The new root: a small tmpfs.
    Tmpfs {
        target: CString,
    },
    Mkdir {
        path: CString,
    },
    /// An empty file to bind a file onto.
    Touch {
        path: CString,
    },
    /// Bind `source` on `target` (recursively), then make it read-only unless `writable`;
    /// always `nosuid`, `nodev` unless `dev`, `noexec` unless `exec`.
    Bind {
        source: CString,
        target: CString,
        writable: bool,
        exec: bool,
        dev: bool,
    },
    /// A procfs of QEMU's pid namespace on `target`, read-only and holding only the process
    /// directories (`subset=pid`): a clone's RAM is `mem-path=/proc/self/fd/N`.
    Proc {
        target: CString,
    },
    /// `pivot_root` into `new_root`, the old root lazily detached.
    PivotRoot {
        new_root: CString,
    },
    /// The tmpfs root itself read-only (after everything is mounted on it).
    RootReadOnly,
}

fn cstr(p: &Path) -> Result<CString, JailerError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| JailerError::Path(p.to_path_buf()))
}

/// What appears in QEMU's root: (host source, path inside, writable, exec, dev, directory).
struct Entry<'a> {
    source: &'a Path,
    inside: &'a Path,
    writable: bool,
    exec: bool,
    dev: bool,
    dir: bool,
}

/// The mount steps for one VM: `root` is an empty directory to mount the new root on,
/// `slot_dir` the VM's slot directory. A VM whose RAM is on a file also gets that file's
/// directory read-write (a template VM writes the snapshot's RAM file in its staging
/// directory), or `/proc` when the file is one of its inherited descriptors (a clone's sealed
/// RAM memfd).
pub fn plan(
    root: &Path,
    files: &QemuFiles,
    spec: &VmSpec,
    slot_dir: &Path,
) -> Result<Vec<Step>, JailerError> {
    let file = |p, exec| Entry {
        source: p,
        inside: p,
        writable: false,
        exec,
        dev: false,
        dir: false,
    };
    let device = |p: &'static str, writable| Entry {
        source: Path::new(p),
        inside: Path::new(p),
        writable,
        exec: false,
        dev: true,
        dir: false,
    };
    let mut entries = vec![file(&files.binary, true)];
    entries.extend(files.libs.iter().map(|l| file(l, true)));
    entries.extend(files.dirs.iter().map(|d| Entry {
        dir: true,
        ..file(d, true)
    }));
    for image in [&spec.kernel, &spec.boot_disk, &spec.root_disk] {
        entries.push(file(image, false));
    }
    entries.push(device("/dev/null", true));
    entries.push(device("/dev/urandom", false));
    if spec.accel == Accel::Kvm {
        entries.push(device("/dev/kvm", true));
    }
    entries.push(Entry {
        source: slot_dir,
        inside: slot_dir,
        writable: true,
        exec: false,
        dev: false,
        dir: true,
    });
    let ram = spec.memory_file.as_ref().and_then(|m| m.path.as_deref());
    let proc = ram.is_some_and(|p| p.starts_with("/proc"));
    if let Some(ram_dir) = ram.filter(|_| !proc).and_then(Path::parent) {
        entries.push(Entry {
            source: ram_dir,
            inside: ram_dir,
            writable: true,
            exec: false,
            dev: false,
            dir: true,
        });
    }

    let at = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    let mut steps = vec![
        Step::MakePrivate,
        Step::Tmpfs {
            target: cstr(root)?,
        },
    ];
    let mut made: Vec<PathBuf> = Vec::new();
    for e in &entries {
        let target = at(e.inside);
        // Every missing ancestor, outermost first.
        let mut ancestors: Vec<&Path> = target
            .ancestors()
            .skip(1)
            .take_while(|a| *a != root)
            .collect();
        ancestors.reverse();
        for a in ancestors {
            if !made.iter().any(|m| m == a) {
                made.push(a.to_path_buf());
                steps.push(Step::Mkdir { path: cstr(a)? });
            }
        }
        if made.contains(&target) {
            // Already there (a file listed twice); binding it again would stack mounts.
            continue;
        }
        made.push(target.clone());
        let path = cstr(&target)?;
        steps.push(if e.dir {
            Step::Mkdir { path: path.clone() }
        } else {
            Step::Touch { path: path.clone() }
        });
        steps.push(Step::Bind {
            source: cstr(e.source)?,
            target: path,
            writable: e.writable,
            exec: e.exec,
            dev: e.dev,
        });
    }
    if proc {
        let target = root.join("proc");
        if !made.contains(&target) {
            steps.push(Step::Mkdir {
                path: cstr(&target)?,
            });
        }
        steps.push(Step::Proc {
            target: cstr(&target)?,
        });
    }
    steps.push(Step::PivotRoot {
        new_root: cstr(root)?,
    });
    steps.push(Step::RootReadOnly);
    Ok(steps)
}

/// Everything the child needs, prepared (and allocated) before `fork`.
#[derive(Debug)]
pub struct Jail {
    pub steps: Vec<Step>,
    /// `cgroup.procs` files to join.
    pub cgroup_procs: Vec<CString>,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (`/dev/kvm`'s group under KVM).
    pub groups: Vec<libc::gid_t>,
    /// Write end of the pipe that carries QEMU's host pid.
    pub pid_fd: RawFd,
}

pub enum Forked {
    Parent { child: libc::pid_t },
    Child,
}

/// The privileged operations of [`enter`].
pub trait JailSys {
    fn setsid(&mut self) -> io::Result<()>;
    fn join_cgroup(&mut self, procs: &CStr) -> io::Result<()>;
    fn unshare(&mut self, flags: libc::c_int) -> io::Result<()>;
    fn fork(&mut self) -> io::Result<Forked>;
    /// In the intermediate process: send `child`'s pid on `fd` and exit (never returns in
    /// [`LiveSys`]).
    fn report_and_exit(&mut self, fd: RawFd, child: libc::pid_t);
    fn mount(&mut self, step: &Step) -> io::Result<()>;
    fn set_ids(&mut self, uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()>;
    fn no_new_privs(&mut self) -> io::Result<()>;
}

/// The jail's sequence, between `fork` and `exec` (see the module docs for why this order).
pub fn enter(jail: &Jail, sys: &mut impl JailSys) -> io::Result<()> {
    sys.setsid()?;
    // Joined before the fork: QEMU never runs outside its limits.
    for procs in &jail.cgroup_procs {
        sys.join_cgroup(procs)?;
    }
    sys.unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID)?;
    match sys.fork()? {
        Forked::Parent { child } => {
            sys.report_and_exit(jail.pid_fd, child);
            return Ok(());
        }
        Forked::Child => {}
    }
    for step in &jail.steps {
        sys.mount(step)?;
    }
    sys.set_ids(jail.uid, jail.gid, &jail.groups)?;
    sys.unshare(
        libc::CLONE_NEWUSER | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS,
    )?;
    sys.no_new_privs()
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The read end of the pid pipe; the write end goes to the child.
pub fn pid_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a valid out-array of two fds.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) })?;
    // SAFETY: both fds were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// QEMU's host pid, once `spawn` has returned (the intermediate wrote it before exiting).
pub fn read_pid(r: &OwnedFd) -> io::Result<libc::pid_t> {
    let mut b = [0u8; 4];
    // SAFETY: reading into a valid buffer from our own fd.
    let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
    if n != 4 {
        return Err(io::Error::other(
            "the jailer did not report QEMU's pid (see qemu.log in the slot directory)",
        ));
    }
    Ok(libc::pid_t::from_ne_bytes(b))
}

/// The cgroups of VMs: one per slot under [`CGROUP_PARENT`].
#[derive(Debug)]
pub struct Cgroups {
    backend: Box<dyn CgroupBackend>,
    /// Tells this driver's VMs from other servers' on the same host.
    prefix: String,
}

/// The limits of a VM with `memory_mb` of RAM and `cpus` vCPUs.
pub fn limits(memory_mb: u64, cpus: u32) -> CgroupLimits {
    let cpus = u64::from(cpus.max(1));
    CgroupLimits {
        memory_bytes: (memory_mb + OVERHEAD_MB) << 20,
        pids_max: PIDS_OVERHEAD + cpus,
        cpu_period_us: CPU_PERIOD_US,
        cpu_quota_us: Some(cpus * CPU_PERIOD_US),
    }
}

impl Cgroups {
    pub fn detect(state_dir: &Path) -> Result<Cgroups, JailerError> {
        let backend =
            cgroup::detect(CGROUP_PARENT).map_err(|e| JailerError::Cgroup(e.to_string()))?;
        use sha2::Digest;
        let digest = sha2::Sha256::digest(state_dir.as_os_str().as_bytes());
        let prefix = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Cgroups { backend, prefix })
    }

    pub fn name(&self, slot: u32) -> String {
        format!("{}-{slot}", self.prefix)
    }

    /// A fresh cgroup for `slot` (a leftover of a crash is removed first); its `cgroup.procs`
    /// files.
    pub fn create(&self, slot: u32, limits: &CgroupLimits) -> Result<Vec<CString>, JailerError> {
        let name = self.name(slot);
        self.remove(slot);
        let procs = self
            .backend
            .create(&name, limits)
            .map_err(|e| JailerError::Cgroup(e.to_string()))?;
        procs.iter().map(|p| cstr(p)).collect()
    }

    /// Removes the slot's cgroup, killing whatever is left in it.
    pub fn remove(&self, slot: u32) {
        let _ = cgroup::remove_with_retry(
            self.backend.as_ref(),
            &self.name(slot),
            std::time::Duration::from_secs(2),
        );
    }

    pub fn dirs(&self, slot: u32) -> Vec<PathBuf> {
        self.backend.dirs(&self.name(slot))
    }
}

mod live;
#[cfg(test)]
mod tests;

pub use live::LiveSys;
