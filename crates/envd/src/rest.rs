//! The plain-HTTP side of envd: `/files`, `/init`, `/envs`, `/metrics`, signed file URLs, the
//! headers the SDKs and the host proxy use, and the routes only the host may call.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::protocol::{AGENT_INFO_PATH, CLONED_PATH, WARM_PATH};

/// Port the SDKs address envd on (`E2b-Sandbox-Port` value).
pub const ENVD_PORT: u16 = 49983;
/// Port of the code interpreter.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// Header with the sandbox id, set by the SDKs for header-based routing.
pub const HEADER_SANDBOX_ID: &str = "e2b-sandbox-id";
/// Header with the in-sandbox port, set by the SDKs for header-based routing.
pub const HEADER_SANDBOX_PORT: &str = "e2b-sandbox-port";
/// Header with the envd access token.
pub const HEADER_ACCESS_TOKEN: &str = "x-access-token";
/// Header with the sandbox's traffic access token (E2B's `trafficAccessToken`): the official
/// code-interpreter SDKs send it, not the envd token, on their `/contexts` calls.
pub const HEADER_TRAFFIC_ACCESS_TOKEN: &str = "e2b-traffic-access-token";
/// Prefix of request headers that set file metadata on upload (`X-Metadata-<key>`).
pub const HEADER_METADATA_PREFIX: &str = "x-metadata-";
/// Extended-attribute prefix under which file metadata is stored.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";

/// envd routes only the host may call: the SDK-facing proxy must answer them with 404, as E2B's
/// proxy does. `/init` hands the sandbox its access token and environment; the others are E2B's
/// snapshot and upgrade hooks (not served here, refused all the same so that no client relies
/// on them), and [`AGENT_INFO_PATH`] is Bulkhead's host↔agent version check.
pub const HOST_ONLY_PATHS: &[&str] = &[
    "/init",
    "/freeze",
    "/unfreeze",
    "/collapse",
    "/fsfreeze",
    "/fsthaw",
    "/upgrade",
    AGENT_INFO_PATH,
    // No agent serves it any more, but agents restored from checkpoints made by older builds
    // still do (it made them confine what they spawn): outside callers must not reach it.
    "/bulkhead/restored",
    WARM_PATH,
    CLONED_PATH,
];

/// Body of `POST /init`, sent by the host after it claims a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InitRequest {
    /// Environment variables for every process started in the sandbox (merged into the
    /// existing set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Access token required from then on in `X-Access-Token` (or as URL signature key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// User that requests without an explicit user run as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_user: Option<String>,
    /// Working directory for processes and relative paths when the request gives none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_workdir: Option<String>,
    /// Hostname to set inside the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// One entry of the `POST /files` response.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UploadedEntry {
    /// Absolute path written.
    pub path: String,
    /// Base name.
    pub name: String,
    /// Always `file`.
    #[serde(rename = "type")]
    pub r#type: String,
    /// The file's metadata as stored after the write (envd's `EntryInfo.metadata`); absent
    /// when the file has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Error body of the plain-HTTP routes: `{"code": <http status>, "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ErrorBody {
    /// HTTP status.
    pub code: u16,
    /// Human-readable message.
    pub message: String,
}

/// Body of the 502 answer for a port nothing listens on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortClosedBody {
    /// Sandbox id from the routing header (empty when absent).
    pub sandbox_id: String,
    /// `The sandbox is running but port is not open`.
    pub message: String,
    /// Always 502.
    pub code: u16,
}

/// Body of `GET /metrics`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Metrics {
    /// Unix time in seconds.
    pub ts: i64,
    /// Number of CPUs available.
    pub cpu_count: u32,
    /// CPU usage in percent of all CPUs, since the previous sample.
    pub cpu_used_pct: f64,
    /// Total memory in bytes.
    pub mem_total: u64,
    /// Used memory in bytes (total − free − buffers − cache).
    pub mem_used: u64,
    /// Page cache in bytes.
    pub mem_cache: u64,
    /// Total memory in MiB.
    pub mem_total_mib: u64,
    /// Used memory in MiB.
    pub mem_used_mib: u64,
    /// Used bytes of the root filesystem.
    pub disk_used: u64,
    /// Size in bytes of the root filesystem.
    pub disk_total: u64,
}

/// What a signed file URL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileOperation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl FileOperation {
    /// `read` or `write`.
    pub const fn as_str(self) -> &'static str {
        match self {
            FileOperation::Read => "read",
            FileOperation::Write => "write",
        }
    }
}

