//! Guest mode: the agent as pid 1 of a microVM (`--guest-port`), where no launcher prepared
//! anything.
//!
//! The kernel mounts the small read-only *boot disk* (serial `bulkhead-boot`: this binary and
//! empty mount points) as `/`. [`prepare_root`] then mounts the template image (`bulkhead-root`,
//! erofs or ext4, read-only) and the sandbox's writable disk (`bulkhead-rw`, ext4) under an
//! overlay, pivots into it (the boot disk stays at `/run/bulkhead/boot`), mounts the API file
//! systems, the sandbox's pids cgroup ([`crate::guest_limits`]), puts the deployment's CA into the trust bundle ([`crate::guest_ca`]), brings up
//! `lo` and configures `eth0` ([`crate::guest_net`]). [`bridge`] serves the host's agent streams arriving on a
//! virtio-serial port by connecting each to the agent's own Unix socket
//! (see `bulkhead-vmchan`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::mount::{MsFlags, mount};

/// Where the boot disk stays visible after the pivot.
pub const BOOT_DIR: &str = "/run/bulkhead/boot";

#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    #[error("No disk with serial {0:?}: start the VM with the microvm driver's disks")]
    MissingDisk(&'static str),
    #[error("Could not mount {what} at {target}")]
    Mount {
        what: String,
        target: String,
        #[source]
        source: nix::Error,
    },
    #[error("Guest set-up failed: {context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> GuestError {
    let context = context.into();
    move |source| GuestError::Io { context, source }
}

fn mnt(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), GuestError> {
    std::fs::create_dir_all(target).map_err(io(format!("mkdir {target}")))?;
    mount(source, target, fstype, flags, data).map_err(|source_err| GuestError::Mount {
        what: format!("{} ({})", source.unwrap_or("-"), fstype.unwrap_or("bind")),
        target: target.into(),
        source: source_err,
    })
}

/// The block device whose virtio serial is `serial` (`/dev/vdX`), looked up in `sysfs`.
fn disk(sysfs: &Path, serial: &'static str) -> Result<String, GuestError> {
    let dir = std::fs::read_dir(sysfs.join("block")).map_err(io("read /sys/block"))?;
    dir.flatten()
        .find(|e| {
            std::fs::read_to_string(e.path().join("serial")).is_ok_and(|s| s.trim() == serial)
        })
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .ok_or(GuestError::MissingDisk(serial))
}

