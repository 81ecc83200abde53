//! [`JailDriver`]: the `Driver` implementation. Runs inside the multi-threaded server, so every
//! step that needs `clone` goes through the launcher process.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bulkhead_engine::driver::{
    AgentStream, Driver, DriverError, DriverHandle, ResourceUsage, SandboxSpec,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::cgroup::{self, CgroupBackend, CgroupLimits, CgroupVersion};
use crate::mountplan::{AGENT_PATH, SOCK_DIR, SOCK_NAME};
use crate::probe::{self, HostReport};
use crate::slots::{self, SlotState, SlotTable};
use crate::spec::{IdmapSpec, LaunchReply, LaunchRequest, StartSpec};
use crate::sys::{self, ExitInfo};
use crate::{IDS_PER_SLOT, JailConfig, JailError};

const DRIVER_NAME: &str = "jail";
/// How long `stop` waits for the init to exit after SIGKILL before giving up on it.
const STOP_EXIT_BUDGET: Duration = Duration::from_secs(5);
/// How long `stop` retries rmdir while the cgroup's tasks drain.
const CGROUP_DRAIN_BUDGET: Duration = Duration::from_secs(5);

/// Driver data stored in [`DriverHandle::data`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct HandleData {
    cgroup: String,
    cgroup_version: CgroupVersion,
    lower: PathBuf,
}

/// A sandbox this driver owns (started or adopted).
struct Sandbox {
    pid: i32,
    start_time: u64,
    cgroup: String,
    pidfd: Arc<AsyncFd<OwnedFd>>,
    exit: watch::Receiver<Option<ExitInfo>>,
    reaper: AbortHandle,
}

impl Sandbox {
    fn matches(&self, h: &DriverHandle) -> bool {
        self.pid == h.pid && self.start_time == h.pid_start_time
    }
    fn exited(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }
}

struct Inner {
    cfg: JailConfig,
    /// The driver's private copy of the agent binary (see `install_agent`).
    agent: PathBuf,
    cgroups: Box<dyn CgroupBackend>,
    slots: Mutex<SlotTable<Arc<Sandbox>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Sandboxes outlive the driver (a restarted server adopts them); only our watchers go.
        if let Ok(slots) = self.slots.lock() {
            for (_, sb) in slots.iter_taken() {
                sb.reaper.abort();
            }
        }
    }
}

pub struct JailDriver {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JailDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JailDriver")
            .field("state_dir", &self.inner.cfg.state_dir)
            .field("cgroups", &self.inner.cgroups.version())
            .finish()
    }
}

/// Every ancestor of `path` must be searchable by "others": the sandbox's root is an
/// unprivileged uid on the host and resolves these paths itself when it mounts.
fn check_searchable(path: &Path, what: &str) -> Result<(), JailError> {
    let mut p = Some(path);
    while let Some(dir) = p {
        if dir.as_os_str().is_empty() {
            break;
        }
        let m =
            fs::metadata(dir).map_err(|e| JailError::io(format!("stat {}", dir.display()), e))?;
        if m.is_dir() && m.mode() & 0o001 == 0 {
            return Err(JailError::Config(format!(
                "{what} {} is not reachable by sandbox uids: {} has mode {:o} (needs o+x; try \
                 chmod o+x {})",
                path.display(),
                dir.display(),
                m.mode() & 0o7777,
                dir.display()
            )));
        }
        p = dir.parent();
    }
    Ok(())
}

fn mkdir_mode(path: &Path, mode: u32) -> Result<(), JailError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| JailError::io(format!("mkdir {}", path.display()), e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| JailError::io(format!("chmod {}", path.display()), e))
}

fn chown(path: &Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
}

/// Copy the agent into the state directory. The bind mount's source path shows in the
/// sandbox's mountinfo, so it should be the neutral state path rather than wherever the binary
/// was built or installed; the copy also pins the version for this server's lifetime. The
/// rename leaves the inode that running sandboxes have bind-mounted untouched.
fn install_agent(src: &Path, state_dir: &Path) -> Result<PathBuf, JailError> {
    let dst = state_dir.join("agent");
    let tmp = state_dir.join(format!(".agent.{}", std::process::id()));
    fs::copy(src, &tmp)
        .map_err(|e| JailError::io(format!("copy the agent binary {}", src.display()), e))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .map_err(|e| JailError::io(format!("chmod {}", tmp.display()), e))?;
    fs::rename(&tmp, &dst).map_err(|e| JailError::io(format!("install {}", dst.display()), e))?;
    Ok(dst)
}

