//! `/health`, `/init`, `/envs`, `/metrics` and the host-only agent info route.
//!
//! `/init` answers with the agent's [`AgentInfo`] (protocol version and build), and so does
//! `GET` [`AGENT_INFO_PATH`](bulkhead_envd::protocol::AGENT_INFO_PATH): that is how the host tells which protocol a sandbox's agent speaks
//! (an agent built before versioning answers `/init` with an empty `204` and has no info route).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bulkhead_envd::protocol::{AgentInfo, CLONED_PATH, ClonedRequest};
use bulkhead_envd::rest::InitRequest;

use crate::http::{error_json, json_response};
use crate::interpreter::Interpreter;
use crate::state::SharedState;

/// `GET /health`.
pub async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `POST /init`: sandbox-wide environment, access token, default user and working directory,
/// hostname. Sent by the host right after it claims the sandbox; answers `200` with the agent's
/// [`AgentInfo`].
pub async fn init(State(state): State<SharedState>, body: Body) -> Response {
    let bytes = match axum::body::to_bytes(body, 1 << 20).await {
        Ok(b) => b,
        Err(e) => {
            return error_json(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}"),
            );
        }
    };
    let request: InitRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        InitRequest::default()
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(e) => {
                return error_json(StatusCode::BAD_REQUEST, format!("invalid /init body: {e}"));
            }
        }
    };
    if let Some(user) = request.default_user.as_deref().filter(|u| !u.is_empty())
        && let Err(e) = state.resolve_user(Some(user))
    {
        return error_json(
            StatusCode::BAD_REQUEST,
            format!("cannot make {user:?} the default user: {e}"),
        );
    }
    if let Some(hostname) = request.hostname.as_deref().filter(|h| !h.is_empty())
        && let Err(e) = nix::unistd::sethostname(hostname)
    {
        tracing::warn!(hostname, error = %e, "could not set the hostname");
    }
    state.update_settings(|s| {
        if let Some(vars) = request.env_vars {
            s.env_vars.extend(vars);
        }
        if let Some(token) = request.access_token {
            s.access_token = (!token.is_empty()).then_some(token);
        }
        if let Some(user) = request.default_user.filter(|u| !u.is_empty()) {
            s.default_user = user;
        }
        if let Some(workdir) = request.default_workdir {
            s.default_workdir =
                (!workdir.is_empty()).then(|| crate::paths::clean(std::path::Path::new(&workdir)));
        }
    });
    tracing::info!("initialized by the host");
    json_response(StatusCode::OK, &AgentInfo::current())
}

/// `GET` [`AGENT_INFO_PATH`](bulkhead_envd::protocol::AGENT_INFO_PATH): the agent's protocol version and build. Needs no access token
/// (it reveals only the version); the host's API proxy keeps it from outside callers.
pub async fn agent_info() -> Response {
    json_response(StatusCode::OK, &AgentInfo::current())
}

/// `POST` [`WARM_PATH`](bulkhead_envd::protocol::WARM_PATH) (host-only): answers once the
/// kernels that start with the sandbox are running and warmed (at once without an interpreter).
/// The host asks before it checkpoints a warm sandbox for a pool.
pub async fn warm(interpreter: Option<Arc<Interpreter>>) -> Response {
    let Some(interpreter) = interpreter else {
        return StatusCode::NO_CONTENT.into_response();
    };
    done_or_500(
        interpreter.warm().await,
        "the sandbox's kernels did not start",
    )
}

/// `POST` [`CLONED_PATH`](bulkhead_envd::protocol::CLONED_PATH) (host-only): this sandbox was
/// restored as one of several clones of one checkpoint or VM snapshot. A VM clone's body
/// ([`ClonedRequest`]) carries fresh entropy and the host's clock for the guest kernel (see
/// [`crate::reseed`]); then what the kernels drew before the checkpoint is re-seeded (see
/// [`Interpreter::reseed`]). The agent's own ids come from the OS RNG per use and need nothing.
pub async fn cloned(interpreter: Option<Arc<Interpreter>>, body: Body) -> Response {
    let request: ClonedRequest = match axum::body::to_bytes(body, 64 << 10).await {
        Ok(b) if b.iter().all(u8::is_ascii_whitespace) => ClonedRequest::default(),
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(r) => r,
            Err(e) => {
                return error_json(
                    StatusCode::BAD_REQUEST,
                    format!("invalid {CLONED_PATH} body: {e}"),
                );
            }
        },
        Err(e) => {
            return error_json(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}"),
            );
        }
    };
    if let Err(e) = crate::reseed::apply(&request) {
        return error_json(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "could not re-seed a cloned VM: {}",
                crate::report::error_chain(&e)
            ),
        );
    }
    let Some(interpreter) = interpreter else {
        return StatusCode::NO_CONTENT.into_response();
    };
    done_or_500(
        interpreter.reseed().await,
        "could not re-seed the kernels of a cloned sandbox",
    )
}

/// `204`, or a `500` saying `what` failed and why.
fn done_or_500<E: std::error::Error>(result: Result<(), E>, what: &str) -> Response {
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error_json(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{what}: {}", crate::report::error_chain(&e)),
        ),
    }
}

/// `GET /envs`: the sandbox-wide environment variables.
pub async fn envs(State(state): State<SharedState>) -> Response {
    Json(state.settings().env_vars).into_response()
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<SharedState>) -> Response {
    Json(crate::metrics::collect(&state.cpu).await).into_response()
}
