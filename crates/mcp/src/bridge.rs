//! `bulkhead mcp --stdio`: an MCP server on stdin/stdout that relays `tools/list` and
//! `tools/call` to a running server's `/mcp` over Streamable HTTP with the API key. Local
//! clients (desktop assistants, IDEs) start it as a command; the sandboxes stay owned by the
//! server's one engine (a second engine in this process would need root, the data directory and
//! the image cache, and would race the server for them). One stdio session is one upstream
//! session, so the default sandbox lives as long as the client keeps the command running and
//! is killed when it exits (the upstream session is closed with a DELETE).

use std::borrow::Cow;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{Peer, RoleClient, RoleServer, ServerHandler, ServiceExt};

use crate::server::{server_info, supported_versions};

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error(
        "cannot open an MCP session at {url}: {message} (is `bulkhead serve` running there, and is the API key valid?)"
    )]
    Connect { url: String, message: String },
    #[error("the stdio MCP session failed: {0}")]
    Stdio(String),
}

/// Relays one stdio session to the upstream session.
struct Relay {
    upstream: Peer<RoleClient>,
}

fn upstream_error(e: rmcp::ServiceError) -> ErrorData {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        e => ErrorData::internal_error(
            format!(
                "the Bulkhead server did not answer: {e}; check that `bulkhead serve` is running"
            ),
            None,
        ),
    }
}

impl ServerHandler for Relay {
    fn get_info(&self) -> ServerConfig {
        server_info()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        supported_versions()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.upstream
            .list_tools(request)
            .await
            .map_err(upstream_error)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.upstream
            .call_tool(request)
            .await
            .map(CallToolResponse::Complete)
            .map_err(upstream_error)
    }
}

/// Serve MCP on stdin/stdout, relaying to `{api_url}/mcp` with `api_key`; returns when the
/// client closes stdin.
pub async fn serve_stdio(api_url: &str, api_key: &str) -> Result<(), BridgeError> {
    // reqwest is built without a default crypto provider (as the rest of the workspace).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("{}/mcp", api_url.trim_end_matches('/'));
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(api_key),
    );
    // Ask for the newest handshake-era version: the server keeps sandboxes per session, which
    // the sessionless 2026-07-28 revision (rmcp's default) does not have.
    let hello = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("bulkhead-mcp-stdio", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);
    let client: RunningService<RoleClient, ClientConfig> =
        hello
            .serve(transport)
            .await
            .map_err(|e| BridgeError::Connect {
                url: url.clone(),
                message: e.to_string(),
            })?;
    let relay = Relay {
        upstream: client.peer().clone(),
    };
    let served = relay
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| BridgeError::Stdio(e.to_string()));
    let result = match served {
        Ok(server) => server
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| BridgeError::Stdio(e.to_string())),
        Err(e) => Err(e),
    };
    // Ends the upstream session (DELETE /mcp), which kills the session's sandboxes.
    let _ = client.cancel().await;
    result
}
