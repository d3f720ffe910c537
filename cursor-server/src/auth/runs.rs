//! Whose each run and conversation is (`[auth]`): a run is admitted for the person who opened it
//! (RunSSE, BidiAppend or `Run`), and the conversation it opens is claimed for that person (in the
//! run's start transaction); another person's run or conversation is refused `permission_denied`.

use std::time::Instant;

use axum::http::HeaderMap;

use super::service::{RUN_OWNER_TTL, RUN_OWNERS_PRUNE_AT, USER_HEADER};
use crate::cursor::connect::{ConnectCode, ConnectError};
use crate::error::ServerError;
use crate::state::AppState;
use crate::store::users;

/// The verified person the identity layer put on this request (`None` without `[auth]`).
pub fn verified_user(headers: &HeaderMap) -> Option<&str> {
    headers.get(USER_HEADER).and_then(|v| v.to_str().ok())
}

/// Admits a request for run `request_id` (a RunSSE, BidiAppend or `Run`): the run becomes the
/// caller's if it is new; a run of someone else is refused `permission_denied`.
pub async fn admit_run(
    state: &AppState,
    headers: &HeaderMap,
    request_id: &str,
) -> Result<(), ConnectError> {
    let Some(auth) = &state.auth else {
        return Ok(());
    };
    let Some(user) = verified_user(headers) else {
        return Err(ConnectError::new(
            ConnectCode::Unauthenticated,
            "this server needs to know who you are; sign in as its [auth] section says",
        ));
    };
    let remembered = auth.owner_of_run(request_id);
    let owner = match remembered {
        Some(owner) => Some(owner),
        None => users::run_owner(&state.store, request_id)
            .await
            .map_err(|e| {
                ConnectError::new(
                    ServerError::from(e).connect_code(),
                    "reading the run's owner failed",
                )
            })?,
    };
    if let Some(owner) = owner
        && owner != user
    {
        let refusal = refused_not_yours("run", request_id);
        let what = format!("run {request_id}");
        auth.audit_refusal(
            &state.store,
            Some(user.to_owned()),
            what,
            refusal.message.clone(),
        );
        return Err(refusal);
    }
    let mut owners = auth.run_owners.lock().unwrap_or_else(|e| e.into_inner());
    if owners.len() >= RUN_OWNERS_PRUNE_AT {
        owners.retain(|_, (_, at)| at.elapsed() < RUN_OWNER_TTL);
    }
    owners
        .entry(request_id.to_owned())
        .or_insert_with(|| (user.to_owned(), Instant::now()));
    Ok(())
}

/// `permission_denied` for another person's run or conversation.
pub fn refused_not_yours(what: &str, id: &str) -> ConnectError {
    ConnectError::new(
        ConnectCode::PermissionDenied,
        format!(
            "{what} {id} belongs to someone else on this server; start a new chat (an admin can see every {what} in the console)"
        ),
    )
}

/// The person a run on `conversation_id` is for (`[auth]` only; `None` without it), once the
/// conversation is known not to be someone else's: the run's start claims it for them in its own
/// write transaction (`store::runs::RunStart::person`), which also refuses it if another person
/// claimed it in between. A conversation of someone else is refused here, before the run reads
/// anything of it, whatever its id or blobs say.
pub async fn person_for_conversation(
    state: &AppState,
    request_id: &str,
    conversation_id: &str,
) -> Result<Option<String>, ServerError> {
    let Some(auth) = &state.auth else {
        return Ok(None);
    };
    let Some(user) = auth.owner_of_run(request_id) else {
        return Err(ServerError::PermissionDenied(format!(
            "run {request_id} was not admitted for anyone; sign in as this server's [auth] section says"
        )));
    };
    let owner = users::conversation_owner(&state.store, conversation_id).await?;
    if let Some(owner) = owner
        && owner != user
    {
        tracing::warn!(
            request_id,
            conversation_id,
            "refused a run on another person's conversation"
        );
        let message = refused_not_yours("conversation", conversation_id).message;
        let what = format!("conversation {conversation_id}");
        auth.audit_refusal(&state.store, Some(user), what, message.clone());
        return Err(ServerError::PermissionDenied(message));
    }
    Ok(Some(user))
}
