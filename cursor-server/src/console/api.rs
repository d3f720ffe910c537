//! The console's JSON API: runs (newest first, filtered, paginated) and one run with its provider
//! calls; conversations and one conversation's history as stored; usage per day, provider and
//! model with its cost from the configured prices; the providers and models with their newest
//! call's outcome. API keys are never part of an answer.
//! Every answer is a typed view model (`RunList`, `RunDetail`, …): the JSON routes serialize it
//! and the pages (`pages.rs`) render the same value through their templates.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::scope;
use crate::auth::service::Caller;
use crate::config::{Config, Pricing};
use crate::model::message::CanonicalMessage;
use crate::model::usage::Usage;
use crate::state::AppState;
use crate::store::runs::{self, FailedAttempt, RunFilter, RunStatus, RunSummary};
use crate::store::{StoreError, conversations, messages};

/// Rows per page unless the query asks for fewer (never more than `MAX_PAGE`).
const PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;

/// A console API failure, mapped to a response at the edge (`IntoResponse`): a request people can
/// fix gets its own words; a store failure is logged there, once, with its detail, and people get
/// a message that says where to look (the database's text never reaches the browser).
#[derive(Debug)]
pub enum ApiError {
    /// A bad query, an unknown run or conversation, a stale form: the status and what to say.
    Request(StatusCode, String),
    /// The store failed; the detail is for the log only.
    Store(StoreError),
}

