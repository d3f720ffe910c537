//! `[auth]`'s console for billing and oversight: `/api/usage.csv` (usage per day, person, team,
//! provider and model, for billing; a member gets their own lines), `/api/audit` (admin actions and
//! refusals; admins only), and the admins' people page: `/api/people` and `/console/people` (each
//! person and team with their limits in force and what they spent today and this month, and the
//! audit log) with its form (`POST /console/people`: disable, enable, set a person's limits, as
//! `cursor-server users` does, audited under the admin's name).

use std::sync::Arc;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form, Json};
use serde::{Deserialize, Serialize};

use super::api::{self, ApiError, UsageQuery};
use super::assets;
use crate::auth::admin::{AdminError, UsersAction, run_by};
use crate::auth::budget::spent_now;
use crate::auth::service::Caller;
use crate::config::auth::Limits;
use crate::state::AppState;
use crate::store::budgets::Spent;
use crate::store::users::{self, AuditEntry};

/// `GET /api/usage.csv`: `/api/usage`'s per-person lines as CSV.
pub async fn usage_csv(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    query: Query<UsageQuery>,
) -> Result<Response, ApiError> {
    let report = api::usage(State(state), caller, query).await?.0;
    let mut csv = String::from(
        "day,user,team,provider,model,calls,input_tokens,output_tokens,cache_read_tokens,cache_write_tokens,reasoning_tokens,cost_usd\n",
    );
    let number = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_default();
    for person in &report.by_person {
        let line = &person.line;
        let fields = [
            line.day.clone(),
            person.user.clone().unwrap_or_default(),
            person.team.clone().unwrap_or_default(),
            line.provider.clone(),
            line.model.clone(),
            line.calls.to_string(),
            number(line.usage.input),
            number(line.usage.output),
            number(line.usage.cache_read),
            number(line.usage.cache_write),
            number(line.usage.reasoning),
            line.cost_usd.map(|c| format!("{c:.6}")).unwrap_or_default(),
        ];
        let quoted: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
        csv.push_str(&quoted.join(","));
        csv.push('\n');
    }
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"cursor-byok-usage.csv\"",
            ),
        ],
        csv,
    )
        .into_response())
}

/// A CSV field, quoted when it holds a separator, a quote or a line break; a leading `=`, `+`,
/// `-` or `@` is prefixed with `'` so a spreadsheet does not run it as a formula.
fn csv_field(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditList {
    pub entries: Vec<AuditEntry>,
}

/// `GET /api/audit`: the newest audit entries (admins only).
pub async fn audit(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    if caller.as_deref().is_some_and(|c| !c.admin) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the audit log is for admins",
        ));
    }
    let limit = query.limit.unwrap_or(200).clamp(1, 1000);
    let entries = users::audit_log(&state.store, limit).await?;
    Ok(Json(AuditList { entries }))
}

/// What one person or team spent in a period, in dollars and tokens.
#[derive(Debug, Clone, Serialize)]
pub struct SpentView {
    pub cost_usd: f64,
    pub tokens: i64,
    pub calls: i64,
}

impl From<Spent> for SpentView {
    fn from(spent: Spent) -> Self {
        SpentView {
            cost_usd: spent.cost_micro_usd as f64 / 1e6,
            tokens: spent.tokens,
            calls: spent.calls,
        }
    }
}

/// One person on the people page.
#[derive(Debug, Clone, Serialize)]
pub struct PersonRow {
    pub email: String,
    pub team: Option<String>,
    pub admin: bool,
    pub disabled: bool,
    /// Their own limits (`[[users]]`, `users set-budget`).
    pub own: Limits,
    /// What applies: their own over their team's.
    pub in_force: Limits,
    pub today: SpentView,
    pub month: SpentView,
}

/// One team on the people page.
#[derive(Debug, Clone, Serialize)]
pub struct TeamRow {
    pub name: String,
    pub members: Vec<String>,
    /// Each member's limits.
    pub limits: Limits,
    /// The whole team's (`[teams.total]`).
    pub total: Option<Limits>,
    pub today: SpentView,
    pub month: SpentView,
}

#[derive(Debug, Clone, Serialize)]
pub struct People {
    pub people: Vec<PersonRow>,
    pub teams: Vec<TeamRow>,
    pub audit: Vec<AuditEntry>,
}

