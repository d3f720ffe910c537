//! The UI on the second port (server-rendered HTML, embedded, no JavaScript build): captured runs newest
//! first, each run's frame timeline with both directions interleaved (JSON and hex expandable), search by
//! any id, JSONL export; and the JSON API behind it (`/api/requests`, `/api/requests/{id}/frames`).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::{Captures, ExchangeRow, FrameRow, RequestRow, StoreError};

/// What the pages show besides the capture.
#[derive(Debug, Clone)]
pub struct UiState {
    pub captures: Captures,
    pub upstream: String,
    pub schema: String,
    /// Changes when the recorder has written a batch.
    pub written: watch::Receiver<u64>,
    /// Ends the live streams, so a graceful shutdown does not wait on open pages.
    pub shutdown: CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no request {0} in this capture")]
    NotFound(String),
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let status = match self {
            UiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            UiError::NotFound(_) => StatusCode::NOT_FOUND,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, "UI request failed");
        }
        (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response()
    }
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// Any id: request, conversation, exec, KV, tool call, model call, blob.
    pub q: Option<String>,
    pub limit: Option<i64>,
}

impl ListQuery {
    fn search(&self) -> Option<&str> {
        self.q.as_deref().map(str::trim).filter(|q| !q.is_empty())
    }

    fn limit(&self) -> i64 {
        self.limit.unwrap_or(200).clamp(1, 5000)
    }
}

pub fn router(state: UiState) -> Router {
    Router::new()
        .route("/", get(requests_page))
        .route("/requests/{request_id}", get(request_page))
        .route("/requests/{request_id}/export.jsonl", get(export))
        .route("/api/requests", get(api_requests))
        .route("/api/live", get(live))
        .route("/api/requests/{request_id}", get(api_request))
        .route("/api/requests/{request_id}/frames", get(api_frames))
        .with_state(state)
}

/// Live pages are told at most this often that the capture grew (a streaming run writes many batches).
const LIVE_INTERVAL: Duration = Duration::from_millis(500);

/// `GET /api/live`: a server-sent event each time the recorder has written (at most one per
/// `LIVE_INTERVAL`); the requests page reloads on it.
async fn live(
    State(state): State<UiState>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let mut written = state.written.clone();
    written.borrow_and_update();
    let stream = futures_util::stream::unfold(
        (written, state.shutdown, false),
        |(mut written, shutdown, sent_before)| async move {
            if sent_before {
                tokio::time::sleep(LIVE_INTERVAL).await;
            }
            tokio::select! {
                changed = written.changed() => changed.ok()?,
                _ = shutdown.cancelled() => return None,
            }
            let batches = *written.borrow_and_update();
            let event = SseEvent::default()
                .event("written")
                .data(batches.to_string());
            Some((Ok(event), (written, shutdown, true)))
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The exchanges of run `request_id`; an id this capture does not have is a 404.
async fn exchanges_of(state: &UiState, request_id: &str) -> Result<Vec<ExchangeRow>, UiError> {
    let exchanges = state.captures.exchanges(request_id).await?;
    if exchanges.is_empty() {
        return Err(UiError::NotFound(request_id.to_owned()));
    }
    Ok(exchanges)
}

async fn api_requests(
    State(state): State<UiState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Vec<RequestRow>>, UiError> {
    Ok(Json(
        state
            .captures
            .requests(query.search(), query.limit())
            .await?,
    ))
}

async fn api_request(
    State(state): State<UiState>,
    Path(request_id): Path<String>,
) -> Result<Json<Vec<ExchangeRow>>, UiError> {
    let exchanges = exchanges_of(&state, &request_id).await?;
    Ok(Json(exchanges))
}

async fn api_frames(
    State(state): State<UiState>,
    Path(request_id): Path<String>,
) -> Result<Json<Vec<FrameRow>>, UiError> {
    exchanges_of(&state, &request_id).await?;
    Ok(Json(state.captures.frames(&request_id).await?))
}

/// One line per exchange (`"record":"exchange"`), then one per frame (`"record":"frame"`).
async fn export(
    State(state): State<UiState>,
    Path(request_id): Path<String>,
) -> Result<Response, UiError> {
    let exchanges = exchanges_of(&state, &request_id).await?;
    let mut out = String::new();
    let tagged = |record: &str, value: serde_json::Value| {
        let mut value = value;
        if let serde_json::Value::Object(map) = &mut value {
            map.insert("record".to_owned(), record.into());
        }
        value.to_string()
    };
    for exchange in &exchanges {
        out.push_str(&tagged(
            "exchange",
            serde_json::to_value(exchange).unwrap_or_default(),
        ));
        out.push('\n');
    }
    for frame in state.captures.frames(&request_id).await? {
        out.push_str(&tagged(
            "frame",
            serde_json::to_value(&frame).unwrap_or_default(),
        ));
        out.push('\n');
    }
    let filename = format!("attachment; filename=\"{}.jsonl\"", safe_name(&request_id));
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_owned()),
            (header::CONTENT_DISPOSITION, filename),
        ],
        out,
    )
        .into_response())
}

