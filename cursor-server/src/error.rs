//! The service-wide error type: what can stop the server from starting or a run from completing.
//!
//! Each layer has its own precise error (`ConfigError`, `StoreError`, `ProviderError`, `ProtocolError`);
//! this enum is where they meet, and the only place that decides which Connect code a failure gets.
//! `ProtocolError` is defined here rather than in `run/`: the uplink translator (`cursor/`) raises it
//! and the run reports it, and neither layer should import the other's files to name it.

use crate::config::ConfigError;
use crate::cursor::connect::ConnectCode;
use crate::provider::ProviderError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("provider: {0}")]
    Provider(#[from] ProviderError),
    /// The call that summarizes older history failed (not the user's own turn's call).
    #[error("summarizing older history (compaction) failed: {0}")]
    Compaction(ProviderError),
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// `[auth]`: the caller may not do this (another person's conversation).
    #[error("{0}")]
    PermissionDenied(String),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("serving HTTP: {0}")]
    Serve(std::io::Error),
    #[error("building the HTTP client: {0}")]
    HttpClient(String),
    #[error("prompt assets: {0}")]
    Assets(String),
    /// The node could not join its cluster (`cluster/lease.rs` says why).
    #[error("joining the cluster: {0}")]
    Join(String),
}

impl ServerError {
    /// The Connect code a client sees when this error ends a stream (protocol.md §8).
    pub fn connect_code(&self) -> ConnectCode {
        match self {
            ServerError::Provider(provider) | ServerError::Compaction(provider) => {
                provider_code(provider)
            }
            ServerError::Protocol(_) | ServerError::InvalidRequest(_) => {
                ConnectCode::InvalidArgument
            }
            ServerError::NotFound(_) => ConnectCode::NotFound,
            ServerError::PermissionDenied(_)
            | ServerError::Store(crate::store::StoreError::NotYours { .. }) => {
                ConnectCode::PermissionDenied
            }
            // A database that is down or restarting: the client may try again once it is back.
            ServerError::Store(store) if store.is_unavailable() => ConnectCode::Unavailable,
            ServerError::Config(_)
            | ServerError::Store(_)
            | ServerError::Bind { .. }
            | ServerError::Serve(_)
            | ServerError::HttpClient(_)
            | ServerError::Assets(_)
            | ServerError::Join(_) => ConnectCode::Internal,
        }
    }

    /// Whether trying the same request again can succeed: a provider that is down, slow, rate
    /// limiting or cut the stream, yes; a rejected request, key or model, no.
    pub fn is_retryable(&self) -> bool {
        match self {
            ServerError::Provider(provider) | ServerError::Compaction(provider) => {
                crate::provider::retry::by_client(provider)
            }
            ServerError::Store(_) | ServerError::Serve(_) => true,
            _ => false,
        }
    }

    /// The provider's failure behind this error, if it is one.
    pub fn provider(&self) -> Option<&ProviderError> {
        match self {
            ServerError::Provider(provider) | ServerError::Compaction(provider) => Some(provider),
            _ => None,
        }
    }
}

/// A provider's answer as a Connect code: what the client (and the user) should make of it.
fn provider_code(error: &ProviderError) -> ConnectCode {
    match error {
        ProviderError::Http { status, .. } => match status {
            400 | 413 | 422 => ConnectCode::InvalidArgument,
            401 => ConnectCode::Unauthenticated,
            403 => ConnectCode::PermissionDenied,
            404 => ConnectCode::NotFound,
            429 => ConnectCode::ResourceExhausted,
            _ => ConnectCode::Unavailable,
        },
        ProviderError::Unsupported(_) => ConnectCode::InvalidArgument,
        ProviderError::KeysCoolingDown { .. } | ProviderError::OverBudget(_) => {
            ConnectCode::ResourceExhausted
        }
        _ => ConnectCode::Unavailable,
    }
}

/// A client that broke the protocol at run time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("{0}")]
    Exec(String),
    #[error("{0}")]
    Kv(String),
    #[error("a second run_request arrived for a run that already started")]
    DuplicateRunRequest,
    #[error("{0} before run_request")]
    BeforeRunRequest(&'static str),
    #[error("run_request without conversation_id")]
    MissingConversationId,
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("append_seqno {seqno}: {reason}")]
    Seqno { seqno: i64, reason: String },
    #[error("request stream: {0}")]
    Uplink(String),
}
