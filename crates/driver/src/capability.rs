//! Optional driver capabilities, in the manner of Cloud Hypervisor's `Pausable` and
//! `Snapshottable`: every driver answers [`crate::Driver::capabilities`], and the trait's
//! optional methods default to [`crate::DriverError::Unsupported`] (or to a documented plain
//! behaviour). A driver claims a capability only once it implements it and passes the
//! conformance cases for it; a case skips an operation only when the capability is not claimed,
//! and then checks the default answer instead.
//!
//! Every optional method of the trait and the capability that declares it:
//!
//! | method | capability | without it |
//! |---|---|---|
//! | [`open_network`](crate::Driver::open_network) | [`network`](Capabilities::network) `!= None` | `Unsupported` |
//! | [`freeze`](crate::Driver::freeze), [`thaw`](crate::Driver::thaw) | [`freeze`](Capabilities::freeze) | `Unsupported` |
//! | [`checkpoint`](crate::Driver::checkpoint) (`leave_running: false`), [`restore`](crate::Driver::restore), [`checkpoint_info`](crate::Driver::checkpoint_info) | [`checkpoint`](Capabilities::checkpoint) | `Unsupported`; `checkpoint_info` answers `None` |
//! | [`checkpoint`](crate::Driver::checkpoint) (`leave_running: true`) | [`snapshot`](Capabilities::snapshot) | `Unsupported` |
//! | [`checkpoint_key`](crate::Driver::checkpoint_key) | [`checkpoint_key`](Capabilities::checkpoint_key) | `None` |
//! | [`start_warm`](crate::Driver::start_warm), [`claimed`](crate::Driver::claimed) | [`warm_start`](Capabilities::warm_start) | a plain start; `claimed` does nothing |
//! | [`changes`](crate::Driver::changes) | [`changes`](Capabilities::changes) | `Unsupported` |
//! | [`export_changes`](crate::Driver::export_changes) | [`export_changes`](Capabilities::export_changes) | `Unsupported` |
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
//! | warm pool | [`start_warm`](crate::Driver::start_warm), then [`claimed`](crate::Driver::claimed) when handed out |
//! | template build | [`export_changes`](crate::Driver::export_changes) |

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The optional things a driver can do (see the module's table for the methods each covers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Capabilities {
    /// [`freeze`](crate::Driver::freeze) and [`thaw`](crate::Driver::thaw): stop every process
    /// of the sandbox where it is and let it go on later.
    pub freeze: bool,
    /// [`checkpoint`](crate::Driver::checkpoint) with `leave_running: false`,
    /// [`restore`](crate::Driver::restore), and [`checkpoint_info`](crate::Driver::checkpoint_info)
    /// recognising the checkpoints it wrote.
    pub checkpoint: bool,
    /// [`checkpoint`](crate::Driver::checkpoint) with `leave_running: true`.
    pub snapshot: bool,
    /// The kind of network link [`open_network`](crate::Driver::open_network) gives.
    pub network: NetworkLink,
    /// [`start_warm`](crate::Driver::start_warm) runs the sandbox at a background CPU priority
    /// until [`claimed`](crate::Driver::claimed). Without it a warm start is a plain start.
    pub warm_start: bool,
    /// [`changes`](crate::Driver::changes): the files a sandbox (or, with `checkpoint`, one of
    /// its checkpoints) changed against its template.
    pub changes: bool,
    /// [`export_changes`](crate::Driver::export_changes): a sandbox's changes as an overlay
    /// layer (template builds).
    pub export_changes: bool,
    /// [`checkpoint_key`](crate::Driver::checkpoint_key) names what memory checkpoints depend
    /// on, so that they may be kept for reuse across server starts.
    pub checkpoint_key: bool,
}

impl Capabilities {
    /// What every one of `caps` offers (none: the default). The network link: none if any
    /// lacks one, else the first's (callers only ask whether there is a link at all).
    pub fn common(caps: &[Capabilities]) -> Capabilities {
        let Some(first) = caps.first() else {
            return Capabilities::default();
        };
        let all = |f: fn(&Capabilities) -> bool| caps.iter().all(f);
        Capabilities {
            freeze: all(|c| c.freeze),
            checkpoint: all(|c| c.checkpoint),
            snapshot: all(|c| c.snapshot),
            warm_start: all(|c| c.warm_start),
            changes: all(|c| c.changes),
            export_changes: all(|c| c.export_changes),
            checkpoint_key: all(|c| c.checkpoint_key),
            network: if caps.iter().any(|c| c.network == NetworkLink::None) {
                NetworkLink::None
            } else {
                first.network
            },
        }
    }
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