fn safe_name(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// HTML-escapes text (the workspace's one escaper, shared with the server's console).
pub use cursor_wire::html::escape as esc;

/// Percent-encodes a path segment.
fn seg(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;width:100%}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}\
th{background:#f4f4f4}code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap;word-break:break-all;background:#f8f8f8;padding:6px;margin:4px 0}\
.client{color:#0550ae}.server{color:#116329}.bad{color:#b00020}.muted{color:#777}\
header{display:flex;gap:1em;align-items:baseline;flex-wrap:wrap}form{display:inline}input[type=search]{width:28em}";

fn page(title: &str, state: &UiState, search: Option<&str>, body: &str) -> Html<String> {
    Html(format!(
        "<!doctype html><html><head><meta charset=utf-8><title>{} · cursor-backend</title><link rel=icon href=\"data:,\"><style>{STYLE}</style></head>\
<body><header><h2><a href=\"/\">cursor-backend</a></h2><span class=muted>upstream {} · {}</span>\
<form action=\"/\"><input type=search name=q value=\"{}\" placeholder=\"request, conversation, exec, KV, tool-call or blob id\"> <button type=submit>Search</button></form></header>{body}</body></html>",
        esc(title),
        esc(&state.upstream),
        esc(&state.schema),
        esc(search.unwrap_or("")),
    ))
}

fn short_route(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

async fn requests_page(
    State(state): State<UiState>,
    Query(query): Query<ListQuery>,
) -> Result<Html<String>, UiError> {
    let rows = state
        .captures
        .requests(query.search(), query.limit())
        .await?;
    let mut body = String::new();
    if let Some(q) = query.search() {
        let _ = write!(
            body,
            "<p>Runs with id <code>{}</code>: {}</p>",
            esc(q),
            rows.len()
        );
    }
    body.push_str(
        "<table><tr><th>started</th><th>route</th><th>request id</th><th>conversation</th><th>status</th>\
<th>outcome</th><th>exchanges</th><th>frames</th><th>duration</th></tr>",
    );
    for row in &rows {
        let outcome = row.outcome.as_deref().unwrap_or("");
        let class = if outcome.is_empty() || outcome == "ok" {
            ""
        } else {
            "bad"
        };
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td><a href=\"/requests/{}\"><code>{}</code></a></td><td><code>{}</code></td>\
<td>{}</td><td class=\"{class}\">{}{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            format_time(row.started_at_ms),
            esc(short_route(&row.route)),
            seg(&row.request_id),
            esc(&row.request_id),
            esc(row.conversation_id.as_deref().unwrap_or("")),
            row.status.map(|s| s.to_string()).unwrap_or_default(),
            esc(outcome),
            row.error
                .as_deref()
                .map(|e| format!(" <span class=bad>{}</span>", esc(e)))
                .unwrap_or_default(),
            row.exchanges,
            row.frames,
            row.duration_ms
                .map(|d| format!("{d:.0} ms"))
                .unwrap_or_else(|| "open".to_owned()),
        );
    }
    body.push_str("</table>");
    if rows.is_empty() {
        body.push_str("<p class=muted>Nothing captured yet: point Cursor at the proxy port (docs/capture.md).</p>");
    }
    // New runs appear by themselves: the page reloads when the capture grows — held back while the
    // pointer is over the table or a search is being typed, and done once the reader moves on.
    body.push_str(
        "<script>let held=false;\
const busy=()=>document.querySelector('table:hover')||(document.activeElement&&document.activeElement.name==='q');\
const reload=()=>{if(busy()){held=true;return;}location.reload();};\
new EventSource('/api/live').addEventListener('written',reload);\
for(const e of ['mouseout','focusout'])document.addEventListener(e,()=>{if(held)setTimeout(reload,0);});</script>",
    );
    Ok(page("requests", &state, query.search(), &body))
}

fn format_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    format!("{h:02}:{m:02}:{s:02}.{:03} UTC", ms.rem_euclid(1000))
}

/// Frames shown inline are cut here; the API and the export have them whole.
const SHOWN_JSON_BYTES: usize = 64 * 1024;

async fn request_page(
    State(state): State<UiState>,
    Path(request_id): Path<String>,
) -> Result<Html<String>, UiError> {
    let exchanges = exchanges_of(&state, &request_id).await?;
    let frames = state.captures.frames(&request_id).await?;
    let mut body = format!(
        "<h3>Request <code>{}</code></h3><p><a href=\"/requests/{}/export.jsonl\">Export JSONL</a> · \
<a href=\"/api/requests/{}/frames\">frames as JSON</a></p>",
        esc(&request_id),
        seg(&request_id),
        seg(&request_id)
    );
    body.push_str("<table><tr><th>#</th><th>exchange</th><th>status</th><th>outcome</th><th>frames</th><th>duration</th><th>headers</th></tr>");
    for e in &exchanges {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{} {} <span class=muted>{}</span></td><td>{}</td><td>{}{}</td><td>{}</td><td>{}</td>\
<td><details><summary>request / response</summary><pre>{}</pre><pre>{}</pre></details></td></tr>",
            e.id,
            esc(&e.method),
            esc(&e.path),
            esc(&e.http_version),
            e.status.map(|s| s.to_string()).unwrap_or_default(),
            esc(e.outcome.as_deref().unwrap_or("")),
            e.error
                .as_deref()
                .map(|x| format!(" <span class=bad>{}</span>", esc(x)))
                .unwrap_or_default(),
            e.frames,
            e.duration_ms
                .map(|d| format!("{d:.0} ms"))
                .unwrap_or_else(|| "open".to_owned()),
            esc(&headers_text(&e.request_headers)),
            esc(&e
                .response_headers
                .as_ref()
                .map(headers_text)
                .unwrap_or_default()),
        );
    }
    body.push_str("</table><h3>Frames</h3>");
    body.push_str("<table><tr><th>t (ms)</th><th></th><th>route</th><th>type</th><th>bytes</th><th>content</th></tr>");
    let t0 = frames.first().map(|f| f.t_us).unwrap_or(0);
    for frame in &frames {
        body.push_str(&frame_row(frame, t0));
    }
    body.push_str("</table>");
    Ok(page(&request_id, &state, None, &body))
}

