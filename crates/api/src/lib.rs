//! The HTTP front end: E2B's control-plane REST API and the routing proxy that carries SDK
//! traffic to each sandbox's agent. Everything is on one port; a request goes to a sandbox when
//! it carries `E2b-Sandbox-Id`/`E2b-Sandbox-Port` (or a `{port}-{id}.{domain}` Host), or is a
//! signed `/files` URL; otherwise it is a control-plane call. Handlers only translate between
//! the wire and [`bulkhead_engine::Engine`]; with several API replicas, a request for a sandbox
//! another replica drives is forwarded there first (`forward`).

mod changes;
mod console;
mod control;
mod docs;
mod docs_page;
mod error;
mod forward;
mod http;
mod inspect;
mod metrics;
mod persist;
mod proxy;
mod request_id;
mod state;
mod team_keys;
mod template_wire;
mod templates;
mod usage;
mod volumes;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use bulkhead_engine::Engine;
use utoipa_axum::router::OpenApiRouter;

pub use changes::Change;
pub use control::api_key_of;
pub use error::ApiError;
pub use proxy::sandbox_of_host;
pub use state::AppState;

/// Every documented route. `require_key` puts a group behind the API-key check; it is given
/// once for the real router and once (marking only) for the document, so both come from this
/// one list.
fn documented(
    require_key: impl Fn(OpenApiRouter<AppState>) -> OpenApiRouter<AppState>,
) -> OpenApiRouter<AppState> {
    let keyed = volumes::rest_routes()
        .merge(changes::routes())
        .merge(metrics::routes())
        .merge(templates::routes())
        .merge(usage::routes())
        .merge(inspect::routes().merge(team_keys::routes()));
    control::routes(keyed, &require_key)
        .merge(volumes::content_routes())
        .merge(templates::upload_routes())
        .merge(docs::routes())
}

/// The OpenAPI document of every REST route (`bulkhead openapi`, `GET /openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    docs::finish(documented(docs::keyed).into_openapi())
}

/// [`openapi`] as checked in at `docs/openapi.json`.
pub fn openapi_json() -> String {
    docs::to_json(&openapi())
}

/// The full application: sandbox routing in front of the control plane.
pub fn router(engine: Arc<Engine>) -> Router {
    let state = AppState { engine };
    metrics::install();
    let served = Arc::new(docs::Served::new(&openapi()));
    let key_state = state.clone();
    let (api, _) = documented(move |r| {
        docs::keyed(r).layer(axum::middleware::from_fn_with_state(
            key_state.clone(),
            control::require_api_key,
        ))
    })
    .split_for_parts();
    // MCP (Streamable HTTP) behind the same API-key check as the REST API; the check puts the
    // caller in the request's extensions, where the tools read it. Described in the document
    // by `docs::mcp_endpoint` (a nested service has no handler to annotate).
    let mcp = Router::new()
        .nest_service("/mcp", bulkhead_mcp::http_service(state.engine.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            control::require_api_key,
        ));
    // The web console (`/console`, an HTML app with its own session routes) wraps the API; it is
    // not part of the REST document.
    console::around(api.merge(mcp).layer(axum::Extension(served)), state.clone())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            proxy::route_to_sandbox,
        ))
        // Before anything reads the sandbox: a request for one that another API replica
        // drives is answered by that replica.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_owner,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::new())
        .layer(axum::middleware::from_fn(metrics::count_responses))
        // Outermost, so every answer (a panic's 500 included) carries the id.
        .layer(axum::middleware::from_fn(request_id::assign))
        .with_state(state)
}
