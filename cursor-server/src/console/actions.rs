//! What the console does rather than shows: probing a model (the `check` probe, as a POST with
//! the page's CSRF token), logging in with the console token (sets the cookie), and exporting a
//! conversation as Markdown. The probe's answer and the login form are templates
//! (`templates/console/`).

use std::sync::{Arc, OnceLock};

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::COOKIE;
use super::api::ApiError;
use super::assets;
use crate::model::message::CanonicalMessage;
use crate::ops::check::{self, Probe};
use crate::state::AppState;
use crate::store::messages;

/// The token every console form carries and every console POST must return: random per process,
/// so another site cannot forge a POST (it cannot read the page that holds it).
pub fn csrf_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| uuid::Uuid::new_v4().simple().to_string())
}

pub(super) fn csrf_ok(presented: &str) -> bool {
    super::constant_time_eq(presented.as_bytes(), csrf_token().as_bytes())
}

#[derive(Debug, Deserialize)]
pub struct ProbeForm {
    model: String,
    csrf: String,
}

/// `POST /console/probe`: sends the model a minimal request and shows what came of it.
pub async fn probe(
    State(state): State<Arc<AppState>>,
    Form(form): Form<ProbeForm>,
) -> Result<Response, ApiError> {
    if !csrf_ok(&form.csrf) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or stale; reload the page".to_owned(),
        ));
    }
    let Some((provider, model)) = state
        .config
        .providers
        .iter()
        .find_map(|p| p.models.iter().find(|m| m.id == form.model).map(|m| (p, m)))
    else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no model {:?}", form.model),
        ));
    };
    let outcome = check::probe(&state.http, provider, model).await;
    Ok(assets::page(
        StatusCode::OK,
        &ProbePage {
            model: &model.id,
            outcome,
        },
    ))
}

#[derive(Template)]
#[template(path = "console/probe.html")]
struct ProbePage<'a> {
    model: &'a str,
    outcome: Probe,
}

#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    csrf: &'static str,
}

/// `GET /console/login`: the token form (only useful when `console_token` is set).
pub async fn login_form() -> Response {
    assets::page(StatusCode::OK, &LoginPage { csrf: csrf_token() })
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    token: String,
    csrf: String,
}

/// `POST /console/login`: the right token sets the console's cookie (HTTP-only, same-site).
pub async fn login(State(state): State<Arc<AppState>>, Form(form): Form<LoginForm>) -> Response {
    let expected = state.config.console_token.as_ref();
    let right = expected.is_some_and(|token| {
        super::constant_time_eq(form.token.as_bytes(), token.expose().as_bytes())
    });
    // `[auth]`: a token issued to an enabled person logs them in (the identity layer reads the
    // cookie on every later request).
    let right = right
        || (state.auth.is_some() && crate::auth::service::issued(&state.store, &form.token).await);
    if !csrf_ok(&form.csrf) || !right {
        tracing::warn!("a console login failed");
        return (StatusCode::UNAUTHORIZED, "wrong token").into_response();
    }
    let cookie = format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", form.token);
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console")).into_response()
}

/// `GET /api/conversations/{id}/markdown`: the stored history as a Markdown document.
pub async fn markdown(
    State(state): State<Arc<AppState>>,
    caller: Option<axum::Extension<crate::auth::service::Caller>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !super::scope::may_read(&state, caller.as_deref(), &id).await? {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("conversation {id} belongs to someone else on this server"),
        ));
    }
    let history = messages::load(&state.store, &id).await?;
    if history.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no conversation {id:?}"),
        ));
    }
    let mut text = format!("# Conversation {id}\n");
    for message in &history {
        let (heading, body) = match message {
            CanonicalMessage::User(user) => ("User", user.text.clone()),
            CanonicalMessage::Assistant(assistant) if assistant.thinking.is_empty() => {
                ("Assistant", assistant.text.clone())
            }
            CanonicalMessage::Assistant(assistant) => (
                "Assistant",
                format!(
                    "<details><summary>Thinking</summary>\n\n{}\n\n</details>\n\n{}",
                    assistant.thinking, assistant.text
                ),
            ),
            CanonicalMessage::ToolCall(record) => (
                "Tool call",
                format!(
                    "`{}`\n\n```json\n{}\n```",
                    record.call.name, record.call.arguments
                ),
            ),
            CanonicalMessage::ToolResult(record) => (
                "Tool result",
                format!("```\n{}\n```", record.result.content),
            ),
        };
        text.push_str(&format!("\n## {heading}\n\n{body}\n"));
    }
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "text/markdown; charset=utf-8".to_owned(),
            ),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"{}.md\"",
                    id.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
                ),
            ),
        ],
        text,
    )
        .into_response())
}
