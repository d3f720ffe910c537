//! The console's JSON API: runs (newest first, filtered, paginated) and one run with its provider
//! calls; conversations and one conversation's history as stored; usage per day, provider and
//! model with its cost from the configured prices; the providers and models with their newest
//! call's outcome. API keys are never part of an answer.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{Config, Pricing};
use crate::model::usage::Usage;
use crate::state::AppState;
use crate::store::runs::{self, RunFilter, RunStatus, RunSummary};
use crate::store::{StoreError, conversations, messages};

/// Rows per page unless the query asks for fewer (never more than `MAX_PAGE`).
const PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;

/// A console API failure: a bad query or the store's error, as JSON with a status.
pub struct ApiError(pub StatusCode, pub String);

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        tracing::error!("console query failed: {error}");
        ApiError(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

/// A number from a query string, where an empty value (a form's blank choice) means none.
fn empty_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    match text.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(number) => number.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunQuery {
    pub status: Option<String>,
    pub model: Option<String>,
    pub conversation: Option<String>,
    /// Runs started at or after this time (ms since the epoch); empty (a form's "any time") is none.
    #[serde(default, deserialize_with = "empty_is_none")]
    pub since: Option<i64>,
    /// The previous page's `next` cursor.
    pub before: Option<i64>,
    pub limit: Option<u32>,
}

pub async fn runs(
    State(state): State<Arc<AppState>>,
    Query(query): Query<RunQuery>,
) -> Result<Json<Value>, ApiError> {
    let status = match query.status.as_deref() {
        None | Some("") => None,
        Some(text) => Some(RunStatus::parse(text).ok_or_else(|| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("status {text:?}: expected running, succeeded, failed or canceled"),
            )
        })?),
    };
    let limit = query.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE);
    let filter = RunFilter {
        request_id: None,
        status,
        model_id: query.model.filter(|m| !m.is_empty()),
        conversation_id: query.conversation.filter(|c| !c.is_empty()),
        since_ms: query.since,
        before_ms: query.before,
        limit,
    };
    let found = runs::list(&state.store, &filter).await?;
    let next = (found.len() == limit as usize)
        .then(|| found.last().map(|r| r.started_at_ms))
        .flatten();
    let rows: Vec<Value> = found.iter().map(|r| run_json(&state.config, r)).collect();
    Ok(Json(json!({"runs": rows, "next": next})))
}

pub async fn run(
    State(state): State<Arc<AppState>>,
    Path(request_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let found = runs::list(
        &state.store,
        &RunFilter {
            request_id: Some(request_id.clone()),
            limit: 1,
            ..RunFilter::default()
        },
    )
    .await?;
    let Some(summary) = found.first() else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no run {request_id:?}"),
        ));
    };
    let calls = runs::provider_calls(&state.store, &request_id).await?;
    let calls: Vec<Value> = calls
        .iter()
        .map(|call| {
            json!({
                "model_call_id": call.model_call_id,
                "provider": call.provider,
                "model": call.model_id,
                "purpose": call.purpose.as_str(),
                "started_at_ms": call.started_at_ms,
                "first_event_ms": call.first_event_ms,
                "total_ms": call.total_ms,
                "request_bytes": call.request_bytes,
                "attempts": call.attempts(),
                "retries": call.retries,
                "key_index": call.key_index,
                "key": key_used(&state.config, &call.provider, call.key_index),
                "usage": usage_json(&call.usage),
                "cost_usd": pricing(&state.config, &call.model_id).and_then(|p| p.cost(&call.usage)),
                "finish_reason": call.finish_reason,
                "error": call.error,
                "fallback_from": call.fallback_from,
            })
        })
        .collect();
    let tools: Vec<Value> = runs::tool_executions(&state.store, &request_id)
        .await?
        .iter()
        .map(|tool| {
            json!({
                "call_id": tool.call_id,
                "tool": tool.tool,
                "arguments": tool.summary,
                "started_at_ms": tool.started_at_ms,
                "duration_ms": tool.duration_ms,
                "outcome": tool.outcome,
            })
        })
        .collect();
    let mut run = run_json(&state.config, summary);
    run["provider_calls"] = Value::Array(calls);
    run["tool_calls"] = Value::Array(tools);
    Ok(Json(run))
}

