//! `GET /metrics`: the Prometheus exposition of what the engine, the egress proxy and this
//! front end record (through the `metrics` facade), plus the levels read at scrape time.
//! It needs an API key like every other control-plane route (Prometheus sends one as
//! `authorization: Bearer <key>`): the counts describe every tenant's sandboxes.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bulkhead_engine::telemetry::names;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::state::AppState;

/// Create latency buckets (seconds): a claim takes milliseconds, a cold kernel start seconds.
const CREATE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The process-wide recorder. The `metrics` facade has one global recorder, so the first
/// router of the process installs it and later ones (tests build several) share it.
static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the recorder if nobody has; `None` when another recorder was installed first (an
/// embedder's own), in which case `/metrics` says so.
pub(crate) fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(names::CREATE_SECONDS.into()), CREATE_BUCKETS)
                .expect("buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|()| handle)
        })
        .as_ref()
}

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    crate::docs::tagged(OpenApiRouter::new().routes(routes!(scrape)), "bulkhead")
}

/// Series of the level gauges set by the previous scrape, so the ones that are gone (the last
/// paused sandbox of a template resumed) drop to 0 instead of repeating their last value.
static LAST_LEVELS: Mutex<BTreeSet<Series>> = Mutex::new(BTreeSet::new());

/// A gauge's name and labels.
type Series = (&'static str, Vec<(&'static str, String)>);

#[utoipa::path(get, path = "/metrics",
    responses((status = 200, description = "Prometheus text exposition format (version 0.0.4)", content_type = "text/plain", body = String)))]
async fn scrape(State(st): State<AppState>) -> Result<Response, ApiError> {
    let Some(handle) = install() else {
        return Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "metrics are not available: another metrics recorder is installed in this process",
        ));
    };
    let g = st.engine.gauges().await?;
    let mut now: BTreeSet<Series> = BTreeSet::new();
    for (state, template, n) in g.sandboxes {
        let labels = vec![("state", state), ("template", template)];
        set_level(names::SANDBOXES, &labels, n as f64);
        now.insert((names::SANDBOXES, labels));
    }
    for (template, n) in g.pools {
        let labels = vec![("template", template)];
        set_level(names::POOL_MEMBERS, &labels, n as f64);
        now.insert((names::POOL_MEMBERS, labels));
    }
    metrics::gauge!(names::CREATES_IN_FLIGHT).set(g.creates_in_flight as f64);
    {
        let mut last = LAST_LEVELS.lock().expect("levels lock");
        for (name, labels) in last.difference(&now) {
            set_level(name, labels, 0.0);
        }
        *last = now;
    }
    handle.run_upkeep();
    let mut resp = handle.render().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(resp)
}

fn set_level(name: &'static str, labels: &[(&'static str, String)], v: f64) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(k, val)| metrics::Label::new(*k, val.clone()))
        .collect();
    metrics::gauge!(name, labels).set(v);
}

/// Every answer of this listener by status code (control plane and sandbox traffic alike):
/// errors by code, as Prometheus wants them.
pub(crate) async fn count_responses(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    metrics::counter!("bulkhead_http_responses_total", "status" => resp.status().as_u16().to_string())
        .increment(1);
    resp
}
