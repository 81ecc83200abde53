//! HTTP routes of port 49999, answering exactly like E2B's FastAPI server: plain-text errors
//! (400/404/500), `null` bodies for restart/delete, 422 for malformed bodies.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bulkhead_envd::rest::{HEADER_ACCESS_TOKEN, HEADER_TRAFFIC_ACCESS_TOKEN, traffic_access_token};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::execute::{self, ExecRequest};
use super::{Interpreter, snippets};
use crate::http::constant_time_eq;
use crate::state::SharedState;

/// Router state.
#[derive(Clone)]
struct Api {
    interpreter: Arc<Interpreter>,
    state: SharedState,
    /// Whether `/execute` needs the access token (from the host: yes; from the sandbox's own
    /// loopback: no, as on E2B, where code in the sandbox calls `localhost:49999` as is).
    check_token: bool,
}

/// The port-49999 router for requests the host forwards.
pub fn router(interpreter: Arc<Interpreter>) -> Router {
    router_with(interpreter, true)
}

/// The port-49999 router for the sandbox's own loopback (see [`super::local`]).
pub fn loopback_router(interpreter: Arc<Interpreter>) -> Router {
    router_with(interpreter, false)
}

fn router_with(interpreter: Arc<Interpreter>, check_token: bool) -> Router {
    let state = Arc::clone(&interpreter.state);
    let api = Api {
        interpreter,
        state,
        check_token,
    };
    // Every route but `/health` acts on the kernels (runs code, lists, starts, restarts or
    // ends them), so every one needs the token; `route_layer` leaves unknown paths a 404.
    Router::new()
        .route("/execute", post(execute_code))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}/restart", post(restart_context))
        .route("/contexts/{id}", axum::routing::delete(delete_context))
        .route_layer(axum::middleware::from_fn_with_state(
            api.clone(),
            require_token,
        ))
        .route("/health", get(health))
        .with_state(api)
}

/// Whether `headers` carry the sandbox's token: the envd access token in `X-Access-Token` (the
/// SDKs send it on `/execute`, Bulkhead's MCP tools on every call) or the traffic access token
/// derived from it in `E2B-Traffic-Access-Token` (what the official SDKs send on the
/// `/contexts` calls, from the create answer's `trafficAccessToken`).
fn token_matches(headers: &HeaderMap, token: &str) -> bool {
    let sent = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if sent(HEADER_ACCESS_TOKEN).is_some_and(|sent| constant_time_eq(sent, token)) {
        return true;
    }
    sent(HEADER_TRAFFIC_ACCESS_TOKEN)
        .is_some_and(|sent| constant_time_eq(sent, &traffic_access_token(token)))
}

/// Refuses a request without the sandbox's token, like envd does, when the sandbox has one and
/// the request came from the host (the sandbox's own loopback needs none, as on E2B).
async fn require_token(
    State(api): State<Api>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(token) = api.state.access_token().filter(|_| api.check_token)
        && !token_matches(request.headers(), &token)
    {
        return text(
            StatusCode::UNAUTHORIZED,
            "unauthorized access: send the sandbox's access token in the X-Access-Token header (or its traffic access token in E2B-Traffic-Access-Token)",
        );
    }
    next.run(request).await
}

fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        message.into(),
    )
        .into_response()
}

fn json(value: &serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}

/// Parses a JSON body; FastAPI answers malformed bodies with 422 and a `detail`.
#[expect(
    clippy::result_large_err,
    reason = "the error is the finished response"
)]
fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(serde_json::json!({"detail": format!("Invalid request body: {e}")})),
        )
            .into_response()
    })
}

async fn health() -> Response {
    json(&serde_json::json!("OK"))
}

#[derive(Debug, Deserialize)]
struct ExecuteBody {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

/// What `/execute` should run on.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// The default context of a language.
    Language(String),
    /// A context by id.
    Context(String),
}

/// E2B's validation: both selectors is 400; empty strings count as absent; neither means the
/// python default context.
fn target(context_id: Option<&str>, language: Option<&str>) -> Result<Target, &'static str> {
    let context_id = context_id.filter(|s| !s.is_empty());
    let language = language.filter(|s| !s.is_empty());
    match (context_id, language) {
        (Some(_), Some(_)) => Err("Only one of context_id or language can be provided"),
        (Some(id), None) => Ok(Target::Context(id.to_owned())),
        (None, Some(language)) => Ok(Target::Language(language.to_owned())),
        (None, None) => Ok(Target::Language("python".to_owned())),
    }
}