/// Short stable id of a template root: its path plus device and inode, so a template rebuilt
/// into a fresh directory at the same path gets a fresh idmapped view. FNV-1a, 48 bits.
fn template_key(rootfs: &Path) -> io::Result<String> {
    let m = fs::metadata(rootfs)?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |b: &[u8]| {
        for x in b {
            h ^= u64::from(*x);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    feed(rootfs.as_os_str().as_encoded_bytes());
    feed(&m.dev().to_le_bytes());
    feed(&m.ino().to_le_bytes());
    Ok(format!("{:012x}", h & 0xffff_ffff_ffff))
}

/// Bytes allocated under `dir` (not following symlinks, not crossing mounts).
fn disk_usage(dir: &Path) -> u64 {
    let Ok(root) = fs::symlink_metadata(dir) else {
        return 0;
    };
    let dev = root.dev();
    let mut total = root.blocks() * 512;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

fn statvfs_total(path: &Path) -> u64 {
    let Ok(c) = sys::cpath(path) else { return 0 };
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    st.f_blocks.saturating_mul(st.f_frsize)
}

/// Connect to the agent's socket without following symlinks. The socket directory is writable
/// by the sandbox, which could otherwise swap `agent.sock` for a symlink to a host socket and
/// have the server connect there. The socket is opened `O_PATH|O_NOFOLLOW`, checked to be a
/// socket, and connected through its `/proc/self/fd` link, which names that very inode.
async fn connect_agent(sock: &Path) -> io::Result<tokio::net::UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = sys::cpath(sock)?;
    // SAFETY: valid C string; the returned descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = fs::File::from(fd);
    if !file.metadata()?.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a socket", sock.display()),
        ));
    }
    tokio::net::UnixStream::connect(format!("/proc/self/fd/{}", file.as_raw_fd())).await
}

/// The last few lines the agent wrote, for start errors (never following a symlink the
/// sandbox may have planted, never blocking on a FIFO).
fn log_tail(path: &Path) -> String {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return String::new();
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return String::new();
    }
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(2048)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!("; agent output: {text}")
    }
}

/// Register a pidfd with the reactor; it becomes readable when the process exits.
fn watch_pidfd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the OwnedFd owns the descriptor for the AsyncFd's whole lifetime and always
    // reports the same raw fd.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Open a pidfd for `pid` only if it still is the process that started at `start_time`.
fn verified_pidfd(pid: i32, start_time: u64) -> Option<OwnedFd> {
    let fd = sys::pidfd_open(pid).ok()?;
    // Checked after opening: the pidfd pins the process, so a match now cannot go stale.
    (sys::proc_start_time(pid).ok()? == start_time).then_some(fd)
}

fn start_err(msg: impl Into<String>) -> DriverError {
    DriverError::Start(msg.into())
}

fn fnv32(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5_u32, |h, x| {
        (h ^ u32::from(*x)).wrapping_mul(0x0100_0193)
    })
}

/// The template's own CA bundle (empty if it has none). An absolute symlink is resolved inside
/// the template, never against the host's root.
fn template_ca_bundle(rootfs: &Path) -> Vec<u8> {
    let rel = crate::mountplan::CA_BUNDLE.trim_start_matches('/');
    let mut path = rootfs.join(rel);
    for _ in 0..8 {
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let Ok(target) = fs::read_link(&path) else {
                    return Vec::new();
                };
                path = if target.is_absolute() {
                    rootfs.join(target.strip_prefix("/").unwrap_or(&target))
                } else {
                    path.parent().unwrap_or(rootfs).join(target)
                };
            }
            Ok(m) if m.is_file() => return fs::read(&path).unwrap_or_default(),
            _ => return Vec::new(),
        }
    }
    Vec::new()
}

/// `/etc/resolv.conf` in the fresh overlay upper dir: a regular file owned by the sandbox's
/// root, so it shadows whatever the template has (even a symlink) and stays editable inside.
fn write_resolv_conf(upper: &Path, uid: u32, ns: std::net::Ipv4Addr) -> Result<(), JailError> {
    let etc = upper.join("etc");
    mkdir_mode(&etc, 0o755)?;
    chown(&etc, uid).map_err(|e| JailError::io(format!("chown {}", etc.display()), e))?;
    let file = etc.join("resolv.conf");
    fs::write(
        &file,
        format!("nameserver {ns}\noptions timeout:2 attempts:1\n"),
    )
    .and_then(|()| fs::set_permissions(&file, fs::Permissions::from_mode(0o644)))
    .and_then(|()| chown(&file, uid))
    .map_err(|e| JailError::io(format!("write {}", file.display()), e))
}

