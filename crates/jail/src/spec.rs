//! The launcher's wire contract: one JSON request on stdin, one JSON reply line on stdout.
//!
//! ```text
//! stdin : {"op":"start", ...StartSpec}   or   {"op":"idmap", ...IdmapSpec}
//! stdout: {"pid":1234,"start_time":5678} | {"ok":true} | {"error":"<step>: <reason>"}
//! exit  : 0 on success, 1 on a reported error, 2 when the request itself is unreadable
//! ```

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything the launcher needs to start one sandbox. Host paths are absolute.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartSpec {
    /// First host uid/gid of the slot; 0..id_count inside maps to uid_base.. outside.
    pub uid_base: u32,
    pub id_count: u32,
    /// Idmapped, read-only view of the template root filesystem.
    pub lower: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub merged: PathBuf,
    /// Host directory bind-mounted to `/run/bulkhead/sock` (the agent's socket lands here).
    pub sock_dir: PathBuf,
    /// Host path of the agent binary, bind-mounted read-only to `/run/bulkhead/agent`.
    pub agent_binary: PathBuf,
    /// argv of the agent; argv[0] is the in-sandbox path that is executed.
    pub argv: Vec<String>,
    /// Complete environment of the agent (`KEY=value`).
    pub env: Vec<String>,
    pub hostname: String,
    /// `cgroup.procs` files the child is written into before it is released.
    pub cgroup_procs: Vec<PathBuf>,
    /// Size of the `/dev/shm` tmpfs mount.
    pub shm_size_mb: u64,
    /// Mount the overlay `volatile`: the kernel then never syncs the upper filesystem, neither
    /// on `fsync` inside the sandbox nor when the overlay goes away. Without it every sandbox
    /// teardown runs `syncfs` on the whole host filesystem that holds the upper dirs (measured:
    /// 60-170 ms per stop with a busy disk), and any sandbox can force host-wide flushes. The
    /// price: after a host crash an upper dir is not trustworthy, which is moot for sandboxes
    /// whose processes died with the host anyway. Checkpointing must `syncfs` explicitly.
    pub volatile_upper: bool,
    /// RLIMIT_NPROC for the agent and everything it starts. Counted per uid inside the user
    /// namespace, it keeps a fork bomb by one user below the cgroup's pids limit so the agent
    /// (root, its own count) can still start threads and a `kill` when the cgroup is full.
    #[serde(default)]
    pub nproc_limit: Option<u64>,
    /// Host file bind-mounted read-only over [`crate::mountplan::CA_BUNDLE`].
    #[serde(default)]
    pub ca_bundle: Option<PathBuf>,
    /// Volumes bound read-write into the sandbox, idmapped to the slot's uid range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeBind>,
}

/// A host directory (a volume's root) mounted read-write at `target` inside the sandbox. The
/// launcher makes an idmapped, `nosuid,nodev` copy of it before the clone (files stored with
/// id N on the host appear as N inside any sandbox); the child attaches it after `pivot_root`,
/// so `target` resolves inside the sandbox's own root, never on the host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeBind {
    pub source: PathBuf,
    /// Absolute, normalised path inside the sandbox (the engine checked it).
    pub target: String,
}

/// Create an idmapped, read-only view of `source` at `target` for one slot's uid range.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IdmapSpec {
    pub source: PathBuf,
    pub target: PathBuf,
    pub uid_base: u32,
    pub id_count: u32,
    /// A volume's view for a restore: writable, and only the volume's own filesystem (not
    /// recursive). Otherwise a template's: read-only, recursive.
    #[serde(default)]
    pub volume: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // built once per launch, never stored in bulk
pub enum LaunchRequest {
    Start(StartSpec),
    Idmap(IdmapSpec),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum LaunchReply {
    Started { pid: i32, start_time: u64 },
    Done { ok: bool },
    Failed { error: String },
}

impl LaunchReply {
    /// Parse the launcher's stdout: the last non-empty line is the reply (anything before it is
    /// noise, e.g. a panic message would go to stderr but be defensive anyway).
    pub fn parse(stdout: &str) -> Option<LaunchReply> {
        let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
        serde_json::from_str(line).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StartSpec {
        StartSpec {
            uid_base: 1_065_536,
            id_count: 65536,
            lower: "/var/lib/bulkhead/jail/l/1-abc".into(),
            upper: "/var/lib/bulkhead/jail/s/1/upper".into(),
            work: "/var/lib/bulkhead/jail/s/1/work".into(),
            merged: "/var/lib/bulkhead/jail/s/1/merged".into(),
            sock_dir: "/var/lib/bulkhead/jail/s/1/sock".into(),
            agent_binary: "/usr/lib/bulkhead/bulkhead-agent".into(),
            argv: vec!["/run/bulkhead/agent".into(), "--listen".into()],
            env: vec!["PATH=/usr/bin:/bin".into()],
            hostname: "sandbox".into(),
            cgroup_procs: vec!["/sys/fs/cgroup/pids/bulkhead/1-x/cgroup.procs".into()],
            shm_size_mb: 64,
            volatile_upper: true,
            nproc_limit: None,
            ca_bundle: None,
            volumes: Vec::new(),
        }
    }

    #[test]
    fn request_round_trips_with_op_tag() {
        let req = LaunchRequest::Start(sample());
        let json = serde_json::to_string(&req).unwrap();
        assert!(json.starts_with(r#"{"op":"start","#), "{json}");
        assert_eq!(serde_json::from_str::<LaunchRequest>(&json).unwrap(), req);

        let idmap = LaunchRequest::Idmap(IdmapSpec {
            source: "/img".into(),
            target: "/l/0-x".into(),
            uid_base: 1_000_000,
            id_count: 65536,
            volume: false,
        });
        let json = serde_json::to_string(&idmap).unwrap();
        assert!(json.contains(r#""op":"idmap""#));
        assert_eq!(serde_json::from_str::<LaunchRequest>(&json).unwrap(), idmap);
        // A request of an older server (no `volume`) is a template view.
        let old = json.replace(r#","volume":false"#, "");
        assert_eq!(serde_json::from_str::<LaunchRequest>(&old).unwrap(), idmap);
    }

    #[test]
    fn replies_parse_from_the_last_line() {
        assert_eq!(
            LaunchReply::parse("noise\n{\"pid\":42,\"start_time\":7}\n"),
            Some(LaunchReply::Started {
                pid: 42,
                start_time: 7
            })
        );
        assert_eq!(
            LaunchReply::parse(r#"{"ok":true}"#),
            Some(LaunchReply::Done { ok: true })
        );
        assert_eq!(
            LaunchReply::parse(r#"{"error":"mount overlay: EPERM"}"#),
            Some(LaunchReply::Failed {
                error: "mount overlay: EPERM".into()
            })
        );
        assert_eq!(LaunchReply::parse(""), None);
        assert_eq!(LaunchReply::parse("not json"), None);
    }
}
