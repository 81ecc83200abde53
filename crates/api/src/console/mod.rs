//! The web console at `/console` (docs/console.md; docs/threat-model.md "Web
//! console"): a few static files built into the binary, whose script reads the same REST API
//! the SDKs use.
//!
//! It is a middleware in front of the control plane. `/console/api/login` trades an API key
//! for a session cookie ([`session`]); `/console/api/<route>` then replays an allowlisted,
//! read-mostly REST route (`GET /v2/sandboxes`, `GET /bulkhead/v1/usage`, ...) into the
//! control plane with the session's key as `X-API-Key`, so every answer comes from the one
//! implementation the SDKs use, team-scoped and E2B-shaped, and a revoked key stops working
//! at once. Every other path passes through untouched.

mod assets;
mod session;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bulkhead_engine::{Caller, Engine};
use serde::Deserialize;

use crate::error::ApiError;
use crate::state::AppState;
use session::Sessions;

const PREFIX: &str = "/console";
const API: &str = "/console/api";
const COOKIE: &str = "bulkhead_console";
/// The console's script sends this on every state-changing request. A cross-origin page can
/// only send it after a CORS preflight, which this server never approves.
const CSRF_HEADER: &str = "x-bulkhead-console";
/// A login body is `{"apiKey": "..."}`.
const MAX_LOGIN_BODY: usize = 4096;

/// The console's state: the engine (to check keys) and the live sessions.
#[derive(Clone)]
pub struct Console {
    engine: Arc<Engine>,
    sessions: Arc<Sessions>,
}

impl Console {
    pub fn new(engine: Arc<Engine>) -> Self {
        Console {
            engine,
            sessions: Arc::new(Sessions::default()),
        }
    }
}

/// `api` behind the console: `/console` and below are answered by [`handle`], which replays
/// console API calls into `api` (hence one service around it, so a rewritten request is routed
/// afresh); every other request goes to `api` unchanged.
pub fn around(api: Router<AppState>, state: AppState) -> Router<AppState> {
    let console = Console::new(state.engine.clone());
    Router::new()
        .fallback_service(api.with_state(state))
        .layer(axum::middleware::from_fn_with_state(console, handle))
}

/// The middleware: `/console` and below are answered here, everything else goes on.
async fn handle(State(c): State<Console>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path != PREFIX && !path.starts_with("/console/") {
        return next.run(req).await;
    }
    let mut resp = route(&c, req, next).await;
    assets::harden(resp.headers_mut());
    resp
}

async fn route(c: &Console, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (method, path.as_str()) {
        (Method::GET | Method::HEAD, "/console" | "/console/") => assets::page(),
        (Method::GET | Method::HEAD, p) if p.starts_with("/console/assets/") => {
            assets::file(&p["/console/assets/".len()..])
        }
        (Method::POST, "/console/api/login") => login(c, req).await,
        (Method::POST, "/console/api/logout") => logout(c, &req),
        (Method::GET, "/console/api/session") => session_info(c, req).await,
        (_, p) if p.starts_with("/console/api/") => forward(c, req, next).await,
        (m, p) => ApiError::not_found(format!(
            "No console page {m} {p}: open /console/ for the console"
        ))
        .into_response(),
    }
}

/// Refuses requests another site made the browser send: `Sec-Fetch-Site` (sent by current
/// browsers) must be same-origin or a typed URL, and an `Origin` must name this host.
fn cross_site(req: &Request) -> Option<ApiError> {
    let h = req.headers();
    let site = h.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if site.is_some_and(|s| s != "same-origin" && s != "none") {
        return Some(forbidden("another site cannot use the console's session"));
    }
    if let Some(origin) = h.get(header::ORIGIN) {
        let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest);
        if host.is_none() || origin_host != host {
            return Some(forbidden("the request's Origin is not this server"));
        }
    }
    None
}

/// State-changing requests must come from the console's own script.
fn csrf_checked(req: &Request) -> Option<ApiError> {
    if let Some(e) = cross_site(req) {
        return Some(e);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let ok = req
            .headers()
            .get(CSRF_HEADER)
            .is_some_and(|v| v.as_bytes() == b"1");
        if !ok {
            return Some(forbidden(
                "state-changing console requests must carry X-Bulkhead-Console: 1",
            ));
        }
    }
    None
}

