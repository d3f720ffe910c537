//! The console's pages: server-rendered HTML from the same answers the JSON API gives (each page
//! calls its API handler), with a little inline script only where a page updates itself. Every
//! value shown is escaped; no asset is fetched from anywhere else.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use serde_json::Value;

use super::api::{self, ApiError, PageQuery, RunQuery, UsageQuery};
use super::charts::{self, esc};
use crate::model::conversation::Mode;
use crate::state::AppState;

/// A JSON value as page text: strings bare, null as an em dash.
fn show(value: &Value) -> String {
    match value {
        Value::Null => "—".to_owned(),
        Value::String(text) => esc(text),
        other => esc(&other.to_string()),
    }
}

fn cost(value: &Value) -> String {
    match value.as_f64() {
        Some(usd) => format!("${usd:.4}"),
        None => "unknown".to_owned(),
    }
}

fn time(ms: &Value) -> String {
    match ms.as_i64() {
        Some(ms) => format!("<time data-ms=\"{ms}\">{}</time>", utc(ms)),
        None => "—".to_owned(),
    }
}

/// `YYYY-MM-DD HH:MM:SS` UTC of a millisecond timestamp.
fn utc(ms: i64) -> String {
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

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}\
nav{background:#1d1d1f;padding:10px 16px}nav a{color:#fff;margin-right:16px;text-decoration:none}\
main{padding:16px}table{border-collapse:collapse;width:100%;background:#fff}\
td,th{border-bottom:1px solid #e5e5e5;padding:4px 8px;text-align:left;vertical-align:top}\
th{background:#f0f0f0}.failed{color:#b00020}.succeeded{color:#1b7f3b}.canceled{color:#8a6d00}\
pre{white-space:pre-wrap;background:#fff;border:1px solid #e5e5e5;padding:8px;margin:4px 0}\
form{margin:8px 0}.muted{color:#777}";

fn page(title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\"><title>{title} · cursor-byok</title>\
         <style>{STYLE}</style></head><body><nav><a href=\"/console\">Overview</a>\
         <a href=\"/console/runs\">Runs</a><a href=\"/console/conversations\">Conversations</a>\
         <a href=\"/console/usage\">Usage</a><a href=\"/console/logs\">Logs</a></nav><main><h1>{title}</h1>{body}</main></body></html>",
        title = esc(title)
    );
    ([(header::CACHE_CONTROL, "no-store")], Html(html)).into_response()
}

/// A provider's route and, with several keys, each key's state: `key 2 (KEY_2): cooling 41 s
/// (HTTP 429)`.
fn keys_and_route(provider: &Value) -> String {
    let keys = provider["keys"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut cell = show(&provider["route"]);
    if keys.len() < 2 {
        return cell;
    }
    for key in keys {
        let state = match key["cooling_secs"].as_u64() {
            Some(secs) => format!(
                "<span class=\"failed\">cooling {secs} s (HTTP {})</span>",
                show(&key["cooling_status"])
            ),
            None => format!("{} in flight", show(&key["in_flight"])),
        };
        let _ = write!(cell, "<br>{}: {state}", show(&key["name"]));
    }
    cell
}

/// Providers and models with their newest call, and the runs in progress (kept up to date).
pub async fn overview(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let providers = api::providers(State(Arc::clone(&state))).await?.0;
    let (active, finished) = state.runs.counts();
    let (ready, checks) = crate::ops::readiness(&state).await;
    let health = checks
        .iter()
        .map(|(name, check)| format!("{name}: {}", show(&check["detail"])))
        .collect::<Vec<_>>()
        .join(" · ");
    let mut body = format!(
        "<p class=\"{}\">{} — {health}</p>\
         <p>cursor-server {} · schema {} · <span id=\"active\">{active}</span> runs in progress, \
         {finished} finished since start</p><h2>Providers</h2><table><tr><th>provider</th>\
         <th>model</th><th>route</th><th>flags</th><th>last call</th><th></th></tr>",
        if ready { "succeeded" } else { "failed" },
        if ready { "ready" } else { "not ready" },
        env!("CARGO_PKG_VERSION"),
        esc(crate::cursor::proto::SCHEMA_FINGERPRINT),
    );
    for provider in providers["providers"].as_array().into_iter().flatten() {
        let route = keys_and_route(provider);
        for model in provider["models"].as_array().into_iter().flatten() {
            let last = match &model["last_call"] {
                Value::Null => "none yet".to_owned(),
                call if call["ok"] == true => format!("ok {}", time(&call["at_ms"])),
                call => format!("<span class=\"failed\">{}</span>", show(&call["error"])),
            };
            let _ = write!(
                body,
                "<tr class=\"model\"><td>{}</td><td>{}</td><td>{}</td><td>{}{}{}</td><td>{last}</td><td>{}</td></tr>",
                show(&provider["name"]),
                show(&model["id"]),
                route,
                if model["default"] == true {
                    "default "
                } else {
                    ""
                },
                if model["vision"] == true {
                    "vision "
                } else {
                    ""
                },
                if model["reasoning"] == true {
                    "reasoning"
                } else {
                    ""
                },
                super::actions::probe_button(model["id"].as_str().unwrap_or_default()),
            );
        }
    }
    body.push_str("</table>");
    // Live: the server says when a run starts or ends (no polling).
    body.push_str(
        "<p>In progress: <span id=\"running\"></span></p><script>\
         const live=new EventSource('/api/live');live.addEventListener('runs',e=>{\
         const runs=JSON.parse(e.data).active;document.getElementById('active').textContent=runs.length;\
         const list=document.getElementById('running');list.replaceChildren();for(const id of runs){\
         const a=document.createElement('a');a.href='/console/runs/'+encodeURIComponent(id);\
         a.textContent=id+' ';list.append(a)}});</script>",
    );
    drift_section(&mut body);
    Ok(page("Overview", &body))
}

pub async fn runs(
    State(state): State<Arc<AppState>>,
    Query(query): Query<RunQuery>,
) -> Result<Response, ApiError> {
    let listed = api::runs(State(state), Query(query.clone())).await?.0;
    let mut body = format!(
        "<form method=\"get\">status <select name=\"status\">{}</select> started <select name=\"since\">{}</select> model \
         <input name=\"model\" value=\"{}\"> conversation <input name=\"conversation\" value=\"{}\"> \
         <button type=\"submit\">Filter</button></form><table><tr><th>started</th><th>run</th><th>conversation</th>\
         <th>model</th><th>mode</th><th>transport</th><th>status</th><th>first token</th>\
         <th>duration</th><th>tokens in/out</th><th>cost</th><th>error</th></tr>",
        ["", "running", "succeeded", "failed", "canceled"]
            .iter()
            .map(|s| format!(
                "<option{}>{s}</option>",
                if query.status.as_deref() == Some(*s) {
                    " selected"
                } else {
                    ""
                }
            ))
            .collect::<String>(),
        since_options(query.since),
        esc(query.model.as_deref().unwrap_or_default()),
        esc(query.conversation.as_deref().unwrap_or_default()),
    );
    for run in listed["runs"].as_array().into_iter().flatten() {
        let id = run["request_id"].as_str().unwrap_or_default();
        let conversation = run["conversation_id"].as_str().unwrap_or_default();
        let _ = write!(
            body,
            "<tr class=\"run\"><td>{}</td><td><a href=\"/console/runs/{}\">{}</a></td>\
             <td><a href=\"/console/conversations/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"{}\">{}</td><td>{} ms</td><td>{} ms</td><td>{} / {}</td><td>{}</td><td>{}</td></tr>",
            time(&run["started_at_ms"]),
            esc(id),
            esc(id),
            esc(conversation),
            esc(conversation),
            show(&run["model"]),
            show(&run["mode"]),
            show(&run["transport"]),
            show(&run["status"]),
            show(&run["status"]),
            show(&run["first_token_ms"]),
            show(&run["duration_ms"]),
            show(&run["usage"]["input"]),
            show(&run["usage"]["output"]),
            cost(&run["cost_usd"]),
            show(&run["error"]["message"]),
        );
    }
    body.push_str("</table>");
    if let Some(next) = listed["next"].as_i64() {
        let _ = write!(body, "<p><a href=\"?before={next}\">Older runs</a></p>");
    }
    Ok(page("Runs", &body))
}

/// The runs page's time filter: any time, or the last hour, day or week (as `since` in ms).
fn since_options(chosen: Option<i64>) -> String {
    let now = crate::store::now_ms();
    let mut options = format!(
        "<option value=\"\"{}>any time</option>",
        if chosen.is_none() { " selected" } else { "" }
    );
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
        let _ = write!(
            options,
            "<option value=\"{value}\"{}>{label}</option>",
            if value == chosen.unwrap_or(i64::MIN) {
                " selected"
            } else {
                ""
            }
        );
    }
    options
}

/// "`requested` → " before the model a run was routed to, when Cursor asked for another name.
fn requested(requested: &Value, model: &Value) -> String {
    match requested {
        Value::Null => String::new(),
        name if name == model => String::new(),
        name => format!("{} → ", show(name)),
    }
}

pub async fn run(
    State(state): State<Arc<AppState>>,
    Path(request_id): Path<String>,
) -> Result<Response, ApiError> {
    let run = api::run(State(state), Path(request_id.clone())).await?.0;
    let mut body = format!(
        "<p>conversation <a href=\"/console/conversations/{c}\">{c}</a> · model {}{} · mode {} · \
         transport {} · <span class=\"{s}\">{s}</span> · started {} · first token {} ms · \
         duration {} ms · cost {}</p>",
        requested(&run["requested_model"], &run["model"]),
        show(&run["model"]),
        show(&run["mode"]),
        show(&run["transport"]),
        time(&run["started_at_ms"]),
        show(&run["first_token_ms"]),
        show(&run["duration_ms"]),
        cost(&run["cost_usd"]),
        c = show(&run["conversation_id"]),
        s = show(&run["status"]),
    );
    if !run["error"].is_null() {
        let _ = write!(
            body,
            "<p class=\"failed\">ended {}: {}</p>",
            show(&run["error"]["code"]),
            show(&run["error"]["message"])
        );
    }
    body.push_str(
        "<h2>Provider calls</h2><table><tr><th>model call</th><th>provider / model</th>\
         <th>purpose</th><th>attempts</th>\
         <th>first event</th><th>total</th><th>request</th><th>tokens in/out/cache read</th>\
         <th>cost</th><th>ending</th></tr>",
    );
    for call in run["provider_calls"].as_array().into_iter().flatten() {
        let ending = match &call["error"] {
            Value::Null => show(&call["finish_reason"]),
            error => format!("<span class=\"failed\">{}</span>", show(error)),
        };
        let _ = write!(
            body,
            "<tr class=\"call\"><td>{}</td><td>{} / {}{}</td><td>{}</td><td>{}</td><td>{} ms</td>\
             <td>{} ms</td><td>{} B</td><td>{} / {} / {}</td><td>{}</td><td>{ending}</td></tr>",
            show(&call["model_call_id"]),
            show(&call["provider"]),
            show(&call["model"]),
            match &call["fallback_from"] {
                Value::Null => String::new(),
                from => format!(" (fallback of {})", show(from)),
            },
            show(&call["purpose"]),
            match &call["key"] {
                Value::Null => show(&call["attempts"]),
                key => format!("{} ({})", show(&call["attempts"]), show(key)),
            },
            show(&call["first_event_ms"]),
            show(&call["total_ms"]),
            show(&call["request_bytes"]),
            show(&call["usage"]["input"]),
            show(&call["usage"]["output"]),
            show(&call["usage"]["cache_read"]),
            cost(&call["cost_usd"]),
        );
    }
    body.push_str(
        "</table><h2>Tool calls</h2><table><tr><th>tool</th><th>arguments</th><th>duration</th>\
         <th>outcome</th></tr>",
    );
    for tool in run["tool_calls"].as_array().into_iter().flatten() {
        let _ = write!(
            body,
            "<tr class=\"tool\"><td>{}</td><td><code>{}</code></td><td>{} ms</td><td class=\"{o}\">{o}</td></tr>",
            show(&tool["tool"]),
            show(&tool["arguments"]),
            show(&tool["duration_ms"]),
            o = show(&tool["outcome"]),
        );
    }
    body.push_str("</table>");
    Ok(page(&format!("Run {request_id}"), &body))
}

pub async fn conversations(
    State(state): State<Arc<AppState>>,
    Query(query): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let listed = api::conversations(State(state), Query(query)).await?.0;
    let mut body = String::from(
        "<table><tr><th>conversation</th><th>title</th><th>runs</th><th>messages</th>\
         <th>last activity</th></tr>",
    );
    for conversation in listed["conversations"].as_array().into_iter().flatten() {
        let id = conversation["id"].as_str().unwrap_or_default();
        let _ = write!(
            body,
            "<tr class=\"conversation\"><td><a href=\"/console/conversations/{id}\">{id}</a></td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            show(&conversation["title"]),
            show(&conversation["runs"]),
            show(&conversation["messages"]),
            time(&conversation["last_activity_ms"]),
            id = esc(id),
        );
    }
    body.push_str("</table>");
    if let Some(next) = listed["next"].as_i64() {
        let _ = write!(body, "<p><a href=\"?before={next}\">Older</a></p>");
    }
    Ok(page("Conversations", &body))
}

/// The stored history as the model is shown it, message by message, and the runs.
pub async fn conversation(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let found = api::conversation(State(Arc::clone(&state)), Path(id.clone()))
        .await?
        .0;
    let mut body = format!(
        "<p>checkpoint revision {} · export as <a href=\"/api/conversations/{i}\">JSON</a> or \
         <a href=\"/api/conversations/{i}/markdown\">Markdown</a></p>",
        show(&found["head"]["revision"]),
        i = esc(&id)
    );
    // Every request starts with the system prompt of the mode it runs in (then the tools).
    let history = found["history"].as_array().cloned().unwrap_or_default();
    let mut modes = vec![Mode::Agent];
    for mode in history.iter().filter_map(|m| m["mode"].as_str()) {
        if let Some(mode) = Mode::ALL.into_iter().find(|known| known.as_str() == mode)
            && !modes.contains(&mode)
        {
            modes.push(mode);
        }
    }
    body.push_str("<h2>What the model is shown</h2>");
    for mode in modes {
        let _ = write!(
            body,
            "<details class=\"system\"><summary>system prompt ({})</summary><pre>{}</pre></details>",
            mode.as_str(),
            esc(&state.prompts.mode(mode).system)
        );
    }
    for message in &history {
        let role = match (message["role"].as_str(), message["origin"].as_str()) {
            (Some("user"), Some("runtime")) => "runtime",
            (Some(role), _) => role,
            (None, _) => "?",
        };
        let text = match role {
            "user" | "runtime" => message["text"].as_str().map(|text| {
                match message["images"].as_array().map(Vec::len) {
                    Some(n) if n > 0 => format!("{text}\n[{n} attached image(s)]"),
                    _ => text.to_owned(),
                }
            }),
            "assistant" => message["text"].as_str().map(|text| {
                match message["thinking"].as_str().filter(|t| !t.is_empty()) {
                    Some(thinking) => format!("[thinking]\n{thinking}\n[answer]\n{text}"),
                    None => text.to_owned(),
                }
            }),
            "tool_call" => Some(format!(
                "{}({})",
                message["call"]["name"].as_str().unwrap_or_default(),
                message["call"]["arguments"].as_str().unwrap_or_default()
            )),
            "tool_result" => message["result"]["content"].as_str().map(str::to_owned),
            _ => None,
        }
        .unwrap_or_else(|| message.to_string());
        let _ = write!(
            body,
            "<div class=\"message {r}\"><b>{r}</b><pre>{}</pre></div>",
            esc(&text),
            r = esc(role)
        );
    }
    body.push_str("<h2>Runs</h2><ul>");
    for run in found["runs"].as_array().into_iter().flatten() {
        let id = run["request_id"].as_str().unwrap_or_default();
        let _ = write!(
            body,
            "<li><a href=\"/console/runs/{id}\">{id}</a> {}</li>",
            show(&run["status"]),
            id = esc(id)
        );
    }
    body.push_str("</ul>");
    Ok(page(&format!("Conversation {id}"), &body))
}

pub async fn usage(
    State(state): State<Arc<AppState>>,
    Query(query): Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let found = api::usage(State(state), Query(query)).await?.0;
    let rows: Vec<Value> = found["rows"].as_array().cloned().unwrap_or_default();
    let mut body = charts::tokens_per_day(&rows);
    body.push_str(
        "<table><tr><th>day</th><th>provider</th><th>model</th><th>calls</th><th>input</th>\
         <th>output</th><th>cache read</th><th>cache write</th><th>reasoning</th>\
         <th>cache hit rate</th><th>cost</th></tr>",
    );
    for row in &rows {
        let hit = row["cache_hit_rate"]
            .as_f64()
            .map_or("—".to_owned(), |r| format!("{:.0} %", r * 100.0));
        let _ = write!(
            body,
            "<tr class=\"usage\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{hit}</td><td>{}</td></tr>",
            show(&row["day"]),
            show(&row["provider"]),
            show(&row["model"]),
            show(&row["calls"]),
            show(&row["usage"]["input"]),
            show(&row["usage"]["output"]),
            show(&row["usage"]["cache_read"]),
            show(&row["usage"]["cache_write"]),
            show(&row["usage"]["reasoning"]),
            cost(&row["cost_usd"]),
        );
    }
    body.push_str("</table>");
    Ok(page("Usage and cost", &body))
}

/// The last warnings and errors, newest first.
pub async fn logs() -> Response {
    let found = api::logs().await.0;
    let mut body = String::from(
        "<p class=\"muted\">The last 500 warnings and errors since the server started.</p>\
         <table><tr><th>time</th><th>level</th><th>where</th><th>message</th></tr>",
    );
    for entry in found["entries"].as_array().into_iter().flatten() {
        let _ = write!(
            body,
            "<tr class=\"log\"><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            time(&entry["at_ms"]),
            if entry["level"] == "ERROR" {
                "failed"
            } else {
                "canceled"
            },
            show(&entry["level"]),
            show(&entry["target"]),
            show(&entry["message"]),
        );
    }
    body.push_str("</table>");
    page("Logs", &body)
}

/// What connected clients sent that the schema does not know (`ops/drift.rs`), with the fix.
fn drift_section(body: &mut String) {
    let seen = crate::ops::drift::seen();
    if seen.is_empty() {
        return;
    }
    let _ = write!(
        body,
        "<h2>Schema drift</h2><p class=\"failed\">Cursor clients sent {} field(s) this server's schema \
         does not know (ignored). Rebuild against your Cursor install: <code>cursor-server \
         schema-check</code>.</p><table><tr><th>message</th><th>field</th><th>what</th>\
         <th>client version</th><th>messages</th></tr>",
        seen.len()
    );
    for drift in seen {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(drift.message),
            drift.number,
            esc(&drift.what),
            esc(drift.client_version.as_deref().unwrap_or("unknown")),
            drift.count
        );
    }
    body.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