fn headers_text(headers: &serde_json::Value) -> String {
    headers
        .as_array()
        .map(|pairs| {
            pairs
                .iter()
                .filter_map(|p| Some(format!("{}: {}", p.get(0)?.as_str()?, p.get(1)?.as_str()?)))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn frame_row(frame: &FrameRow, t0: i64) -> String {
    let arrow = if frame.direction == "client" {
        "→"
    } else {
        "←"
    };
    let mut json = frame
        .json
        .as_ref()
        .and_then(|j| serde_json::to_string_pretty(j).ok())
        .unwrap_or_default();
    if json.len() > SHOWN_JSON_BYTES {
        let mut cut = SHOWN_JSON_BYTES;
        while !json.is_char_boundary(cut) {
            cut -= 1;
        }
        json.truncate(cut);
        json.push_str("\n… (cut here; the export has it whole)");
    }
    let hex_shown = &frame.raw_hex[..frame.raw_hex.len().min(SHOWN_JSON_BYTES)];
    format!(
        "<tr id=\"f{}\"><td>{:.1}</td><td class=\"{}\">{arrow}</td><td>{}</td><td><code>{}</code>{}</td><td>{}</td>\
<td>{}<details><summary>JSON</summary><pre>{}</pre></details><details><summary>hex</summary><pre>{}</pre></details></td></tr>",
        frame.id,
        (frame.t_us - t0) as f64 / 1000.0,
        esc(&frame.direction),
        esc(short_route(&frame.route)),
        esc(&frame.type_path),
        if frame.transport {
            " <span class=muted>(transport)</span>"
        } else {
            ""
        },
        frame.size,
        frame
            .error
            .as_deref()
            .map(|e| format!("<span class=bad>{}</span>", esc(e)))
            .unwrap_or_default(),
        esc(&json),
        esc(hex_shown),
    )
}
