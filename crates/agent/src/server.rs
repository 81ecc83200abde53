//! HTTP routing: by sandbox port first (the host forwards the client's `E2b-Sandbox-Port`
//! header), then the envd routes, behind the access-token check.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use bulkhead_envd::protocol::{AGENT_INFO_PATH, CLONED_PATH, WARM_PATH};
use bulkhead_envd::rest::{ENVD_PORT, HEADER_ACCESS_TOKEN, HEADER_SANDBOX_PORT};
use bulkhead_envd::{ConnectError, filesystem, process};
use tower::ServiceExt as _;

use crate::connect;
use crate::http::{constant_time_eq, error_json};
use crate::port_forward;
use crate::state::SharedState;

/// Routes requests to a per-port router; requests without a port header go to envd.
///
/// To serve another in-sandbox port (e.g. the code interpreter on 49999), add its router with
/// [`PortRouter::with_port`].
#[derive(Clone)]
pub struct PortRouter {
    routes: Arc<HashMap<u16, Router>>,
    default_port: u16,
}

impl PortRouter {
    /// A router whose default port (used when the header is absent) is served by `router`.
    pub fn new(default_port: u16, router: Router) -> Self {
        Self {
            routes: Arc::new(HashMap::from([(default_port, router)])),
            default_port,
        }
    }

    /// Serves `port` with `router`.
    #[must_use]
    pub fn with_port(mut self, port: u16, router: Router) -> Self {
        Arc::make_mut(&mut self.routes).insert(port, router);
        self
    }

    /// The axum app.
    pub fn into_router(self) -> Router {
        Router::new().fallback(move |request: Request| {
            let this = self.clone();
            async move { this.dispatch(request).await }
        })
    }

    async fn dispatch(&self, request: Request) -> Response {
        let port = match request.headers().get(HEADER_SANDBOX_PORT) {
            None => Some(self.default_port),
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u16>().ok()),
        };
        match port.map(|p| (p, self.routes.get(&p))) {
            Some((_, Some(router))) => match router.clone().oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            },
            // Any other port is the user's own server inside the sandbox (E2B's
            // `{port}-{id}.{domain}` hosts).
            Some((port, None)) => port_forward::forward(port, request).await,
            None => port_forward::port_closed(request.headers()),
        }
    }
}

/// The whole app: port routing around the envd routes.
pub fn app(state: SharedState) -> Router {
    app_with_interpreter(state, None)
}

/// The whole app, with the code-interpreter API on port 49999 when the template has one
/// (otherwise that port answers like any closed port).
pub fn app_with_interpreter(
    state: SharedState,
    interpreter: Option<Arc<crate::interpreter::Interpreter>>,
) -> Router {
    let mut ports = PortRouter::new(ENVD_PORT, envd_router(state, interpreter.clone()));
    if let Some(interpreter) = interpreter {
        ports = ports.with_port(
            crate::interpreter::INTERPRETER_PORT,
            crate::interpreter::http::router(interpreter),
        );
    }
    ports
        .into_router()
        .layer(middleware::from_fn(log_with_request_id))
}

/// Requests the server sends with an `X-Request-Id` (every client request it proxies, and its
/// own calls made for one) run in a span carrying it, and get one log line when answered, so
/// a request can be followed from the server's log into this one. Requests without an id
/// (health polls, pool warm-ups) are not logged.
async fn log_with_request_id(request: Request, next: Next) -> Response {
    use bulkhead_common::request_id;
    use tracing::Instrument;
    let id = request
        .headers()
        .get(request_id::HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(request_id::accept)
        .map(str::to_owned);
    let Some(id) = id else {
        return next.run(request).await;
    };
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
    );
    let started = std::time::Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::info!(
            status = response.status().as_u16(),
            ms = started.elapsed().as_millis() as u64,
            "request answered"
        );
    });
    response
}

/// The envd API (with the host-only pool routes, which need the interpreter when there is one).
pub fn envd_router(
    state: SharedState,
    interpreter: Option<Arc<crate::interpreter::Interpreter>>,
) -> Router {
    let warm_interpreter = interpreter.clone();
    Router::new()
        .route(
            WARM_PATH,
            post(move || crate::control::warm(warm_interpreter.clone())),
        )
        .route(
            CLONED_PATH,
            post(move |body: axum::body::Body| crate::control::cloned(interpreter.clone(), body)),
        )
        .route("/health", get(crate::control::health))
        .route(
            "/files",
            get(crate::files::download).post(crate::files::upload),
        )
        .route("/init", post(crate::control::init))
        .route("/envs", get(crate::control::envs))
        .route("/metrics", get(crate::control::metrics))
        .route(AGENT_INFO_PATH, get(crate::control::agent_info))
        .route(
            &format!("/{}/{{method}}", process::SERVICE),
            post(process_rpc),
        )
        .route(
            &format!("/{}/{{method}}", filesystem::SERVICE),
            post(filesystem_rpc),
        )
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if is_rpc_path(&path) {
        unknown_method(&path)
    } else {
        error_json(
            StatusCode::NOT_FOUND,
            format!("no route for {} {path}", request.method()),
        )
    }
}

