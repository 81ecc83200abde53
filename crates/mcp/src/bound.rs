//! Sessions bound to the API key that opened them. rmcp's Streamable HTTP service finds a
//! session by its `Mcp-Session-Id` alone, so anyone holding the id would drive the session (its
//! default sandbox, its SSE stream, its DELETE). This layer remembers which caller's
//! `initialize` answer carried each id and answers a request naming the id with anyone else's
//! key exactly as rmcp answers an id it does not know (404), so another team learns nothing
//! about the session, not even that it exists.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bulkhead_engine::Caller;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use rmcp::transport::StreamableHttpService;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::server::BulkheadMcp;

type Inner = StreamableHttpService<BulkheadMcp, LocalSessionManager>;
type Response = http::Response<BoxBody<Bytes, Infallible>>;

/// Ids of ended sessions are dropped once the map reaches this size (and then whenever it has
/// doubled since), so the map tracks the live sessions without a timer.
const PRUNE_AT_LEAST: usize = 64;

/// Which caller opened each live session.
struct Owners {
    sessions: Arc<LocalSessionManager>,
    state: Mutex<OwnersState>,
}

#[derive(Default)]
struct OwnersState {
    by_id: HashMap<String, Caller>,
    prune_at: usize,
}

impl Owners {
    fn state(&self) -> std::sync::MutexGuard<'_, OwnersState> {
        // A panic while holding this lock leaves a map that is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn owned_by(&self, id: &str, caller: Option<&Caller>) -> bool {
        caller.is_some_and(|c| self.state().by_id.get(id) == Some(c))
    }

    async fn bind(&self, id: String, caller: Caller) {
        let prune = {
            let mut s = self.state();
            s.by_id.insert(id, caller);
            s.by_id.len() >= s.prune_at.max(PRUNE_AT_LEAST)
        };
        if prune {
            // rmcp drops a session from its manager when it ends (closed, or idle past the
            // keep-alive); its id goes from here at the next prune.
            let live = self.sessions.sessions.read().await;
            let mut s = self.state();
            s.by_id.retain(|id, _| live.contains_key(id.as_str()));
            s.prune_at = s.by_id.len() * 2;
        }
    }

    fn forget(&self, id: &str) {
        self.state().by_id.remove(id);
    }
}

/// The Streamable HTTP endpoint (a tower service; mount it under `/mcp`): rmcp's service, with
/// each session usable only by the caller whose `initialize` opened it.
#[derive(Clone)]
pub struct HttpService {
    inner: Inner,
    owners: Arc<Owners>,
}

impl HttpService {
    pub(crate) fn new(inner: Inner, sessions: Arc<LocalSessionManager>) -> Self {
        HttpService {
            inner,
            owners: Arc::new(Owners {
                sessions,
                state: Mutex::new(OwnersState::default()),
            }),
        }
    }

    async fn handle<B>(self, req: http::Request<B>) -> Response
    where
        B: http_body::Body + Send + 'static,
        B::Error: Display,
    {
        let caller = req.extensions().get::<Caller>().cloned();
        let Some(id) = req.headers().get(HEADER_SESSION_ID) else {
            // No session yet: an `initialize` (anything else is rmcp's to refuse). Its answer
            // names the new session; bind it before the client can read that name.
            let resp = self.inner.handle(req).await;
            if let (Some(caller), Some(id)) = (
                caller,
                resp.headers()
                    .get(HEADER_SESSION_ID)
                    .and_then(|v| v.to_str().ok()),
            ) {
                self.owners.bind(id.to_owned(), caller).await;
            }
            return resp;
        };
        let id = id.to_str().unwrap_or_default().to_owned();
        if !self.owners.owned_by(&id, caller.as_ref()) {
            return session_not_found();
        }
        let closing = req.method() == http::Method::DELETE;
        let resp = self.inner.handle(req).await;
        if closing && resp.status().is_success() {
            self.owners.forget(&id);
            // rmcp answers 202; the official clients take only 200 or 204 for a session that
            // ended ("Session termination failed: 202" otherwise). Nothing else comes with it.
            if resp.status() == http::StatusCode::ACCEPTED {
                return http::Response::builder()
                    .status(http::StatusCode::NO_CONTENT)
                    .body(Full::new(Bytes::new()).boxed())
                    .expect("a static response is valid");
            }
        }
        resp
    }
}

/// rmcp's own answer to an unknown session id, byte for byte.
fn session_not_found() -> Response {
    http::Response::builder()
        .status(http::StatusCode::NOT_FOUND)
        .body(Full::new(Bytes::from("Not Found: Session not found")).boxed())
        .expect("a static response is valid")
}