/// What people are told when the store failed.
pub const STORE_FAILED: &str = "the console could not read the database; see the server log";

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::Store(error)
    }
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError::Request(status, message.into())
    }

    /// The status and the message for people; logs a store failure's detail (call once, at the
    /// edge: the JSON answer and the pages' error page both come through here).
    pub fn resolve(self) -> (StatusCode, String) {
        match self {
            ApiError::Request(status, message) => (status, message),
            ApiError::Store(error) => {
                tracing::error!(%error, "console query failed");
                (StatusCode::INTERNAL_SERVER_ERROR, STORE_FAILED.to_owned())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = self.resolve();
        (status, Json(json!({"error": message}))).into_response()
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

/// `GET /api/runs`: one page of runs and the cursor of the next.
#[derive(Debug, Clone, Serialize)]
pub struct RunList {
    pub runs: Vec<RunRow>,
    /// The `before` of the next page, when this one is full.
    pub next: Option<i64>,
}

/// A run as the console shows it (in a list, and at the head of its own page).
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub request_id: String,
    pub conversation_id: String,
    pub model: String,
    /// The name Cursor sent, when routing chose `model` for it.
    pub requested_model: Option<String>,
    pub mode: Option<String>,
    pub transport: Option<String>,
    /// The node that ran it (several nodes on one database); `None` for a single node.
    pub node: Option<String>,
    /// `[auth]`: the person whose conversation it ran on.
    pub user: Option<String>,
    pub status: &'static str,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub duration_ms: Option<i64>,
    pub first_token_ms: Option<i64>,
    pub provider_call_count: u32,
    pub usage: Tokens,
    /// Unknown (`None`) without a price for every bucket used, never zero.
    pub cost_usd: Option<f64>,
    pub error: Option<RunError>,
}

/// How a run that failed ended: the code and the message Cursor was shown.
#[derive(Debug, Clone, Serialize)]
pub struct RunError {
    pub code: String,
    pub message: String,
}

/// The five token buckets (`None` where the provider did not say).
#[derive(Debug, Clone, Serialize)]
pub struct Tokens {
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub cache_read: Option<u64>,
    pub cache_write: Option<u64>,
    pub reasoning: Option<u64>,
}

impl From<&Usage> for Tokens {
    fn from(usage: &Usage) -> Self {
        Tokens {
            input: usage.input_tokens,
            output: usage.output_tokens,
            cache_read: usage.cache_read_tokens,
            cache_write: usage.cache_write_tokens,
            reasoning: usage.reasoning_tokens,
        }
    }
}

pub async fn runs(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<Caller>>,
    Query(query): Query<RunQuery>,
) -> Result<Json<RunList>, ApiError> {
    let status = match query.status.as_deref() {
        None | Some("") => None,
        Some(text) => Some(RunStatus::parse(text).ok_or_else(|| {
            ApiError::new(
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
        owner: scope::own_only(caller.as_deref()).map(str::to_owned),
    };
    let found = runs::list(&state.store, &filter).await?;
    let next = (found.len() == limit as usize)
        .then(|| found.last().map(|r| r.started_at_ms))
        .flatten();
    let runs = found.iter().map(|r| run_row(&state.config, r)).collect();
    Ok(Json(RunList { runs, next }))
}

/// `GET /api/runs/{request_id}`: the run, its provider calls and its tool calls.
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunRow,
    pub provider_calls: Vec<CallRow>,
    pub tool_calls: Vec<ToolRow>,
}

/// One provider call of a run.
#[derive(Debug, Clone, Serialize)]
pub struct CallRow {
    pub model_call_id: String,
    pub provider: String,
    pub model: String,
    pub purpose: &'static str,
    pub started_at_ms: i64,
    pub first_event_ms: Option<u64>,
    pub total_ms: u64,
    pub request_bytes: u64,
    pub attempts: u32,
    pub retries: Vec<FailedAttempt>,
    pub key_index: Option<u32>,
    /// "key 2 of 2" (never the key), when a key answered.
    pub key: Option<String>,
    pub usage: Tokens,
    pub cost_usd: Option<f64>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// The model whose failed call this one replaced.
    pub fallback_from: Option<String>,
}

/// One tool call of a run.
#[derive(Debug, Clone, Serialize)]
pub struct ToolRow {
    pub call_id: String,
    pub tool: String,
    /// The arguments, shortened.
    pub arguments: String,
    pub started_at_ms: i64,
    pub duration_ms: i64,
    pub outcome: &'static str,
}

pub async fn run(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<Caller>>,
    Path(request_id): Path<String>,
) -> Result<Json<RunDetail>, ApiError> {
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
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no run {request_id:?}"),
        ));
    };
    if let Some(email) = scope::own_only(caller.as_deref())
        && summary.user.as_deref() != Some(email)
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("run {request_id} belongs to someone else on this server"),
        ));
    }
    let config = &state.config;
    let provider_calls = runs::provider_calls(&state.store, &request_id)
        .await?
        .into_iter()
        .map(|call| CallRow {
            attempts: call.attempts(),
            key: key_used(config, &call.provider, call.key_index),
            cost_usd: pricing(config, &call.model_id).and_then(|p| p.cost(&call.usage)),
            usage: Tokens::from(&call.usage),
            purpose: call.purpose.as_str(),
            model_call_id: call.model_call_id,
            provider: call.provider,
            model: call.model_id,
            started_at_ms: call.started_at_ms,
            first_event_ms: call.first_event_ms,
            total_ms: call.total_ms,
            request_bytes: call.request_bytes,
            retries: call.retries,
            key_index: call.key_index,
            finish_reason: call.finish_reason,
            error: call.error,
            fallback_from: call.fallback_from,
        })
        .collect();
    let tool_calls = runs::tool_executions(&state.store, &request_id)
        .await?
        .into_iter()
        .map(|tool| ToolRow {
            call_id: tool.call_id,
            tool: tool.tool,
            arguments: tool.summary,
            started_at_ms: tool.started_at_ms,
            duration_ms: tool.duration_ms,
            outcome: tool.outcome,
        })
        .collect();
    Ok(Json(RunDetail {
        run: run_row(config, summary),
        provider_calls,
        tool_calls,
    }))
}