/// Builds the sandbox's root file system and enters it. Runs in pid 1 before any thread.
pub fn prepare_root() -> Result<(), GuestError> {
    let none = MsFlags::empty();
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    // The boot disk is read-only: everything below goes onto a tmpfs.
    mnt(
        Some("tmpfs"),
        "/run",
        Some("tmpfs"),
        nosuid,
        Some("mode=0755"),
    )?;
    mnt(Some("sysfs"), "/run/sys", Some("sysfs"), nosuid, None)?;
    let sysfs = Path::new("/run/sys");
    let (root_dev, rw_dev) = (disk(sysfs, "bulkhead-root")?, disk(sysfs, "bulkhead-rw")?);
    let _ = nix::mount::umount("/run/sys");
    let lower = "/run/lower";
    let ro = MsFlags::MS_RDONLY;
    if mnt(Some(&root_dev), lower, Some("erofs"), ro, None).is_err() {
        mnt(Some(&root_dev), lower, Some("ext4"), ro, None)?;
    }
    mnt(Some(&rw_dev), "/run/rw", Some("ext4"), none, None)?;
    for d in ["/run/rw/upper", "/run/rw/work"] {
        std::fs::create_dir_all(d).map_err(io(format!("mkdir {d}")))?;
    }
    let new_root = "/run/root";
    mnt(
        Some("overlay"),
        new_root,
        Some("overlay"),
        none,
        Some("lowerdir=/run/lower,upperdir=/run/rw/upper,workdir=/run/rw/work"),
    )?;
    mnt(
        Some("tmpfs"),
        "/run/root/run",
        Some("tmpfs"),
        nosuid,
        Some("mode=0755"),
    )?;
    let put_old = format!("{new_root}{BOOT_DIR}");
    std::fs::create_dir_all(&put_old).map_err(io(format!("mkdir {put_old}")))?;
    nix::unistd::pivot_root(new_root, put_old.as_str()).map_err(|e| GuestError::Mount {
        what: "pivot_root".into(),
        target: new_root.into(),
        source: e,
    })?;
    std::env::set_current_dir("/").map_err(io("chdir /"))?;
    mnt(Some("proc"), "/proc", Some("proc"), nosuid, None)?;
    mnt(Some("sysfs"), "/sys", Some("sysfs"), nosuid | ro, None)?;
    crate::guest_limits::setup(crate::guest_limits::boot_pids_max()).map_err(io(
        "make the sandbox's pids cgroup (a guest kernel without CONFIG_CGROUP_PIDS: rebuild it \
         with scripts/guest-kernel.sh)",
    ))?;
    mnt(
        Some("devtmpfs"),
        "/dev",
        Some("devtmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )?;
    mnt(
        Some("devpts"),
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    )?;
    let _ = std::fs::remove_file("/dev/ptmx");
    std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx").map_err(io("symlink /dev/ptmx"))?;
    mnt(
        Some("tmpfs"),
        "/dev/shm",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    crate::guest_ca::install(Path::new(BOOT_DIR))
        .map_err(io("put the deployment's CA into the system trust bundle"))?;
    loopback_up()?;
    set_clock();
    // The sandbox still works without its NIC (commands, files): say why and go on.
    if let Err(e) = crate::guest_net::configure() {
        eprintln!(
            "bulkhead-agent: the sandbox has no network: {}",
            crate::error_chain(&e)
        );
    }
    Ok(())
}

/// The guest has no RTC: start from the host's clock at VM start, passed on the kernel command
/// line as `BULKHEAD_GUEST_CLOCK=<secs>.<nanos>` (behind by the boot time).
fn set_clock() {
    let Some((secs, nanos)) = std::env::var("BULKHEAD_GUEST_CLOCK").ok().and_then(|v| {
        let (s, n) = v.split_once('.')?;
        Some((s.parse::<i64>().ok()?, n.parse::<i64>().ok()?))
    }) else {
        return;
    };
    let ts = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: nanos as libc::c_long,
    };
    // SAFETY: a valid timespec; pid 1 runs as root in the guest.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        eprintln!(
            "bulkhead-agent: cannot set the guest clock: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// `ip link set lo up`.
fn loopback_up() -> Result<(), GuestError> {
    bulkhead_host::netif::loopback_up().map_err(|e| GuestError::Io {
        context: format!("bring up lo ({e})"),
        source: e.source,
    })
}

/// `/dev/vportNpM` of the virtio-serial port named `name`.
fn port_device(name: &str) -> Option<PathBuf> {
    let dir = std::fs::read_dir("/sys/class/virtio-ports").ok()?;
    dir.flatten()
        .find(|e| std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == name))
        .map(|e| Path::new("/dev").join(e.file_name()))
}

/// Serves the host's streams on the virtio-serial port `name` forever, connecting each to the
/// agent's Unix socket `agent`. When the host is not connected the port reads end of file;
/// the bridge then waits and reads again (the next host session starts with a HELLO).
pub async fn bridge(name: String, agent: PathBuf) {
    let acceptor: bulkhead_vmchan::Acceptor = Arc::new(move || {
        let agent = agent.clone();
        Box::pin(async move {
            let s = tokio::net::UnixStream::connect(agent).await?;
            Ok(Box::new(s) as bulkhead_vmchan::Local)
        })
    });
    let Some(dev) = port_device(&name) else {
        tracing::error!(port = %name, "no virtio-serial port of that name; the host cannot reach the agent");
        return;
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
    {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(device = %dev.display(), "cannot open the agent port: {e}");
            return;
        }
    };
    loop {
        // Separate descriptors for reads and writes, so a blocked read does not hold writes.
        let (r, w) = match file.try_clone() {
            Ok(w) => match file.try_clone() {
                Ok(r) => (tokio::fs::File::from_std(r), tokio::fs::File::from_std(w)),
                Err(e) => {
                    tracing::error!("dup of the agent port failed: {e}");
                    return;
                }
            },
            Err(e) => {
                tracing::error!("dup of the agent port failed: {e}");
                return;
            }
        };
        if let Err(e) = bulkhead_vmchan::serve_guest(r, w, acceptor.clone()).await {
            tracing::warn!("agent channel: {e}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
