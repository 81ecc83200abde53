//! The OpenAPI document of the REST API. Routes are registered through `utoipa-axum`'s
//! `OpenApiRouter` with `routes!`, so a route and its document entry are one declaration; this
//! module holds what is said once for the whole document (info, security schemes, the error
//! response every operation can give, the MCP endpoint) and serves the document and its
//! reference page (`GET /openapi.json`, `GET /docs/api`, no API key).

use std::sync::Arc;

use axum::Extension;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use utoipa::OpenApi;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, SecurityRequirement};
use utoipa::openapi::security::{Http, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ErrorBody;
use crate::state::AppState;

/// The scheme of the control plane's key (`X-API-Key`; `Authorization: Bearer` works too).
pub(crate) const API_KEY: &str = "ApiKeyAuth";
/// The bearer form of the same key, for tooling that cannot set custom headers.
pub(crate) const API_KEY_BEARER: &str = "ApiKeyBearer";
/// A volume's content token (`Authorization: Bearer`).
pub(crate) const VOLUME_TOKEN: &str = "VolumeToken";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Bulkhead API",
        description = "The REST API of `bulkhead serve`: E2B's control-plane API (what the official \
E2B SDKs call; shapes follow their generated models) and Bulkhead's own endpoints (usage, metrics, \
MCP). Errors are E2B's `Error` shape: `{\"code\", \"message\", \"error_code\"?}`.\n\n\
Every response carries `X-Request-Id` (the client's, if it sent a sane one: at most 128 characters \
from `A-Za-z0-9-_.:`; else a generated one). The same id is on the server's log lines for the \
request and is forwarded to the sandbox's agent, whose log lines carry it too.\n\n\
**Not REST, so not here:** traffic to a sandbox (requests with `E2b-Sandbox-Id`/`E2b-Sandbox-Port` \
headers or a `{port}-{sandboxID}.{domain}` Host) is proxied to the sandbox's agent, which speaks \
envd's Connect RPC protocol: see `crates/envd/proto/process/process.proto` and \
`crates/envd/proto/filesystem/filesystem.proto` in the Bulkhead repository (E2B's envd spec: \
https://github.com/e2b-dev/E2B/tree/main/spec/envd), plus envd's `/files` and `/health` HTTP routes.",
        license(name = "Apache-2.0")
    ),
    paths(mcp_endpoint),
    components(schemas(ErrorBody)),
    tags(
        (name = "sandboxes", description = "Create, list, inspect, pause, resume, fork and kill sandboxes"),
        (name = "snapshots", description = "Snapshots of sandboxes, usable as templates"),
        (name = "templates", description = "Templates and E2B's template build API"),
        (name = "secrets", description = "Team secrets, injected by the egress proxy"),
        (name = "volumes", description = "Persistent volumes"),
        (name = "volume content", description = "Files inside a volume (E2B's volume content API)"),
        (name = "bulkhead", description = "Bulkhead's own endpoints (not in E2B's API)"),
        (name = "server", description = "Health and this document"),
    )
)]
struct ApiDoc;

/// `/mcp` is served by the MCP SDK's own service (nested, not a handler), so it is described
/// here instead of on a handler.
#[utoipa::path(
    method(post, get, delete),
    path = "/mcp",
    tag = "bulkhead",
    description = "Model Context Protocol server, Streamable HTTP transport \
(https://modelcontextprotocol.io/specification/2025-06-18/basic/transports#streamable-http): POST \
sends JSON-RPC messages, GET opens the server-to-client event stream, DELETE ends the session \
(`Mcp-Session-Id`). Authenticated with the same API keys.",
    responses((status = 200, description = "A JSON-RPC response or an event stream"))
)]
#[allow(dead_code)] // documentation only: see above
fn mcp_endpoint() {}

/// A request or response body of raw bytes (file contents, archives).
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // a schema only: bodies are streamed, never held in this type
pub(crate) struct Binary(Vec<u8>);

