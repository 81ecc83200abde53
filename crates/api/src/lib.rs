//! The HTTP front end: E2B's control-plane REST API and the routing proxy that carries SDK
//! traffic to each sandbox's agent. Everything is on one port; a request goes to a sandbox when
//! it carries `E2b-Sandbox-Id`/`E2b-Sandbox-Port` (or a `{port}-{id}.{domain}` Host), or is a
//! signed `/files` URL; otherwise it is a control-plane call. Handlers only translate between
//! the wire and [`bulkhead_engine::Engine`].

mod changes;
mod console;
mod control;
mod error;
mod http;
mod inspect;
mod metrics;
mod persist;
mod proxy;
mod state;
mod team_keys;
mod templates;
mod usage;
mod volumes;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use bulkhead_engine::Engine;

pub use changes::Change;
pub use error::ApiError;
pub use state::AppState;

/// The full application: sandbox routing in front of the control plane.
pub fn router(engine: Arc<Engine>) -> Router {
    let state = AppState { engine };
    metrics::install();
    let keyed = volumes::rest_routes()
        .merge(changes::routes())
        .merge(metrics::routes())
        .merge(templates::routes())
        .merge(usage::routes())
        .merge(inspect::routes().merge(team_keys::routes()));
    // MCP (Streamable HTTP) behind the same API-key check as the REST API; the check puts the
    // caller in the request's extensions, where the tools read it.
    let mcp = Router::new()
        .nest_service("/mcp", bulkhead_mcp::http_service(state.engine.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            control::require_api_key,
        ));
    let api = control::routes(state.clone(), keyed)
        .merge(mcp)
        .merge(volumes::content_routes())
        .merge(templates::upload_routes());
    console::around(api, state.clone())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            proxy::route_to_sandbox,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::new())
        .layer(axum::middleware::from_fn(metrics::count_responses))
        .with_state(state)
}