/// The traffic access token of a sandbox whose envd access token is `access_token`:
/// `base64url_no_pad(sha256("bulkhead-traffic-v1:<token>"))`. Derived (not a second secret to
/// store and restore) and one-way, so that handing it to something that only needs the sandbox's
/// ports (port 49999 is the one that checks it) does not hand over envd (files, processes).
pub fn traffic_access_token(access_token: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"bulkhead-traffic-v1:");
    hasher.update(access_token.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hasher.finalize())
}

/// Computes the signature of a file URL:
/// `"v1_" + base64_std_no_pad(sha256("<path>:<op>:<username>:<token>"[":<expiration>"]))`.
///
/// `path` and `username` are the query values exactly as sent (`username` is empty for the
/// default user); `expiration` is a Unix time in seconds.
pub fn file_signature(
    path: &str,
    operation: FileOperation,
    username: &str,
    access_token: &str,
    expiration: Option<i64>,
) -> String {
    let mut hasher = Sha256::new();
    hasher.update(path.as_bytes());
    hasher.update(b":");
    hasher.update(operation.as_str().as_bytes());
    hasher.update(b":");
    hasher.update(username.as_bytes());
    hasher.update(b":");
    hasher.update(access_token.as_bytes());
    if let Some(exp) = expiration {
        hasher.update(b":");
        hasher.update(exp.to_string().as_bytes());
    }
    let digest = hasher.finalize();
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_sdk_formula() {
        // sha256("/home/user/a.txt:read::tok") computed independently with coreutils:
        // printf '%s' '/home/user/a.txt:read::tok' | sha256sum | xxd -r -p | base64 | tr -d =
        // printf '%s' 'a.txt:write:root:tok:1700000000' | sha256sum | xxd -r -p | base64 | tr -d =
        let sig = file_signature("/home/user/a.txt", FileOperation::Read, "", "tok", None);
        assert_eq!(sig, "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY");
        assert_eq!(
            file_signature(
                "a.txt",
                FileOperation::Write,
                "root",
                "tok",
                Some(1_700_000_000)
            ),
            "v1_xb/mfSAOsY4YpZgv+XwNldKoTJiskHiYOF/Gz/ZxxU4"
        );
        assert_ne!(
            sig,
            file_signature("/home/user/a.txt", FileOperation::Write, "", "tok", None)
        );
        assert_ne!(
            sig,
            file_signature("/home/user/a.txt", FileOperation::Read, "", "tok", Some(1))
        );
        assert_ne!(
            sig,
            file_signature("/home/user/a.txt", FileOperation::Read, "root", "tok", None)
        );
    }

    #[test]
    fn traffic_token_is_derived_and_differs_from_the_envd_token() {
        // printf '%s' 'bulkhead-traffic-v1:tok' | sha256sum | xxd -r -p | base64 | tr '+/' '-_' | tr -d =
        assert_eq!(
            traffic_access_token("tok"),
            "fKapw0GrETMmYbwZ5lrL5E8jtl8FGGVVr7bxvBJoawM"
        );
        assert_ne!(traffic_access_token("tok"), "tok");
        assert_ne!(traffic_access_token("tok"), traffic_access_token("tok2"));
    }

    #[test]
    fn host_only_paths_include_init_and_the_agent_info() {
        assert!(HOST_ONLY_PATHS.contains(&"/init"));
        assert!(HOST_ONLY_PATHS.contains(&AGENT_INFO_PATH));
        assert!(HOST_ONLY_PATHS.contains(&"/bulkhead/restored"));
        assert!(HOST_ONLY_PATHS.contains(&WARM_PATH));
        assert!(HOST_ONLY_PATHS.contains(&CLONED_PATH));
        assert!(!HOST_ONLY_PATHS.contains(&"/files"));
        assert!(!HOST_ONLY_PATHS.contains(&"/health"));
    }

    #[test]
    fn init_request_parses_host_body() {
        let req: InitRequest = serde_json::from_str(
            r#"{"envVars":{"A":"1"},"accessToken":"t","defaultUser":"user","defaultWorkdir":null,"timestamp":"2024-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(req.env_vars.unwrap()["A"], "1");
        assert_eq!(req.access_token.as_deref(), Some("t"));
        assert_eq!(req.default_user.as_deref(), Some("user"));
        assert_eq!(req.default_workdir, None);
    }
}
