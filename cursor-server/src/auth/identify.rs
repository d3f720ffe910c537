//! The identity layer: runs before every route this server answers (not the pass-through, whose
//! requests Cursor's backend judges by their own credentials) and either puts the verified person
//! on the request (`USER_HEADER`, and a `Caller` extension) or refuses it with a Connect error the
//! IDE shows: `unauthenticated` (who are you?) or `permission_denied` (not you, or not here).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::cursor_account;
use super::service::{Auth, Caller, TOKEN_HEADER, TOKEN_PREFIX, USER_HEADER, token_hash};
use crate::client::downlink::StreamError;
use crate::config::auth::{AuthMode, normalize_email};
use crate::cursor::connect::{ConnectCode, ConnectError};
use crate::cursor::proto::agent::agent_service_routes;
use crate::state::AppState;
use crate::store::{StoreError, users};

/// Paths answered without an identity: the console's login form and its stylesheet.
fn is_open(path: &str) -> bool {
    path == "/console/login" || path.starts_with("/console/static/")
}

/// The middleware (`axum::middleware::from_fn_with_state`).
pub async fn layer(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(auth) = &state.auth else {
        return next.run(request).await;
    };
    let path = request.uri().path().to_owned();
    if is_open(&path) {
        return next.run(request).await;
    }
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    // A client's own `x-cursor-byok-user` is never believed: only a peer node's (below) is.
    let claimed = request.headers_mut().remove(USER_HEADER);
    let verified = if path.starts_with("/internal/cluster/") {
        from_peer_node(&state, request.headers(), claimed).await
    } else {
        identify(&state, auth, request.headers(), peer)
            .await
            .map(Some)
    };
    match verified {
        // A peer node's own request (StopRun): no person; the route checks the secret itself.
        Ok(None) => next.run(request).await,
        Ok(Some(caller)) => {
            if let Ok(value) = HeaderValue::from_str(&caller.email) {
                request.headers_mut().insert(USER_HEADER, value);
            }
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refusal) => {
            tracing::info!(path = %path, code = refusal.code.as_str(), "refused: {}", refusal.message);
            crate::ops::metrics::auth_refused(refusal.code.as_str());
            let who = peer.map(|p| format!("from {}", p.ip()));
            let what = format!("{path} ({})", refusal.code.as_str());
            auth.audit_refusal(&state.store, who, what, refusal.message.clone());
            refuse(&path, refusal)
        }
    }
}

/// A refusal in the form the route's client reads: an end-of-stream frame on the streaming routes,
/// a Connect JSON error elsewhere.
fn refuse(path: &str, refusal: ConnectError) -> Response {
    if path == agent_service_routes::RUN_SSE || path == agent_service_routes::RUN {
        StreamError(refusal).into_response()
    } else {
        refusal.into_response()
    }
}

/// A forward from another node of the cluster: its person is believed with the cluster secret
/// (`None`: the node's own request, which names no person).
async fn from_peer_node(
    state: &AppState,
    headers: &HeaderMap,
    claimed: Option<HeaderValue>,
) -> Result<Option<Caller>, ConnectError> {
    let Some(cluster) = &state.cluster else {
        return Err(ConnectError::new(
            ConnectCode::Unauthenticated,
            "internal cluster route: this node is not part of a cluster",
        ));
    };
    cluster.authorize(headers)?;
    // A forwarded run request without a person is refused by the route (`auth::runs`).
    let Some(email) = claimed.as_ref().and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let auth = state.auth.as_ref().ok_or_else(|| {
        ConnectError::new(ConnectCode::Unauthenticated, "this node has no [auth]")
    })?;
    known_person(state, auth, email).await.map(Some)
}

