//! LLM endpoint adapters. `call` starts one streaming provider call and hands back its canonical
//! events; which adapter runs is decided by the configured provider kind, nowhere else.

pub mod event;
pub mod openai_chat;

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{ProviderConfig, ProviderKind};
pub use event::{FinishReason, ResponseEvent};

/// How many canonical events may wait between the adapter task and the loop.
const EVENT_BUFFER: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("{provider} answered HTTP {status}: {message}")]
    Http {
        provider: String,
        status: u16,
        message: String,
    },
    #[error("{provider} could not be reached: {message}")]
    Connect { provider: String, message: String },
    #[error("{provider} sent no response headers within {secs} s")]
    HeadersTimeout { provider: String, secs: u64 },
    #[error("{provider} sent nothing for {secs} s (idle timeout)")]
    Idle { provider: String, secs: u64 },
    #[error("{provider} stream failed: {message}")]
    Stream { provider: String, message: String },
    #[error("{provider} stream ended without its terminal event ({missing})")]
    Truncated {
        provider: String,
        missing: &'static str,
    },
    #[error("{provider} sent an undecodable event: {message}")]
    Decode { provider: String, message: String },
    #[error("{provider} reported an error: {message}")]
    InBand { provider: String, message: String },
    #[error("{0}")]
    Unsupported(String),
}

impl ProviderError {
    /// Short title for Cursor's error card.
    pub fn title(&self) -> &'static str {
        match self {
            ProviderError::Http { status: 429, .. } => "Provider rate limit",
            ProviderError::Http { status, .. } if *status >= 500 => "Provider unavailable",
            ProviderError::Http { .. } => "Provider rejected the request",
            ProviderError::Connect { .. } | ProviderError::HeadersTimeout { .. } => {
                "Provider unreachable"
            }
            ProviderError::Idle { .. } | ProviderError::Truncated { .. } => {
                "Provider stream interrupted"
            }
            ProviderError::Stream { .. }
            | ProviderError::Decode { .. }
            | ProviderError::InBand { .. } => "Provider error",
            ProviderError::Unsupported(_) => "Unsupported model output",
        }
    }
}

/// Timing limits of one provider call.
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    /// Waiting for the response headers.
    pub headers_timeout: Duration,
    /// Between two streamed events (not a total limit).
    pub idle_timeout: Duration,
}

pub type EventReceiver = mpsc::Receiver<Result<ResponseEvent, ProviderError>>;

/// Starts a streaming call with an already projected request `body`. The call runs on its own task
/// until it finishes, fails (the error is the last item) or `cancel` fires (then nothing more is sent
/// and the HTTP connection is dropped, which the provider observes as a disconnect).
pub fn call(
    http: &reqwest::Client,
    provider: &ProviderConfig,
    body: serde_json::Value,
    limits: CallLimits,
    cancel: CancellationToken,
) -> EventReceiver {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    match provider.kind {
        ProviderKind::OpenAiChat => {
            let call = openai_chat::ChatCall::new(http.clone(), provider, body, limits);
            tokio::spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = call.run(&tx) => {}
                }
            });
        }
        ProviderKind::OpenAiResponses | ProviderKind::Anthropic => {
            // Config validation refuses these kinds until their adapters exist; fail loudly anyway.
            let message = format!(
                "provider kind {:?} has no adapter in this build",
                provider.kind
            );
            let _ = tx.try_send(Err(ProviderError::Unsupported(message)));
        }
    }
    rx
}

/// Reads an error body (bounded) and extracts the provider's message from the usual
/// `{"error":{"message":...}}` shape, else returns the raw text.
pub(crate) async fn error_message(response: reqwest::Response) -> String {
    const MAX_ERROR_BODY: usize = 16 * 1024;
    let bytes = match tokio::time::timeout(Duration::from_secs(10), response.bytes()).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => return format!("(error body unreadable: {e})"),
        Err(_) => return "(error body not received in time)".to_owned(),
    };
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_ERROR_BODY)]).into_owned();
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(json) => json
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .or_else(|| json.get("message").and_then(|m| m.as_str()))
            .map(str::to_owned)
            .unwrap_or(text),
        Err(_) => text,
    }
}
