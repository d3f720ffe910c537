//! The console's routes: its pages under `/console` and the JSON API under `/api/` (each page
//! renders its API handler's answer through its template) and the static assets the pages link.
//! Who may call them: on a loopback listener anyone on this machine unless `console_token` is set;
//! on any other listener only with the token (a bearer header or the console's cookie). Never
//! passed through to Cursor's backend.

pub mod actions;
pub mod api;
pub mod assets;
pub mod charts;
pub mod logs;
pub mod pages;
pub mod people;
pub mod scope;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::state::AppState;

/// The cookie a console login sets (holding the token).
pub const COOKIE: &str = "cursor_byok_console";

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/console", get(pages::overview))
        .route("/console/runs", get(pages::runs))
        .route("/console/runs/{request_id}", get(pages::run))
        .route("/console/conversations", get(pages::conversations))
        .route("/console/conversations/{id}", get(pages::conversation))
        .route("/console/usage", get(pages::usage))
        .route("/console/logs", get(pages::logs))
        .route("/api/logs", get(api::logs))
        .route("/api/runs", get(api::runs))
        .route("/api/runs/{request_id}", get(api::run))
        .route("/api/conversations", get(api::conversations))
        .route("/api/conversations/{id}", get(api::conversation))
        .route("/api/usage", get(api::usage))
        .route("/api/usage.csv", get(people::usage_csv))
        .route("/api/audit", get(people::audit))
        .route("/api/people", get(people::people))
        .route(
            "/console/people",
            get(people::people_page).post(people::person_action),
        )
        .route("/api/providers", get(api::providers))
        .route("/api/live", get(api::live))
        .route("/api/conversations/{id}/markdown", get(actions::markdown))
        .route("/console/probe", post(actions::probe))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), guard))
        // Logging in is how a browser gets past the guard; its page needs the stylesheet, which
        // holds nothing private.
        .route("/console/static/{name}", get(assets::serve))
        .route(
            "/console/login",
            get(actions::login_form).post(actions::login),
        )
        .with_state(state)
}

/// Lets a request through when the console is open to it (see the module's header).
async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    // `[auth]`: the identity layer in front already verified the person (or refused them); a
    // member may not use the admin's pages.
    if state.auth.is_some() {
        let member = request
            .extensions()
            .get::<crate::auth::service::Caller>()
            .is_none_or(|c| !c.admin);
        if member && scope::admin_only(request.uri().path()) {
            return (
                StatusCode::FORBIDDEN,
                "this page is for the server's admins ([auth] admins)",
            )
                .into_response();
        }
        return next.run(request).await;
    }
    match access(&state, request.headers()) {
        Access::Granted => next.run(request).await,
        Access::Denied(why) => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            why,
        )
            .into_response(),
    }
}

enum Access {
    Granted,
    Denied(&'static str),
}

fn access(state: &AppState, headers: &HeaderMap) -> Access {
    let Some(token) = state.config.console_token.as_ref() else {
        return if state.config.listen.ip().is_loopback() {
            Access::Granted
        } else {
            Access::Denied(
                "the console answers only on a loopback listener unless console_token is set",
            )
        };
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .next();
    let presented = bearer.or(cookie).unwrap_or_default();
    if constant_time_eq(presented.as_bytes(), token.expose().as_bytes()) {
        Access::Granted
    } else {
        Access::Denied("a console token is required (Authorization: Bearer <console_token>)")
    }
}

/// Compares without stopping at the first difference (the time taken says nothing of the token).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