impl JailDriver {
    /// Validate the configuration, prepare the state directory, detect the cgroup layout and
    /// make this process a child subreaper (sandbox inits are re-parented to it when their
    /// launcher exits).
    pub fn new(cfg: JailConfig) -> Result<JailDriver, JailError> {
        if cfg.launcher.is_empty() {
            return Err(JailError::Config("launcher command is empty".into()));
        }
        if cfg.max_slots == 0 {
            return Err(JailError::Config("max_slots must be at least 1".into()));
        }
        if !slots::uid_range_fits(cfg.uid_base, cfg.max_slots) {
            return Err(JailError::Config(format!(
                "{} slots of {IDS_PER_SLOT} ids from uid {} exceed the uid space",
                cfg.max_slots, cfg.uid_base
            )));
        }
        if cfg.uid_base == 0 {
            return Err(JailError::Config(
                "uid_base 0 would map sandbox root to host root".into(),
            ));
        }
        if !cfg.state_dir.is_absolute() {
            return Err(JailError::Config(format!(
                "state_dir must be absolute: {}",
                cfg.state_dir.display()
            )));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(JailError::Unsupported(
                "the jail driver must run as root".into(),
            ));
        }
        let agent = fs::metadata(&cfg.agent_binary).map_err(|e| {
            JailError::io(format!("agent binary {}", cfg.agent_binary.display()), e)
        })?;
        if !agent.is_file() {
            return Err(JailError::Config(format!(
                "agent binary {} is not a regular file",
                cfg.agent_binary.display()
            )));
        }
        // 0711: the sandbox uids may traverse (to reach their own slot), not list.
        for d in [
            cfg.state_dir.clone(),
            cfg.state_dir.join("s"),
            cfg.state_dir.join("l"),
            cfg.state_dir.join("ca"),
        ] {
            mkdir_mode(&d, 0o711)?;
        }
        check_searchable(&cfg.state_dir, "state_dir")?;
        let agent = install_agent(&cfg.agent_binary, &cfg.state_dir)?;
        let sock = cfg
            .state_dir
            .join(format!("s/{}/sock/{SOCK_NAME}", cfg.max_slots - 1));
        if sock.as_os_str().len() >= 108 {
            return Err(JailError::Config(format!(
                "state_dir is too long: agent socket paths ({}) exceed the 107-byte Unix socket limit",
                sock.display()
            )));
        }
        let cgroups = cgroup::detect(&cfg.cgroup_parent).map_err(JailError::Unsupported)?;
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(JailError::io(
                "PR_SET_CHILD_SUBREAPER",
                io::Error::last_os_error(),
            ));
        }
        let slots = Mutex::new(SlotTable::new(cfg.max_slots));
        Ok(JailDriver {
            inner: Arc::new(Inner {
                cfg,
                agent,
                cgroups,
                slots,
            }),
        })
    }

    /// What this host supports (for deciding to use or skip the driver, loudly).
    pub fn probe() -> HostReport {
        probe::probe()
    }

    pub fn cgroup_version(&self) -> CgroupVersion {
        self.inner.cgroups.version()
    }

    pub fn config(&self) -> &JailConfig {
        &self.inner.cfg
    }

    /// Remove this driver's cgroup parent directories if no sandbox cgroup is left in them
    /// (called when the server stops; busy parents stay for the sandboxes that keep running).
    pub fn release_cgroup_parent(&self) {
        for d in self.inner.cgroups.parent_dirs() {
            // Only our own leaf: the shared top (`bulkhead`) may hold other servers' parents.
            let _ = fs::remove_dir(&d);
        }
    }

    /// Unmount the idmapped template views no running sandbox uses (they are otherwise kept
    /// for reuse). Returns how many were removed.
    pub fn prune_lowers(&self) -> Result<usize, JailError> {
        let dir = self.inner.cfg.state_dir.join("l");
        // Keep the views of busy slots: a running sandbox uses one, a start in flight may be
        // about to.
        let busy: BTreeSet<u32> = {
            let slots = self.inner.slots.lock().expect("slot table poisoned");
            (0..slots.max()).filter(|n| slots.is_busy(*n)).collect()
        };
        let mut removed = 0;
        let rd =
            fs::read_dir(&dir).map_err(|e| JailError::io(format!("read {}", dir.display()), e))?;
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let slot = name.split('-').next().and_then(|n| n.parse::<u32>().ok());
            if slot.is_some_and(|n| busy.contains(&n)) {
                continue;
            }
            if sys::is_mount_root(&p).unwrap_or(false) {
                sys::umount_detach(&p)
                    .map_err(|e| JailError::io(format!("umount {}", p.display()), e))?;
            }
            fs::remove_dir(&p).map_err(|e| JailError::io(format!("rmdir {}", p.display()), e))?;
            removed += 1;
        }
        Ok(removed)
    }

    fn slot_dir(&self, slot: u32) -> PathBuf {
        self.inner.cfg.state_dir.join("s").join(slot.to_string())
    }

    fn sock_path(&self, slot: u32) -> PathBuf {
        self.slot_dir(slot).join("sock").join(SOCK_NAME)
    }

    /// pid, start time and cgroup recorded in a slot directory by a (possibly previous) run.
    fn slot_owner(&self, slot: u32) -> Option<(i32, u64, Option<String>)> {
        let s = fs::read_to_string(self.slot_dir(slot).join("pid")).ok()?;
        let mut it = s.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start = it.next()?.parse().ok()?;
        Some((pid, start, it.next().map(str::to_owned)))
    }

    /// Is the slot held by a live sandbox this driver does not track?
    fn slot_held_elsewhere(&self, slot: u32) -> bool {
        self.slot_owner(slot)
            .is_some_and(|(pid, st, _)| sys::proc_start_time(pid).is_ok_and(|t| t == st))
    }

    fn reserve_slot(&self) -> Result<u32, DriverError> {
        let mut slots = self.inner.slots.lock().expect("slot table poisoned");
        slots
            .reserve(|n| self.slot_held_elsewhere(n))
            .ok_or_else(|| {
                start_err(format!(
                    "all {} jail slots are in use",
                    self.inner.cfg.max_slots
                ))
            })
    }

    fn lookup(&self, h: &DriverHandle) -> Option<Arc<Sandbox>> {
        let slots = self.inner.slots.lock().expect("slot table poisoned");
        slots.taken(h.slot).filter(|sb| sb.matches(h)).cloned()
    }

    /// Fresh per-sandbox directories; leftovers of a crashed run in this slot are removed
    /// together with their cgroups.
    fn prepare_slot(&self, slot: u32) -> Result<PathBuf, JailError> {
        let dir = self.slot_dir(slot);
        if dir.exists() {
            fs::remove_dir_all(&dir)
                .map_err(|e| JailError::io(format!("clean {}", dir.display()), e))?;
        }
        self.remove_stale_cgroups(slot);
        let uid = slots::slot_uid(self.inner.cfg.uid_base, slot);
        mkdir_mode(&dir, 0o711)?;
        for (sub, owned) in [
            ("upper", true),
            ("work", true),
            ("merged", false),
            ("sock", true),
        ] {
            let p = dir.join(sub);
            mkdir_mode(&p, 0o755)?;
            if owned {
                chown(&p, uid).map_err(|e| JailError::io(format!("chown {}", p.display()), e))?;
            }
        }
        if let Some(ns) = self.inner.cfg.nameserver {
            write_resolv_conf(&dir.join("upper"), uid, ns)?;
        }
        Ok(dir)
    }

    /// The CA bundle for sandboxes of `rootfs`: the template's own bundle plus
    /// `sandbox_ca_pem`, built once per template (and per extra PEM) under `<state>/ca`.
    /// Shared read-only by every sandbox of the template.
    fn ca_bundle(&self, rootfs: &Path) -> Result<Option<PathBuf>, DriverError> {
        let Some(extra) = &self.inner.cfg.sandbox_ca_pem else {
            return Ok(None);
        };
        let key = template_key(rootfs)
            .map_err(|e| DriverError::io(format!("template root {}", rootfs.display()), e))?;
        let path = self
            .inner
            .cfg
            .state_dir
            .join("ca")
            .join(format!("{key}-{:08x}.pem", fnv32(extra.as_bytes())));
        if path.is_file() {
            return Ok(Some(path));
        }
        let mut bundle = template_ca_bundle(rootfs);
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(extra.as_bytes());
        let tmp = path.with_extension(format!("tmp{}", sys::random_u64()));
        fs::write(&tmp, &bundle)
            .and_then(|()| fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)))
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|e| {
                DriverError::io(format!("write the sandbox CA bundle {}", path.display()), e)
            })?;
        Ok(Some(path))
    }

    fn remove_stale_cgroups(&self, slot: u32) {
        let prefix = format!("{slot}-");
        if let Ok(names) = self.inner.cgroups.list() {
            for n in names.iter().filter(|n| n.starts_with(&prefix)) {
                // Fails harmlessly (EBUSY) if something still runs in it.
                let _ = self.inner.cgroups.remove(n);
            }
        }
    }

    /// The slot's idmapped view of `rootfs`, created on first use and kept.
    async fn ensure_lower(&self, slot: u32, rootfs: &Path) -> Result<PathBuf, DriverError> {
        let key = template_key(rootfs)
            .map_err(|e| DriverError::io(format!("template root {}", rootfs.display()), e))?;
        let lower = self
            .inner
            .cfg
            .state_dir
            .join("l")
            .join(format!("{slot}-{key}"));
        if sys::is_mount_root(&lower).unwrap_or(false) {
            return Ok(lower);
        }
        let req = LaunchRequest::Idmap(IdmapSpec {
            source: rootfs.to_path_buf(),
            target: lower.clone(),
            uid_base: slots::slot_uid(self.inner.cfg.uid_base, slot),
            id_count: IDS_PER_SLOT,
        });
        match self
            .run_launcher(&req, self.inner.cfg.start_timeout)
            .await?
        {
            LaunchReply::Done { ok: true } => Ok(lower),
            LaunchReply::Failed { error } => Err(start_err(format!(
                "cannot create the idmapped template view: {error}"
            ))),
            other => Err(start_err(format!("unexpected launcher reply {other:?}"))),
        }
    }

    async fn run_launcher(
        &self,
        req: &LaunchRequest,
        timeout: Duration,
    ) -> Result<LaunchReply, DriverError> {
        let launcher = &self.inner.cfg.launcher;
        let mut cmd = tokio::process::Command::new(&launcher[0]);
        cmd.args(&launcher[1..])
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            DriverError::io(format!("spawn the jail launcher {:?}", launcher[0]), e)
        })?;
        let json = serde_json::to_vec(req).expect("launch request serialises");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin
            .write_all(&json)
            .await
            .map_err(|e| DriverError::io("send the launch request", e))?;
        drop(stdin);
        let out = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                start_err(format!(
                    "the jail launcher did not answer within {timeout:?}"
                ))
            })?
            .map_err(|e| DriverError::io("wait for the jail launcher", e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        LaunchReply::parse(&stdout).ok_or_else(|| {
            start_err(format!(
                "the jail launcher {:?} gave no reply ({}); stderr: {}",
                launcher,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        })
    }

    /// Take ownership of a running sandbox: pidfd, reaper task, slot entry.
    fn register(
        &self,
        slot: u32,
        pid: i32,
        start_time: u64,
        cgroup: String,
        pidfd: OwnedFd,
        adopting: bool,
    ) -> Result<Arc<Sandbox>, DriverError> {
        let afd = Arc::new(
            watch_pidfd(pidfd).map_err(|e| DriverError::io("watch the sandbox pidfd", e))?,
        );
        let (tx, rx) = watch::channel(None);
        let watched = afd.clone();
        let task = tokio::spawn(async move {
            // Readable = the process has exited. waitid reaps it when it is our child (started
            // by this process); an adopted one belongs to someone else (ECHILD).
            loop {
                let Ok(mut guard) = watched.readable().await else {
                    break;
                };
                match sys::waitid_pidfd(watched.get_ref().as_fd(), true) {
                    Ok(Some(info)) => {
                        let _ = tx.send(Some(info));
                        break;
                    }
                    Ok(None) => guard.clear_ready(),
                    Err(e) => {
                        tracing::warn!(pid, error = %e, "waitid on a sandbox pidfd failed");
                        let _ = tx.send(Some(ExitInfo::Unknown));
                        break;
                    }
                }
            }
        });
        let sb = Arc::new(Sandbox {
            pid,
            start_time,
            cgroup,
            pidfd: afd,
            exit: rx,
            reaper: task.abort_handle(),
        });
        let mut slots = self.inner.slots.lock().expect("slot table poisoned");
        // Adoption must not steal a slot a start has reserved; a start completes its own.
        if (adopting && slots.is_busy(slot)) || slots.take(slot, sb.clone()).is_err() {
            task.abort();
            return Err(start_err(format!("slot {slot} is already taken")));
        }
        Ok(sb)
    }

    async fn start_in_slot(
        &self,
        slot: u32,
        cgroup_name: &str,
        spec: &SandboxSpec,
        deadline: Instant,
    ) -> Result<DriverHandle, DriverError> {
        let cfg = &self.inner.cfg;
        let dir = self.prepare_slot(slot)?;
        let lower = self.ensure_lower(slot, &spec.rootfs).await?;
        let limits = CgroupLimits::from_spec(spec);
        let procs = self
            .inner
            .cgroups
            .create(cgroup_name, &limits)
            .map_err(|e| DriverError::io(format!("create cgroup {cgroup_name}"), e))?;
        let mut argv = vec![
            AGENT_PATH.to_string(),
            "--listen".to_string(),
            format!("unix:{SOCK_DIR}/{SOCK_NAME}"),
        ];
        argv.extend(cfg.agent_args.iter().cloned());
        let start = StartSpec {
            uid_base: slots::slot_uid(cfg.uid_base, slot),
            id_count: IDS_PER_SLOT,
            lower: lower.clone(),
            upper: dir.join("upper"),
            work: dir.join("work"),
            merged: dir.join("merged"),
            sock_dir: dir.join("sock"),
            agent_binary: self.inner.agent.clone(),
            argv,
            env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                "HOME=/root".into(),
            ],
            hostname: "sandbox".into(),
            cgroup_procs: procs,
            // tmpfs pages are charged to the sandbox's memory cgroup, so bound them by it.
            tmp_size_mb: spec.memory_mb.max(16),
            shm_size_mb: spec.memory_mb.clamp(1, 64),
            volatile_upper: true,
            // Leave a reserve of tasks for the agent (see `StartSpec::nproc_limit`).
            nproc_limit: Some(
                spec.pids_max
                    .saturating_sub((spec.pids_max / 8).clamp(8, 64))
                    .max(1),
            ),
            ca_bundle: self.ca_bundle(&spec.rootfs)?,
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (pid, start_time) = match self
            .run_launcher(&LaunchRequest::Start(start), remaining)
            .await?
        {
            LaunchReply::Started { pid, start_time } => (pid, start_time),
            LaunchReply::Failed { error } => {
                return Err(start_err(format!("sandbox setup failed: {error}")));
            }
            other => return Err(start_err(format!("unexpected launcher reply {other:?}"))),
        };
        // Record the owner first: if we crash from here on, the next run will not hand this
        // slot out while the sandbox lives.
        let registered = fs::write(
            dir.join("pid"),
            format!("{pid} {start_time} {cgroup_name}\n"),
        )
        .map_err(|e| DriverError::io("record the sandbox pid", e))
        .and_then(|()| sys::pidfd_open(pid).map_err(|e| DriverError::io("pidfd_open", e)))
        .and_then(|fd| self.register(slot, pid, start_time, cgroup_name.to_string(), fd, false));
        let sb = match registered {
            Ok(sb) => sb,
            Err(e) => {
                // No reaper watches it yet, and it is our child now: kill and reap it here.
                let _ = tokio::task::spawn_blocking(move || {
                    // SAFETY: signalling and reaping our own (re-parented) child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, std::ptr::null_mut(), 0);
                    }
                })
                .await;
                return Err(e);
            }
        };
        let handle = DriverHandle {
            driver: DRIVER_NAME.into(),
            pid,
            pid_start_time: start_time,
            slot,
            data: serde_json::to_value(HandleData {
                cgroup: cgroup_name.to_string(),
                cgroup_version: self.inner.cgroups.version(),
                lower,
            })
            .expect("handle data serialises"),
        };
        self.wait_for_socket(slot, &sb, deadline).await?;
        Ok(handle)
    }

    async fn wait_for_socket(
        &self,
        slot: u32,
        sb: &Sandbox,
        deadline: Instant,
    ) -> Result<(), DriverError> {
        let sock = self.sock_path(slot);
        let mut exit = sb.exit.clone();
        let mut delay = Duration::from_millis(1);
        loop {
            if let Some(info) = *exit.borrow() {
                return Err(start_err(format!(
                    "the agent {info} before accepting connections{}",
                    log_tail(&self.slot_dir(slot).join("sock/agent.log"))
                )));
            }
            if connect_agent(&sock).await.is_ok() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(start_err(format!(
                    "the agent did not accept connections on {} within {:?}{}",
                    sock.display(),
                    self.inner.cfg.start_timeout,
                    log_tail(&self.slot_dir(slot).join("sock/agent.log"))
                )));
            }
            let nap = delay.min(deadline - now);
            tokio::select! {
                _ = tokio::time::sleep(nap) => {}
                _ = exit.changed() => {}
            }
            delay = (delay * 2).min(Duration::from_millis(20));
        }
    }

    /// Kill, wait, remove cgroups and the slot directory, free the slot.
    async fn teardown(
        &self,
        slot: u32,
        pid: i32,
        start_time: u64,
        cgroup_name: Option<&str>,
        failed_start: bool,
    ) -> Result<(), DriverError> {
        let handle_like = DriverHandle {
            driver: DRIVER_NAME.into(),
            pid,
            pid_start_time: start_time,
            slot,
            data: serde_json::Value::Null,
        };
        let ours = self.lookup(&handle_like);
        // 1. SIGKILL the init: the kernel then kills the whole pid namespace.
        let foreign_fd = match &ours {
            Some(sb) => {
                let _ = sys::pidfd_send_signal(sb.pidfd.get_ref().as_fd(), libc::SIGKILL);
                None
            }
            None if pid > 0 => verified_pidfd(pid, start_time).inspect(|fd| {
                let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
            }),
            None => None,
        };
        // 2. Belt and braces: everything in the cgroup.
        if let Some(name) = cgroup_name {
            let _ = self.inner.cgroups.kill_all(name);
        }
        // 3. Wait (bounded) for the init to be gone.
        let waited = async {
            if let Some(sb) = &ours {
                let mut rx = sb.exit.clone();
                let _ = rx.wait_for(Option::is_some).await;
            } else if let Some(fd) = foreign_fd
                && let Ok(afd) = watch_pidfd(fd)
            {
                let _ = afd.readable().await;
                let _ = sys::waitid_pidfd(afd.get_ref().as_fd(), true);
            }
        };
        if tokio::time::timeout(STOP_EXIT_BUDGET, waited)
            .await
            .is_err()
        {
            tracing::warn!(
                pid,
                slot,
                "sandbox init did not exit within {STOP_EXIT_BUDGET:?} of SIGKILL"
            );
        }
        // 4. cgroups (rmdir fails until the last task is gone).
        let mut result = Ok(());
        if let Some(name) = cgroup_name {
            let inner = self.inner.clone();
            let name = name.to_string();
            let r = tokio::task::spawn_blocking(move || {
                cgroup::remove_with_retry(inner.cgroups.as_ref(), &name, CGROUP_DRAIN_BUDGET)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
            if let Err(e) = r {
                result = Err(DriverError::io("remove the sandbox cgroup", e));
            }
        }
        // 5. The slot's files, unless the slot now belongs to somebody else. A free slot is
        // reserved while its directory goes, so a concurrent start cannot pick it meanwhile.
        let (slot_is_ours, cleaning) = {
            let mut slots = self.inner.slots.lock().expect("slot table poisoned");
            match slots.get(slot) {
                Some(SlotState::Taken(sb)) => (sb.pid == pid && sb.start_time == start_time, false),
                // Reserved: a start is in flight; only that start may clean up after itself.
                Some(SlotState::Reserved) => (failed_start, false),
                None => {
                    let ours = match self.slot_owner(slot) {
                        Some((p, st, _)) => {
                            (p == pid && st == start_time) || !self.slot_held_elsewhere(slot)
                        }
                        None => true,
                    };
                    (ours, ours && slots.reserve_at(slot))
                }
            }
        };
        if slot_is_ours {
            let dir = self.slot_dir(slot);
            let r = tokio::task::spawn_blocking(move || match fs::remove_dir_all(&dir) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => {
                    other.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
                }
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
            if let Err(e) = r
                && result.is_ok()
            {
                result = Err(DriverError::io("remove the sandbox directory", e));
            }
        }
        if cleaning {
            self.inner
                .slots
                .lock()
                .expect("slot table poisoned")
                .free(slot);
        }
        // 6. Free the slot (only if this sandbox held it).
        if let Some(sb) = &ours {
            sb.reaper.abort();
            let mut slots = self.inner.slots.lock().expect("slot table poisoned");
            if slots.taken(slot).is_some_and(|cur| Arc::ptr_eq(cur, sb)) {
                slots.free(slot);
            }
        }
        result
    }
}

#[async_trait]
impl Driver for JailDriver {
    fn name(&self) -> &'static str {
        DRIVER_NAME
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        let started = Instant::now();
        let deadline = started + self.inner.cfg.start_timeout;
        if !spec.rootfs.is_dir() {
            return Err(start_err(format!(
                "template root filesystem {} is not a directory",
                spec.rootfs.display()
            )));
        }
        let slot = self.reserve_slot()?;
        let cgroup_name = format!("{slot}-{:08x}", sys::random_u64() as u32);
        match self.start_in_slot(slot, &cgroup_name, spec, deadline).await {
            Ok(h) => {
                tracing::debug!(slot, pid = h.pid, elapsed = ?started.elapsed(), "jail sandbox started");
                Ok(h)
            }
            Err(e) => {
                // The init (if any) is in the cgroup: teardown finds it there even when the
                // launcher failed before telling us its pid.
                let registered = {
                    let slots = self.inner.slots.lock().expect("slot table poisoned");
                    slots.taken(slot).map(|sb| (sb.pid, sb.start_time))
                };
                let (pid, st) = registered.unwrap_or((0, 0));
                if let Err(te) = self.teardown(slot, pid, st, Some(&cgroup_name), true).await {
                    tracing::warn!(slot, error = %te, "cleanup after a failed start");
                }
                let mut slots = self.inner.slots.lock().expect("slot table poisoned");
                if matches!(slots.get(slot), Some(SlotState::Reserved)) {
                    slots.free(slot);
                }
                Err(e)
            }
        }
    }

    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        let data: Option<HandleData> = serde_json::from_value(handle.data.clone()).ok();
        let cgroup = match (&data, self.lookup(handle)) {
            (_, Some(sb)) => Some(sb.cgroup.clone()),
            (Some(d), None) => Some(d.cgroup.clone()),
            (None, None) => None,
        };
        self.teardown(
            handle.slot,
            handle.pid,
            handle.pid_start_time,
            cgroup.as_deref(),
            false,
        )
        .await
    }

    async fn wait(&self, handle: &DriverHandle) {
        if let Some(sb) = self.lookup(handle) {
            let mut rx = sb.exit.clone();
            let _ = rx.wait_for(Option::is_some).await;
            return;
        }
        let Some(fd) = verified_pidfd(handle.pid, handle.pid_start_time) else {
            return;
        };
        if let Ok(afd) = watch_pidfd(fd) {
            let _ = afd.readable().await;
        }
    }

    async fn adopt(&self, handle: &DriverHandle) -> bool {
        if handle.driver != DRIVER_NAME || handle.slot >= self.inner.cfg.max_slots {
            return false;
        }
        let Ok(data) = serde_json::from_value::<HandleData>(handle.data.clone()) else {
            return false;
        };
        if data.cgroup_version != self.inner.cgroups.version() {
            return false;
        }
        if let Some(sb) = self.lookup(handle) {
            return sb.exited().is_none();
        }
        if !fs::symlink_metadata(self.sock_path(handle.slot))
            .is_ok_and(|m| m.file_type().is_socket())
        {
            return false;
        }
        let Some(fd) = verified_pidfd(handle.pid, handle.pid_start_time) else {
            return false;
        };
        self.register(
            handle.slot,
            handle.pid,
            handle.pid_start_time,
            data.cgroup,
            fd,
            true,
        )
        .is_ok()
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let kept: BTreeSet<(u32, i32, u64)> = keep
            .iter()
            .filter(|h| h.driver == DRIVER_NAME)
            .map(|h| (h.slot, h.pid, h.pid_start_time))
            .collect();
        let kept_slots: BTreeSet<u32> = kept.iter().map(|k| k.0).collect();
        let mut reclaimed = 0;

        // 1. Sandboxes this driver tracks but the engine no longer wants.
        let tracked: Vec<(u32, i32, u64, String)> = {
            let slots = self.inner.slots.lock().expect("slot table poisoned");
            slots
                .iter_taken()
                .filter(|(n, sb)| !kept.contains(&(*n, sb.pid, sb.start_time)))
                .map(|(n, sb)| (n, sb.pid, sb.start_time, sb.cgroup.clone()))
                .collect()
        };
        for (n, pid, st, cg) in tracked {
            self.teardown(n, pid, st, Some(&cg), false).await?;
            reclaimed += 1;
        }

        // 2. Slot directories left by a previous run (live or dead sandboxes).
        let free = |n: u32| {
            let slots = self.inner.slots.lock().expect("slot table poisoned");
            !slots.is_busy(n) && !kept_slots.contains(&n)
        };
        let sdir = self.inner.cfg.state_dir.join("s");
        let on_disk: Vec<u32> = fs::read_dir(&sdir)
            .map_err(|e| DriverError::io(format!("read {}", sdir.display()), e))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        for n in on_disk.into_iter().filter(|n| free(*n)) {
            let (pid, st, cg) = self.slot_owner(n).unwrap_or((0, 0, None));
            self.teardown(n, pid, st, cg.as_deref(), false).await?;
            reclaimed += 1;
        }

        // 3. Sandbox cgroups whose slot is free (e.g. a crash before the pid file was written).
        let names = self
            .inner
            .cgroups
            .list()
            .map_err(|e| DriverError::io("list sandbox cgroups", e))?;
        for name in names {
            let Some(n) = name.split('-').next().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if kept_slots.contains(&n) {
                continue;
            }
            // Hold the slot while its cgroup goes, so no start can pick it meanwhile. Slots
            // beyond max_slots (a previous configuration) cannot be started into anyway.
            let reserved = {
                let mut slots = self.inner.slots.lock().expect("slot table poisoned");
                if n < slots.max() && !slots.reserve_at(n) {
                    continue;
                }
                n < slots.max()
            };
            let inner = self.inner.clone();
            let r = tokio::task::spawn_blocking(move || {
                let _ = inner.cgroups.kill_all(&name);
                cgroup::remove_with_retry(inner.cgroups.as_ref(), &name, CGROUP_DRAIN_BUDGET)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
            if reserved {
                self.inner
                    .slots
                    .lock()
                    .expect("slot table poisoned")
                    .free(n);
            }
            r.map_err(|e| DriverError::io("remove a leftover sandbox cgroup", e))?;
        }
        Ok(reclaimed)
    }

    async fn connect(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError> {
        match self.lookup(handle) {
            Some(sb) if sb.exited().is_none() => {}
            Some(_) => return Err(DriverError::NotRunning),
            None => {
                if verified_pidfd(handle.pid, handle.pid_start_time).is_none() {
                    return Err(DriverError::NotRunning);
                }
            }
        }
        let sock = self.sock_path(handle.slot);
        let s = connect_agent(&sock)
            .await
            .map_err(|e| DriverError::Connect(format!("{}: {e}", sock.display())))?;
        Ok(Box::new(s))
    }

    async fn open_network(&self, handle: &DriverHandle) -> Result<OwnedFd, DriverError> {
        let sb = self.lookup(handle).ok_or(DriverError::NotRunning)?;
        if sb.exited().is_some() {
            return Err(DriverError::NotRunning);
        }
        let (pid, start_time) = (sb.pid, sb.start_time);
        tokio::task::spawn_blocking(move || {
            use std::os::fd::AsRawFd;
            // Open the namespace first, then check the pid still names the sandbox: the open
            // fd pins the namespace, so an adopted sandbox's pid recycled in between can never
            // make us configure somebody else's network.
            let ns = fs::File::open(format!("/proc/{pid}/ns/net"))
                .map_err(|_| DriverError::NotRunning)?;
            if sys::proc_start_time(pid).ok() != Some(start_time) {
                return Err(DriverError::NotRunning);
            }
            let path = PathBuf::from(format!("/proc/self/fd/{}", ns.as_raw_fd()));
            bulkhead_egress::open_tun_in_netns(&path).map_err(|e| {
                DriverError::io(
                    "create the sandbox's network link",
                    io::Error::other(e.to_string()),
                )
            })
        })
        .await
        .map_err(|e| DriverError::io("network link task", io::Error::other(e.to_string())))?
    }

    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        let sb = self.lookup(handle).ok_or(DriverError::NotRunning)?;
        if sb.exited().is_some() {
            return Err(DriverError::NotRunning);
        }
        let inner = self.inner.clone();
        let upper = self.slot_dir(handle.slot).join("upper");
        let name = sb.cgroup.clone();
        tokio::task::spawn_blocking(move || {
            let cg = inner
                .cgroups
                .usage(&name)
                .map_err(|e| DriverError::io(format!("read cgroup {name}"), e))?;
            Ok(ResourceUsage {
                cpu_usage_ns: cg.cpu_usage_ns,
                mem_used_bytes: cg.mem_used_bytes,
                mem_cache_bytes: cg.mem_cache_bytes,
                mem_limit_bytes: cg.mem_limit_bytes,
                disk_used_bytes: disk_usage(&upper),
                disk_total_bytes: statvfs_total(&upper),
                pids_current: cg.pids_current,
            })
        })
        .await
        .map_err(|e| DriverError::io("usage task", io::Error::other(e.to_string())))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_keys_are_stable_and_short() {
        let t = tempfile::tempdir().unwrap();
        let a = template_key(t.path()).unwrap();
        assert_eq!(a, template_key(t.path()).unwrap());
        assert_eq!(a.len(), 12);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(a, template_key(other.path()).unwrap());
    }

    #[test]
    fn handle_data_round_trips() {
        let d = HandleData {
            cgroup: "3-deadbeef".into(),
            cgroup_version: CgroupVersion::V1,
            lower: "/var/lib/bulkhead/jail/l/3-abc".into(),
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["cgroup_version"], "v1");
        assert_eq!(serde_json::from_value::<HandleData>(v).unwrap(), d);
    }

    #[test]
    fn unsearchable_ancestors_are_reported() {
        let t = tempfile::tempdir().unwrap();
        let inner = t.path().join("a/b");
        fs::create_dir_all(&inner).unwrap();
        fs::set_permissions(t.path().join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        let e = check_searchable(&inner, "state_dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs o+x"), "{e}");
        fs::set_permissions(t.path().join("a"), fs::Permissions::from_mode(0o711)).unwrap();
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
        check_searchable(&inner, "state_dir").unwrap();
    }

    #[test]
    fn log_tail_ignores_symlinks_and_fifos() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        fs::write(&secret, "host secret").unwrap();
        let log = t.path().join("agent.log");
        std::os::unix::fs::symlink(&secret, &log).unwrap();
        assert_eq!(log_tail(&log), "");
        fs::remove_file(&log).unwrap();
        let c = sys::cpath(&log).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(log_tail(&log), "");
        fs::remove_file(&log).unwrap();
        fs::write(&log, "line 1\nboom\n").unwrap();
        assert_eq!(log_tail(&log), "; agent output: line 1\nboom");
    }

    #[tokio::test]
    async fn agent_connections_refuse_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real.sock");
        let listener = tokio::net::UnixListener::bind(&real).unwrap();
        connect_agent(&real).await.unwrap();
        let (_conn, _) = listener.accept().await.unwrap();
        let link = t.path().join("agent.sock");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // O_PATH|O_NOFOLLOW opens the link itself, which is not a socket.
        let e = connect_agent(&link).await.unwrap_err();
        assert!(e.to_string().contains("is not a socket"), "{e}");
        let file = t.path().join("plain");
        fs::write(&file, "").unwrap();
        assert!(connect_agent(&file).await.is_err());
    }

    #[test]
    fn disk_usage_counts_allocated_blocks() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("d")).unwrap();
        fs::write(t.path().join("d/f"), vec![1u8; 64 * 1024]).unwrap();
        let u = disk_usage(t.path());
        assert!(u >= 64 * 1024, "{u}");
        assert!(statvfs_total(t.path()) > u);
    }
}