/// Every operation of `r` gets `tag`.
pub(crate) fn tagged(mut r: OpenApiRouter<AppState>, tag: &str) -> OpenApiRouter<AppState> {
    for item in r.get_openapi_mut().paths.paths.values_mut() {
        for op in operations(item) {
            op.tags.get_or_insert_with(Vec::new).push(tag.to_string());
        }
    }
    r
}

/// Every operation of `r` accepts `scheme`, or the API key.
pub(crate) fn with_security(
    mut r: OpenApiRouter<AppState>,
    scheme: &str,
) -> OpenApiRouter<AppState> {
    for item in r.get_openapi_mut().paths.paths.values_mut() {
        for op in operations(item) {
            op.security = Some(vec![
                requirement(scheme),
                requirement(API_KEY),
                requirement(API_KEY_BEARER),
            ]);
        }
    }
    r
}

/// Marks every operation of `r` as needing the API key (the caller adds the check itself).
pub(crate) fn keyed(mut r: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    for item in r.get_openapi_mut().paths.paths.values_mut() {
        for op in operations(item) {
            op.security = Some(vec![requirement(API_KEY), requirement(API_KEY_BEARER)]);
        }
    }
    r
}

fn requirement(name: &str) -> SecurityRequirement {
    SecurityRequirement::new(name, Vec::<String>::new())
}

pub(crate) fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
        &mut item.head,
        &mut item.options,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// The routes' own document plus what is said once for all of them.
pub(crate) fn finish(routes: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    // The MCP endpoint needs the key like the rest of the control plane; its three methods
    // share one annotated function, so they get an operation id each here.
    for item in doc.paths.paths.values_mut() {
        for (method, op) in [
            ("get", &mut item.get),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
        ] {
            if let Some(op) = op {
                op.security = Some(vec![requirement(API_KEY), requirement(API_KEY_BEARER)]);
                op.operation_id = Some(format!("mcp_{method}"));
            }
        }
    }
    doc.merge(routes);
    let error = ResponseBuilder::new()
        .description("An error in E2B's shape; 5xx answers name the request id in the message")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(RefOr::Ref(Ref::from_schema_name("Error"))))
                .build(),
        )
        .build();
    for item in doc.paths.paths.values_mut() {
        for op in operations(item) {
            op.responses
                .responses
                .entry("default".to_string())
                .or_insert_with(|| RefOr::T(error.clone()));
        }
    }
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        API_KEY,
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            "X-API-Key",
            "A key from `bulkhead keys create` (E2B_API_KEY)",
        ))),
    );
    components.add_security_scheme(
        API_KEY_BEARER,
        SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
    );
    components.add_security_scheme(
        VOLUME_TOKEN,
        SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
    );
    doc
}

/// The routes of this module (no API key: the document describes a public interface).
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    tagged(
        OpenApiRouter::new()
            .routes(routes!(openapi_json))
            .routes(routes!(reference_page)),
        "server",
    )
}

/// The document and its rendered page, made once when the router is built.
pub(crate) struct Served {
    json: String,
    page: String,
}

impl Served {
    pub(crate) fn new(doc: &utoipa::openapi::OpenApi) -> Self {
        Served {
            json: to_json(doc),
            page: crate::docs_page::render(doc),
        }
    }
}

/// The document as checked in (`docs/openapi.json`): pretty, with a final newline.
pub(crate) fn to_json(doc: &utoipa::openapi::OpenApi) -> String {
    let mut s = doc
        .to_pretty_json()
        .expect("an OpenAPI document always serializes");
    s.push('\n');
    s
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    responses((status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json", body = Object))
)]
async fn openapi_json(Extension(served): Extension<Arc<Served>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        served.json.clone(),
    )
        .into_response()
}

#[utoipa::path(
    get,
    path = "/docs/api",
    responses((status = 200, description = "The API reference, rendered from this document", content_type = "text/html", body = String))
)]
async fn reference_page(Extension(served): Extension<Arc<Served>>) -> Html<String> {
    Html(served.page.clone())
}