fn is_rpc_path(path: &str) -> bool {
    path.starts_with(&format!("/{}/", process::SERVICE))
        || path.starts_with(&format!("/{}/", filesystem::SERVICE))
}

fn unknown_method(path: &str) -> Response {
    connect::error_response_with_status(
        StatusCode::NOT_FOUND,
        &ConnectError::unimplemented(format!("{path} is not a method of this envd API")),
    )
}

/// When an access token is set, every route except `GET /health`, `GET` [`AGENT_INFO_PATH`]
/// (host-only, reveals only the version) and `/files` (which also accepts URL signatures and
/// checks itself) needs `X-Access-Token`.
async fn require_token(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    let Some(token) = state.access_token() else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let exempt = (request.method() == Method::GET
        && (path == "/health" || path == AGENT_INFO_PATH))
        || path == "/files";
    let sent = request
        .headers()
        .get(HEADER_ACCESS_TOKEN)
        .and_then(|v| v.to_str().ok());
    if exempt || sent.is_some_and(|sent| constant_time_eq(sent, &token)) {
        return next.run(request).await;
    }
    let (rpc, token_sent) = (is_rpc_path(path), sent.is_some());
    crate::http::drain(request.into_body()).await;
    let message = if token_sent {
        "unauthorized access: the X-Access-Token header does not match the sandbox's access token"
    } else {
        "unauthorized access: send the sandbox's access token in the X-Access-Token header"
    };
    if rpc {
        connect::error_response(&ConnectError::unauthenticated(message))
    } else {
        error_json(StatusCode::UNAUTHORIZED, message.to_owned())
    }
}

/// Largest request body of a method that carries only ids, paths and flags (paths are capped
/// at 4096 bytes): far above any valid request, small enough that a runaway body gets a clear
/// 413 instead of being buffered. `Start` and `SendInput` carry user data and keep
/// [`connect::MAX_REQUEST_BYTES`]; `StreamInput` is read envelope by envelope.
pub const SMALL_REQUEST_BYTES: usize = 64 << 10;

/// Reads a small method's body whole, or answers 413 (Connect `resource_exhausted`) after
/// draining what the client sent.
async fn small_body(path: &str, body: Body) -> Result<Body, Response> {
    match crate::http::read_limited(body, SMALL_REQUEST_BYTES).await {
        Ok(bytes) => Ok(Body::from(bytes)),
        Err(crate::http::BodyError::TooLarge) => Err(connect::error_response_with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            &ConnectError::new(
                bulkhead_envd::Code::ResourceExhausted,
                format!(
                    "The request body is too large: {path} takes at most {SMALL_REQUEST_BYTES} bytes"
                ),
            ),
        )),
        Err(crate::http::BodyError::Read) => Err(connect::error_response(&ConnectError::new(
            bulkhead_envd::Code::Canceled,
            "Could not read the request body: the client went away",
        ))),
    }
}

async fn process_rpc(
    State(state): State<SharedState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    use process::method as m;
    let body = match method.as_str() {
        m::START | m::SEND_INPUT | m::STREAM_INPUT => body,
        _ => match small_body(&process::path(&method), body).await {
            Ok(body) => body,
            Err(response) => return response,
        },
    };
    match method.as_str() {
        m::START => crate::process::start(state, headers, body).await,
        m::CONNECT => crate::process::connect_process(state, headers, body).await,
        m::LIST => crate::process::list(state, headers, body).await,
        m::SEND_INPUT => crate::process::send_input(state, headers, body).await,
        m::STREAM_INPUT => crate::process::stream_input(state, headers, body).await,
        m::SEND_SIGNAL => crate::process::send_signal(state, headers, body).await,
        m::UPDATE => crate::process::update(state, headers, body).await,
        m::CLOSE_STDIN => crate::process::close_stdin(state, headers, body).await,
        _ => unknown_method(&process::path(&method)),
    }
}

async fn filesystem_rpc(
    State(state): State<SharedState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    use filesystem::method as m;
    let body = match small_body(&filesystem::path(&method), body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    match method.as_str() {
        m::STAT => crate::filesystem::stat(state, headers, body).await,
        m::MAKE_DIR => crate::filesystem::make_dir(state, headers, body).await,
        m::MOVE => crate::filesystem::move_entry(state, headers, body).await,
        m::LIST_DIR => crate::filesystem::list_dir(state, headers, body).await,
        m::REMOVE => crate::filesystem::remove(state, headers, body).await,
        m::WATCH_DIR => crate::filesystem::watch_dir(state, headers, body).await,
        m::CREATE_WATCHER => crate::filesystem::create_watcher(state, headers, body).await,
        m::GET_WATCHER_EVENTS => crate::filesystem::get_watcher_events(state, headers, body).await,
        m::REMOVE_WATCHER => crate::filesystem::remove_watcher(state, headers, body).await,
        _ => unknown_method(&filesystem::path(&method)),
    }
}
