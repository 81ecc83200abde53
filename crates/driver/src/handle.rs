//! What the engine hands a driver ([`SandboxSpec`]) and what it keeps of a running sandbox
//! ([`DriverHandle`], stored as JSON so a restarted server can re-adopt the sandbox).
//!
//! # Handle format
//!
//! A stored handle outlives the server that wrote it: after an upgrade the new server reads
//! handles written by the old one, and a checkpoint image (persistence) may keep one for
//! weeks. [`DriverHandle::format`] says which layout a handle has:
//!
//! | format | layout |
//! |---|---|
//! | 1 | `driver`, `pid`, `pid_start_time`, `slot`, `data` (driver-specific), and `node` where a cluster placed it (absent otherwise). Handles written before the field existed lack `format` and are read as 1. |
//!
//! A change that an older server could misread (a field changing meaning, `data` changing shape
//! in a way the driver's own parser would accept wrongly) bumps [`DRIVER_HANDLE_FORMAT`]. A
//! server adopts handles up to its own format and refuses newer ones ([`DriverHandle::is_readable`]),
//! so a downgrade leaves such sandboxes alone rather than guessing. Adding an optional field
//! with a serde default does not need a bump.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The handle format this build writes (see the module docs).
pub const DRIVER_HANDLE_FORMAT: u32 = 1;

/// What the engine asks a driver to start. Per-request identity (sandbox id, env vars, access
/// token) is *not* here: it is applied after a warm-pool claim through the agent's `/init`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxSpec {
    /// Template id (for logs and cgroup naming only).
    pub template_id: String,
    /// Read-only root filesystem of the template on the host.
    pub rootfs: PathBuf,
    /// Number of CPUs the sandbox may use (cgroup quota = cpu_count * period).
    pub cpu_count: u32,
    /// Memory limit in MiB (memory + swap).
    pub memory_mb: u64,
    /// Maximum number of tasks (processes + threads) in the sandbox.
    pub pids_max: u64,
    /// Size of the sandbox's writable disk in MiB (E2B's `diskSizeMB`): what it may write on
    /// top of its template, bytes and files alike. 0: the driver's default.
    #[serde(default)]
    pub disk_mb: u64,
    /// Host directories mounted read-write into the sandbox (E2B volumes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
}

/// A host directory the driver mounts read-write at `path` inside the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeMount {
    /// The volume's name (for logs and checkpoint keys).
    pub name: String,
    /// The volume's data directory on the host (owned by the engine's volume store).
    pub host_dir: PathBuf,
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// Driver-specific, serialisable description of a running sandbox; stored so a restarted
/// server can re-adopt it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DriverHandle {
    /// Layout of this handle (see the module docs). Absent in handles written before it
    /// existed, which are format 1.
    #[serde(default = "first_format")]
    pub format: u32,
    /// Driver name (`jail`, `microvm`).
    pub driver: String,
    /// Host pid of the sandbox's init (the agent, pid 1 inside).
    pub pid: i32,
    /// Process start time (field 22 of /proc/PID/stat) so a recycled pid is never mistaken
    /// for the sandbox after a restart.
    pub pid_start_time: u64,
    /// Per-driver slot (uid range, directories).
    pub slot: u32,
    /// Opaque driver data (paths, cgroup names).
    pub data: serde_json::Value,
    /// The cluster node the sandbox runs on, set by the router that placed it (the engine's
    /// `ClusterNode`) so that every later call reaches that node. Drivers and single nodes
    /// leave it unset and ignore it; absent in handles written before clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

fn first_format() -> u32 {
    1
}

impl DriverHandle {
    /// A handle in the current format.
    pub fn new(
        driver: impl Into<String>,
        pid: i32,
        pid_start_time: u64,
        slot: u32,
        data: serde_json::Value,
    ) -> DriverHandle {
        DriverHandle {
            format: DRIVER_HANDLE_FORMAT,
            driver: driver.into(),
            pid,
            pid_start_time,
            slot,
            data,
            node: None,
        }
    }

    /// Can this build interpret the handle? False for handles written by a newer server.
    pub fn is_readable(&self) -> bool {
        (1..=DRIVER_HANDLE_FORMAT).contains(&self.format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_without_a_format_are_format_1() {
        // Exactly what a server before the format field stored.
        let old = r#"{"driver":"jail","pid":4242,"pid_start_time":987654,"slot":3,
            "data":{"cgroup":"3-deadbeef","cgroup_version":"v1","lower":"/var/lib/bulkhead/jail/l/3-abc"}}"#;
        let h: DriverHandle = serde_json::from_str(old).unwrap();
        assert_eq!(h.format, 1);
        assert_eq!(
            (h.driver.as_str(), h.pid, h.pid_start_time, h.slot),
            ("jail", 4242, 987654, 3)
        );
        assert_eq!(h.data["cgroup"], "3-deadbeef");
        assert!(h.is_readable());
    }

    #[test]
    fn current_handles_round_trip_with_their_format() {
        let h = DriverHandle::new("jail", 7, 8, 9, serde_json::json!({"k": "v"}));
        assert_eq!(h.format, DRIVER_HANDLE_FORMAT);
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["format"], DRIVER_HANDLE_FORMAT);
        assert_eq!(serde_json::from_value::<DriverHandle>(json).unwrap(), h);
    }

    #[test]
    fn the_node_is_optional_and_left_out_when_unset() {
        let h = DriverHandle::new("jail", 7, 8, 9, serde_json::Value::Null);
        assert_eq!(h.node, None);
        let json = serde_json::to_value(&h).unwrap();
        assert!(
            json.get("node").is_none(),
            "a single node's handle is stored as before: {json}"
        );
        let mut placed = h.clone();
        placed.node = Some("n2".into());
        let json = serde_json::to_value(&placed).unwrap();
        assert_eq!(json["node"], "n2");
        assert_eq!(
            serde_json::from_value::<DriverHandle>(json).unwrap(),
            placed
        );
    }

    #[test]
    fn newer_formats_are_not_readable() {
        let mut h = DriverHandle::new("jail", 7, 8, 9, serde_json::Value::Null);
        h.format = DRIVER_HANDLE_FORMAT + 1;
        assert!(!h.is_readable());
        h.format = 0;
        assert!(!h.is_readable());
    }
}
