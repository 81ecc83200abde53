//! Bulkhead as an MCP server: tools an agent calls to create sandboxes, run code and commands,
//! move files and manage sandbox lifetimes. The tools only translate into the engine API
//! ([`bulkhead_engine::Engine`]) and into calls on the sandbox's agent over the engine's agent
//! stream; they hold no sandbox state beyond what one MCP session remembers (its default
//! sandbox, killed when the session ends).
//!
//! Two ways in, built on rmcp (the official Rust MCP SDK):
//! - [`http_service`]: Streamable HTTP, mounted by crates/api at `/mcp` on the API's listener
//!   behind the same API-key check as the REST API (the caller reaches the tools through the
//!   request's extensions).
//! - [`bridge::serve_stdio`]: `bulkhead mcp --stdio`, for local clients that start a command;
//!   it relays stdio to a running server's `/mcp`, so one engine owns every sandbox.
//!
//! Layout: `params` (tool arguments and their schemas), `error`, `execution` (the
//! interpreter's stream as MCP content), `agent` (calls into a sandbox's agent), `session`
//! (per-session state) are leaves; `server` holds the per-session value and `tools` its tools;
//! `bound` wraps rmcp's HTTP service so a session answers only the key that opened it.

mod agent;
mod bound;
pub mod bridge;
mod error;
mod execution;
mod params;
mod server;
mod session;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use bulkhead_engine::Engine;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

pub use bound::HttpService;
pub use error::ToolError;
pub use server::{BulkheadMcp, DEFAULT_SANDBOX_TIMEOUT_SECS, DEFAULT_TEMPLATE};

/// The endpoint over `engine`. Requests must reach it authenticated: the caller is read from
/// the request's extensions (a [`bulkhead_engine::Caller`]), which the API layer sets, and a
/// session answers only the caller that opened it.
pub fn http_service(engine: Arc<Engine>) -> HttpService {
    let config = StreamableHttpServerConfig::default()
        // Host checks guard unauthenticated local servers against DNS rebinding; every request
        // here needs the API key, which a rebinding page does not have, and the server is
        // reached under whatever name the operator gives it.
        .disable_allowed_hosts()
        .with_sse_keep_alive(Some(Duration::from_secs(15)));
    let sessions = Arc::new(LocalSessionManager::default());
    let inner = StreamableHttpService::new(
        move || Ok(BulkheadMcp::new(Arc::clone(&engine))),
        Arc::clone(&sessions),
        config,
    );
    HttpService::new(inner, sessions)
}