fn forbidden(why: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, format!("Refused: {why}"))
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

/// `Secure` when the browser reached us over HTTPS (directly or through a proxy that says so).
fn is_https(headers: &HeaderMap) -> bool {
    let said = |name: header::HeaderName, what: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().starts_with(what))
    };
    said(header::ORIGIN, "https://")
        || said(
            header::HeaderName::from_static("x-forwarded-proto"),
            "https",
        )
}

fn cookie(value: &str, max_age: u64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let c = format!(
        "{COOKIE}={value}; Path={PREFIX}; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    );
    HeaderValue::from_str(&c).unwrap_or(HeaderValue::from_static(""))
}

/// 401 in E2B's shape that also clears the cookie; the page shows the login form with `why`.
fn signed_out(why: &str, secure: bool) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, why).into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0, secure));
    r
}

const NO_SESSION: &str = "Not logged in to the console: log in with an API key";
const KEY_REFUSED: &str = "This API key is not accepted: it is unknown or has been revoked. Log in with an active key (create one with `bulkhead keys create`)";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LoginBody {
    api_key: String,
}

async fn login(c: &Console, req: Request) -> Response {
    if let Some(e) = csrf_checked(&req) {
        return e.into_response();
    }
    let secure = is_https(req.headers());
    let body = match axum::body::to_bytes(req.into_body(), MAX_LOGIN_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::bad_request(
                "The login body must be {\"apiKey\": \"...\"} (4 KiB at most)",
            )
            .into_response();
        }
    };
    let Ok(LoginBody { api_key }) = serde_json::from_slice(&body) else {
        return ApiError::bad_request("The login body must be {\"apiKey\": \"...\"}")
            .into_response();
    };
    let api_key = api_key.trim().to_owned();
    match c.engine.authenticate(&api_key).await {
        Ok(Some(caller)) => {
            let id = c.sessions.create(api_key, Instant::now());
            let mut r = axum::Json(who(&caller)).into_response();
            r.headers_mut().insert(
                header::SET_COOKIE,
                cookie(&id, session::ABSOLUTE.as_secs(), secure),
            );
            r
        }
        Ok(None) => signed_out(KEY_REFUSED, secure),
        Err(e) => ApiError::from(e).into_response(),
    }
}

fn who(caller: &Caller) -> serde_json::Value {
    serde_json::json!({ "teamID": caller.team_id, "keyID": caller.key_id })
}

fn logout(c: &Console, req: &Request) -> Response {
    if let Some(e) = csrf_checked(req) {
        return e.into_response();
    }
    if let Some(id) = session_id(req.headers()) {
        c.sessions.remove(&id);
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0, is_https(req.headers())));
    r
}

/// The session's key, checked again now: `Err` is the answer to send (not logged in, or the
/// key was revoked since, which also ends the session).
async fn session_key(c: &Console, headers: &HeaderMap) -> Result<(String, Caller), Response> {
    let secure = is_https(headers);
    let Some(id) = session_id(headers) else {
        return Err(signed_out(NO_SESSION, secure));
    };
    let Some(key) = c.sessions.key(&id, Instant::now()) else {
        return Err(signed_out(NO_SESSION, secure));
    };
    match c.engine.authenticate(&key).await {
        Ok(Some(caller)) => Ok((key, caller)),
        Ok(None) => {
            c.sessions.remove(&id);
            Err(signed_out(KEY_REFUSED, secure))
        }
        Err(e) => Err(ApiError::from(e).into_response()),
    }
}

async fn session_info(c: &Console, req: Request) -> Response {
    if let Some(e) = cross_site(&req) {
        return e.into_response();
    }
    let headers = req.headers().clone();
    match session_key(c, &headers).await {
        Ok((_, caller)) => axum::Json(who(&caller)).into_response(),
        Err(r) => r,
    }
}

/// The REST routes the console may replay, as (method, path pattern); `*` is one segment.
const ALLOWED: &[(Method, &str)] = &[
    (Method::GET, "/v2/sandboxes"),
    (Method::GET, "/sandboxes/metrics"),
    (Method::GET, "/sandboxes/*"),
    (Method::DELETE, "/sandboxes/*"),
    (Method::GET, "/sandboxes/*/metrics"),
    (Method::GET, "/sandboxes/*/network/events"),
    (Method::GET, "/bulkhead/v1/usage"),
    (Method::GET, "/bulkhead/v1/keys"),
    (Method::DELETE, "/bulkhead/v1/keys/*"),
    (Method::GET, "/bulkhead/v1/sandboxes/*/processes"),
    (Method::GET, "/bulkhead/v1/sandboxes/*/files"),
    (Method::GET, "/bulkhead/v1/sandboxes/*/files/content"),
];