fn run_row(config: &Config, run: &RunSummary) -> RunRow {
    let record = &run.record;
    RunRow {
        request_id: record.request_id.clone(),
        conversation_id: record.conversation_id.clone(),
        model: record.model_id.clone(),
        requested_model: record.requested_model.clone(),
        mode: run.mode.clone(),
        transport: run.transport.clone(),
        node: run.node.clone(),
        user: run.user.clone(),
        status: record.outcome.status.as_str(),
        started_at_ms: run.started_at_ms,
        finished_at_ms: run.finished_at_ms,
        duration_ms: run.finished_at_ms.map(|end| end - run.started_at_ms),
        first_token_ms: run.first_token_ms,
        provider_call_count: record.outcome.provider_calls,
        usage: Tokens::from(&record.outcome.usage),
        cost_usd: pricing(config, &record.model_id).and_then(|p| p.cost(&record.outcome.usage)),
        error: record
            .outcome
            .error
            .as_ref()
            .map(|(code, message)| RunError {
                code: code.clone(),
                message: message.clone(),
            }),
    }
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

/// `GET /api/conversations`: one page of conversations and the cursor of the next.
#[derive(Debug, Clone, Serialize)]
pub struct ConversationList {
    pub conversations: Vec<ConversationRow>,
    pub next: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConversationRow {
    pub id: String,
    /// The first line of the first user message, if there is one.
    pub title: Option<String>,
    pub runs: u64,
    pub messages: u64,
    pub last_activity_ms: i64,
}

pub async fn conversations(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<Caller>>,
    Query(query): Query<PageQuery>,
) -> Result<Json<ConversationList>, ApiError> {
    let limit = query.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE);
    let owner = scope::own_only(caller.as_deref());
    let found = conversations::list_of(&state.store, owner, query.before, limit).await?;
    let next = (found.len() == limit as usize)
        .then(|| found.last().map(|c| c.last_activity_ms))
        .flatten();
    let conversations = found
        .into_iter()
        .map(|c| ConversationRow {
            id: c.id,
            title: c.title,
            runs: c.runs,
            messages: c.messages,
            last_activity_ms: c.last_activity_ms,
        })
        .collect();
    Ok(Json(ConversationList {
        conversations,
        next,
    }))
}

/// `GET /api/conversations/{id}`: the stored history (what the model is shown, before each
/// family's shape), the published checkpoint and the runs.
#[derive(Debug, Clone, Serialize)]
pub struct ConversationDetail {
    pub id: String,
    pub history: Vec<CanonicalMessage>,
    pub head: Option<Head>,
    pub runs: Vec<RunRow>,
}

/// The published checkpoint: its blob and revision.
#[derive(Debug, Clone, Serialize)]
pub struct Head {
    pub blob: String,
    pub revision: i64,
}

pub async fn conversation(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<Caller>>,
    Path(id): Path<String>,
) -> Result<Json<ConversationDetail>, ApiError> {
    if !scope::may_read(&state, caller.as_deref(), &id).await? {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("conversation {id} belongs to someone else on this server"),
        ));
    }
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
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no conversation {id:?}"),
        ));
    }
    let runs = runs.iter().map(|r| run_row(&state.config, r)).collect();
    Ok(Json(ConversationDetail {
        id,
        history,
        head: head.map(|(blob, revision)| Head {
            blob: blob.to_hex(),
            revision,
        }),
        runs,
    }))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// Days back from today (UTC), default 30.
    pub days: Option<u32>,
}

/// `GET /api/usage`: the period and its rows.
#[derive(Debug, Clone, Serialize)]
pub struct UsageReport {
    pub days: i64,
    pub rows: Vec<UsageLine>,
    /// `[auth]`: the same per person and team (a member sees only their own); empty without it.
    pub by_person: Vec<PersonLine>,
}

/// One day, person, provider and model (`[auth]`).
#[derive(Debug, Clone, Serialize)]
pub struct PersonLine {
    pub user: Option<String>,
    pub team: Option<String>,
    #[serde(flatten)]
    pub line: UsageLine,
}

/// One day, provider and model.
#[derive(Debug, Clone, Serialize)]
pub struct UsageLine {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub provider: String,
    pub model: String,
    pub calls: u64,
    pub usage: Tokens,
    /// Cache reads over all input read; `None` when nothing was read.
    pub cache_hit_rate: Option<f64>,
    pub cost_usd: Option<f64>,
}

