//! The agent's `/init` body and its description of itself (crates/envd).

use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;

use crate::v1;

impl From<&InitRequest> for v1::InitRequest {
    fn from(r: &InitRequest) -> Self {
        v1::InitRequest {
            env_vars: r
                .env_vars
                .as_ref()
                .map(|vars| v1::EnvVars { vars: vars.clone() }),
            access_token: r.access_token.clone(),
            default_user: r.default_user.clone(),
            default_workdir: r.default_workdir.clone(),
            hostname: r.hostname.clone(),
        }
    }
}

impl From<v1::InitRequest> for InitRequest {
    fn from(r: v1::InitRequest) -> Self {
        InitRequest {
            env_vars: r.env_vars.map(|e| e.vars),
            access_token: r.access_token,
            default_user: r.default_user,
            default_workdir: r.default_workdir,
            hostname: r.hostname,
        }
    }
}

impl From<&AgentInfo> for v1::AgentInfo {
    fn from(i: &AgentInfo) -> Self {
        v1::AgentInfo {
            protocol_version: i.protocol_version,
            agent_build: i.agent_build.clone(),
        }
    }
}

impl From<v1::AgentInfo> for AgentInfo {
    fn from(i: v1::AgentInfo) -> Self {
        AgentInfo {
            protocol_version: i.protocol_version,
            agent_build: i.agent_build,
        }
    }
}