fn allowed(method: &Method, path: &str) -> bool {
    let segs: Vec<&str> = path.split('/').collect();
    ALLOWED.iter().any(|(m, pat)| {
        let pat: Vec<&str> = pat.split('/').collect();
        m == method
            && pat.len() == segs.len()
            && pat
                .iter()
                .zip(&segs)
                .all(|(p, s)| (*p == "*" && !s.is_empty() && *s != "..") || p == s)
    })
}

async fn forward(c: &Console, req: Request, next: Next) -> Response {
    if let Some(e) = csrf_checked(&req) {
        return e.into_response();
    }
    let rest = req.uri().path()[API.len()..].to_owned();
    if !allowed(req.method(), &rest) {
        return ApiError::not_found(format!(
            "The console has no {} {rest}; it reads sandboxes, usage and keys",
            req.method()
        ))
        .into_response();
    }
    let headers = req.headers().clone();
    let (key, _) = match session_key(c, &headers).await {
        Ok(k) => k,
        Err(r) => return r,
    };
    let secure = is_https(req.headers());
    let strip_token = req.method() == Method::GET
        && rest.starts_with("/sandboxes/")
        && rest.matches('/').count() == 2;
    let (mut parts, _) = req.into_parts();
    let target = match parts.uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest,
    };
    let Ok(uri) = target.parse() else {
        return ApiError::bad_request("Invalid console request path").into_response();
    };
    parts.uri = uri;
    // Only what the control plane needs: the browser's cookies stay here.
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&key) {
        headers.insert("x-api-key", v);
    }
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    parts.headers = headers;
    let mut resp = next.run(Request::from_parts(parts, Body::empty())).await;
    if resp.status() == StatusCode::UNAUTHORIZED {
        return signed_out(KEY_REFUSED, secure);
    }
    if strip_token && resp.status().is_success() {
        resp = without_access_token(resp).await;
    }
    resp
}

/// `GET /sandboxes/{id}` carries the sandbox's envd access token, which the page never needs:
/// it stays on the server.
async fn without_access_token(resp: Response) -> Response {
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return ApiError::new(
            StatusCode::BAD_GATEWAY,
            "The sandbox description was too large",
        )
        .into_response();
    };
    let out = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(mut v) => {
            if let Some(o) = v.as_object_mut() {
                o.remove("envdAccessToken");
            }
            serde_json::to_vec(&v).unwrap_or_default()
        }
        Err(_) => bytes.to_vec(),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_routes_are_replayed() {
        assert!(allowed(&Method::GET, "/v2/sandboxes"));
        assert!(allowed(&Method::GET, "/sandboxes/abc/metrics"));
        assert!(allowed(&Method::DELETE, "/sandboxes/abc"));
        assert!(allowed(
            &Method::GET,
            "/bulkhead/v1/sandboxes/abc/files/content"
        ));
        assert!(!allowed(&Method::POST, "/sandboxes"));
        assert!(!allowed(&Method::POST, "/v2/sandboxes"));
        assert!(!allowed(&Method::GET, "/secrets"));
        assert!(!allowed(&Method::GET, "/sandboxes//metrics"));
        assert!(!allowed(&Method::GET, "/sandboxes/../secrets"));
        assert!(!allowed(&Method::DELETE, "/bulkhead/v1/keys"));
        assert!(!allowed(&Method::GET, "/sandboxes/a/b/c"));
    }

    #[test]
    fn the_session_cookie_is_read_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; bulkhead_console=abc; b=2"),
        );
        assert_eq!(session_id(&h).as_deref(), Some("abc"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("bulkhead_consolex=1"),
        );
        assert_eq!(session_id(&h), None);
        let c = cookie("abc", 60, true);
        let c = c.to_str().unwrap();
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Path=/console",
            "Secure",
            "Max-Age=60",
        ] {
            assert!(c.contains(part), "{c}");
        }
    }
}
