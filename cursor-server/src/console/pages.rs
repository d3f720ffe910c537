//! The console's pages: one typed view per page (the API handler's answer, plus what only the
//! page needs), rendered by its compiled template in `templates/console/` (escaped by default,
//! see `charts::Html`). The stylesheet and the one script are assets served from the binary
//! (`assets.rs`); nothing is fetched from anywhere else. A failure is shown as a page with a
//! message for people; a store failure's detail goes to the log only (`ApiError::resolve`).

use std::fmt::Display;
use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::api::{
    self, ApiError, ConversationDetail, ConversationList, LogList, PageQuery, ProviderList,
    RunDetail, RunList, RunQuery, RunRow, UsageQuery, UsageReport,
};
use super::assets;
use crate::model::conversation::Mode;
use crate::model::message::{CanonicalMessage, Origin};
use crate::state::AppState;

/// A page that could not be shown: rendered as the error page, with the status `ApiError` maps
/// to (which logs a store failure's detail, once).
pub struct PageError(ApiError);

impl From<ApiError> for PageError {
    fn from(error: ApiError) -> Self {
        PageError(error)
    }
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    title: &'static str,
    message: String,
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, message) = self.0.resolve();
        let title = if status == StatusCode::NOT_FOUND {
            "Not found"
        } else {
            "Something went wrong"
        };
        assets::page(status, &ErrorPage { title, message })
    }
}

type PageResult = Result<Response, PageError>;

fn ok(template: &impl Template) -> PageResult {
    Ok(assets::page(StatusCode::OK, template))
}

// What the templates call (as `self::…`, which passes each argument by reference) to show a
// value.

/// A value, or an em dash when there is none.
fn dash<T: Display>(value: &Option<T>) -> String {
    match value {
        Some(value) => value.to_string(),
        None => "—".to_owned(),
    }
}

fn cost(usd: &Option<f64>) -> String {
    match usd {
        Some(usd) => format!("${usd:.4}"),
        None => "unknown".to_owned(),
    }
}

fn percent(rate: &Option<f64>) -> String {
    rate.map_or("—".to_owned(), |r| format!("{:.0} %", r * 100.0))
}

/// Markup (digits and the date only, so the template may show it unescaped).
fn time(ms: &i64) -> String {
    format!("<time data-ms=\"{ms}\">{}</time>", utc(*ms))
}

/// "`requested` → " before the model a run was routed to, when Cursor asked for another name.
fn requested(run: &RunRow) -> String {
    match &run.requested_model {
        Some(name) if *name != run.model => format!("{name} → "),
        _ => String::new(),
    }
}

/// `YYYY-MM-DD HH:MM:SS` UTC of a millisecond timestamp.
pub(super) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Template)]
#[template(path = "console/overview.html")]
struct OverviewPage {
    title: &'static str,
    ready: bool,
    /// Each readiness check: `database: writable · …`.
    health: String,
    version: &'static str,
    schema: &'static str,
    active: usize,
    finished: u64,
    providers: ProviderList,
    csrf: &'static str,
    drift: Vec<crate::ops::drift::Seen>,
}

/// Providers and models with their newest call, and the runs in progress (kept up to date).
pub async fn overview(State(state): State<Arc<AppState>>) -> PageResult {
    let providers = api::providers(State(Arc::clone(&state))).await?.0;
    let (active, finished) = state.runs.counts();
    let (ready, checks) = crate::ops::readiness(&state).await;
    let health = checks
        .iter()
        .map(|(name, check)| match check["detail"].as_str() {
            Some(detail) => format!("{name}: {detail}"),
            None => format!("{name}: {}", check["detail"]),
        })
        .collect::<Vec<_>>()
        .join(" · ");
    ok(&OverviewPage {
        title: "Overview",
        ready,
        health,
        version: env!("CARGO_PKG_VERSION"),
        schema: crate::cursor::proto::SCHEMA_FINGERPRINT,
        active,
        finished,
        providers,
        csrf: super::actions::csrf_token(),
        drift: crate::ops::drift::seen(),
    })
}

/// One `<option>` of a filter.
struct Choice {
    value: String,
    label: &'static str,
    selected: bool,
}

#[derive(Template)]
#[template(path = "console/runs.html")]
struct RunsPage {
    title: &'static str,
    statuses: Vec<Choice>,
    since: Vec<Choice>,
    model: String,
    conversation: String,
    list: RunList,
}

pub async fn runs(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<crate::auth::service::Caller>>,
    Query(query): Query<RunQuery>,
) -> PageResult {
    let list = api::runs(State(state), caller, Query(query.clone()))
        .await?
        .0;
    let statuses = ["", "running", "succeeded", "failed", "canceled"]
        .into_iter()
        .map(|status| Choice {
            value: status.to_owned(),
            label: status,
            selected: query.status.as_deref() == Some(status),
        })
        .collect();
    ok(&RunsPage {
        title: "Runs",
        statuses,
        since: since_options(query.since),
        model: query.model.unwrap_or_default(),
        conversation: query.conversation.unwrap_or_default(),
        list,
    })
}

