//! Bulkhead's host↔agent protocol version: what a server and the agent inside a sandbox tell
//! each other so that a newer server can still drive an older agent (a sandbox that outlived an
//! upgrade, or one frozen in a checkpoint image for weeks) and says clearly when it cannot.
//!
//! The agent announces itself on the host-only route [`AGENT_INFO_PATH`] and in the answer to
//! `POST /init`. An agent that predates versioning answers `/init` with `204 No Content` and has no
//! info route: the server treats it as protocol [`LEGACY_PROTOCOL_VERSION`]. Rules for changing
//! the number are in `docs/versioning.md`.

use serde::{Deserialize, Serialize};

/// The protocol this build of the agent speaks and this build of the server prefers.
/// Bump it when the host starts relying on an agent behaviour that older agents lack.
pub const AGENT_PROTOCOL_VERSION: u32 = 2;

/// The oldest agent protocol this server can still drive. Sandboxes whose agent is older are
/// kept (never killed on their own) but answer every request with a clear error.
pub const MIN_AGENT_PROTOCOL_VERSION: u32 = 1;

/// The version of agents built before the protocol was versioned (no info route, `/init` → 204).
pub const LEGACY_PROTOCOL_VERSION: u32 = 1;

/// Host-only route where the agent describes itself (`GET`, answers [`AgentInfo`]).
pub const AGENT_INFO_PATH: &str = "/bulkhead/agent";

/// Host-only: answers (`204`) once the kernels that start with the sandbox are running and
/// warmed. The host asks before it checkpoints a warm sandbox for a pool. Agents without it
/// answer 404: their template is then pooled by cold starts.
pub const WARM_PATH: &str = "/bulkhead/warm";

/// Host-only: this sandbox is one of several restored from one checkpoint (a pool member);
/// re-seed the generators running kernels seeded before the checkpoint. Answers `204` when done.
pub const CLONED_PATH: &str = "/bulkhead/cloned";

/// Body of a `POST` to [`CLONED_PATH`] from the microvm driver: a VM clone resumes with the
/// snapshot's kernel RNG state and wall clock, so the host hands it fresh ones. Jail clones send
/// no body (their kernel is the host's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClonedRequest {
    /// Host randomness (hex) to mix into the guest kernel's pool, which is then reseeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<String>,
    /// The host's wall clock when it sent the request, in nanoseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_unix_ns: Option<u64>,
    /// The sandbox's process limit (0: none), for the guest's pids cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
}

/// What the agent says about itself: in the body of `POST /init` answers and on
/// [`AGENT_INFO_PATH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    /// Host↔agent protocol version the agent speaks.
    pub protocol_version: u32,
    /// The agent's build (crate version, e.g. `0.1.0`), for logs and error messages.
    pub agent_build: String,
}

impl AgentInfo {
    /// This build's own description.
    pub fn current() -> Self {
        AgentInfo {
            protocol_version: AGENT_PROTOCOL_VERSION,
            agent_build: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// What a server assumes of an agent that predates versioning.
    pub fn legacy() -> Self {
        AgentInfo {
            protocol_version: LEGACY_PROTOCOL_VERSION,
            agent_build: "unversioned".to_string(),
        }
    }

    /// Can this server drive the agent?
    pub fn is_supported(&self) -> bool {
        self.protocol_version >= MIN_AGENT_PROTOCOL_VERSION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_is_supported_and_round_trips() {
        let info = AgentInfo::current();
        assert!(info.is_supported());
        let json = serde_json::to_string(&info).unwrap();
        assert!(json.contains("\"protocolVersion\":2"), "{json}");
        assert_eq!(serde_json::from_str::<AgentInfo>(&json).unwrap(), info);
    }

    #[test]
    fn legacy_is_the_minimum_and_older_is_refused() {
        assert!(AgentInfo::legacy().is_supported());
        let old = AgentInfo {
            protocol_version: MIN_AGENT_PROTOCOL_VERSION - 1,
            agent_build: "0.0.1".into(),
        };
        assert!(!old.is_supported());
    }
}