async fn execute_code(State(api): State<Api>, body: Bytes) -> Response {
    let request: ExecuteBody = match parse_body(&body) {
        Ok(r) => r,
        Err(response) => return response,
    };
    let target = match target(request.context_id.as_deref(), request.language.as_deref()) {
        Ok(t) => t,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let env_vars = request.env_vars.unwrap_or_default();
    if let Some(problem) = env_vars
        .iter()
        .find_map(|(k, v)| snippets::invalid_env_var(k, v))
    {
        return text(StatusCode::BAD_REQUEST, problem);
    }
    let interpreter = &api.interpreter;
    let context = match target {
        Target::Language(language) => {
            let language = interpreter.manifest().normalize(Some(&language));
            match interpreter.default_context(&language).await {
                Ok(c) => c,
                Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        Target::Context(id) => match interpreter.get(&id) {
            Some(c) => c,
            None => return text(StatusCode::NOT_FOUND, format!("Context {id} not found")),
        },
    };
    let body = execute::start(
        Arc::clone(interpreter),
        context,
        ExecRequest {
            code: request.code,
            env_vars,
        },
    );
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )],
        body,
    )
        .into_response()
}

#[derive(Debug, Default, Deserialize)]
struct CreateBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

async fn create_context(State(api): State<Api>, body: Bytes) -> Response {
    let request: CreateBody = if body.iter().all(u8::is_ascii_whitespace) {
        CreateBody::default()
    } else {
        match parse_body(&body) {
            Ok(r) => r,
            Err(response) => return response,
        }
    };
    let interpreter = &api.interpreter;
    let language = interpreter
        .manifest()
        .normalize(request.language.as_deref());
    let cwd = request.cwd.filter(|c| !c.is_empty()).unwrap_or_else(|| {
        interpreter
            .config
            .default_cwd
            .to_string_lossy()
            .into_owned()
    });
    match interpreter.create_context(&language, &cwd).await {
        Ok(context) => json(&context.to_json()),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn list_contexts(State(api): State<Api>) -> Response {
    let all: Vec<_> = api.interpreter.list().iter().map(|c| c.to_json()).collect();
    json(&serde_json::Value::Array(all))
}

async fn restart_context(State(api): State<Api>, Path(id): Path<String>) -> Response {
    let Some(context) = api.interpreter.get(&id) else {
        return text(StatusCode::NOT_FOUND, format!("Context {id} not found"));
    };
    match api.interpreter.restart(&context).await {
        Ok(()) => json(&serde_json::Value::Null),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to restart context {id}: {e}"),
        ),
    }
}

async fn delete_context(State(api): State<Api>, Path(id): Path<String>) -> Response {
    if api.interpreter.delete(&id).await {
        json(&serde_json::Value::Null)
    } else {
        text(StatusCode::NOT_FOUND, format!("Context {id} not found"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{AppState, Config};
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// An interpreter whose only kernel cannot start: the checks below never reach a kernel
    /// (every request that passes the token check fails on its body or an unknown context).
    fn interpreter(token: Option<&str>) -> Arc<Interpreter> {
        let manifest = serde_json::from_str(
            r#"{"version": 1, "languages": {"python": {"argv": ["/bin/false", "{connection_file}"]}}}"#,
        )
        .unwrap();
        let state = AppState::new(&Config {
            default_user: "user".into(),
            max_background_processes: 1,
        });
        state.update_settings(|s| s.access_token = token.map(str::to_owned));
        Interpreter::new(manifest, super::super::InterpreterConfig::default(), state)
    }

    async fn call(
        router: &Router,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, String) {
        let mut req = axum::http::Request::builder().method(method).uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        // A body no route accepts: a request past the token check ends at its parser.
        let resp = router
            .clone()
            .oneshot(req.body(Body::from("{")).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Each kernel route and what it answers once the token check lets it through.
    const ROUTES: &[(&str, &str, StatusCode)] = &[
        ("POST", "/execute", StatusCode::UNPROCESSABLE_ENTITY),
        ("GET", "/contexts", StatusCode::OK),
        ("POST", "/contexts", StatusCode::UNPROCESSABLE_ENTITY),
        ("POST", "/contexts/nope/restart", StatusCode::NOT_FOUND),
        ("DELETE", "/contexts/nope", StatusCode::NOT_FOUND),
    ];

    #[tokio::test]
    async fn every_kernel_route_needs_the_token() {
        let router = router(interpreter(Some("tok")));
        let traffic = traffic_access_token("tok");
        for &(method, path, passed) in ROUTES {
            for refused in [
                &[][..],
                &[(HEADER_ACCESS_TOKEN, "wrong")],
                &[(HEADER_ACCESS_TOKEN, "to")],
                // The traffic header takes the derived token only, the envd header only the
                // envd token.
                &[(HEADER_TRAFFIC_ACCESS_TOKEN, "tok")],
                &[(HEADER_ACCESS_TOKEN, traffic.as_str())],
            ] {
                let (status, body) = call(&router, method, path, refused).await;
                assert_eq!(
                    status,
                    StatusCode::UNAUTHORIZED,
                    "{method} {path} {refused:?}: {body}"
                );
                assert!(body.contains("X-Access-Token"), "{body}");
            }
            for accepted in [
                &[(HEADER_ACCESS_TOKEN, "tok")][..],
                &[(HEADER_TRAFFIC_ACCESS_TOKEN, traffic.as_str())],
                &[
                    (HEADER_ACCESS_TOKEN, "wrong"),
                    (HEADER_TRAFFIC_ACCESS_TOKEN, traffic.as_str()),
                ],
            ] {
                let (status, body) = call(&router, method, path, accepted).await;
                assert_eq!(status, passed, "{method} {path} {accepted:?}: {body}");
            }
        }
        // Health stays open (the host and the SDKs probe it without a token).
        assert_eq!(call(&router, "GET", "/health", &[]).await.0, StatusCode::OK);
        assert_eq!(
            call(&router, "GET", "/nowhere", &[]).await.0,
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn no_token_is_asked_of_the_loopback_or_of_a_sandbox_without_one() {
        for router in [
            loopback_router(interpreter(Some("tok"))),
            router(interpreter(None)),
        ] {
            for &(method, path, passed) in ROUTES {
                let (status, body) = call(&router, method, path, &[]).await;
                assert_eq!(status, passed, "{method} {path}: {body}");
            }
        }
    }

    #[test]
    fn request_validation_matches_e2b() {
        assert_eq!(
            target(Some("c1"), Some("python")),
            Err("Only one of context_id or language can be provided")
        );
        assert_eq!(
            target(Some("c1"), None),
            Ok(Target::Context("c1".to_owned()))
        );
        assert_eq!(
            target(Some(""), Some("js")),
            Ok(Target::Language("js".to_owned()))
        );
        assert_eq!(
            target(None, None),
            Ok(Target::Language("python".to_owned()))
        );
        assert_eq!(
            target(Some(""), Some("")),
            Ok(Target::Language("python".to_owned()))
        );
    }

    #[test]
    fn execute_body_accepts_both_sdk_shapes() {
        // Python sends every key with nulls; JS omits undefined ones.
        let py: ExecuteBody = serde_json::from_str(
            r#"{"code": "1+1", "context_id": null, "language": null, "env_vars": null}"#,
        )
        .unwrap();
        assert_eq!(py.code, "1+1");
        assert!(py.context_id.is_none() && py.language.is_none() && py.env_vars.is_none());
        let js: ExecuteBody =
            serde_json::from_str(r#"{"code": "x", "env_vars": {"A": "1"}}"#).unwrap();
        assert_eq!(js.env_vars.unwrap()["A"], "1");
        assert!(serde_json::from_str::<ExecuteBody>(r#"{"language": "python"}"#).is_err());
        assert!(serde_json::from_str::<ExecuteBody>(r#"{"code": 1}"#).is_err());
        assert!(
            serde_json::from_str::<ExecuteBody>(r#"{"code": "x", "env_vars": {"A": 1}}"#).is_err()
        );
    }
}
