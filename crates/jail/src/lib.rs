//! The `jail` driver: sandboxes as Linux namespaces on one host.
//!
//! A sandbox is the agent binary running as pid 1 of fresh user, mount, pid, net, ipc, uts and
//! cgroup namespaces, over an overlay whose lower layer is an idmapped, read-only view of the
//! template root filesystem. Each sandbox gets a *slot*: a uid/gid range
//! (`uid_base + slot * 65536`, 65536 ids), a directory `<state_dir>/s/<slot>` (overlay upper,
//! work, merge point, agent socket) and cgroups `<cgroup_parent>/<slot>-<nonce>`.
//!
//! The server is multi-threaded, so it never calls `clone`; a short-lived launcher process
//! (see [`launcher`]) does, then exits, and the sandbox init is re-parented to the server,
//! which is a child subreaper and reaps it through a pidfd. Hardening: Docker's default
//! capability set inside the user namespace, Landlock, and a seccomp deny-list kept as data in
//! `policy/seccomp.json` (installed with CAP_SYS_ADMIN in the user namespace rather than with
//! `no_new_privs`, so set-uid programs such as `sudo` reach the sandbox's own root).
//!
//! x86_64 only (the seccomp policy and the raw `clone` calls are architecture-specific).

#[cfg(not(target_arch = "x86_64"))]
compile_error!("bulkhead-jail supports x86_64 only");

pub mod changes;
mod child;
pub mod confine;
pub mod criu;
mod driver;
pub mod launcher;
pub mod loopdev;
pub mod mountplan;
mod probe;
pub mod seccomp;
pub mod slots;
pub mod spec;
pub mod uidshift;
pub mod zygote;

/// The host primitives the jail shares with the microvm driver (see `bulkhead-host`), under the
/// paths the jail has always had them.
pub use bulkhead_host::{cgroup, freezer, sys};

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use bulkhead_driver::{DriverError, StartError};

pub use cgroup::CgroupVersion;
pub use driver::{JailDriver, LaunchError};
pub use probe::HostReport;

/// Size of each slot's uid/gid range.
pub const IDS_PER_SLOT: u32 = 65536;
pub const DEFAULT_UID_BASE: u32 = 1_000_000;

#[derive(Debug, Clone)]
pub struct JailConfig {
    /// Slots, per-sandbox directories and idmapped lowers live here. Keep it short and neutral:
    /// overlay paths under it show in the sandbox's `/proc/self/mountinfo`. Every ancestor must
    /// be searchable by others (mode `o+x`): the sandbox root, an unprivileged uid on the host,
    /// mounts from beneath it.
    pub state_dir: PathBuf,
    /// Host path of `bulkhead-agent`, bind-mounted read-only to `/run/bulkhead/agent`.
    pub agent_binary: PathBuf,
    /// Program and arguments that run [`launcher::main`] in a fresh process
    /// (`[<bulkhead>, "__jail-launch"]`).
    pub launcher: Vec<OsString>,
    /// Extra arguments for the agent.
    pub agent_args: Vec<String>,
    /// First host uid (and gid) of slot 0.
    pub uid_base: u32,
    pub max_slots: u32,
    /// cgroup directory (relative to each hierarchy's root) that holds the sandbox cgroups.
    pub cgroup_parent: String,
    /// Upper bound for `start`, from spawning the launcher to the agent accepting connections.
    pub start_timeout: Duration,
    /// PEM certificates appended to each template's CA bundle, which is then bind-mounted
    /// read-only over the sandbox's `/etc/ssl/certs/ca-certificates.crt` (the egress proxy's
    /// public CA certificate and the operator's extra roots). None leaves the template's own.
    pub sandbox_ca_pem: Option<String>,
    /// The only `nameserver` of every sandbox's `/etc/resolv.conf` (the egress gateway). None
    /// leaves the template's file alone.
    pub nameserver: Option<std::net::Ipv4Addr>,
    /// The CRIU binary (see `scripts/criu.sh`) for checkpoint and restore (pause, resume,
    /// snapshot, fork). None: those answer `Unsupported` with how to fix it.
    pub criu: Option<PathBuf>,
}

impl JailConfig {
    /// A configuration with the default uid base, 256 slots, cgroup parent `bulkhead` and a
    /// 10 s start timeout.
    pub fn new(state_dir: PathBuf, agent_binary: PathBuf, launcher: Vec<OsString>) -> JailConfig {
        JailConfig {
            state_dir,
            agent_binary,
            launcher,
            agent_args: Vec::new(),
            uid_base: DEFAULT_UID_BASE,
            max_slots: 256,
            cgroup_parent: "bulkhead".into(),
            start_timeout: Duration::from_secs(10),
            sandbox_ca_pem: None,
            nameserver: None,
            criu: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("Invalid jail configuration: {0}")]
    Config(String),
    #[error("This host cannot run jail sandboxes: {0}")]
    Unsupported(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl JailError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> JailError {
        JailError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<JailError> for DriverError {
    fn from(e: JailError) -> DriverError {
        match e {
            JailError::Unsupported(reason) => DriverError::HostUnsupported {
                driver: "jail",
                reason,
            },
            JailError::Config(m) => DriverError::Start(StartError::Config(m)),
            JailError::Io { context, source } => DriverError::Io { context, source },
        }
    }
}
