//! Errors in E2B's shape (`{"code", "message", "error_code"?}`) and the mapping from engine
//! errors to statuses and codes. A client error (4xx) says what to change. A server error (5xx)
//! says what failed and what to do, plus a request id; its cause chain (which can name host
//! paths and internals) goes only to the log, under the same request id.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bulkhead_engine::driver::DriverError;
use bulkhead_engine::volume_fs::VolumeFsError;
use bulkhead_engine::{ChangesError, EngineError, IdempotencyError, Limit, Operation, VolumeError};

/// An error in E2B's shape: `{"code": <status>, "message": "...", "error_code"?: "..."}`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub error_code: Option<&'static str>,
    /// Set on server errors: the id under which the full cause was logged.
    pub request_id: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            error_code: None,
            request_id: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "Invalid API key: pass a key created with `bulkhead keys create` in the X-API-Key header (E2B_API_KEY)",
        )
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

/// E2B `Error`: the body of every error answer.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// The HTTP status.
    pub code: u16,
    /// What went wrong and what to do about it.
    pub message: String,
    /// A machine-readable reason, where E2B defines one (e.g. `sandbox_capacity_unavailable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.status.as_u16(),
            message: self.message,
            error_code: self.error_code,
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(id) = self
            .request_id
            .as_deref()
            .and_then(|i| HeaderValue::from_str(i).ok())
        {
            resp.headers_mut().insert("x-request-id", id);
        }
        resp
    }
}

/// A cluster with no node to take the sandbox (its router's `DriverError::NoCapacity`), on a
/// create, a resume or anything else that places one.
fn no_capacity(e: &EngineError) -> Option<&DriverError> {
    match e {
        EngineError::Driver { source, .. } | EngineError::RestoreFailed { source, .. }
            if matches!(source, DriverError::NoCapacity { .. }) =>
        {
            Some(source)
        }
        _ => None,
    }
}

/// E2B's status and `error_code` for an engine error.
fn classify(e: &EngineError) -> (StatusCode, Option<&'static str>) {
    if no_capacity(e).is_some() {
        // E2B's answer when placement finds no node (503: a retry later may pass).
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("sandbox_capacity_unavailable"),
        );
    }
    match e {
        EngineError::SandboxNotFound(_)
        | EngineError::SnapshotNotFound(_)
        | EngineError::TemplateNotFound(_)
        | EngineError::SecretNotFound(_) => (StatusCode::NOT_FOUND, None),
        EngineError::Conflict(_) | EngineError::Refused { .. } => (StatusCode::CONFLICT, None),
        EngineError::AgentTooOld { .. } => {
            (StatusCode::CONFLICT, Some("sandbox_agent_unsupported"))
        }
        EngineError::Unsupported(_) | EngineError::NotCapable { .. } => {
            (StatusCode::NOT_IMPLEMENTED, None)
        }
        EngineError::BadRequest(_) => (StatusCode::BAD_REQUEST, None),
        EngineError::Capacity => (
            StatusCode::TOO_MANY_REQUESTS,
            Some("sandbox_capacity_unavailable"),
        ),
        // No `Retry-After`: the SDKs would retry silently; the caller decides (E2B's SDKs
        // raise their rate-limit error).
        EngineError::TooManyCreates { .. } => (
            StatusCode::TOO_MANY_REQUESTS,
            Some("too_many_concurrent_creates"),
        ),
        // E2B's code for a create that failed on the way; other verbs fail as plain 500s.
        EngineError::Driver { op, .. }
        | EngineError::Agent { op, .. }
        | EngineError::Network { op, .. }
            if *op == Operation::Create =>
        {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                Some("sandbox_create_failed"),
            )
        }
        EngineError::Volume(v) => volume_status(v),
        EngineError::Changes(c) => match c {
            ChangesError::Paused(_) => (StatusCode::CONFLICT, None),
            ChangesError::Unsupported => (StatusCode::NOT_IMPLEMENTED, None),
            ChangesError::SnapshotNotFound(_) => (StatusCode::NOT_FOUND, None),
        },
        EngineError::VolumeFs(f) => volume_fs_status(f),
        // The SDKs raise their rate-limit error on 429 (a retry later may pass) and their
        // generic error with the status and message otherwise.
        EngineError::Quota(q) => match q.limit {
            Limit::Credits => (StatusCode::PAYMENT_REQUIRED, Some("credits_exhausted")),
            Limit::CreateRate => (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited")),
            Limit::MaxSandboxes => (StatusCode::TOO_MANY_REQUESTS, Some("team_sandbox_limit")),
            Limit::ConcurrentBuilds => (StatusCode::TOO_MANY_REQUESTS, Some("team_build_limit")),
            Limit::MaxVcpus | Limit::MaxMemory | Limit::MaxTimeout => {
                (StatusCode::FORBIDDEN, Some("team_quota"))
            }
        },
        // 422 for a key reused with another body (the IETF Idempotency-Key draft's answer);
        // 409 while the first attempt still runs or after its sandbox ended.
        EngineError::Idempotency(i) => match i {
            IdempotencyError::InvalidKey { .. } => (StatusCode::BAD_REQUEST, None),
            IdempotencyError::Mismatch { .. } => (StatusCode::UNPROCESSABLE_ENTITY, None),
            IdempotencyError::InProgress { .. } | IdempotencyError::Ended { .. } => {
                (StatusCode::CONFLICT, None)
            }
        },
        EngineError::TemplateBuild(t) => {
            use bulkhead_engine::template_builds::TemplateBuildError as T;
            match t {
                T::NotFound(_) => (StatusCode::NOT_FOUND, None),
                T::Invalid(_) => (StatusCode::BAD_REQUEST, None),
                T::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, None),
                T::NotConfigured => (StatusCode::NOT_IMPLEMENTED, None),
                T::StartFailed(_) | T::Io { .. } => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Some("internal_server_error"),
                ),
            }
        }
        EngineError::Driver { .. }
        | EngineError::Agent { .. }
        | EngineError::Network { .. }
        | EngineError::Recover(_)
        | EngineError::CheckpointFailed { .. }
        | EngineError::RestoreFailed { .. }
        | EngineError::Checkpoint { .. }
        | EngineError::Store(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("internal_server_error"),
        ),
    }
}

