use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bulkhead_engine::EngineError;

/// An error in E2B's shape: `{"code": <status>, "message": "...", "error_code"?: "..."}`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub error_code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            error_code: None,
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        if let Some(code) = self.error_code {
            body["error_code"] = code.into();
        }
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let (status, code) = match &e {
            EngineError::SandboxNotFound(_)
            | EngineError::TemplateNotFound(_)
            | EngineError::SecretNotFound(_) => (StatusCode::NOT_FOUND, None),
            EngineError::Conflict(_) | EngineError::Refused { .. } => (StatusCode::CONFLICT, None),
            EngineError::Unsupported(_) => (StatusCode::NOT_IMPLEMENTED, None),
            EngineError::Network(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Some("internal_server_error"),
            ),
            EngineError::BadRequest(_) => (StatusCode::BAD_REQUEST, None),
            EngineError::Capacity => (
                StatusCode::TOO_MANY_REQUESTS,
                Some("sandbox_capacity_unavailable"),
            ),
            EngineError::Driver(_) | EngineError::Agent(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Some("sandbox_create_failed"),
            ),
            EngineError::Store(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Some("internal_server_error"),
            ),
        };
        if status.is_server_error() {
            tracing::error!(error = %error_chain(&e), "request failed");
        }
        // Server errors carry the cause chain so operators and users see what to fix.
        let message = if status.is_server_error() {
            error_chain(&e)
        } else {
            e.to_string()
        };
        ApiError {
            status,
            message,
            error_code: code,
        }
    }
}

pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
