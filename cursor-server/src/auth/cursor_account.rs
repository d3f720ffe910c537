//! `cursor_account`: the person's own Cursor sign-in. Cursor sends its access token
//! (`Authorization: Bearer …`) on every request; it is verified once by asking Cursor's backend
//! (the pass-through's upstream) for the account behind it (`GetMe`, configurable as
//! `cursor_me_route`), and the answer is cached by the token's SHA-256 for `cursor_cache_secs`.
//! When Cursor's backend cannot be reached, cached identities keep working until they expire and
//! new ones are refused with a message saying so. The token itself is never stored or logged.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::{HeaderMap, header};
use prost::Message as _;

use super::service::token_hash;
use crate::config::auth::AuthMode;
use crate::cursor::connect::{ConnectCode, ConnectError};
use crate::cursor::proto::aiserver::{GetMeRequest, GetMeResponse};
use crate::state::AppState;

/// How long one verification may take before it counts as Cursor's backend being unreachable.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);
/// The e-mail of the Cursor account whose access token the request carries.
pub async fn verify(
    state: &AppState,
    auth: &super::service::Auth,
    headers: &HeaderMap,
) -> Result<String, ConnectError> {
    let AuthMode::CursorAccount { cache, me_route } = &auth.config.mode else {
        return Err(ConnectError::new(
            ConnectCode::Internal,
            "cursor_account verification outside cursor_account mode",
        ));
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .filter(|v| v.to_str().is_ok_and(|v| v.starts_with("Bearer ")))
        .ok_or_else(|| {
            ConnectError::new(
                ConnectCode::Unauthenticated,
                "this server identifies you by your Cursor sign-in, and the request carried none: sign in to Cursor",
            )
        })?;
    let hash = token_hash(authorization.to_str().unwrap_or_default());
    if let Some(email) = auth.cursor_tokens.get(&hash) {
        return Ok(email);
    }
    let (Some(client), Some(upstream)) = (&state.upstream, &state.config.upstream) else {
        return Err(ConnectError::new(
            ConnectCode::Unavailable,
            "cursor_account needs pass-through to Cursor's backend, and it is off",
        ));
    };
    auth.cursor_tokens.asked.fetch_add(1, Ordering::Relaxed);
    let unreachable = |why: String| {
        tracing::warn!("verifying a Cursor sign-in: {why}");
        ConnectError::new(
            ConnectCode::Unavailable,
            format!(
                "Cursor's backend could not be reached to verify your sign-in ({why}); sessions verified before keep working, new ones must wait until it answers"
            ),
        )
    };
    let response = client
        .post(format!("{}{me_route}", upstream.url))
        .header(header::CONTENT_TYPE, "application/proto")
        .header("connect-protocol-version", "1")
        .header(header::AUTHORIZATION, authorization.clone())
        .body(GetMeRequest {}.encode_to_vec())
        .timeout(VERIFY_TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(e.without_url().to_string()))?;
    let status = response.status().as_u16();
    if status == 401 || status == 403 {
        return Err(ConnectError::new(
            ConnectCode::Unauthenticated,
            "Cursor did not accept your sign-in (expired or invalid); sign in to Cursor again",
        ));
    }
    if status != 200 {
        return Err(unreachable(format!("{me_route} answered HTTP {status}")));
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| unreachable(e.without_url().to_string()))?;
    let me = GetMeResponse::decode(body.as_ref()).map_err(|e| {
        unreachable(format!(
            "{me_route} answered something else than GetMeResponse: {e}"
        ))
    })?;
    let email = me.email.filter(|e| !e.trim().is_empty()).ok_or_else(|| {
        ConnectError::new(
            ConnectCode::PermissionDenied,
            "your Cursor account has no e-mail address this server could key you by",
        )
    })?;
    auth.cursor_tokens.put(hash, email.clone(), *cache);
    Ok(email)
}