/// The runs page's time filter: any time, or the last hour, day or week (as `since` in ms).
fn since_options(chosen: Option<i64>) -> Vec<Choice> {
    let now = crate::store::now_ms();
    let mut options = vec![Choice {
        value: String::new(),
        label: "any time",
        selected: chosen.is_none(),
    }];
    for (label, back) in [
        ("last hour", 3_600_000),
        ("last day", 86_400_000),
        ("last week", 604_800_000),
    ] {
        let since = now - back;
        // A chosen filter keeps its own value (and its label) when the page is shown again.
        let value = match chosen {
            Some(chosen) if (chosen - since).abs() < back / 2 => chosen,
            _ => since,
        };
        options.push(Choice {
            value: value.to_string(),
            label,
            selected: Some(value) == chosen,
        });
    }
    options
}

#[derive(Template)]
#[template(path = "console/run.html")]
struct RunPage {
    title: String,
    detail: RunDetail,
}

pub async fn run(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<crate::auth::service::Caller>>,
    Path(request_id): Path<String>,
) -> PageResult {
    let detail = api::run(State(state), caller, Path(request_id.clone()))
        .await?
        .0;
    ok(&RunPage {
        title: format!("Run {request_id}"),
        detail,
    })
}

#[derive(Template)]
#[template(path = "console/conversations.html")]
struct ConversationsPage {
    title: &'static str,
    list: ConversationList,
}

pub async fn conversations(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<crate::auth::service::Caller>>,
    Query(query): Query<PageQuery>,
) -> PageResult {
    let list = api::conversations(State(state), caller, Query(query))
        .await?
        .0;
    ok(&ConversationsPage {
        title: "Conversations",
        list,
    })
}

#[derive(Template)]
#[template(path = "console/conversation.html")]
struct ConversationPage {
    title: String,
    system_prompts: Vec<SystemPrompt>,
    messages: Vec<MessageView>,
    detail: ConversationDetail,
}

/// The system prompt of a mode the conversation ran in.
struct SystemPrompt {
    mode: &'static str,
    text: String,
}

/// One stored message as the page shows it: who (`runtime` for the server's own user messages)
/// and its text.
struct MessageView {
    role: &'static str,
    text: String,
}

impl From<&CanonicalMessage> for MessageView {
    fn from(message: &CanonicalMessage) -> Self {
        match message {
            CanonicalMessage::User(user) => MessageView {
                role: match user.origin {
                    Origin::Runtime => "runtime",
                    Origin::User => "user",
                },
                text: match user.images.len() {
                    0 => user.text.clone(),
                    n => format!("{}\n[{n} attached image(s)]", user.text),
                },
            },
            CanonicalMessage::Assistant(assistant) => MessageView {
                role: "assistant",
                text: if assistant.thinking.is_empty() {
                    assistant.text.clone()
                } else {
                    format!(
                        "[thinking]\n{}\n[answer]\n{}",
                        assistant.thinking, assistant.text
                    )
                },
            },
            CanonicalMessage::ToolCall(record) => MessageView {
                role: "tool_call",
                text: format!("{}({})", record.call.name, record.call.arguments),
            },
            CanonicalMessage::ToolResult(record) => MessageView {
                role: "tool_result",
                text: record.result.content.clone(),
            },
        }
    }
}

/// The stored history as the model is shown it, message by message, and the runs.
pub async fn conversation(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<crate::auth::service::Caller>>,
    Path(id): Path<String>,
) -> PageResult {
    let detail = api::conversation(State(Arc::clone(&state)), caller, Path(id.clone()))
        .await?
        .0;
    // Every request starts with the system prompt of the mode it runs in (then the tools).
    let mut modes = vec![Mode::Agent];
    for message in &detail.history {
        if let CanonicalMessage::User(user) = message
            && let Some(mode) = user.mode
            && !modes.contains(&mode)
        {
            modes.push(mode);
        }
    }
    let system_prompts = modes
        .into_iter()
        .map(|mode| SystemPrompt {
            mode: mode.as_str(),
            text: state.prompts.mode(mode).system.clone(),
        })
        .collect();
    ok(&ConversationPage {
        title: format!("Conversation {id}"),
        system_prompts,
        messages: detail.history.iter().map(MessageView::from).collect(),
        detail,
    })
}

#[derive(Template)]
#[template(path = "console/usage.html")]
struct UsagePage {
    title: &'static str,
    /// The SVG chart, escaped as it was drawn (`charts.rs`).
    chart: String,
    report: UsageReport,
}

pub async fn usage(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<crate::auth::service::Caller>>,
    Query(query): Query<UsageQuery>,
) -> PageResult {
    let report = api::usage(State(state), caller, Query(query)).await?.0;
    ok(&UsagePage {
        title: "Usage and cost",
        chart: super::charts::tokens_per_day(&report.rows),
        report,
    })
}

#[derive(Template)]
#[template(path = "console/logs.html")]
struct LogsPage {
    title: &'static str,
    list: LogList,
}

/// The last warnings and errors, newest first.
pub async fn logs() -> Response {
    let list = api::logs().await.0;
    assets::page(
        StatusCode::OK,
        &LogsPage {
            title: "Logs",
            list,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::charts::esc;

    #[test]
    fn text_is_escaped_and_times_are_utc() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_764_892_800_000 + 3_661_000), "2025-12-05 01:01:01");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
    }

    #[test]
    fn templates_escape_what_they_show() {
        let page = ErrorPage {
            title: "Not found",
            message: "no run \"<script>alert('x')</script>\"".to_owned(),
        };
        let html = page.render().expect("rendered");
        assert!(
            html.contains("no run &quot;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;"),
            "{html}"
        );
        assert!(!html.contains("<script>"), "{html}");
    }
}
