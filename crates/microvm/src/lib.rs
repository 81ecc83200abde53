//! The `microvm` driver: each sandbox is a QEMU `microvm` virtual machine running
//! `bulkhead-agent` as its pid 1, behind the same [`Driver`](bulkhead_driver::Driver) trait as
//! the jail.
//!
//! - [`qemu`]: the QEMU command line (direct kernel boot, no firmware, PCI or ACPI);
//! - [`image`]: the VM's disks from the jail's template trees (erofs, cached per content) and
//!   the agent binary (a boot disk), plus each sandbox's writable disk;
//! - [`vm`]: spawning QEMU, the per-sandbox record, process checks;
//! - [`jailer`]: QEMU's jail (cgroup, pid and mount namespaces, a root with only its files);
//! - [`qmp`]: QEMU's control socket (freeze and thaw are `stop` and `cont`);
//! - [`probe`]: which acceleration the host offers (hardware KVM, PVM-only, TCG);
//! - [`snapshot`]: per-template snapshots (RAM file, device state, disk) sandboxes are cloned
//!   from; `clone`: taking them and restoring clones; `persist`: checkpoints (pause, snapshot)
//!   and their restores;
//! - `driver`: [`MicrovmDriver`].
//!
//! The host reaches the agent through a virtio-serial port mapped to a Unix socket, with many
//! streams multiplexed over it (`bulkhead-vmchan`), so no `vhost-vsock` is needed.
//!
//! A sandbox has a *slot*: `<state_dir>/s/<slot>` (writable disk, sockets, console log, the
//! record) and a host uid `uid_base + slot` that QEMU runs as.

mod clone;
mod driver;
pub mod image;
pub mod jailer;
mod migrate;
mod persist;
pub mod probe;
pub mod qemu;
pub mod qmp;
pub mod snapshot;
pub mod vm;

use std::path::PathBuf;
use std::time::Duration;

use bulkhead_driver::{DriverError, StartError};

pub use driver::MicrovmDriver;
pub use qemu::Accel;

pub const DEFAULT_UID_BASE: u32 = 20_000_000;

#[derive(Debug, Clone)]
pub struct MicrovmConfig {
    /// Slots (per-sandbox directories) live here. Every ancestor must be searchable by others
    /// (mode `o+x`): QEMU runs as an unprivileged uid.
    pub state_dir: PathBuf,
    /// Shared images are cached in `<cache_dir>/microvm/`.
    pub cache_dir: PathBuf,
    /// The guest kernel (`bzImage` from `scripts/guest-kernel.sh`).
    pub kernel: PathBuf,
    /// `bulkhead-agent` (a static or glibc build; the guest runs it from the template's libc).
    pub agent_binary: PathBuf,
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// None: detect ([`probe::detect`]).
    pub accel: Option<Accel>,
    /// Host uid (and gid) of slot 0's QEMU.
    pub uid_base: u32,
    pub max_slots: u32,
    /// Size of each sandbox's writable disk (sparse; the sandbox's disk limit).
    pub disk_mb: u64,
    /// Upper bound for `start`, from spawning QEMU to the agent answering.
    pub start_timeout: Duration,
    /// The agent's log filter inside the guest (its output goes to the console log).
    pub agent_log: String,
    /// Create sandboxes as clones of a per-template snapshot (docs/microvm.md); false: every
    /// start boots from scratch.
    pub snapshots: bool,
    /// Where template snapshots are kept (default `<cache_dir>/microvm`).
    pub snapshot_dir: PathBuf,
    /// PEM certificates every sandbox trusts beside its template's (the egress proxy's CA,
    /// operator roots): carried on the boot disk, added to the guest's system bundle.
    pub sandbox_ca_pem: Option<String>,
}

impl MicrovmConfig {
    pub fn new(
        state_dir: PathBuf,
        cache_dir: PathBuf,
        kernel: PathBuf,
        agent_binary: PathBuf,
    ) -> MicrovmConfig {
        MicrovmConfig {
            snapshot_dir: cache_dir.join("microvm"),
            state_dir,
            cache_dir,
            kernel,
            agent_binary,
            qemu: "qemu-system-x86_64".into(),
            accel: None,
            uid_base: DEFAULT_UID_BASE,
            max_slots: 256,
            disk_mb: 2048,
            start_timeout: Duration::from_secs(60),
            agent_log: "warn".into(),
            snapshots: true,
            sandbox_ca_pem: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MicrovmError {
    #[error("Invalid microvm configuration: {0}")]
    Config(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl MicrovmError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> MicrovmError {
        MicrovmError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<MicrovmError> for DriverError {
    fn from(e: MicrovmError) -> DriverError {
        match e {
            MicrovmError::Config(m) => DriverError::Start(StartError::Config(m)),
            MicrovmError::Io { context, source } => DriverError::Io { context, source },
        }
    }
}
