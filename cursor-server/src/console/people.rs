//! `[auth]`'s console API for billing and oversight: `/api/usage.csv` (usage per day, person,
//! team, provider and model, for billing; a member gets their own lines) and `/api/audit` (admin
//! actions and refusals; admins only).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::api::{self, ApiError, UsageQuery};
use crate::auth::service::Caller;
use crate::state::AppState;
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
