//! The operator's routes, answered by this server itself and never passed through to Cursor's
//! backend: `GET /healthz` (the process is up), `GET /readyz` (the database takes a write, the
//! prompts are loaded, the server is not shutting down; in a cluster, this node's lease is held) and `GET /metrics` (Prometheus text).
//! `check.rs` is the pre-flight check (`cursor-server check`); `drift.rs` notices what connected
//! clients send that the schema does not know.

pub mod check;
pub mod drift;
pub mod metrics;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::prompting::assets::PromptKind;
use crate::state::AppState;

pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";

/// How long the readiness probe waits for the database's write lock before it answers not ready.
const DATABASE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(HEALTHZ, get(healthz))
        .route(READYZ, get(readyz))
        .route(METRICS, get(metrics_route))
        .with_state(state)
}

async fn healthz() -> Response {
    (
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")})),
    )
        .into_response()
}

/// 200 when every check passes, 503 naming the ones that did not.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let (ready, checks) = readiness(&state).await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(json!({"ready": ready, "checks": checks})),
    )
        .into_response()
}

/// Whether the server is ready, and each check's outcome (`ok`, `detail`) by name: what
/// `/readyz` answers and the console's overview shows.
pub async fn readiness(state: &AppState) -> (bool, serde_json::Map<String, serde_json::Value>) {
    let database =
        match tokio::time::timeout(DATABASE_PROBE_TIMEOUT, state.store.probe_write()).await {
            Ok(Ok(())) => Ok("writable".to_owned()),
            Ok(Err(e)) => Err(format!("not writable: {e}")),
            Err(_) => Err(format!(
                "write lock not obtained within {} s",
                DATABASE_PROBE_TIMEOUT.as_secs()
            )),
        };
    let prompts = Ok(format!("{} prompt sets loaded", PromptKind::ALL.len()));
    let accepting = if state.shutdown.is_cancelled() {
        Err("shutting down".to_owned())
    } else {
        Ok("accepting connections".to_owned())
    };
    let mut checks = vec![
        ("database", database),
        ("prompts", prompts),
        ("listener", accepting),
    ];
    if let Some(cluster) = &state.cluster {
        checks.push(("lease", cluster.own_lease(&state.store).await));
    }
    let ready = checks.iter().all(|(_, check)| check.is_ok());
    let body: serde_json::Map<String, serde_json::Value> = checks
        .into_iter()
        .map(|(name, check)| {
            let value = match check {
                Ok(ok) => json!({"ok": true, "detail": ok}),
                Err(error) => json!({"ok": false, "detail": error}),
            };
            (name.to_owned(), value)
        })
        .collect();
    (ready, body)
}

async fn metrics_route(State(state): State<Arc<AppState>>) -> Response {
    let (active, _) = state.runs.counts();
    let node = state.cluster.as_ref().map(|c| c.node_name());
    match metrics::render(active, &state.keys.cooling(), node) {
        Some(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics are off: another metrics recorder was installed in this process\n",
        )
            .into_response(),
    }
}
