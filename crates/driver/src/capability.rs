//! Optional driver capabilities, in the manner of Cloud Hypervisor's `Pausable` and
//! `Snapshottable`: every driver answers [`crate::Driver::capabilities`], and the trait's
//! optional methods default to [`crate::DriverError::Unsupported`]. A driver claims a
//! capability only once it implements it and passes the conformance cases for it.
//!
//! How the engine's verbs map onto them (the persistence work builds these):
//!
//! | verb | driver calls |
//! |---|---|
//! | short pause | [`freeze`](crate::Driver::freeze), later [`thaw`](crate::Driver::thaw) (RAM stays allocated) |
//! | pause (free RAM) | `freeze`, [`checkpoint`](crate::Driver::checkpoint) with `leave_running: false` |
//! | resume | [`restore`](crate::Driver::restore) from the pause's directory |
//! | snapshot | `checkpoint` with `leave_running: true` |
//! | fork | `restore` of a snapshot as a new sandbox |

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The optional things a driver can do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// [`freeze`](crate::Driver::freeze) and [`thaw`](crate::Driver::thaw): stop every process
    /// of the sandbox where it is and let it go on later.
    pub freeze: bool,
    /// [`checkpoint`](crate::Driver::checkpoint) with `leave_running: false` and
    /// [`restore`](crate::Driver::restore).
    pub checkpoint: bool,
    /// [`checkpoint`](crate::Driver::checkpoint) with `leave_running: true`.
    pub snapshot: bool,
    /// The kind of network link [`open_network`](crate::Driver::open_network) gives.
    pub network: NetworkLink,
}

/// The host's end of a sandbox's network link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkLink {
    /// No link: `open_network` answers `Unsupported`.
    #[default]
    None,
    /// A TUN device created inside the sandbox's network namespace (the jail); the host holds
    /// its file descriptor and moves IP packets.
    TunInNetns,
    /// The VM's NIC, bridged by the driver to a packet socket (the microvm): the host's end
    /// moves IP packets, like the TUN's.
    VmNic,
    /// A TAP device the VMM attaches to the guest's virtio-net (the microvm); Ethernet frames.
    Tap,
}

/// An optional operation, named in [`crate::DriverError::Unsupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    OpenNetwork,
    Freeze,
    Thaw,
    Checkpoint,
    Snapshot,
    Restore,
    Changes,
    ExportChanges,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::OpenNetwork => "give a sandbox a network link",
            Operation::Freeze => "freeze a sandbox",
            Operation::Thaw => "thaw a sandbox",
            Operation::Checkpoint => "checkpoint a sandbox",
            Operation::Snapshot => "snapshot a running sandbox",
            Operation::Restore => "restore a sandbox from a checkpoint",
            Operation::Changes => "list a sandbox's file changes",
            Operation::ExportChanges => "export a sandbox's file changes",
        })
    }
}

/// How to [`checkpoint`](crate::Driver::checkpoint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// Keep the sandbox running afterwards (a snapshot). Otherwise the sandbox has ended once
    /// the checkpoint is written, and its resources (RAM, slot) are free.
    pub leave_running: bool,
    /// Keep only the filesystem changes, no memory or processes (E2B's `memory: false`): a
    /// restore boots the template afresh on the saved files.
    pub filesystem_only: bool,
}

/// How to [`restore`](crate::Driver::restore).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreOptions {
    /// The checkpoint is not needed afterwards (resuming a pause): the driver may move files
    /// out of it instead of copying them. The caller deletes the directory after success; on
    /// failure the checkpoint is left restorable.
    pub consume: bool,
    /// Ignore the checkpoint's memory and processes: boot the template afresh on the
    /// checkpoint's saved filesystem (E2B's `memory: false` on connect). The memory part of the
    /// image is left as it was. A checkpoint without memory always restores this way.
    pub filesystem_only: bool,
    /// The envd access token the restored agent already holds (a secured sandbox's memory):
    /// what a driver sends with its own calls to that agent after the restore.
    pub access_token: Option<String>,
}

/// What [`checkpoint`](crate::Driver::checkpoint) wrote into its directory: memory, process
/// state and the sandbox's filesystem changes, everything [`restore`](crate::Driver::restore)
/// needs besides the template itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// The driver that wrote it; only that driver can restore it.
    pub driver: String,
    /// Layout of the image, versioned like [`crate::DriverHandle::format`] and by the driver.
    pub format: u32,
    /// Where the image is.
    pub dir: PathBuf,
    /// Bytes written (for quotas and metering).
    pub size_bytes: u64,
    /// Whether memory and processes were kept (false: filesystem only).
    #[serde(default = "yes")]
    pub memory: bool,
}

fn yes() -> bool {
    true
}

/// One entry of a sandbox's filesystem changes against its template (or a snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// Absolute path inside the sandbox.
    pub path: String,
    pub kind: ChangeKind,
    /// `file`, `dir`, `symlink` or `other`; for a deletion, what was deleted if known.
    pub file_type: String,
    /// Size in bytes (0 for deletions and directories).
    pub size: u64,
    /// Modification time, seconds since the epoch (absent for deletions).
    pub mtime: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Created,
    Modified,
    Deleted,
}

/// Whose changes [`changes`](crate::Driver::changes) lists.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeSource {
    /// A live sandbox.
    Running(crate::DriverHandle),
    /// A checkpoint (a paused sandbox or a snapshot) in this directory.
    Checkpoint(PathBuf),
}
