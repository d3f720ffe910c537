//! Whose data a console or `/api` request may see (`[auth]`): a member their own conversations and
//! runs, an admin everyone's. Without `[auth]` (no `Caller` on the request) everything, as before.

use crate::auth::service::Caller;
use crate::state::AppState;
use crate::store::{StoreError, users};

/// Pages and API routes only admins may use: the server's logs, providers and keys, the live
/// runs of everyone, probes, the audit log, the people page and its form.
pub fn admin_only(path: &str) -> bool {
    matches!(
        path,
        "/console/logs"
            | "/api/logs"
            | "/api/providers"
            | "/api/live"
            | "/console/probe"
            | "/api/audit"
            | "/api/people"
            | "/console/people"
    )
}

/// The owner to restrict a listing to: the member's own e-mail; `None` (everything) for an admin
/// or without `[auth]`.
pub fn own_only(caller: Option<&Caller>) -> Option<&str> {
    caller.filter(|c| !c.admin).map(|c| c.email.as_str())
}

/// Whether the caller may read conversation `conversation_id`: not a member reading someone
/// else's.
pub async fn may_read(
    state: &AppState,
    caller: Option<&Caller>,
    conversation_id: &str,
) -> Result<bool, StoreError> {
    let Some(email) = own_only(caller) else {
        return Ok(true);
    };
    let owner = users::conversation_owner(&state.store, conversation_id).await?;
    Ok(owner.as_deref().is_none_or(|owner| owner == email))
}