/// `GET /api/people`: every person and team with their limits and spending, and the newest audit
/// entries (admins only; `not_found` without `[auth]`: one user, no people).
pub async fn people(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
) -> Result<Json<People>, ApiError> {
    let Some(auth) = &state.auth else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "this server has no [auth] section: it has one user and no people to manage",
        ));
    };
    if caller.as_deref().is_none_or(|c| !c.admin) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the people page is for admins",
        ));
    }
    let store = &state.store;
    let mut people = Vec::new();
    for user in users::list(store).await? {
        let (own, in_force) = auth
            .config
            .limits_of(user.team.as_deref(), user.limits.as_deref());
        let [today, month] = spent_now(store, &format!("user:{}", user.email)).await?;
        people.push(PersonRow {
            in_force,
            own,
            email: user.email,
            team: user.team,
            admin: user.admin,
            disabled: user.disabled,
            today: today.into(),
            month: month.into(),
        });
    }
    let mut teams = Vec::new();
    for team in &auth.config.teams {
        let [today, month] = spent_now(store, &format!("team:{}", team.name)).await?;
        teams.push(TeamRow {
            name: team.name.clone(),
            members: team.members.clone(),
            limits: team.limits.clone(),
            total: team.total.clone(),
            today: today.into(),
            month: month.into(),
        });
    }
    let audit = users::audit_log(store, 50).await?;
    Ok(Json(People {
        people,
        teams,
        audit,
    }))
}

#[derive(Template)]
#[template(path = "console/people.html")]
struct PeoplePage {
    title: &'static str,
    csrf: &'static str,
    view: People,
}

// What the template calls (as `self::…`, each argument by reference) to show a value.

/// Limits as one line (`daily_cost_usd 5, requests_per_minute 30`), or an em dash.
fn limits(limits: &Limits) -> String {
    shown_limits(serde_json::to_value(limits).ok())
}

fn total(total: &Option<Limits>) -> String {
    shown_limits(total.as_ref().and_then(|t| serde_json::to_value(t).ok()))
}

fn spent(spent: &SpentView) -> String {
    format!(
        "${:.4} · {} tokens · {} calls",
        spent.cost_usd, spent.tokens, spent.calls
    )
}

/// A person's own limits as the form's JSON.
fn own_json(limits: &Limits) -> String {
    serde_json::to_string(limits).unwrap_or_default()
}

fn utc(at_ms: &i64) -> String {
    super::pages::utc(*at_ms)
}

fn dash(text: &Option<String>) -> String {
    text.clone().unwrap_or_else(|| "—".to_owned())
}

fn shown_limits(value: Option<serde_json::Value>) -> String {
    let Some(serde_json::Value::Object(map)) = value else {
        return "—".to_owned();
    };
    if map.is_empty() {
        return "—".to_owned();
    }
    map.iter()
        .map(|(k, v)| match v {
            serde_json::Value::Array(items) => format!(
                "{k} {}",
                items
                    .iter()
                    .filter_map(|i| i.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            other => format!("{k} {other}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `GET /console/people`: the admins' page of people, teams and the audit log.
pub async fn people_page(
    state: State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
) -> Result<Response, super::pages::PageError> {
    let view = people(state, caller).await?.0;
    Ok(assets::page(
        StatusCode::OK,
        &PeoplePage {
            title: "People",
            csrf: super::actions::csrf_token(),
            view,
        },
    ))
}

/// The people page's form: one action on one person.
#[derive(Debug, Deserialize)]
pub struct PersonForm {
    csrf: String,
    email: String,
    action: PersonAction,
    /// `set-budget`: a JSON object of limits replacing the person's own.
    #[serde(default)]
    limits: String,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum PersonAction {
    Disable,
    Enable,
    SetBudget,
}

/// `POST /console/people`: disables, enables or sets the limits of a person, audited under the
/// admin's name, then shows the page again.
pub async fn person_action(
    State(state): State<Arc<AppState>>,
    caller: Option<Extension<Caller>>,
    Form(form): Form<PersonForm>,
) -> Result<Response, super::pages::PageError> {
    if !super::actions::csrf_ok(&form.csrf) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or stale; reload the page",
        )
        .into());
    }
    let Some(admin) = caller.as_deref().filter(|c| c.admin) else {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "the people page is for admins").into());
    };
    let email = form.email;
    // This node's copy of the person is forgotten once the change is made, so their next call
    // here sees it at once (other nodes within `auth::service::PERSON_FRESH`).
    let changed = crate::config::auth::normalize_email(&email);
    let action = match form.action {
        PersonAction::Disable => UsersAction::Disable { email },
        PersonAction::Enable => UsersAction::Enable { email },
        PersonAction::SetBudget => UsersAction::SetBudget {
            email,
            limits: form.limits,
        },
    };
    match run_by(&state.store, &admin.email, action).await {
        Ok(done) => {
            if let (Some(auth), Some(changed)) = (&state.auth, &changed) {
                auth.forget_person(changed);
            }
            tracing::info!(admin = %admin.email, "{done}");
            Ok(Redirect::to("/console/people").into_response())
        }
        Err(AdminError::Store(error)) => Err(ApiError::from(error).into()),
        Err(refused) => Err(ApiError::new(StatusCode::BAD_REQUEST, refused.to_string()).into()),
    }
}