/// The person behind a client's request, by the configured mode.
async fn identify(
    state: &AppState,
    auth: &Auth,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<Caller, ConnectError> {
    match &auth.config.mode {
        AuthMode::Tokens => {
            let token = presented_token(headers).ok_or_else(|| {
                ConnectError::new(
                    ConnectCode::Unauthenticated,
                    format!(
                        "this server needs your token: send it as {TOKEN_HEADER} or Authorization: Bearer {TOKEN_PREFIX}… (an admin issues one with `cursor-server users add`)"
                    ),
                )
            })?;
            let found = users::by_token(&state.store, &token_hash(token))
                .await
                .map_err(store_failed)?;
            let record = found.ok_or_else(|| {
                ConnectError::new(
                    ConnectCode::Unauthenticated,
                    "this token is not one this server issued (or it was revoked); ask an admin for a new one",
                )
            })?;
            caller_of(auth, record)
        }
        AuthMode::TrustedHeader {
            header,
            trusted_proxies,
        } => {
            let named = headers.get(header).and_then(|v| v.to_str().ok());
            let trusted = peer.is_some_and(|p| trusted_proxies.iter().any(|c| c.contains(p.ip())));
            let Some(named) = named else {
                return Err(ConnectError::new(
                    ConnectCode::Unauthenticated,
                    format!(
                        "no {header} header: reach this server through the sign-in proxy in front of it"
                    ),
                ));
            };
            if !trusted {
                return Err(ConnectError::new(
                    ConnectCode::PermissionDenied,
                    format!(
                        "{header} is believed only from the configured trusted_proxies, not from {}; reach this server through its sign-in proxy",
                        peer.map_or_else(
                            || "an unknown address".to_owned(),
                            |p| p.ip().to_string()
                        )
                    ),
                ));
            }
            admitted(state, auth, named).await
        }
        AuthMode::CursorAccount { .. } => {
            let email = cursor_account::verify(state, auth, headers).await?;
            admitted(state, auth, &email).await
        }
    }
}

/// The token a client presented: `x-cursor-byok-token`, a `cbk_` bearer, or the console cookie.
fn presented_token(headers: &HeaderMap) -> Option<&str> {
    let own = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok());
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| t.starts_with(TOKEN_PREFIX));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            pair.trim()
                .strip_prefix(crate::console::COOKIE)?
                .strip_prefix('=')
        })
        .find(|t| t.starts_with(TOKEN_PREFIX));
    own.or(bearer).or(cookie).map(str::trim)
}

/// A person named by a trusted source (proxy or Cursor): admitted if the file lists them, their
/// domain is allowed, or an admin added them.
async fn admitted(state: &AppState, auth: &Auth, named: &str) -> Result<Caller, ConnectError> {
    let email = normalize_email(named).ok_or_else(|| {
        ConnectError::new(
            ConnectCode::Unauthenticated,
            format!("{named:?} is not an e-mail address this server can key a person by"),
        )
    })?;
    let stored = users::get(&state.store, &email)
        .await
        .map_err(store_failed)?;
    let record = match stored {
        Some(record) => record,
        None if auth.config.admits(&email) => users::ensure(&state.store, &email)
            .await
            .map_err(store_failed)?,
        None => {
            return Err(ConnectError::new(
                ConnectCode::PermissionDenied,
                format!(
                    "{email} is not a member of this server; ask an admin ({}) to add you",
                    admins_of(auth)
                ),
            ));
        }
    };
    caller_of(auth, record)
}

/// A person a peer node already verified: known to the store (the first node recorded them).
async fn known_person(state: &AppState, auth: &Auth, email: &str) -> Result<Caller, ConnectError> {
    let record = users::get(&state.store, email)
        .await
        .map_err(store_failed)?
        .ok_or_else(|| {
            ConnectError::new(
                ConnectCode::Unauthenticated,
                format!("the forwarded user {email} is not known to the store"),
            )
        })?;
    caller_of(auth, record)
}

/// The caller a record names, remembered for the run's budget check (`Auth::person`).
fn caller_of(auth: &Auth, record: users::UserRecord) -> Result<Caller, ConnectError> {
    auth.read_person(&record);
    if record.disabled {
        return Err(ConnectError::new(
            ConnectCode::PermissionDenied,
            format!(
                "{} is disabled on this server; ask an admin to enable you",
                record.email
            ),
        ));
    }
    Ok(Caller {
        email: record.email,
        team: record.team,
        admin: record.admin,
    })
}

fn admins_of(auth: &Auth) -> String {
    if auth.config.admins.is_empty() {
        "the server's operator".to_owned()
    } else {
        auth.config.admins.join(", ")
    }
}

fn store_failed(error: StoreError) -> ConnectError {
    tracing::warn!("identifying a request: {error}");
    ConnectError::new(
        ConnectCode::Unavailable,
        "the server's database did not answer while checking who you are; try again shortly",
    )
}