impl<B> tower::Service<http::Request<B>> for HttpService
where
    B: http_body::Body + Send + 'static,
    B::Error: Display,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_engine::testing::{FakeEngine, base_template, fake_engine};
    use bulkhead_engine::{EngineConfig, keys, teams};
    use tower::ServiceExt;

    const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    const LIST_TOOLS: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;

    struct Setup {
        _dir: tempfile::TempDir,
        service: HttpService,
        /// The seeded key (default team).
        a: Caller,
        /// Another key of the same team.
        a2: Caller,
        /// A key of team `b`.
        b: Caller,
    }

    async fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let cfg = EngineConfig {
            checkpoint_dir: dir.path().join("checkpoints"),
            ..Default::default()
        };
        let FakeEngine {
            store,
            engine,
            owner,
            ..
        } = fake_engine(dir.path(), cfg, base_template()).await;
        teams::create(&store, "b", None).await.unwrap();
        let (kb, _) = keys::create_in(&store, "kb", "b").await.unwrap();
        let (ka2, _) = keys::create(&store, "a2").await.unwrap();
        Setup {
            _dir: dir,
            service: crate::http_service(engine),
            a: owner,
            a2: ka2.caller(),
            b: kb.caller(),
        }
    }

    /// One request as crates/api passes it on: the caller in the extensions.
    async fn send(
        service: &HttpService,
        method: http::Method,
        caller: &Caller,
        session: Option<&str>,
        body: &str,
    ) -> (http::StatusCode, Option<String>, String) {
        let mut req = http::Request::builder()
            .method(method)
            .uri("/")
            .header(http::header::HOST, "localhost")
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(id) = session {
            req = req.header(HEADER_SESSION_ID, id);
        }
        let mut req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
        req.extensions_mut().insert(caller.clone());
        let resp = service.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let id = resp
            .headers()
            .get(HEADER_SESSION_ID)
            .map(|v| v.to_str().unwrap().to_owned());
        // An SSE answer stays open for the session's notifications: read its first event.
        let mut body = resp.into_body();
        let mut text = String::new();
        while let Ok(Some(Ok(frame))) =
            tokio::time::timeout(std::time::Duration::from_secs(5), body.frame()).await
        {
            if let Ok(data) = frame.into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
                if text.contains("\"result\"") || text.contains("\"error\"") {
                    break;
                }
            }
        }
        (status, id, text)
    }

    async fn open(s: &Setup, caller: &Caller) -> String {
        let (status, id, body) = send(&s.service, http::Method::POST, caller, None, INIT).await;
        assert_eq!(status, http::StatusCode::OK, "{body}");
        let id = id.expect("initialize names the session");
        let (status, _, body) = send(
            &s.service,
            http::Method::POST,
            caller,
            Some(&id),
            INITIALIZED,
        )
        .await;
        assert_eq!(status, http::StatusCode::ACCEPTED, "{body}");
        id
    }

    #[tokio::test]
    async fn a_session_answers_only_the_key_that_opened_it() {
        let s = setup().await;
        let id = open(&s, &s.a).await;
        let (status, _, body) =
            send(&s.service, http::Method::POST, &s.a, Some(&id), LIST_TOOLS).await;
        assert_eq!(status, http::StatusCode::OK);
        assert!(body.contains("run_command"), "{body}");

        // Another team's key, and another key of the same team, get what an id nobody
        // opened gets, on every method.
        let unknown = send(
            &s.service,
            http::Method::POST,
            &s.a,
            Some("nope"),
            LIST_TOOLS,
        )
        .await;
        assert_eq!(unknown.0, http::StatusCode::NOT_FOUND);
        for other in [&s.b, &s.a2] {
            for (method, body) in [
                (http::Method::POST, LIST_TOOLS),
                (http::Method::GET, ""),
                (http::Method::DELETE, ""),
            ] {
                let (status, _, text) =
                    send(&s.service, method.clone(), other, Some(&id), body).await;
                assert_eq!(
                    (status, text.as_str()),
                    (unknown.0, unknown.2.as_str()),
                    "{method} by {}",
                    other.key_id
                );
            }
        }

        // The refused DELETE did not end it; the owner's does.
        let (status, _, _) =
            send(&s.service, http::Method::POST, &s.a, Some(&id), LIST_TOOLS).await;
        assert_eq!(status, http::StatusCode::OK);
        let (status, _, _) = send(&s.service, http::Method::DELETE, &s.a, Some(&id), "").await;
        assert_eq!(
            status,
            http::StatusCode::NO_CONTENT,
            "what the official clients take"
        );
        let (status, _, _) =
            send(&s.service, http::Method::POST, &s.a, Some(&id), LIST_TOOLS).await;
        assert_eq!(status, http::StatusCode::NOT_FOUND);

        // B's own session works for B.
        let id_b = open(&s, &s.b).await;
        let (status, _, _) = send(
            &s.service,
            http::Method::POST,
            &s.b,
            Some(&id_b),
            LIST_TOOLS,
        )
        .await;
        assert_eq!(status, http::StatusCode::OK);
    }

    #[tokio::test]
    async fn ended_sessions_leave_the_owner_map() {
        let s = setup().await;
        let mut ids = Vec::new();
        for _ in 0..PRUNE_AT_LEAST {
            let id = open(&s, &s.a).await;
            let (status, _, _) = send(&s.service, http::Method::DELETE, &s.a, Some(&id), "").await;
            assert!(status.is_success());
            ids.push(id);
        }
        assert!(s.service.owners.state().by_id.is_empty());
        // Sessions rmcp ended without a DELETE (the idle timeout) go at the next prune.
        let kept = open(&s, &s.a).await;
        {
            let mut st = s.service.owners.state();
            for id in &ids {
                st.by_id.insert(id.clone(), s.a.clone());
            }
        }
        let _ = open(&s, &s.a).await;
        let st = s.service.owners.state();
        assert_eq!(st.by_id.len(), 2, "{:?}", st.by_id.keys());
        assert!(st.by_id.contains_key(&kept));
    }
}