fn volume_status(e: &VolumeError) -> (StatusCode, Option<&'static str>) {
    match e {
        VolumeError::InvalidName(_) | VolumeError::BadMount { .. } => {
            (StatusCode::BAD_REQUEST, None)
        }
        VolumeError::NotFound(_) => (StatusCode::NOT_FOUND, None),
        VolumeError::NameTaken(_) | VolumeError::InUse { .. } => (StatusCode::CONFLICT, None),
        VolumeError::BadToken => (StatusCode::UNAUTHORIZED, None),
        VolumeError::NoStorage => (StatusCode::NOT_IMPLEMENTED, None),
        VolumeError::Storage(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("internal_server_error"),
        ),
    }
}

fn volume_fs_status(e: &VolumeFsError) -> (StatusCode, Option<&'static str>) {
    match e {
        VolumeFsError::NotFound(_) => (StatusCode::NOT_FOUND, None),
        VolumeFsError::Exists(_) | VolumeFsError::NotEmpty(_) => (StatusCode::CONFLICT, None),
        // The client asked for more than the volume holds: a 4xx that says so.
        VolumeFsError::Full => (StatusCode::PAYLOAD_TOO_LARGE, Some("volume_full")),
        VolumeFsError::BadPath { .. }
        | VolumeFsError::Escapes(_)
        | VolumeFsError::NotADirectory(_)
        | VolumeFsError::IsADirectory(_)
        | VolumeFsError::IsASymlink(_)
        | VolumeFsError::BadArgument { .. } => (StatusCode::BAD_REQUEST, None),
        VolumeFsError::Io(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("internal_server_error"),
        ),
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let (status, error_code) = classify(&e);
        if !status.is_server_error() {
            return ApiError {
                status,
                message: e.to_string(),
                error_code,
                request_id: None,
            };
        }
        let request_id = new_request_id();
        tracing::error!(request_id = %request_id, error = %error_chain(&e), "request failed");
        // Only the top-level message: it names the operation and what to do, never a host path
        // or the internal chain. A capacity refusal says so itself (it holds no host details).
        let message = match no_capacity(&e) {
            Some(refusal) => format!("{refusal} (request id {request_id})"),
            None => format!("{e} (request id {request_id})"),
        };
        ApiError {
            status,
            message,
            error_code,
            request_id: Some(request_id),
        }
    }
}

/// The id of the request being served (set by `request_id::assign`), tying a server error's
/// answer to its log lines; a new one outside a request (tests calling handlers directly).
fn new_request_id() -> String {
    bulkhead_common::request_id::current().unwrap_or_else(bulkhead_common::request_id::generate)
}

pub use bulkhead_common::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_capacity_in_a_cluster_is_a_503_in_e2b_shape() {
        let refusal = || DriverError::NoCapacity {
            reason: "no node has room for it".into(),
        };
        for e in [
            EngineError::Driver {
                op: Operation::Create,
                source: refusal(),
            },
            EngineError::RestoreFailed {
                id: "sb".into(),
                source: refusal(),
            },
        ] {
            let api = ApiError::from(e);
            assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(api.error_code, Some("sandbox_capacity_unavailable"));
            assert!(
                api.message
                    .starts_with("No node can take the sandbox now: no node has room for it"),
                "{}",
                api.message
            );
        }
        // Any other driver failure of a create stays E2B's create failure.
        let other = ApiError::from(EngineError::Driver {
            op: Operation::Create,
            source: DriverError::NotRunning,
        });
        assert_eq!(other.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(other.error_code, Some("sandbox_create_failed"));
    }

    #[test]
    fn idempotency_refusals_are_client_errors_that_say_what_to_do() {
        let key = || "k-1".to_string();
        for (e, status, hint) in [
            (
                IdempotencyError::InvalidKey {
                    reason: "it is empty".into(),
                },
                StatusCode::BAD_REQUEST,
                "1 to 255 visible ASCII characters",
            ),
            (
                IdempotencyError::Mismatch { key: key() },
                StatusCode::UNPROCESSABLE_ENTITY,
                "was used with a different request",
            ),
            (
                IdempotencyError::InProgress {
                    key: key(),
                    waited_secs: 300,
                },
                StatusCode::CONFLICT,
                "retry with the same key later",
            ),
            (
                IdempotencyError::Ended {
                    key: key(),
                    sandbox_id: "sb".into(),
                },
                StatusCode::CONFLICT,
                "use a new key",
            ),
        ] {
            let api = ApiError::from(EngineError::from(e));
            assert_eq!(api.status, status, "{}", api.message);
            assert!(api.message.contains(hint), "{}", api.message);
            assert_eq!((api.error_code, api.request_id), (None, None));
        }
    }
}