fn run_json(config: &Config, run: &RunSummary) -> Value {
    let record = &run.record;
    json!({
        "request_id": record.request_id,
        "conversation_id": record.conversation_id,
        "model": record.model_id,
        "requested_model": record.requested_model,
        "mode": run.mode,
        "transport": run.transport,
        "status": record.outcome.status.as_str(),
        "started_at_ms": run.started_at_ms,
        "finished_at_ms": run.finished_at_ms,
        "duration_ms": run.finished_at_ms.map(|end| end - run.started_at_ms),
        "first_token_ms": run.first_token_ms,
        "provider_call_count": record.outcome.provider_calls,
        "usage": usage_json(&record.outcome.usage),
        "cost_usd": pricing(config, &record.model_id).and_then(|p| p.cost(&record.outcome.usage)),
        "error": record.outcome.error.as_ref().map(|(code, message)| json!({"code": code, "message": message})),
    })
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input": usage.input_tokens,
        "output": usage.output_tokens,
        "cache_read": usage.cache_read_tokens,
        "cache_write": usage.cache_write_tokens,
        "reasoning": usage.reasoning_tokens,
    })
}

/// The configured prices of the model Cursor knows as `model_id`.
fn pricing(config: &Config, model_id: &str) -> Option<Pricing> {
    config
        .providers
        .iter()
        .flat_map(|p| &p.models)
        .find(|m| m.id == model_id)
        .and_then(|m| m.pricing)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    pub before: Option<i64>,
    pub limit: Option<u32>,
}

pub async fn conversations(
    State(state): State<Arc<AppState>>,
    Query(query): Query<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = query.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE);
    let found = conversations::list(&state.store, query.before, limit).await?;
    let next = (found.len() == limit as usize)
        .then(|| found.last().map(|c| c.last_activity_ms))
        .flatten();
    let rows: Vec<Value> = found
        .iter()
        .map(|c| {
            json!({
                "id": c.id,
                "title": c.title,
                "runs": c.runs,
                "messages": c.messages,
                "last_activity_ms": c.last_activity_ms,
            })
        })
        .collect();
    Ok(Json(json!({"conversations": rows, "next": next})))
}

/// One conversation: its stored history (what the model is shown, before each family's shape)
/// and its runs.
pub async fn conversation(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let history = messages::load(&state.store, &id).await?;
    let head = conversations::head(&state.store, &id).await?;
    let runs = runs::list(
        &state.store,
        &RunFilter {
            conversation_id: Some(id.clone()),
            limit: MAX_PAGE,
            ..RunFilter::default()
        },
    )
    .await?;
    if history.is_empty() && runs.is_empty() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no conversation {id:?}"),
        ));
    }
    let runs: Vec<Value> = runs.iter().map(|r| run_json(&state.config, r)).collect();
    Ok(Json(json!({
        "id": id,
        "history": history,
        "head": head.map(|(blob, revision)| json!({"blob": blob.to_hex(), "revision": revision})),
        "runs": runs,
    })))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// Days back from today (UTC), default 30.
    pub days: Option<u32>,
}

/// Usage per day, provider and model: the five token buckets, the cache hit rate (cache reads
/// over all input read) and the cost (unknown without a price for every bucket used).
pub async fn usage(
    State(state): State<Arc<AppState>>,
    Query(query): Query<UsageQuery>,
) -> Result<Json<Value>, ApiError> {
    let days = i64::from(query.days.unwrap_or(30).clamp(1, 3650));
    let since = crate::store::now_ms() - days * 86_400_000;
    let rows = runs::usage_by_day(&state.store, since).await?;
    let rows: Vec<Value> = rows
        .iter()
        .map(|row| {
            let input = row.usage.input_tokens.unwrap_or(0);
            let cached = row.usage.cache_read_tokens.unwrap_or(0);
            let read = input + cached;
            json!({
                "day": row.day,
                "provider": row.provider,
                "model": row.model_id,
                "calls": row.calls,
                "usage": usage_json(&row.usage),
                "cache_hit_rate": (read > 0).then(|| cached as f64 / read as f64),
                "cost_usd": pricing(&state.config, &row.model_id).and_then(|p| p.cost(&row.usage)),
            })
        })
        .collect();
    Ok(Json(json!({"days": days, "rows": rows})))
}