/// Usage per day, provider and model: the five token buckets, the cache hit rate (cache reads
/// over all input read) and the cost (unknown without a price for every bucket used).
pub async fn usage(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<Caller>>,
    Query(query): Query<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    let days = i64::from(query.days.unwrap_or(30).clamp(1, 3650));
    let since = crate::store::now_ms() - days * 86_400_000;
    let line = |day: String, (provider, model): (String, String), calls: u64, usage: &Usage| {
        let input = usage.input_tokens.unwrap_or(0);
        let cached = usage.cache_read_tokens.unwrap_or(0);
        let read = input + cached;
        UsageLine {
            cache_hit_rate: (read > 0).then(|| cached as f64 / read as f64),
            cost_usd: pricing(&state.config, &model).and_then(|p| p.cost(usage)),
            usage: Tokens::from(usage),
            day,
            provider,
            model,
            calls,
        }
    };
    let owner = scope::own_only(caller.as_deref());
    let by_person: Vec<PersonLine> = match &state.auth {
        None => Vec::new(),
        Some(_) => crate::store::budgets::usage_by_person(&state.store, since, owner)
            .await?
            .into_iter()
            .map(|row| PersonLine {
                line: line(row.day, (row.provider, row.model_id), row.calls, &row.usage),
                user: row.user,
                team: row.team,
            })
            .collect(),
    };
    // A member's rows are their own (one person: the same grouping as by day, provider, model).
    let rows = if owner.is_some() {
        by_person.iter().map(|p| p.line.clone()).collect()
    } else {
        runs::usage_by_day(&state.store, since)
            .await?
            .into_iter()
            .map(|row| line(row.day, (row.provider, row.model_id), row.calls, &row.usage))
            .collect()
    };
    Ok(Json(UsageReport {
        days,
        rows,
        by_person,
    }))
}

/// `GET /api/logs`: the last warnings and errors, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct LogList {
    pub entries: Vec<super::logs::Entry>,
}

pub async fn logs() -> Json<LogList> {
    Json(LogList {
        entries: super::logs::recent(),
    })
}

/// How often the live list reads the other nodes' runs from the database (`[cluster]` only: this
/// node's own runs are announced the moment they start or end).
const LIVE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// `GET /api/live`: server-sent events, one `runs` event with the active runs now and again
/// whenever one starts or ends (a comment every 15 s keeps proxies from closing it). `active`
/// lists their request ids, `runs` each with its node; with `[cluster]`, the runs of every live
/// node, the others' read from the database every second and announced when they changed.
pub async fn live(State(state): State<Arc<AppState>>) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let changes = state.runs.watch();
    let shutdown = state.shutdown.clone();
    let events = futures_util::stream::unfold((changes, None), move |(mut changes, last)| {
        let state = Arc::clone(&state);
        let shutdown = shutdown.clone();
        async move {
            let mut last: Option<serde_json::Value> = last;
            let runs = loop {
                let polled = if last.is_some() {
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        changed = changes.changed() => { changed.ok()?; false }
                        _ = tokio::time::sleep(LIVE_POLL), if state.cluster.is_some() => true,
                    }
                } else {
                    false
                };
                let runs = live_runs(&state).await;
                // A poll that found nothing new says nothing.
                if polled && last.as_ref() == Some(&runs) {
                    continue;
                }
                last = Some(runs.clone());
                break runs;
            };
            let event = Event::default().event("runs").json_data(runs).ok()?;
            Some((Ok::<_, std::convert::Infallible>(event), (changes, last)))
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response()
}

/// The live list's payload: this node's active runs, and with `[cluster]` the other live nodes'
/// running runs (an unreadable database leaves them out, with a warning).
async fn live_runs(state: &AppState) -> serde_json::Value {
    let me = state.cluster.as_ref().map(|c| c.node_name().to_owned());
    let mut runs: Vec<(String, Option<String>)> = state
        .runs
        .active_ids()
        .into_iter()
        .map(|id| (id, me.clone()))
        .collect();
    if let Some(cluster) = &state.cluster {
        match crate::store::nodes::running_elsewhere(&state.store, cluster.node_name()).await {
            Ok(others) => runs.extend(others.into_iter().map(|(id, node)| (id, Some(node)))),
            Err(e) => tracing::warn!("the console's live list: the other nodes' runs: {e}"),
        }
    }
    runs.sort();
    let active: Vec<&str> = runs.iter().map(|(id, _)| id.as_str()).collect();
    let listed: Vec<serde_json::Value> = runs
        .iter()
        .map(|(id, node)| json!({"request_id": id, "node": node}))
        .collect();
    json!({"active": active, "runs": listed})
}

/// `GET /api/providers`.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderList {
    pub providers: Vec<ProviderView>,
}

