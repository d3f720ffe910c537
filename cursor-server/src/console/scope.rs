//! Whose data a console or `/api` request may see (`[auth]`): a member their own conversations and
//! runs, an admin everyone's. Without `[auth]` (no `Caller` on the request) everything, as before.

use axum::http::StatusCode;

use super::api::ApiError;
use crate::auth::service::Caller;
use crate::state::AppState;
use crate::store::users;

/// The owner to restrict a listing to: the member's own e-mail; `None` (everything) for an admin
/// or without `[auth]`.
pub fn own_only(caller: Option<&Caller>) -> Option<&str> {
    caller.filter(|c| !c.admin).map(|c| c.email.as_str())
}

/// Refuses a member reading a conversation that is someone else's (403, naming no owner).
pub async fn may_read(
    state: &AppState,
    caller: Option<&Caller>,
    conversation_id: &str,
) -> Result<(), ApiError> {
    let Some(email) = own_only(caller) else {
        return Ok(());
    };
    let owner = users::conversation_owner(&state.store, conversation_id).await?;
    if owner.as_deref().is_some_and(|owner| owner != email) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("conversation {conversation_id} belongs to someone else on this server"),
        ));
    }
    Ok(())
}