/// The last warnings and errors the server logged, newest first.
pub async fn logs() -> Json<Value> {
    Json(json!({"entries": super::logs::recent()}))
}

/// `GET /api/live`: server-sent events, one `runs` event with the active request ids now and
/// again whenever a run starts or ends (a comment every 15 s keeps proxies from closing it).
pub async fn live(State(state): State<Arc<AppState>>) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let changes = state.runs.watch();
    let shutdown = state.shutdown.clone();
    let events = futures_util::stream::unfold((changes, true), move |(mut changes, first)| {
        let state = Arc::clone(&state);
        let shutdown = shutdown.clone();
        async move {
            if !first {
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    changed = changes.changed() => changed.ok()?,
                }
            }
            let mut active = state.runs.active_ids();
            active.sort();
            let event = Event::default()
                .event("runs")
                .json_data(json!({"active": active}))
                .ok()?;
            Some((Ok::<_, std::convert::Infallible>(event), (changes, false)))
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response()
}

/// A provider's keys as the console shows them: each by its source (`key 2 (KEY_2)`, never the
/// key), its calls in flight, and its cooldown if the provider turned it away.
fn keys_json(state: &AppState, provider: &crate::config::ProviderConfig) -> Value {
    let status = state.keys.get(provider).status();
    Value::Array(
        status
            .iter()
            .enumerate()
            .map(|(i, key)| {
                json!({
                    "name": crate::ops::check::key_name(provider, i),
                    "in_flight": key.in_flight,
                    "cooling_secs": key.cooling.map(|(left, _)| left.as_secs()),
                    "cooling_status": key.cooling.map(|(_, status)| status),
                })
            })
            .collect(),
    )
}

/// "key 2 of 2" for a call a key answered, when the provider has several (never the key); the
/// count is the configuration's now.
fn key_used(config: &crate::config::Config, provider: &str, index: Option<u32>) -> Value {
    let count = config
        .providers
        .iter()
        .find(|p| p.name == provider)
        .map_or(0, |p| p.keys.len());
    match index {
        Some(index) if count > 1 => json!(format!("key {} of {count}", index + 1)),
        Some(index) => json!(format!("key {}", index + 1)),
        None => Value::Null,
    }
}

/// Each provider (URL and route, never its key) and model, with its newest call's outcome.
pub async fn providers(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let last = runs::last_calls(&state.store).await?;
    let providers: Vec<Value> = state
        .config
        .providers
        .iter()
        .map(|provider| {
            let models: Vec<Value> = provider
                .models
                .iter()
                .map(|model| {
                    let newest = last.iter().find(|(id, _, _)| *id == model.id);
                    json!({
                        "id": model.id,
                        "upstream_id": model.upstream_id,
                        "display_name": model.display_name,
                        "context_window": model.context_window,
                        "reasoning": model.reasoning,
                        "vision": model.vision,
                        "default": model.id == state.config.default_model,
                        "priced": model.pricing.is_some(),
                        "last_call": newest.map(|(_, at, error)| json!({"at_ms": at, "ok": error.is_none(), "error": error})),
                    })
                })
                .collect();
            json!({
                "name": provider.name,
                "kind": format!("{:?}", provider.kind),
                "base_url": provider.base_url,
                "route": provider.route.shown(),
                "api_key": "***",
                "keys": keys_json(&state, provider),
                "models": models,
            })
        })
        .collect();
    Ok(Json(json!({"providers": providers})))
}