/// A provider: its URL and route, never its key.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderView {
    pub name: String,
    pub kind: String,
    pub base_url: String,
    pub route: String,
    /// Always `***`: the answer says a key is set without showing it.
    pub api_key: &'static str,
    pub keys: Vec<KeyView>,
    pub models: Vec<ModelView>,
}

/// A provider's key as the console shows it: by its source (`key 2 (KEY_2)`, never the key), its
/// calls in flight, and its cooldown if the provider turned it away.
#[derive(Debug, Clone, Serialize)]
pub struct KeyView {
    pub name: String,
    pub in_flight: u32,
    pub cooling_secs: Option<u64>,
    /// The HTTP status that started the cooldown.
    pub cooling_status: Option<u16>,
}

/// A configured model with its newest call.
#[derive(Debug, Clone, Serialize)]
pub struct ModelView {
    pub id: String,
    pub upstream_id: String,
    pub display_name: String,
    pub context_window: u32,
    pub reasoning: bool,
    pub vision: bool,
    pub default: bool,
    pub priced: bool,
    pub last_call: Option<LastCall>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LastCall {
    pub at_ms: i64,
    pub ok: bool,
    pub error: Option<String>,
}

fn keys_of(state: &AppState, provider: &crate::config::ProviderConfig) -> Vec<KeyView> {
    state
        .keys
        .get(provider)
        .status()
        .iter()
        .enumerate()
        .map(|(i, key)| KeyView {
            name: crate::ops::check::key_name(provider, i),
            in_flight: key.in_flight,
            cooling_secs: key.cooling.map(|(left, _)| left.as_secs()),
            cooling_status: key.cooling.map(|(_, status)| status),
        })
        .collect()
}

/// "key 2 of 2" for a call a key answered, when the provider has several (never the key); the
/// count is the configuration's now.
fn key_used(config: &Config, provider: &str, index: Option<u32>) -> Option<String> {
    let count = config
        .providers
        .iter()
        .find(|p| p.name == provider)
        .map_or(0, |p| p.keys.len());
    match index {
        Some(index) if count > 1 => Some(format!("key {} of {count}", index + 1)),
        Some(index) => Some(format!("key {}", index + 1)),
        None => None,
    }
}

/// Each provider (URL and route, never its key) and model, with its newest call's outcome.
pub async fn providers(State(state): State<Arc<AppState>>) -> Result<Json<ProviderList>, ApiError> {
    let last = runs::last_calls(&state.store).await?;
    let providers = state
        .config
        .providers
        .iter()
        .map(|provider| ProviderView {
            name: provider.name.clone(),
            kind: format!("{:?}", provider.kind),
            base_url: provider.base_url.clone(),
            route: provider.route.shown(),
            api_key: "***",
            keys: keys_of(&state, provider),
            models: provider
                .models
                .iter()
                .map(|model| ModelView {
                    id: model.id.clone(),
                    upstream_id: model.upstream_id.clone(),
                    display_name: model.display_name.clone(),
                    context_window: model.context_window,
                    reasoning: model.reasoning,
                    vision: model.vision,
                    default: model.id == state.config.default_model,
                    priced: model.pricing.is_some(),
                    last_call: last.iter().find(|(id, _, _)| *id == model.id).map(
                        |(_, at, error)| LastCall {
                            at_ms: *at,
                            ok: error.is_none(),
                            error: error.clone(),
                        },
                    ),
                })
                .collect(),
        })
        .collect();
    Ok(Json(ProviderList { providers }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_store_failure_reaches_people_without_the_databases_text() {
        let error = ApiError::from(StoreError::CorruptRun {
            request_id: "r".to_owned(),
            status: "secret table detail".to_owned(),
        });
        let response = error.into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .expect("a body");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(STORE_FAILED), "{body}");
        assert!(!body.contains("secret"), "{body}");
    }
}
